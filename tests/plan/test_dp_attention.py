"""Data-parallel attention groups for MoE models, worked by hand: weights per GPU under DP + EP, DP + MoE TP
and TP, the group's capacity, the all-to-all bytes of one MoE layer, each GPU's share of a kernel, and the
groups the homogeneous baseline tries."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.cost import CostModel
from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.hardware import LinkSpec
from tessera.plan.baselines.homogeneous import group_options
from tessera.plan.model.units import (
    UnitCost,
    allreduce_s,
    dispatch_bytes,
    dp_share,
    ep_share,
    gpu_weight_bytes,
    group_link,
    make_dp_unit,
    moe_comm_s,
    unit_name,
)
from tessera.plan.pool import resolve_gpu

E, TOPK, T, HID = 8, 2, 64, 1024


def moe_graph():
    """embed -> 2 × [attention GEMM (300 B of weights), decode attention over KV, router GEMM (20 B),
    fused MoE of 8 experts × 100 B] -> LM head; the embedding and the head 500 B each: 3,240 B of weights,
    of which 1,600 B are experts."""
    bufs: list[Buffer] = []

    def buf(name: str, nbytes: int, role: Role) -> int:
        bufs.append(Buffer(id=len(bufs), name=name, bytes=nbytes, role=role))
        return len(bufs) - 1

    ks: list[Kernel] = []

    def kern(name, kind, reads, writes, layer, module, dims, flops=1000):
        ks.append(Kernel(id=len(ks), name=name, kind=kind, flops=flops, bytes_read=1000, bytes_written=100,
                         reads=reads, writes=writes, layer=layer, module=module, dims=dims))

    x = buf("ids", 8, Role.INPUT)
    h = buf("h", 100, Role.ACTIVATION)
    kern("embed", KernelKind.EMBEDDING, (x, buf("emb", 500, Role.WEIGHT)), (h,), None, "model.embed_tokens",
         {"numel": T * HID})
    for li in range(2):
        p = f"model.layers.{li}"
        q = buf(f"q{li}", 100, Role.ACTIVATION)
        kern("mm", KernelKind.GEMM, (h, buf(f"wq{li}", 300, Role.WEIGHT)), (q,), li, f"{p}.self_attn.q_proj",
             {"m": T, "n": HID, "k": HID})
        o = buf(f"o{li}", 100, Role.ACTIVATION)
        kern("attn", KernelKind.ATTENTION_DECODE, (q, buf(f"kv{li}", 4000, Role.KV)), (o,), li, f"{p}.self_attn",
             {"batch": T, "heads": 8, "kv_heads": 2, "q_len": 1, "kv_len": 512, "head_dim": 128})
        r = buf(f"r{li}", 100, Role.ACTIVATION)
        kern("mm", KernelKind.GEMM, (o, buf(f"wr{li}", 20, Role.WEIGHT)), (r,), li, f"{p}.mlp.gate",
             {"m": T, "n": E, "k": HID})
        experts = tuple(buf(f"{p}.mlp.experts.{j}", 100, Role.WEIGHT) for j in range(E))
        h = buf(f"h{li}", 100, Role.ACTIVATION)
        kern("fused_moe", KernelKind.GEMM, (o, r, *experts), (h,), li, f"{p}.mlp.experts",
             {"tokens": T, "hidden": HID, "inter": 512, "topk": TOPK, "experts": E, "expert_bytes": 100})
    kern("mm", KernelKind.GEMM, (h, buf("head", 500, Role.WEIGHT)), (buf("logits", 100, Role.OUTPUT),), None,
         "lm_head", {"m": T, "n": 1000, "k": HID})
    return build_graph(model="moe-toy", phase="decode", shape={"batch": T, "context": 512}, kernels=ks,
                       buffers=bufs)


def test_weights_per_gpu_under_dp_ep_dp_tp_and_tp() -> None:
    g = moe_graph()
    # 4 GPUs. TP: 1/4 of all 3,240 B = 810. DP attention: the 1,640 B outside the experts (embedding 500,
    # head 500, 2 × (300 + 20)) on every GPU; EP: ⌈8/4⌉ = 2 experts of each layer, 2 × 2 × 100 = 400 →
    # 2,040; MoE TP: a quarter of each layer's 800 B of experts, 2 × 200 = 400 → 2,040. With 3 GPUs EP holds
    # ⌈8/3⌉ = 3 experts a layer (600 B: 2,240), MoE TP ⌈800/3⌉ = 267 B a layer (2,174).
    assert gpu_weight_bytes(g, 4, "tp") == 810
    assert gpu_weight_bytes(g, 4, "dp-ep") == 2040
    assert gpu_weight_bytes(g, 4, "dp-tp") == 2040
    assert gpu_weight_bytes(g, 3, "dp-ep") == 2240
    assert gpu_weight_bytes(g, 3, "dp-tp") == 2174
    # the group's device: 4 GPUs of 3,000 B hold 4 × (3,000 − 2,040) = 3,840 B of KV and activations; the
    # verifier counts every weight once (3,240), so the unit's capacity is 3,240 + 3,840 = 7,080
    gpu = replace(resolve_gpu("H200"), mem_bytes=3000)
    unit = make_dp_unit(gpu, 4, "dp-ep", g)
    assert unit.name == unit_name("H200", 4, "dp-ep") == "4xH200-dp-ep"
    assert unit.mem_bytes == 7080 and unit.usd_per_hour == pytest.approx(4 * gpu.usd_per_hour)
    # one GPU's share of the weights does not fit one GPU: no group
    assert make_dp_unit(replace(gpu, mem_bytes=2040), 4, "dp-ep", g) is None


def test_all_to_all_bytes_of_one_moe_layer() -> None:
    g = moe_graph()
    moe = next(k for k in g.kernels if "expert_bytes" in k.dims)
    # EP over 4 GPUs: 16 tokens per GPU; another GPU holds 2 of the 8 experts and misses both of a token's
    # 2 distinct picks with probability (6/8)·(5/7) = 15/28, so a token goes to 3 · 13/28 other GPUs:
    # 16 · 3 · 13/28 · 1024 · 2 B
    want = 16 * 3 * 13 / 28 * 1024 * 2
    assert dispatch_bytes(moe, 4) == pytest.approx(want)
    lk = LinkSpec(name="nv", bytes_per_s=100e9, latency_s=2e-6, efficiency=0.5)
    # dispatch + combine, each the bytes at 50 GB/s and one latency per peer
    assert moe_comm_s(moe, 4, "dp-ep", lk) == pytest.approx(2 * (want / 50e9 + 3 * 2e-6))
    # MoE TP: all-gather of 64 tokens × 1024 × 2 B before and reduce-scatter after, (3/4) of it each way
    assert moe_comm_s(moe, 4, "dp-tp", lk) == pytest.approx(2 * 0.75 * 64 * 1024 * 2 / 50e9 + 6 * 2e-6)
    assert moe_comm_s(moe, 4, "dp-tp", lk) == allreduce_s(64 * 1024 * 2, 4, lk)


def test_each_gpus_share_of_a_kernel() -> None:
    g = moe_graph()
    q, attn, moe = g.kernels[1], g.kernels[2], g.kernels[4]
    # a GEMM keeps its 1024 × 1024 weight and runs 16 of the 64 rows
    s = dp_share(q, 4)
    assert s.dims["m"] == 16 and s.flops == 250
    w, act = 1024 * 1024, 64 * 1024
    assert s.bytes_read == int(1000 * (w + act / 4) / (w + act))
    # attention keeps its heads and takes 16 of the 64 sequences
    a = dp_share(attn, 4)
    assert (a.dims["batch"], a.dims["heads"], a.flops, a.bytes_read) == (16, 8, 250, 250)
    # EP: 2 of the 8 experts, the 64 · 2 / 4 = 32 token-expert pairs routed to them as 16 tokens × top-2
    e = ep_share(moe, 4)
    assert (e.dims["experts"], e.dims["topk"], e.dims["tokens"], e.flops) == (2, 2, 16, 250)
    # 8 GPUs: one expert each, top-2 becomes top-1 over 64 · 2 / 8 = 16 pairs
    e8 = ep_share(moe, 8)
    assert (e8.dims["experts"], e8.dims["topk"], e8.dims["tokens"]) == (1, 1, 16)


def test_dp_unit_prices_each_gpus_share_and_the_collectives() -> None:
    g = moe_graph()
    cost = CostModel()
    gpu = resolve_gpu("H200")
    for layout in ("dp-ep", "dp-tp"):
        unit = make_dp_unit(gpu, 4, layout, g)
        uc = UnitCost.over(cost, ((gpu, 4, layout),))
        assert uc.tp_of(unit) == 4 and uc.layout_of(unit) == layout
        q, moe = g.kernels[1], g.kernels[4]
        assert uc.kernel_time_s(q, unit) == cost.kernel_time_s(dp_share(q, 4), gpu)
        share = ep_share(moe, 4) if layout == "dp-ep" else replace(
            moe, dims={**moe.dims, "inter": 128, "expert_bytes": 25}, flops=moe.flops // 4,
            bytes_read=moe.bytes_read // 4)
        assert uc.kernel_time_s(moe, unit) == pytest.approx(
            cost.kernel_time_s(share, gpu) + moe_comm_s(moe, 4, layout, group_link(gpu, 4)))


def test_group_options() -> None:
    tp = [(1, "tp"), (2, "tp"), (4, "tp"), (8, "tp")]
    assert group_options(8, 8, False) == tp
    assert group_options(8, 8, True) == tp + [(k, lay) for k in (2, 4, 8) for lay in ("dp-ep", "dp-tp")]
    assert group_options(6, 8, True) == [(1, "tp"), (2, "tp"), (2, "dp-ep"), (2, "dp-tp")]
    assert group_options(8, 4, False) == tp[:3]
