"""`tessera models` / `tessera trace` through the real entry point: output, JSON, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.graph import KernelGraph
from tests.conftest import RunCli


@pytest.mark.parametrize(("argv", "needle"), [
    (["trace", "gpt-9", "--phase", "prefill"], "unknown model 'gpt-9'; valid:"),
    (["trace", "llama-tiny", "--phase", "denoise"], "valid: decode, prefill"),
    (["trace", "{cfg}", "--phase", "prefill"], "cannot read model config"),
])
def test_user_mistakes_are_one_line_exit_2(argv: list[str], needle: str, tmp_path: Path,
                                           run_cli: RunCli) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    code, _, err = run_cli([a.replace("{cfg}", str(bad)) for a in argv])
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_trace_json_and_graph_file(tmp_path: Path, run_cli: RunCli) -> None:
    path = tmp_path / "g.json"
    code, out, _ = run_cli(["trace", "llama-tiny", "--phase", "decode", "--batch", "2", "--context", "8",
                         "--json", "-o", str(path)])
    assert code == 0
    s = json.loads(out)
    for key in ("kernels", "flops", "bytes_read", "bytes_written", "weight_bytes", "kv_bytes", "layers", "capture_s"):
        assert key in s
    g = KernelGraph.load(path)
    assert s["kernels"] == len(g.kernels) and s["flops"] == g.flops and s["layers"] == 2
    # kv: 2 layers × K,V × batch 2 × 2 kv heads × 9 slots × head dim 16 × fp... bf16 (2 bytes)
    assert s["kv_bytes"] == 2 * 2 * 2 * 2 * 9 * 16 * 2


def test_local_config_and_models(tmp_path: Path, run_cli: RunCli) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                               "num_hidden_layers": 3, "num_attention_heads": 2, "num_key_value_heads": 1,
                               "vocab_size": 64}))
    code, out, _ = run_cli(["trace", str(cfg), "--phase", "prefill", "--seq", "4", "--json"])
    assert code == 0 and json.loads(out)["layers"] == 3
    code, out, _ = run_cli(["models"])
    assert code == 0 and "llama-3-70b" in out and "flux-dev" in out
