"""Partitioning, prediction, carrying and tracing on a hand-written three-op program (no processes)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tessera.capture.recorder import OpRecord, TensorRef
from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.runtime.compiled import bind_weights, call, compile_program
from tessera.runtime.device import HOST
from tessera.runtime.measure import LinkModel, charged_kernel_s, chrome_trace, plan_step_s, predict_step_s
from tessera.runtime.partition import STEP_START, partition
from tessera.runtime.placements import carry_over
from tessera.runtime.program import CapturedProgram, from_wire, replay_step, run_op, to_wire, view_of
from tessera.runtime.state import carry

F = torch.float32


def ref(b: int, shape: tuple[int, ...]) -> TensorRef:
    stride = tuple(int(s) for s in torch.empty(shape).stride())
    return TensorRef(b, F, shape, stride, 0)


def toy() -> CapturedProgram:
    """x(2x3) @ w(3x4) -> a; a + kv -> c; relu(c) -> out.  Buffers: 0 w, 1 x, 2 kv, 3 a, 4 c, 5 out."""
    roles = [Role.WEIGHT, Role.INPUT, Role.KV, Role.ACTIVATION, Role.ACTIVATION, Role.OUTPUT]
    shapes = [(3, 4), (2, 3), (2, 4), (2, 4), (2, 4), (2, 4)]
    bufs = [Buffer(id=i, name=f"b{i}", bytes=4 * int(torch.tensor(s).prod()), role=r, dtype="float32", shape=s)
            for i, (r, s) in enumerate(zip(roles, shapes, strict=True))]
    ops = (OpRecord("aten.mm.default", (ref(1, (2, 3)), ref(0, (3, 4))), {}, (ref(3, (2, 4)),)),
           OpRecord("aten.add.Tensor", (ref(3, (2, 4)), ref(2, (2, 4))), {}, (ref(4, (2, 4)),)),
           OpRecord("aten.relu.default", (ref(4, (2, 4)),), {}, (ref(5, (2, 4)),)))
    kinds = [KernelKind.GEMM, KernelKind.ELEMENTWISE, KernelKind.ELEMENTWISE]
    rw = [((1, 0), (3,)), ((3, 2), (4,)), ((4,), (5,))]
    kernels = [Kernel(id=i, name=o.func, kind=kinds[i], flops=0, bytes_read=0, bytes_written=0, reads=r, writes=w,
                      dtype="float32") for i, (o, (r, w)) in enumerate(zip(ops, rw, strict=True))]
    g = torch.Generator().manual_seed(0)
    initial = {b: torch.randn(shapes[b], generator=g).reshape(-1).view(torch.uint8) for b in (0, 1, 2)}
    graph = build_graph(model="toy", phase="prefill", shape={}, kernels=kernels, buffers=bufs)
    return CapturedProgram(graph=graph, ops=ops, initial=initial, outputs=(ref(5, (2, 4)),))


def test_partition_places_only_touched_buffers_and_moves_each_value_once() -> None:
    part = partition(toy(), (0, 1, 0), 2)
    assert part.kernels == ((0, 2), (1,))
    assert part.resident == (frozenset({0}), frozenset({2}))  # w only on 0, kv only on 1
    assert part.inputs == (frozenset({1}), frozenset())
    moves = [(t.buffer, t.src, t.dst, t.after, t.before, t.nbytes) for t in part.transfers]
    assert moves == [(3, 0, 1, 0, 1, 32), (4, 1, 0, 1, 2, 32)]  # a: 0->1, c: 1->0, 2x4 fp32 each
    assert part.output_device == (0,)
    assert part.link_bytes() == {(0, 1): 32, (1, 0): 32}


def test_single_device_has_no_transfers_and_replay_matches_torch() -> None:
    prog = toy()
    part = partition(prog, (0, 0, 0), 1)
    assert part.transfers == () and part.resident == (frozenset({0, 2}),)
    st = {b: t.untyped_storage().clone() for b, t in prog.initial.items()}
    w, x, kv = (prog.initial[b].view(F).reshape(s) for b, s in ((0, (3, 4)), (1, (2, 3)), (2, (2, 4))))
    assert torch.equal(replay_step(prog, st)[0], torch.relu(x @ w + kv))


def test_kv_written_on_two_devices_is_synced_at_step_end() -> None:
    prog = toy()
    ops = list(prog.ops)  # make op 1 write kv in place: add_(kv, a)
    ops[1] = OpRecord("aten.add_.Tensor", (ref(2, (2, 4)), ref(3, (2, 4))), {}, (ref(2, (2, 4)),))
    ops[2] = OpRecord("aten.relu.default", (ref(2, (2, 4)),), {}, (ref(5, (2, 4)),))
    k = list(prog.graph.kernels)
    k[1] = Kernel(id=1, name=ops[1].func, kind=KernelKind.ELEMENTWISE, flops=0, bytes_read=0, bytes_written=0,
                  reads=(2, 3), writes=(2,))
    k[2] = Kernel(id=2, name=ops[2].func, kind=KernelKind.ELEMENTWISE, flops=0, bytes_read=0, bytes_written=0,
                  reads=(2,), writes=(5,))
    g = build_graph(model="toy", phase="prefill", shape={}, kernels=k, buffers=prog.graph.buffers)
    part = partition(CapturedProgram(graph=g, ops=tuple(ops), initial=prog.initial, outputs=prog.outputs), (0, 1, 0), 2)
    # kv: written on 1, read on 0; no copy (1 writes kv no more this step, and sends finish with the step)
    assert [(t.buffer, t.src, t.dst, t.snapshot) for t in part.transfers] == [(3, 0, 1, False), (2, 1, 0, False)]
    part = partition(CapturedProgram(graph=g, ops=tuple(ops), initial=prog.initial, outputs=prog.outputs), (0, 1, 1), 2)
    # kv touched only on 1 now: its write needs no sync; a still goes 0 -> 1
    assert [(t.buffer, t.src, t.dst, t.after) for t in part.transfers] == [(3, 0, 1, 0)]
    assert STEP_START == -1


def test_predicted_pipeline_overlaps_microbatches() -> None:
    """1 s per kernel, free links: m=1 is the chain 3 s; m=2 overlaps to 4 s (not 6)."""
    part = partition(toy(), (0, 1, 0), 2)
    free = LinkModel(latency_s=0.0, bytes_per_s=1e30)
    assert predict_step_s(part, [1.0, 1.0, 1.0], free, 1) == 3.0
    assert predict_step_s(part, [1.0, 1.0, 1.0], free, 2) == 4.0
    slow = LinkModel(latency_s=0.5, bytes_per_s=1e30)  # two hops of 0.5 s on the chain
    assert predict_step_s(part, [1.0, 1.0, 1.0], slow, 1) == 4.0


def test_carry_copies_the_cache_overlap() -> None:
    old = Buffer(id=0, name="kv.0.k", bytes=4 * 4, role=Role.KV, dtype="float32", shape=(1, 1, 2, 2))
    new = Buffer(id=0, name="kv.0.k", bytes=4 * 6, role=Role.KV, dtype="float32", shape=(1, 1, 3, 2))
    st = torch.tensor([1.0, 2.0, 3.0, 4.0]).untyped_storage()
    out = torch.empty(0).set_(carry(st, old, new), 0, (6,))
    assert out.tolist() == [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]


def test_chrome_trace_has_device_and_link_tracks() -> None:
    part = partition(toy(), (0, 1, 0), 2)
    w0 = dict(start_s=10.0, end_s=10.004, kernels=[(0, 0, 10.0, 10.001), (2, 0, 10.003, 10.004)],
              sends=[(0, 0, 10.001)], recvs=[(1, 0, 10.0029)], waits=[(10.001, 10.0029)], outputs={})
    w1 = dict(start_s=10.0, end_s=10.003, kernels=[(1, 0, 10.0015, 10.0025)], sends=[(1, 0, 10.0025)],
              recvs=[(0, 0, 10.0014)], waits=[], outputs={})
    tr = chrome_trace([dict(key="s", plan="p", m=1, workers=[w0, w1])], {("s", "p"): part},
                      {"s": ["mm", "add", "relu"]})
    xs = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["pid"], e["tid"], e["name"]) for e in xs) == [
        (1, 0, "mm"), (1, 0, "relu"), (1, 0, "wait"), (1, 1, "add"), (2, 1, "buffer 3"), (2, 2, "buffer 4")]
    link = next(e for e in xs if e["name"] == "buffer 3")
    assert link["ts"] == 1000.0 and abs(link["dur"] - 400.0) < 1e-6  # posted at 1 ms, arrived at 1.4 ms


def test_plan_formula_prediction_and_charged_transfer_cpu() -> None:
    """Placement (0,1,0), 1 s kernels, 0.5 s per hop: latency 1+.5+1+.5+1 = 4 s, T = busy of device 0 = 2 s.
    StepPoint: m=1 -> max(2, 4) = 4 s; m=2 -> max(4, 4 + 2) = 6 s."""
    part = partition(toy(), (0, 1, 0), 2)
    hop = LinkModel(latency_s=0.5, bytes_per_s=1e30)
    assert plan_step_s(toy().graph, part, [1.0, 1.0, 1.0], hop, 1) == 4.0
    assert plan_step_s(toy().graph, part, [1.0, 1.0, 1.0], hop, 2) == 6.0
    # each message costs 0.125 s CPU at both ends: a -> after k0 / before k1, c -> after k1 / before k2;
    # 0.25 s per-step set-up on each device's first kernel (k0 on device 0, k1 on device 1)
    cpu = LinkModel(latency_s=0.0, bytes_per_s=1e30, cpu_s=0.125)
    assert charged_kernel_s(part, [1.0, 1.0, 1.0], cpu, 0.25) == [1.375, 1.5, 1.125]


def test_compiled_ops_match_run_op_bit_for_bit_and_wire_round_trips() -> None:
    prog = toy()
    ops = bind_weights(compile_program(prog, range(3), HOST), {0: prog.initial[0].untyped_storage()})
    assert [c.arg_refs for c in ops][0] == ((0, prog.ops[0].args[0]),)  # the weight view is built in
    st_a = {b: t.untyped_storage().clone() for b, t in prog.initial.items()}
    st_a[0] = prog.initial[0].untyped_storage()
    st_b = {b: t.untyped_storage().clone() for b, t in prog.initial.items()}
    for c in ops:
        call(st_a, c)
    for op in prog.ops:
        run_op(st_b, op)
    assert torch.equal(view_of(st_a, prog.outputs[0]), view_of(st_b, prog.outputs[0]))
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3)[:, 1:]  # a non-contiguous view
    assert torch.equal(from_wire(to_wire(t)), t) and from_wire(to_wire(t)).dtype == torch.float32


def test_plan_from_a_bf16_capture_carries_over_by_kernel_alignment() -> None:
    """The planner's bf16 graph has casts the fp32 program lacks: they are skipped; unmatched runtime
    kernels follow the kernel before them."""
    g = lambda *names: SimpleNamespace(kernels=[SimpleNamespace(name=n) for n in names])  # noqa: E731
    plan = g("mm", "_to_copy", "add", "_to_copy", "relu", "mm")
    assert carry_over(plan, (0, 1, 1, 0, 0, 1), g("mm", "add", "relu", "mm")) == (0, 1, 0, 1)
    assert carry_over(plan, (1, 1, 0, 0, 0, 0), g("mm", "add", "softmax", "relu", "mm")) == (1, 0, 0, 0, 0)
