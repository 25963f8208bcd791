"""`tessera generate`: JSON lines out, prompts files in, and every mistake one line with exit status 2."""

from __future__ import annotations

import json

import pytest

from tessera.engine.memory import MemoryNeed, check_memory

KEYS = {"text", "token_ids", "finish_reason", "devices", "placement"}


def test_generate_json(run_cli, saved):
    directory, hf = saved("llama")
    code, out, err = run_cli(["generate", str(directory), "--prompt", "w5 w6 w7", "--max-tokens", "4",
                              "--json", "--dtype", "fp32", "--max-num-batched-tokens", "3"])
    assert code == 0, err
    (line,) = out.splitlines()
    got = json.loads(line)
    assert set(got) == KEYS and got["devices"] == ["cpu"] and got["placement"] == "single"
    import torch

    ref = hf.generate(torch.tensor([[1, 5, 6, 7]]), max_new_tokens=4, do_sample=False)[0, 4:].tolist()
    assert got["token_ids"] == ref
    assert "iterations" in err


def test_prompts_file(run_cli, saved, tmp_path):
    directory, _ = saved("llama")
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "w9 w10"}\n\n'
                 '{"prompt_ids": [1, 40, 41, 42], "max_tokens": 5, "ignore_eos": true}\n')
    code, out, err = run_cli(["generate", str(directory), "--prompts-file", str(f), "--json",
                              "--max-tokens", "2"])
    assert code == 0, err
    first, second = (json.loads(x) for x in out.splitlines())
    assert len(first["token_ids"]) <= 2 and len(second["token_ids"]) == 5
    assert second["finish_reason"] == "length"


def test_zoo_model_with_byte_prompts(run_cli):
    code, out, err = run_cli(["generate", "llama-tiny", "--prompt", "hi", "--load-format", "dummy", "--json",
                              "--max-tokens", "3", "--ignore-eos"])
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == 3


@pytest.mark.parametrize("args, message", [
    (["nosuchmodel", "--prompt", "x"], "unknown model 'nosuchmodel'"),
    (["llama-tiny", "--prompt", "x", "--devices", "cpu,gpu"], "unknown device 'gpu'"),
    (["llama-tiny", "--prompt", "x", "--devices", "cpu:speed=2"], "speed=2.0 must be in (0, 1]"),
    (["llama-tiny", "--prompt", "x", "--devices", "cpu:fast=1"], "cpu options are threads=, speed="),
    (["llama-tiny", "--prompt", "x", "--devices", "cpu,cuda:0"], "mix cpu and cuda"),
    (["llama-tiny", "--prompt-ids", "1", "--devices", "cpu,cpu", "--load-format", "dummy", "--placement",
      "diagonal"], "unknown placement 'diagonal'"),
    (["llama-tiny", "--prompt-ids", "1", "--devices", "cpu,cpu", "--load-format", "dummy", "--max-tokens",
      "5000"], "4096-token context"),
    (["llama-tiny", "--prompt", "x"], "no safetensors weights"),
    (["llama-tiny", "--prompt", "x", "--prompt-ids", "1"], "exactly one of --prompt"),
    (["llama-tiny", "--prompt-ids", "1,a"], "not a comma-separated list"),
    (["llama-tiny", "--prompt-ids", "1,999", "--load-format", "dummy"], "token ids must be 0..255"),
    (["llama-tiny", "--prompt", "x", "--load-format", "dummy", "--max-tokens", "5000"], "4096-token context"),
    (["llama-tiny", "--prompt", "x", "--load-format", "dummy", "--dtype", "fp8"], "unknown dtype 'fp8'"),
    (["llama-tiny", "--prompt", "x", "--load-format", "tensorizer"], "unknown load format"),
    (["llama-tiny", "--prompt", "x", "--load-format", "dummy", "--top-p", "2"], "top-p=2.0 must be in"),
    (["llama-tiny", "--prompt", "x", "--load-format", "dummy", "--max-num-seqs", "0"], "max-num-seqs=0"),
])
def test_mistakes_are_one_line(run_cli, args, message):
    code, out, err = run_cli(["generate", *args])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_bad_prompts_file(run_cli, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "a"}\n{"prompt": "b", "temp": 1}\n')
    code, _, err = run_cli(["generate", "llama-tiny", "--prompts-file", str(f), "--load-format", "dummy"])
    assert code == 2 and f"{f}:2: unknown field 'temp'" in err


def test_memory_refused_with_the_figures(run_cli, monkeypatch):
    monkeypatch.setattr("tessera.engine.engine.available_bytes", lambda: 10**6)
    code, _, err = run_cli(["generate", "llama-tiny", "--prompt", "x", "--load-format", "dummy"])
    assert code == 2 and "GB is available: weights" in err and len(err.strip().splitlines()) == 1
    need = MemoryNeed(weights_bytes=2 * 10**9, kv_bytes=10**9, state_bytes=0, activation_bytes=10**8)
    with pytest.raises(ValueError, match=r"needs 3.10 GB but 3.00 GB is available: weights 2.00 GB in "
                                         r"bf16, KV pages 1.00 GB"):
        check_memory("m", need, 3 * 10**9, "bf16")
    check_memory("m", need, 4 * 10**9, "bf16")  # fits: silent
