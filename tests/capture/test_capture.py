"""Capture: analytic FLOPs/bytes, graph invariants per family, determinism, golden replay."""

from __future__ import annotations

import pytest
import torch

from tessera.capture import capture_model, capture_program, model_names, model_phases, replay
from tessera.graph import KernelKind, Role

TINY = ["llama-tiny", "qwen-tiny", "moe-tiny", "mamba2-tiny", "dit-tiny"]


@pytest.mark.slow
def test_llama3_8b_decode_matches_analytic_count() -> None:
    # meta-llama/Meta-Llama-3-8B config.json: hidden 4096, ffn 14336, 32 layers, 32 heads, 8 kv heads (dim 128)
    h, ffn, layers, heads, kv_heads, d, vocab = 4096, 14336, 32, 32, 8, 128, 128256
    batch, context = 32, 2048
    per_layer = h * h + 2 * h * kv_heads * d + h * h + 3 * h * ffn  # q, k+v, o, gate+up+down
    matmul_params = layers * per_layer + h * vocab  # + lm_head; the embedding is a lookup
    attention = layers * 4 * batch * heads * (context + 1) * d  # QKᵀ and PV over the cache (+ the new token)
    analytic = 2 * batch * matmul_params + attention
    params = matmul_params + vocab * h + layers * 2 * h + h  # + embedding, 2 norms per layer, final norm
    g = capture_model("llama-3-8b", "decode", batch=batch, context=context)
    assert abs(g.flops - analytic) / analytic < 0.03
    weight = g.bytes_by_role()[Role.WEIGHT]
    assert abs(weight - 2 * params) / (2 * params) < 0.01
    assert g.layers == 32
    assert sum(k.kind is KernelKind.ATTENTION_DECODE for k in g.kernels) == 32


@pytest.mark.parametrize("name", TINY)
def test_invariants_every_family(name: str) -> None:
    for phase in model_phases(name):
        g = capture_model(name, phase, batch=2, seq=16, context=32)
        g.check_invariants()  # acyclic; every read written earlier or input/weight/kv/state
        assert g.layers == 2 and all(k.layer in (None, 0, 1) for k in g.kernels)
        assert any(b.role is Role.OUTPUT for b in g.buffers)
        if phase == "decode":
            resident = {b.id for b in g.buffers if b.role in (Role.KV, Role.STATE) and b.bytes > 64}
            written = {b for k in g.kernels for b in k.writes}
            read_after = {b for k in g.kernels for b in k.reads if b in written}
            assert resident and resident <= written and resident <= read_after | written


def test_decode_writes_kv_then_reads_it() -> None:
    g = capture_model("llama-tiny", "decode", batch=1, context=8)
    kv = {b.id for b in g.buffers if b.role is Role.KV}
    for b in kv:
        touching = list(g.iter_touching(b))
        first_write = min(k.id for k in touching if b in k.writes)
        assert any(k.id > first_write and b in k.reads and k.kind is KernelKind.ATTENTION_DECODE for k in touching)
    assert len(kv) == 4  # 2 layers × (K, V)


def test_same_kernel_sequence_at_two_batch_sizes() -> None:
    # batch 1 is excluded by design: size-1 dims make some reshapes views that are copies at batch > 1
    for name, phase in (("llama-tiny", "decode"), ("moe-tiny", "decode"), ("dit-tiny", "denoise")):
        a = capture_model(name, phase, batch=2, seq=16, context=16)
        b = capture_model(name, phase, batch=4, seq=16, context=16)
        assert [(k.name, k.module, k.layer) for k in a.kernels] == [(k.name, k.module, k.layer) for k in b.kernels]


def test_moe_experts_are_separate_weights_with_active_flops() -> None:
    g = capture_model("moe-tiny", "prefill", batch=2, seq=8)
    # moe-tiny: 4 experts of (2·128×64 gate/up + 64×128 down) per layer, 2 layers: every expert touched
    experts = [b for b in g.buffers if ".experts." in b.name and b.role is Role.WEIGHT]
    assert len(experts) == 2 * 2 * 4
    expert_flops = sum(k.flops for k in g.kernels if ".experts" in k.module and k.kind is KernelKind.GEMM)
    assert expert_flops == 2 * 2 * (16 * 2) * (3 * 64 * 128)  # layers · 2 · token-slots (16 tokens · top-2) · params


@pytest.mark.parametrize(("name", "phase", "kw"), [
    ("llama-tiny", "prefill", {"seq": 8}), ("llama-tiny", "decode", {"context": 12}),
    ("mamba2-tiny", "prefill", {"seq": 12}), ("mamba2-tiny", "decode", {"context": 12}),
    ("dit-tiny", "denoise", {"seq": 16, "context": 8}),
])
def test_replay_is_bit_exact_and_matches_fake_structure(name: str, phase: str, kw: dict[str, int]) -> None:
    cap = capture_program(name, phase, batch=2, **kw)
    out = replay(cap)
    assert len(out) == len(cap.expected) == 1
    assert all(torch.equal(a, b) for a, b in zip(out, cap.expected, strict=True))
    fake = capture_model(name, phase, batch=2, dtype=torch.float32, eager=True, **kw)  # bf16 adds fp32 casts
    assert [k.name for k in fake.kernels] == [k.name for k in cap.graph.kernels]
    assert [k.module for k in fake.kernels] == [k.module for k in cap.graph.kernels]
    fused = capture_model(name, phase, batch=2, dtype=torch.float32, **kw)  # the default: the fused view
    assert cap.fused is not None
    assert [(k.name, k.module) for k in fused.kernels] == [(k.name, k.module) for k in cap.fused.kernels]
    assert fused.meta["fused_from"] == cap.fused.meta["fused_from"]


def test_zoo_lists_families() -> None:
    names = model_names()
    for n in ("llama-3-8b", "llama-3-70b", "qwen2.5-7b", "mixtral-8x7b", "mamba2-2.7b", "qwen2.5-vl-7b", "flux-dev",
              "qwen-vl-tiny", *TINY):
        assert n in names
    assert model_phases("flux-dev") == ["denoise"]
    assert model_phases("mamba2-2.7b") == ["prefill", "decode"]
