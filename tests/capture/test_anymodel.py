"""Any architecture from its published config.json (tests/capture/configs, see NOTICE there).

Real configs are shrunk to 2 layers for the structural tests (hidden sizes, heads, experts and quantisation
as published); weight bytes are checked on whole configs against a parameter count made independently on
the meta device.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tessera.capture import capture_model, capture_program, replay, resolve
from tessera.capture.ops import dequantise
from tessera.graph import KernelKind, Role
from tests.conftest import RunCli

CONFIGS = Path(__file__).parent / "configs"
# The ten of issue 17 (MiMo needs its own remote code), then five more architectures.
ISSUE = ["meta-llama--Meta-Llama-3.1-8B", "Qwen--Qwen3-8B", "mistralai--Mixtral-8x22B-v0.1", "Qwen--Qwen3-30B-A3B",
         "google--gemma-4-26B-A4B", "deepseek-ai--DeepSeek-V3", "nvidia--Nemotron-H-56B-Base-8K",
         "Qwen--Qwen3-VL-8B-Instruct", "meta-llama--Llama-4-Scout-17B-16E-Instruct"]
FURTHER = ["Qwen--Qwen3-32B-FP8", "openai--gpt-oss-20b", "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
           "Qwen--Qwen3.5-35B-A3B", "Qwen--Qwen3-VL-30B-A3B-Instruct", "zai-org--GLM-5", "MiniMaxAI--MiniMax-M2.5",
           "deepseek-ai--DeepSeek-V3.2", "Qwen--Qwen3.5-27B"]
FAMILY = {"meta-llama--Meta-Llama-3.1-8B": "llm", "Qwen--Qwen3-8B": "llm", "mistralai--Mixtral-8x22B-v0.1": "moe",
          "Qwen--Qwen3-30B-A3B": "moe", "google--gemma-4-26B-A4B": "moe", "deepseek-ai--DeepSeek-V3": "moe",
          "nvidia--Nemotron-H-56B-Base-8K": "llm", "Qwen--Qwen3-VL-8B-Instruct": "llm",
          "meta-llama--Llama-4-Scout-17B-16E-Instruct": "moe", "Qwen--Qwen3-32B-FP8": "llm",
          "openai--gpt-oss-20b": "moe", "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "moe",
          "Qwen--Qwen3.5-35B-A3B": "moe", "Qwen--Qwen3-VL-30B-A3B-Instruct": "moe", "zai-org--GLM-5": "moe",
          "MiniMaxAI--MiniMax-M2.5": "moe", "deepseek-ai--DeepSeek-V3.2": "moe", "Qwen--Qwen3.5-27B": "llm"}


def _config(name: str) -> dict[str, Any]:
    return json.loads((CONFIGS / f"{name}.json").read_text())


def _shrink(cfg: dict[str, Any], layers: int = 2) -> dict[str, Any]:
    """The config with its first few decoder layers (at least ``layers``, and enough that every kind of
    layer in a per-layer list or pattern string appears): those lists cut to match."""
    out = dict(cfg)
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = _shrink(out["text_config"], layers)
    n = out.get("num_hidden_layers")
    if not n:
        return out
    per_layer = {k: v for k, v in cfg.items() if isinstance(v, list | str) and len(v) == n
                 and k not in ("model_type", "architectures")}
    layers = max(layers, (cfg.get("first_k_dense_replace") or 0) + 1)  # DeepSeek: dense layers come first
    for v in per_layer.values():
        kinds = {str(x) for x in v}
        layers = max(layers, next(i for i in range(1, n + 1) if {str(x) for x in v[:i]} == kinds))
    for k, v in per_layer.items():
        out[k] = v[:layers]
    out["num_hidden_layers"] = layers
    return out


def _write(tmp_path: Path, name: str, cfg: dict[str, Any]) -> str:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_configs_resolve_to_their_family_without_a_whitelist() -> None:
    for name in ISSUE + FURTHER:
        assert resolve(str(CONFIGS / f"{name}.json")).family == FAMILY[name], name


def test_remote_code_architecture_is_one_clear_line(run_cli: RunCli) -> None:
    code, _, err = run_cli(["trace", str(CONFIGS / "XiaomiMiMo--MiMo-7B-Base.json"), "--phase", "decode"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "no model_type 'mimo'" in err and "MiMoForCausalLM" in err


@pytest.mark.parametrize(("name", "needle"), [
    ("stepfun-ai--Step-3.7-Flash", "sliding_window"),  # transformers' own cache refuses its config
    ("moonshotai--Kimi-K2.5", "DataDependentOutputException"),  # its weight init reads a tensor's value
])
def test_configs_transformers_cannot_run_are_one_line(name: str, needle: str, tmp_path: Path,
                                                      run_cli: RunCli) -> None:
    code, _, err = run_cli(["trace", _write(tmp_path, name, _shrink(_config(name))), "--phase", "decode"])
    assert code == 2 and needle in err and "(transformers) cannot" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_model_directory_works_like_its_config(tmp_path: Path, run_cli: RunCli) -> None:
    model_dir = tmp_path / "Qwen3-8B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(_shrink(_config("Qwen--Qwen3-8B"))))
    code, out, _ = run_cli(["trace", str(model_dir), "--phase", "decode", "--batch", "2", "--json"])
    assert code == 0 and json.loads(out)["model"] == "Qwen3-8B" and json.loads(out)["layers"] == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli(["trace", str(empty), "--phase", "decode"])
    assert code == 2 and "holds no config.json" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("name", ISSUE + FURTHER)
def test_shrunk_real_config_traces_with_right_kinds(name: str, tmp_path: Path) -> None:
    cfg = _shrink(_config(name))
    path = _write(tmp_path, name, cfg)
    g = capture_model(path, "decode", batch=2, context=64, eager=True)
    g.check_invariants()
    kinds = g.kinds()
    assert kinds.get(KernelKind.GEMM, 0) > 0
    expert_kinds = {k.kind for k in g.kernels if ".experts" in k.module}
    assert KernelKind.EMBEDDING not in expert_kinds  # routing is its own kind
    if FAMILY[name] == "moe":
        assert kinds[KernelKind.MOE_ROUTING] % 2 == 0 and kinds[KernelKind.MOE_ROUTING] > 0
        # the fused view: one fused MoE kernel per experts module, no routing kernel left
        fused = capture_model(path, "decode", batch=2, context=64)
        moe = [k.module for k in fused.kernels if k.name.startswith("fused_moe[")]
        assert len(moe) == len(set(moe)) == len({k.module for k in g.kernels if k.kind is KernelKind.MOE_ROUTING})
        assert KernelKind.MOE_ROUTING not in fused.kinds()
    text = cfg.get("text_config", cfg)
    if "hybrid_override_pattern" in text:  # Nemotron-H: Mamba layers keep conv + SSM state, no KV
        assert g.bytes_by_role()[Role.STATE] > 0 and KernelKind.CONV in kinds
    else:
        assert kinds.get(KernelKind.ATTENTION_DECODE, 0) + kinds.get(KernelKind.GEMM, 0) > 0
        assert g.bytes_by_role()[Role.KV] > 0


def test_deepseek_mla_caches_the_latent_and_attends_in_one_kernel(tmp_path: Path) -> None:
    # DeepSeek-V3 config.json: 128 heads, qk_nope 128 + qk_rope 64 = 192 key dims, v_head_dim 128,
    # kv_lora_rank 512: the cache holds the 512-dim latent and the 64-dim rope key per token (one "head")
    cfg = _shrink(_config("deepseek-ai--DeepSeek-V3"))
    layers = cfg["num_hidden_layers"]  # 3 dense layers, then one MoE layer
    g = capture_model(_write(tmp_path, "dsv3", cfg), "decode", batch=2, context=64)
    att = [k for k in g.kernels if k.kind is KernelKind.ATTENTION_DECODE]
    # decode attends over the latent (absorbed): 128 query heads, one 512 + 64 = 576-dim KV "head"
    assert layers == 4 and len(att) == layers and all(k.name == "tessera.mla_attention.default" for k in att)
    assert all(k.dims["heads"] == 128 and k.dims["kv_heads"] == 1 and k.dims["head_dim"] == 576 for k in att)
    assert all(k.dims["kv_len"] == 65 for k in att)  # 64 cached + the new token
    kv = sorted(b.shape for b in g.buffers if b.role is Role.KV)
    assert kv == [(2, 1, 65, 64)] * layers + [(2, 1, 65, 512)] * layers
    # two absorption bmms a layer (q_nope·W_UK, latent·W_UVᵀ); no kv_b_proj GEMM over the cache
    bmm = [k for k in g.kernels if k.name == "aten.bmm.default" and "self_attn" in k.module]
    assert len(bmm) == 2 * layers and all(k.dims["batch"] == 128 for k in bmm)


def test_moe_routing_is_its_own_kind_one_dispatch_and_combine_per_expert() -> None:
    g = capture_model("moe-tiny", "prefill", batch=2, seq=8, eager=True)  # 32 token-slots over 4 experts, 2 layers
    routing = [k for k in g.kernels if k.kind is KernelKind.MOE_ROUTING]
    assert len(routing) == 2 * 4 * 2 and all(k.indirect for k in routing)
    assert {k.name for k in routing} == {"tessera.moe_dispatch.default", "tessera.moe_combine_.default"}
    # combine touches the expert's 8 rows (bf16, hidden 64), their 8 token ids (int64) and 8 router weights
    # (fp32: Mixtral's router takes the softmax in float32), not the whole [16, 64] output
    combine = next(k for k in routing if "combine" in k.name)
    assert combine.bytes_written == 8 * 64 * 2 + 8 * 8 + 8 * 4


def test_moe_routing_ops_replay_bit_exact_in_real_mode() -> None:
    cap = capture_program("moe-tiny", "prefill", batch=2, seq=8)
    assert any(k.kind is KernelKind.MOE_ROUTING for k in cap.graph.kernels)
    assert all(torch.equal(a, b) for a, b in zip(replay(cap), cap.expected, strict=True))


def _meta_model(cfg: dict[str, Any]) -> nn.Module:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    kw = {k: v for k, v in cfg.items() if k not in ("model_type", "quantization_config")}
    conf = AutoConfig.for_model(cfg["model_type"], **kw)
    auto = AutoModelForImageTextToText if "vision_config" in cfg else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(conf)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "phase", "kw"), [
    ("meta-llama--Meta-Llama-3.1-8B", "decode", {"batch": 2, "context": 64}),
    ("Qwen--Qwen3-VL-8B-Instruct", "decode", {"batch": 2, "context": 64}),
    ("Qwen--Qwen3-32B-FP8", "decode", {"batch": 2, "context": 64}),
    ("openai--gpt-oss-20b", "prefill", {"batch": 1, "seq": 8}),  # 8 tokens · top-4 = 32 slots: every expert
])
def test_weight_bytes_are_parameters_times_stored_bytes(name: str, phase: str, kw: dict[str, int]) -> None:
    cfg = _config(name)
    model = _meta_model(cfg)
    if "vision_config" in cfg:  # a text step touches the language model and lm_head, not the vision tower
        model = nn.ModuleDict({"lm": model.model.language_model, "head": model.lm_head})
    qm = (cfg.get("quantization_config") or {}).get("quant_method")
    expected = 0.0
    for path, p in model.named_parameters():
        if qm == "fp8" and p.dim() > 1 and not any(x in path for x in ("lm_head", "embed", "norm", "mlp.gate.")):
            expected += p.numel() * (1 + 4 / (128 * 128))  # float8 + an fp32 scale per 128×128 block
        elif qm == "mxfp4" and ".experts." in path and p.dim() == 3:
            expected += p.numel() * (0.5 + 1 / 32)  # E2M1 nibbles + a uint8 scale per 32
        else:
            expected += p.numel() * 2  # bf16
    g = capture_model(str(CONFIGS / f"{name}.json"), phase, **kw)
    assert abs(g.bytes_by_role()[Role.WEIGHT] - expected) / expected < 0.01


@pytest.mark.slow
def test_fp8_checkpoint_is_half_the_bf16_weights_and_its_gemms_are_fp8(tmp_path: Path) -> None:
    fp8 = capture_model(str(CONFIGS / "Qwen--Qwen3-32B-FP8.json"), "decode", batch=2, context=64)
    # Qwen3-32B-FP8 config.json: 64 layers, hidden 5120, 64 q heads and 8 kv heads of 128, ffn 25600, vocab
    # 151936. Linear weights in fp8 (1 byte + fp32 scale per 128×128), embedding and lm_head in bf16.
    per_layer = 5120 * 8192 + 2 * 5120 * 1024 + 8192 * 5120 + 3 * 5120 * 25600
    expected = 64 * per_layer * (1 + 4 / 128 ** 2) + 2 * 151936 * 5120 * 2  # ≈ 34.3 GB, bf16 would be 65.5
    weight = fp8.bytes_by_role()[Role.WEIGHT]
    assert abs(weight - expected) / expected < 0.001
    gemms = [k for k in fp8.kernels if k.kind is KernelKind.GEMM]
    assert {k.dtype for k in gemms if k.layer is not None} == {"float8_e4m3fn"}
    assert [k.dtype for k in gemms if k.layer is None] == ["bfloat16"]  # lm_head stays bf16


def test_unmodelled_quantisation_is_one_line(tmp_path: Path, run_cli: RunCli) -> None:
    cfg = dict(_shrink(_config("Qwen--Qwen3-8B")), quantization_config={"quant_method": "bitnet"})
    code, _, err = run_cli(["trace", _write(tmp_path, "q", cfg), "--phase", "decode"])
    assert code == 2 and "quant_method 'bitnet'" in err and "valid:" in err and len(err.strip().splitlines()) == 1


def test_dequantise_by_hand() -> None:
    # fp8: 2.0 stored, block scale 0.5 -> 1.0
    w = torch.full((2, 4), 2.0).to(torch.float8_e4m3fn)
    assert torch.equal(dequantise(w, torch.tensor([[0.5]]), "fp8", 4), torch.ones(2, 4))
    # int4: byte 0x9A = low code 10, high code 9 -> (10-8, 9-8) · scale 3
    assert dequantise(torch.tensor([[0x9A]], dtype=torch.uint8), torch.tensor([[3.0]]), "int4", 2).tolist() == [[6.0, 3.0]]
    # mxfp4: codes 3 (1.5) and 9 (-0.5), E8M0 scale 128 -> ·2
    got = dequantise(torch.tensor([[0x93]], dtype=torch.uint8), torch.tensor([[128]], dtype=torch.uint8), "mxfp4", 2)
    assert got.tolist() == [[3.0, -1.0]]
    assert math.isclose(float(got.sum()), 2.0)


def test_copied_configs_carry_their_notice() -> None:
    notice = (CONFIGS / "NOTICE").read_text()
    assert "aiconfigurator-core" in notice and "Apache-2.0" in notice
    for name in ISSUE + FURTHER:
        assert (CONFIGS / f"{name}.json").is_file()
