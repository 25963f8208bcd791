"""The production-fused view: hand-built graphs with hand-worked bytes, and invariants on every tiny family."""

from __future__ import annotations

import json

import pytest

from tessera.capture import capture_model, model_phases
from tessera.capture.core import fused_view, record
from tessera.capture.fuse import fuse, groups_of, unfuse
from tessera.capture.recorder import BufferAccess
from tessera.graph import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph
from tests.conftest import RunCli

G, E, N = KernelKind.GEMM, KernelKind.ELEMENTWISE, KernelKind.NORM


def _graph(bufs: list[tuple[int, Role]], kernels: list[tuple[KernelKind, dict[int, int], dict[int, int]]]
           ) -> tuple[KernelGraph, list[BufferAccess]]:
    """Buffers (bytes, role); kernels (kind, bytes read per buffer, bytes written per buffer)."""
    ks = [Kernel(id=i, name=f"aten.k{i}.default", kind=kind, flops=100 * (kind is G), bytes_read=sum(r.values()),
                 bytes_written=sum(w.values()), reads=tuple(r), writes=tuple(w), layer=0, dims={"numel": i + 1})
          for i, (kind, r, w) in enumerate(kernels)]
    buffers = [Buffer(id=i, name=f"b{i}", bytes=n, role=role) for i, (n, role) in enumerate(bufs)]
    g = build_graph(model="hand", phase="decode", shape={}, kernels=ks, buffers=buffers)
    return g, [BufferAccess(reads=dict(r), writes=dict(w)) for _, r, w in kernels]


A, W, IN = Role.ACTIVATION, Role.WEIGHT, Role.INPUT


def test_residual_add_and_norm_fuse_to_their_external_bytes() -> None:
    # b0 x (input), b1 w1, b2 h = x@w1, b3 r = h + x, b4 n = r * w2 (norm), b5 w2, b6 y = n@w3, b7 w3
    g, acc = _graph(
        [(64, IN), (256, W), (64, A), (64, A), (64, A), (16, W), (64, A), (256, W)],
        [(G, {0: 64, 1: 256}, {2: 64}),
         (E, {2: 64, 0: 64}, {3: 64}),  # r = h + x
         (N, {3: 64, 5: 16}, {4: 64}),  # n = norm(r) * w2
         (E, {3: 64, 4: 64}, {4: 64}),  # n += r (in place): r read a second time, n written again
         (G, {4: 64, 7: 256}, {6: 64})])
    f = fuse(g, acc)
    assert f.meta["fused_from"] == [[0], [1, 2, 3], [4]]
    k = f.kernels[1]
    # external reads: h, x, w2 once each (r is made inside); r is dead after the chain, n is read by the GEMM
    assert k.reads == (2, 0, 5) and k.writes == (4,)
    assert (k.bytes_read, k.bytes_written) == (64 + 64 + 16, 64)  # n written twice inside: 64, not 128
    assert k.kind is E and k.flops == 0 and k.dims == {"numel": 4, "fused": 3}
    assert k.name == "fused[k1,k2,k3]"
    assert f.kernels[0] == g.kernels[0] and f.kernels[2].reads == (4, 7)  # anchors unchanged, renumbered
    assert f.flops == g.flops and f.bytes_by_role()[W] == g.bytes_by_role()[W]
    assert unfuse(f, (0, 1, 0)) == (0, 1, 1, 1, 0)


def test_silu_joins_the_multiply_after_the_up_projection() -> None:
    # x(0) -> gate(1)=b2, silu -> b3, up(4)=b5, mul(b3,b5) -> b6, down -> b8
    g, acc = _graph(
        [(8, IN), (32, W), (16, A), (16, A), (32, W), (16, A), (16, A), (32, W), (8, A)],
        [(G, {0: 8, 1: 32}, {2: 16}), (E, {2: 16}, {3: 16}), (G, {0: 8, 4: 32}, {5: 16}),
         (E, {3: 16, 5: 16}, {6: 16}), (G, {6: 16, 7: 32}, {8: 8})])
    f = fuse(g, acc)
    assert f.meta["fused_from"] == [[0], [2], [1, 3], [4]]  # silu runs after the up GEMM, with the mul
    assert (f.kernels[2].reads, f.kernels[2].writes) == ((2, 5), (6,))
    assert (f.kernels[2].bytes_read, f.kernels[2].bytes_written) == (32, 16)
    f.check_invariants()


def test_a_chain_never_moves_past_a_kernel_it_conflicts_with() -> None:
    # as above, but the middle GEMM reads the SiLU's output: pulling SiLU after it would break RAW
    g, acc = _graph(
        [(8, IN), (32, W), (16, A), (16, A), (32, W), (16, A), (16, A)],
        [(G, {0: 8, 1: 32}, {2: 16}), (E, {2: 16}, {3: 16}), (G, {3: 16, 4: 32}, {5: 16}),
         (E, {3: 16, 5: 16}, {6: 16})])
    assert groups_of(g) == [[0], [1], [2], [3]]
    # and a write-after-read: the middle GEMM overwrites what SiLU reads
    g, acc = _graph(
        [(8, IN), (32, W), (16, A), (16, A), (32, W), (16, A)],
        [(G, {0: 8, 1: 32}, {2: 16}), (E, {2: 16}, {3: 16}), (G, {0: 8, 4: 32}, {2: 16}),
         (E, {3: 16, 2: 16}, {5: 16})])
    assert groups_of(g) == [[0], [1], [2], [3]]


def _reachable(g: KernelGraph) -> list[int]:
    """Bitset of kernels reachable from each kernel (edges only go forward)."""
    reach = [0] * len(g.kernels)
    for k in reversed(range(len(g.kernels))):
        for s in g.successors[k]:
            reach[k] |= reach[s] | (1 << s)
    return reach


def _check_fused(eager: KernelGraph, fused: KernelGraph) -> None:
    fused.check_invariants()
    groups = fused.meta["fused_from"]
    assert sorted(i for gr in groups for i in gr) == list(range(len(eager.kernels)))
    where = {i: j for j, gr in enumerate(groups) for i in gr}
    reach = _reachable(fused)
    for e in eager.edges:  # every dependency between groups is still a path of the fused graph
        a, b = where[e.src], where[e.dst]
        assert a == b or reach[a] >> b & 1, f"eager edge {e} lost between fused kernels {a} and {b}"
    for j, gr in enumerate(groups):
        k = fused.kernels[j]
        members = [eager.kernels[i] for i in gr]
        # a fused MoE kernel also reads the weights of experts no token reached at this shape
        moe = k.name.startswith("fused_moe[")
        experts = {b.id for b in eager.buffers if moe and b.role is Role.WEIGHT and b.name.startswith(k.module + ".")}
        assert k.flops == sum(m.flops for m in members)
        assert set(k.reads) <= {b for m in members for b in m.reads} | experts
        assert set(k.writes) <= {b for m in members for b in m.writes}
        assert k.bytes_read <= sum(m.bytes_read for m in members)
        assert k.bytes_written <= sum(m.bytes_written for m in members)
        if len(gr) > 1 and not moe:
            assert all(m.kind in (KernelKind.ELEMENTWISE, KernelKind.NORM, KernelKind.COPY) for m in members)
    assert fused.flops == eager.flops
    for role in (Role.WEIGHT, Role.KV, Role.STATE, Role.INPUT, Role.OUTPUT):  # only activations may vanish
        assert fused.bytes_by_role()[role] == eager.bytes_by_role()[role], role


@pytest.mark.parametrize("name", ["llama-tiny", "qwen-tiny", "moe-tiny", "mamba2-tiny", "dit-tiny", "qwen-vl-tiny"])
def test_fused_view_keeps_every_dependency(name: str) -> None:
    for phase in model_phases(name):
        kw = {"seq": 64, "context": 64} if name == "qwen-vl-tiny" else {"seq": 16, "context": 32}
        eager, rec, _ = record(name, phase, batch=2, real=False, **kw)
        fused = fused_view(eager, rec)
        _check_fused(eager, fused)
        assert len(fused.kernels) < len(eager.kernels) / 2, (name, phase, len(fused.kernels), len(eager.kernels))


@pytest.mark.slow
def test_llama3_8b_decode_is_twelve_kernels_a_layer() -> None:
    eager, rec, _ = record("llama-3-8b", "decode", batch=2, seq=None, context=None, real=False)
    fused = fused_view(eager, rec)
    _check_fused(eager, fused)
    # per layer by hand: q, k, v, o, gate, up, down GEMMs; decode attention; and four fused chains:
    # residual add + input RMSNorm, rotary + KV-cache write + mask, residual add + post-attention RMSNorm,
    # SiLU · up
    for layer, ks in fused.by_layer().items():
        kinds = sorted(k.kind.value for k in ks)
        if layer is None:  # embedding; last residual add + final norm; lm_head
            assert kinds == ["elementwise", "embedding", "gemm"]
            continue
        assert len(ks) == 12
        assert kinds == ["attention_decode", *["elementwise"] * 4, *["gemm"] * 7], layer
    assert len(fused.kernels) == 32 * 12 + 3
    assert fused.flops == eager.flops
    assert fused.bytes_by_role()[Role.WEIGHT] == eager.bytes_by_role()[Role.WEIGHT]


@pytest.mark.slow
def test_trace_reports_the_fused_view_and_eager_on_request(run_cli: RunCli) -> None:
    code, out, _ = run_cli(["trace", "llama-3-8b", "--phase", "decode", "--json"])
    fused = json.loads(out)
    code_e, out_e, _ = run_cli(["trace", "llama-3-8b", "--phase", "decode", "--json", "--eager"])
    eager = json.loads(out_e)
    assert code == code_e == 0
    assert (fused["view"], eager["view"]) == ("fused", "eager")
    assert fused["kernels"] == 32 * 12 + 3 and fused["eager_kernels"] == eager["kernels"]
    assert eager["kernels"] > 1000  # one kernel per ATen operator: ~46 a layer
    assert fused["flops"] == eager["flops"] and fused["weight_bytes"] == eager["weight_bytes"]
    assert fused["bytes_read"] < eager["bytes_read"]


def test_eager_capture_is_unchanged_by_the_view() -> None:
    eager = capture_model("llama-tiny", "decode", batch=2, eager=True)
    fused = capture_model("llama-tiny", "decode", batch=2)
    assert eager.meta["view"] == "eager" and fused.meta["view"] == "fused"
    assert fused.meta["eager_kernels"] == len(eager.kernels)
    assert all(len(g) >= 1 for g in fused.meta["fused_from"])
    assert KernelGraph.from_json(fused.to_json()).meta["fused_from"] == fused.meta["fused_from"]
