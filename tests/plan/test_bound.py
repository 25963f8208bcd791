"""The joint LP bound over phases that share residency, worked by hand (bound.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.graph import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph
from tessera.hardware import LinkSpec
from tessera.plan.pool import Pool, resolve_gpu
from tessera.plan.solver.bound import BoundPhase, cycle_bound, lp_bound_joint
from tessera.plan.solver.problem import build_problem

from .helpers import H, L, TableCost

GB = 1_000_000_000
# seconds on (H, L): prefill's GEMM and its cache write both prefer H; decode's GEMM too
COST = TableCost(table={("pa", H): 1.0, ("pa", L): 2.0, ("pk", H): 1.0, ("pk", L): 4.0,
                        ("qa", H): 1.0, ("qa", L): 2.0})
# H has room for one 1 GB buffer, L for two (activations are a few bytes)
POOL = Pool(gpus=(replace(resolve_gpu(H), mem_bytes=GB + 1000), replace(resolve_gpu(L), mem_bytes=2 * GB + 1000)),
            link=LinkSpec(name="test", bytes_per_s=1e9, latency_s=0.0))


def _k(i: int, name: str, reads: tuple[int, ...], writes: tuple[int, ...]) -> Kernel:
    return Kernel(id=i, name=name, kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1, reads=reads,
                  writes=writes, layer=None)


def _prefill() -> KernelGraph:
    """x -> pa(weight A) -> va -> pk writes the 1 GB cache K and the output."""
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT), Buffer(id=1, name="A", bytes=GB, role=Role.WEIGHT),
            Buffer(id=2, name="va", bytes=8, role=Role.ACTIVATION), Buffer(id=3, name="K", bytes=GB, role=Role.KV),
            Buffer(id=4, name="out", bytes=8, role=Role.OUTPUT)]
    return build_graph(model="two", phase="prefill", shape={"batch": 1}, buffers=bufs,
                       kernels=[_k(0, "pa", (0, 1), (2,)), _k(1, "pk", (2,), (3, 4))])


def _decode() -> KernelGraph:
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT), Buffer(id=1, name="A", bytes=GB, role=Role.WEIGHT),
            Buffer(id=2, name="out", bytes=8, role=Role.OUTPUT)]
    return build_graph(model="two", phase="decode", shape={"batch": 1}, buffers=bufs,
                       kernels=[_k(0, "qa", (0, 1), (2,))])


def test_joint_bound_shares_residency_by_hand() -> None:
    # alone, prefill keeps K on H (saves 3 s; A on L): 2 + 1 = 3; decode keeps A on H: 1. Sum 4.
    # together H holds a fraction zA of A and zK of K with zA + zK <= 1: total (2 − zA) + (4 − 3 zK)
    # + (2 − zA) = 8 − 2 zA − 3 zK, least at zK = 1: 5 s.
    p, q = build_problem(_prefill(), POOL, COST), build_problem(_decode(), POOL, COST)
    assert lp_bound_joint([BoundPhase(prob=p, m=1, steps=1)], mode="latency") == pytest.approx(3.0)
    assert lp_bound_joint([BoundPhase(prob=q, m=1, steps=1)], mode="latency") == pytest.approx(1.0)
    joint = [BoundPhase(prob=p, m=1, steps=1), BoundPhase(prob=q, m=1, steps=1)]
    assert lp_bound_joint(joint, mode="latency") == pytest.approx(5.0)
    # decode run 10 times per cycle: now A on H pays (10·1 saved per unit zA vs 3 per unit zK)
    # 8 − 2zA − 3zK becomes 2 − zA + 4 − 3zK + 10·(2 − zA) = 26 − 11 zA − 3 zK, least at zA = 1: 15 s
    joint = [BoundPhase(prob=p, m=1, steps=1), BoundPhase(prob=q, m=1, steps=10)]
    assert lp_bound_joint(joint, mode="latency") == pytest.approx(15.0)


def test_joint_bound_step_objective_adds_the_bottleneck() -> None:
    # decode at m = 3 (step = 2·T + Σ), a fraction x of qa on H: T >= max(x, 2(1 − x)), Σ = 2 − x.
    # x <= 2/3: 2·2(1 − x) + 2 − x = 6 − 5x; x >= 2/3: 2x + 2 − x = 2 + x. Least at x = 2/3: 8/3 s
    # (at m = 1 all of it on H: 1 s)
    q = build_problem(_decode(), POOL, COST)
    assert lp_bound_joint([BoundPhase(prob=q, m=3, steps=1)], mode="throughput") == pytest.approx(8 / 3)
    assert lp_bound_joint([BoundPhase(prob=q, m=1, steps=1)], mode="throughput") == pytest.approx(1.0)


def test_cycle_bound_covers_disjoint_splits_by_hand() -> None:
    # prefill on H alone needs A and K there (2 GB > 1 GB): no; prefill on L (A, K: 2 + 4 = 6 s) with decode
    # on H (1 s per step): a disjoint plan's cycle is max(6, steps·1). With 10 decode steps the joint
    # (shared) bound is 15 s but the split reaches max(6, 10) = 10 s, so the cycle bound is 10 s.
    p, q = build_problem(_prefill(), POOL, COST), build_problem(_decode(), POOL, COST)
    phases = [BoundPhase(prob=p, m=1, steps=1), BoundPhase(prob=q, m=1, steps=10)]
    assert cycle_bound(phases, mode="latency") == pytest.approx(10.0)
    one = [BoundPhase(prob=p, m=1, steps=1), BoundPhase(prob=q, m=1, steps=1)]
    assert cycle_bound(one, mode="latency") == pytest.approx(5.0)  # max(6, 1) = 6 > the shared 5
    assert lp_bound_joint([replace(phases[0], devices=frozenset({0}))], mode="latency") == float("inf")
