"""kernel_graph(): the program as a KernelGraph at an iteration shape, under fake tensors. Figures worked
out by hand from the zoo configs (llama-tiny: vocab 256, hidden 64, 2 layers, 4 heads of 16, 2 KV heads,
MLP 128; moe-tiny: 4 experts of MLP 128, top-2; mamba2-tiny: 8 heads of 16, state 16, 1 group, conv 4)."""

from __future__ import annotations

import torch

from tessera.capture.zoo import SPECS
from tessera.engine import EngineConfig, IterationShape, load_engine
from tessera.engine.arch import arch_of
from tessera.engine.kernels import kernel_graph, pairs
from tessera.graph import KernelGraph, KernelKind, Role

MIXED = IterationShape(decode=2, context=5, chunks=1, chunk_len=3, prefix=4)  # 5 tokens, 3 sequences


def graph(name: str, shape: IterationShape = MIXED) -> KernelGraph:
    return kernel_graph(arch_of(dict(SPECS[name].config), name), shape, model=name)


def by_name(g: KernelGraph, name: str):
    return next(k for k in g.kernels if k.name == name)


def test_one_kernel_per_program_node():
    g = graph("llama-tiny")
    engine = load_engine("llama-tiny", EngineConfig(max_num_seqs=2, max_model_len=32), dtype="fp32",
                         load_format="dummy")
    assert [k.name for k in g.kernels] == list(engine.program.node_names) == g.meta["nodes"]
    g.check_invariants()
    assert KernelGraph.from_json(g.to_json()) == g
    # 2 layers x (2 norms, q/k/v/o, 2 rotary, attention, 2 adds, gate/up/act/down) + embed, gather, norm, head
    assert len(g.kernels) == 2 * 15 + 4
    for k in g.kernels:
        inside = k.module.startswith("model.layers.") or k.name.startswith("add")
        assert (k.layer is not None) == inside, k.name


def test_gemm_attention_and_bytes_by_hand():
    g = graph("llama-tiny")
    q = by_name(g, "model_layers_0_self_attn_q_proj")
    assert q.kind is KernelKind.GEMM and q.flops == 2 * 5 * 64 * 64
    assert (q.dims["m"], q.dims["k"], q.dims["n"]) == (5, 64, 64)
    assert "model.layers.0.self_attn.q_proj.weight" in {g.buffers[b].name for b in q.reads}
    attn = by_name(g, "model_layers_0_self_attn_attn")
    # pairs: 2 decodes at position 5 see 6 keys each; the chunk's 3 queries after 4 tokens see 5, 6, 7
    assert attn.kind is KernelKind.ATTENTION and attn.flops == 4 * 4 * 16 * (2 * 6 + 5 + 6 + 7)
    # bf16: q [5, 64], new K and V [5, 32] each, cached K and V of 5 + 5 + 4 earlier tokens [., 32] each
    assert attn.bytes_read == 2 * (5 * 64 + 2 * 5 * 32 + 2 * 14 * 32)
    assert attn.bytes_written == 2 * (5 * 64 + 2 * 5 * 32)
    assert {g.buffers[b].role for b in attn.writes} >= {Role.KV, Role.ACTIVATION}
    head = g.kernels[-1]
    assert head.name == "lm_head" and g.buffers[head.writes[0]].role is Role.OUTPUT
    assert head.flops == 2 * 3 * 64 * 256  # one row per sequence


def test_resident_bytes_by_hand():
    roles = graph("llama-tiny").bytes_by_role()
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 128 + 2 * 64  # q, o, k, v, MLP, 2 norms
    params = 256 * 64 * 2 + 2 * per_layer + 64  # embedding, head, layers, final norm
    assert roles[Role.WEIGHT] == 2 * params + 2 * 8 * 4  # bf16, + each layer's fp32 rotary table of 8
    # each of the 3 sequences fits one 16-token page: K and V, 2 layers, 2 KV heads of 16, bf16
    assert roles[Role.KV] == 3 * 16 * 2 * 16 * 2 * 2 * 2


def test_decode_only_is_decode_attention():
    g = graph("llama-tiny", IterationShape(decode=4, context=9))
    attn = by_name(g, "model_layers_1_self_attn_attn")
    assert attn.kind is KernelKind.ATTENTION_DECODE and attn.flops == 4 * 4 * 16 * 4 * 10
    assert attn.dims == {"batch": 4, "heads": 4, "kv_heads": 2, "q_len": 1, "kv_len": 10, "head_dim": 16}
    assert g.phase == "decode"


def test_window_pairs_by_hand():
    assert pairs(4, 3, 5) == 5 + 5 + 5  # positions 4, 5, 6 each see the 5 keys of the window
    assert pairs(0, 4, 2) == 1 + 2 + 2 + 2
    assert pairs(3, 2, 0) == 4 + 5


def test_moe_kernel_by_hand():
    g = graph("moe-tiny", IterationShape(decode=4, context=8))
    moe = by_name(g, "model_layers_0_block_sparse_moe_experts")
    assert moe.kind is KernelKind.GEMM and moe.flops == 2 * 3 * 4 * 2 * 64 * 128
    expert = 3 * 128 * 64 * 2
    assert moe.dims == {"tokens": 4, "hidden": 64, "inter": 128, "topk": 2, "experts": 4,
                        "expert_bytes": expert}
    # expected distinct experts of 4 tokens choosing 2 of 4: 4 (1 - (1/2)^4) = 3.75; + hidden and logits in
    assert moe.bytes_read == int(3.75 * expert) + 4 * (64 + 4) * 2
    weights = {g.buffers[b].name for b in moe.reads if g.buffers[b].role is Role.WEIGHT}
    assert len(weights) == 4 * 3  # every expert's weights: placement keeps them on the block's device


def test_mamba_kernels_by_hand():
    g = graph("mamba2-tiny", IterationShape(decode=3, context=7, chunks=1, chunk_len=5))
    scan = by_name(g, "mamba_scan_default")
    conv = by_name(g, "backbone_layers_0_mixer_conv1d")
    assert scan.kind is KernelKind.SCAN and scan.flops == 6 * 8 * 8 * 16 * 16
    assert conv.kind is KernelKind.CONV and conv.flops == 8 * 2 * (128 + 2 * 16) * 4
    state = {g.buffers[b].name for b in scan.writes if g.buffers[b].role is Role.STATE}
    assert state == {"backbone.layers.0.mixer.ssm_state"}
    # 4 sequences' slots: SSM state fp32 [4, 8, 16, 16], conv history bf16 [4, 160, 3], 2 layers
    assert g.bytes_by_role()[Role.STATE] == 2 * (4 * 8 * 16 * 16 * 4 + 4 * 160 * 3 * 2)


def test_fp32_graph_counts_fp32_bytes():
    g = kernel_graph(arch_of(dict(SPECS["llama-tiny"].config), "llama-tiny"), MIXED, dtype=torch.float32)
    q = by_name(g, "model_layers_0_self_attn_q_proj")
    assert q.dtype == "float32" and q.bytes_read == 4 * (5 * 64 + 64 * 64)
