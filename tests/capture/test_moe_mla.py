"""The fused MoE kernel, expert replication and absorbed MLA: numbers worked out by hand, golden equalities."""

from __future__ import annotations

import json
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch

from tessera.capture import anymodel, capture_model
from tessera.capture.fuse import distinct_experts
from tessera.graph import KernelKind, Role
from tessera.plan.model.shapes import IterShape, iteration_graph
from tessera.plan.model.units import shard

CONFIGS = Path(__file__).parent / "configs"


def test_distinct_experts_by_hand() -> None:
    # one token picks k distinct experts: exactly k
    assert distinct_experts(128, 8, 1) == pytest.approx(8.0)
    # two tokens, E=128, k=8: 128·(1 − (15/16)²) = 128·31/256 = 15.5
    assert distinct_experts(128, 8, 2) == pytest.approx(15.5)
    # E=4, k=2, 4 tokens: 4·(1 − (1/2)⁴) = 3.75
    assert distinct_experts(4, 2, 4) == pytest.approx(3.75)
    # every expert picked by every token
    assert distinct_experts(8, 8, 3) == pytest.approx(8.0)


def _moe_tiny_decode4() -> Any:
    return capture_model("moe-tiny", "decode", batch=4, context=32)


def test_fused_moe_kernel_by_hand() -> None:
    # moe-tiny: Mixtral layout, hidden 64, inter 128, 4 experts, top-2, bf16; decode at batch 4 = 4 tokens.
    g = _moe_tiny_decode4()
    eager = capture_model("moe-tiny", "decode", batch=4, context=32, eager=True)
    moe = [k for k in g.kernels if k.name.startswith("fused_moe[")]
    assert len(moe) == 2 and KernelKind.MOE_ROUTING not in g.kinds()
    k = moe[0]
    assert k.kind is KernelKind.GEMM and k.module == "model.layers.0.mlp.experts"
    expert_bytes = 3 * 64 * 128 * 2  # gate, up, down: 64×128 each, bf16
    assert k.dims == {"tokens": 4, "hidden": 64, "inter": 128, "topk": 2, "experts": 4,
                      "expert_bytes": expert_bytes, "fused": k.dims["fused"]}
    # FLOPs: 4 tokens × 2 experts × (2·64·256 up + 2·128·64 down) = 393,216, the eager experts' sum
    assert k.flops == 4 * 2 * (2 * 64 * 256 + 2 * 128 * 64) == 393_216
    members = [eager.kernels[i] for i in g.meta["fused_from"][k.id]]
    assert k.flops == sum(m.flops for m in members)
    # bytes read: 3.75 experts' weights + hidden in (4×64 bf16) + 8 router weights (fp32)
    assert k.bytes_read == int(3.75 * expert_bytes) + 4 * 64 * 2 + 8 * 4
    assert k.bytes_written == 4 * 64 * 2  # the block's output
    # placement holds every expert: the kernel reads all 8 expert matrices (gate·up, down) of its layer
    weights = {b.id for b in g.buffers if b.role is Role.WEIGHT and b.name.startswith(k.module + ".")}
    assert len(weights) == 8 and weights <= set(k.reads)
    assert g.flops == eager.flops
    assert g.bytes_by_role()[Role.WEIGHT] == eager.bytes_by_role()[Role.WEIGHT]


def test_planner_rescales_the_fused_moe_kernel_by_distinct_experts() -> None:
    g = _moe_tiny_decode4()
    k = next(k for k in g.kernels if k.name.startswith("fused_moe["))
    act = k.bytes_read - int(3.75 * k.dims["expert_bytes"])
    # one decode token: exactly top-2 experts touched; 16 tokens: 4·(1 − 2⁻¹⁶) experts
    for tokens, experts in ((1, 2.0), (16, 4 * (1 - 0.5 ** 16))):
        it = iteration_graph(g, IterShape(decode=tokens, context=32, kv_tokens=tokens * 33))
        m = next(x for x in it.kernels if x.module == k.module and x.name == k.name)
        assert m.dims["tokens"] == tokens and m.flops == int(k.flops * tokens / 4)
        assert m.bytes_read == pytest.approx(experts * k.dims["expert_bytes"] + act * tokens / 4, abs=2)
    # TP=2: each GPU holds half of every expert's intermediate dimension
    half = shard(k, 2)
    assert half.dims["inter"] == 64 and half.flops == k.flops // 2 and half.bytes_read == k.bytes_read // 2


def test_replicated_experts_equal_traced_experts(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3 tokens × top-2 = 6 slots over 4 experts: experts 0-1 take 2 slots, 2-3 take 1 (two templates)
    copied = capture_model("moe-tiny", "decode", batch=3, context=8, eager=True)

    @contextmanager
    def off(rec: Any) -> Iterator[None]:
        yield

    monkeypatch.setattr(anymodel, "replicating_experts", off)
    traced = capture_model("moe-tiny", "decode", batch=3, context=8, eager=True)
    assert len(copied.kernels) == len(traced.kernels)
    for a, b in zip(copied.kernels, traced.kernels, strict=True):
        assert (a.name, a.kind, a.flops, a.bytes_read, a.bytes_written, a.module, a.dims) == \
            (b.name, b.kind, b.flops, b.bytes_read, b.bytes_written, b.module, b.dims)
    assert set(copied.edges) == set(traced.edges)  # same dependencies, kernel for kernel
    assert [b.bytes for b in copied.buffers] == [b.bytes for b in traced.buffers]


def _dsv3_tiny() -> dict[str, Any]:
    """DeepSeek-V3's config with its MLA shape kept (128 heads, nope 128, rope 64, v 128, kv_lora 512,
    q_lora 1536) and everything else small: 1 dense layer, no quantisation."""
    cfg = json.loads((CONFIGS / "deepseek-ai--DeepSeek-V3.json").read_text())
    cfg.pop("quantization_config", None)
    cfg.update(num_hidden_layers=1, first_k_dense_replace=1, hidden_size=256, intermediate_size=256,
               vocab_size=512, num_attention_heads=128, num_key_value_heads=128)
    return cfg


def test_mla_decode_flops_one_layer_by_hand(tmp_path: Path) -> None:
    cfg = _dsv3_tiny()
    path = tmp_path / "dsv3-tiny.json"
    path.write_text(json.dumps(cfg))
    b, ctx, h, hid = 2, 100, 128, 256
    nope, rope, v, r, qr = 128, 64, 128, 512, 1536
    g = capture_model(str(path), "decode", batch=b, context=ctx, eager=True)
    att = [k for k in g.kernels if "self_attn" in k.module]
    gemm = sum(k.flops for k in att if k.kind is KernelKind.GEMM)
    attn = [k for k in att if k.kind is KernelKind.ATTENTION_DECODE]
    s = ctx + 1  # the cache holds the new token too
    # projections of the one new token per sequence (no GEMM over the cache):
    proj = 2 * b * (hid * qr + qr * h * (nope + rope) + hid * (r + rope) + h * v * hid)
    absorb = 2 * b * h * nope * r + 2 * b * h * r * v  # q_nope·W_UK and latent·W_UVᵀ
    assert gemm == proj + absorb
    # attention over the latent: scores over r + rope dims, values over r, per head and cached token
    assert len(attn) == 1 and attn[0].flops == 2 * b * h * s * (r + rope) + 2 * b * h * s * r
    assert attn[0].dims == {"batch": b, "heads": h, "kv_heads": 1, "q_len": 1, "kv_len": s, "head_dim": r + rope,
                            "latent": r}
    assert not any(k.kind is KernelKind.GEMM and k.dims.get("m", 0) >= b * s for k in att)  # no re-expansion
    # the planner's rescaled decode attention at the same shape: same FLOPs; bytes by hand (bf16): the
    # queries b·h·(r + rope) plus ONE latent cache b·s·(r + rope), not separate keys and values
    it = iteration_graph(g, IterShape(decode=b, context=s, kv_tokens=b * s))
    dec = [k for k in it.kernels if k.kind is KernelKind.ATTENTION_DECODE]
    assert len(dec) == 1 and dec[0].flops == attn[0].flops
    assert dec[0].bytes_read == 2 * (b * h * (r + rope) + b * s * (r + rope))
    assert dec[0].bytes_written == 2 * b * h * r


def test_absorbed_mla_equals_expanded_attention() -> None:
    from transformers import AutoConfig

    cfg = _dsv3_tiny()
    cfg.update(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=48, qk_nope_head_dim=16,
               qk_rope_head_dim=8, v_head_dim=16)
    kw = {k: v for k, v in cfg.items() if not k.startswith("_") and k != "model_type"}
    conf = AutoConfig.for_model(cfg["model_type"], **kw)
    conf._attn_implementation = anymodel.attention_implementation(conf, "sdpa")
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(conf).float().eval()
    attn = model.model.layers[0].self_attn
    b, s = 2, 7
    q = torch.randn(b, 4, 1, 24)
    kv_nope, k_rot = torch.randn(b, 1, s, 32), torch.randn(b, 1, s, 8)
    mask = torch.ones(b, 1, 1, s, dtype=torch.bool)
    mask[0, ..., :2] = False
    attn.tessera_latent = False
    key, value = attn.expand_kv(kv_nope, k_rot)
    want, _ = anymodel._mla_sdpa(attn, q, key, value, mask, scaling=0.3)
    assert anymodel.absorb_mla(model) == 1
    got, _ = anymodel._mla_sdpa(attn, q, kv_nope, k_rot, mask, scaling=0.3)
    assert got.shape == want.shape == (b, 1, 4, 16)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert isinstance(attn.expand_kv, types.MethodType)


@pytest.mark.slow
def test_moe_run_under_the_planners_placement_is_identical(run_cli: Any) -> None:
    # the MILP places the fused view (one kernel per MoE layer); the runtime runs each fused kernel's
    # eager operators in order on its worker, so tokens and logits equal one process's
    code, out, err = run_cli(["run", "moe-tiny", "--devices", "cpu,cpu", "--placement", "plan", "--verify",
                              "--new-tokens", "2", "--json"])
    assert code == 0, err
    got = json.loads(out)
    assert got["verified"] and got["tokens_identical"] and got["max_abs_diff"] == 0.0
