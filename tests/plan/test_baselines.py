"""The baselines' shared attention-side predicate, and the search's shortcuts (memoised verifier, the LP
floor that skips decided points) leaving its answers unchanged."""

from __future__ import annotations

import pytest

from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.plan.baselines import attention_ffn, is_attention_kernel
from tessera.runtime.placements import attention_gemm


def _k(i: int, name: str, kind: KernelKind, reads: tuple[int, ...], writes: tuple[int, ...], layer: int | None,
       module: str) -> Kernel:
    return Kernel(id=i, name=name, kind=kind, flops=1, bytes_read=1, bytes_written=1, reads=reads, writes=writes,
                  layer=layer, module=module)


def _graph():
    """embed -> [norm, q_proj, cache write, attention, o_proj, mlp] (layer 0) -> [scan over a state] (layer 1)."""
    roles = [("x", Role.INPUT), ("h", Role.ACTIVATION), ("n", Role.ACTIVATION), ("q", Role.ACTIVATION),
             ("kv", Role.KV), ("a", Role.ACTIVATION), ("o", Role.ACTIVATION), ("f", Role.ACTIVATION),
             ("s", Role.STATE), ("y", Role.OUTPUT)]
    bufs = [Buffer(id=i, name=n, bytes=64, role=r) for i, (n, r) in enumerate(roles)]
    G, A, E = KernelKind.GEMM, KernelKind.ATTENTION_DECODE, KernelKind.OTHER  # noqa: N806  (E: elementwise)
    ks = [_k(0, "embed", E, (0,), (1,), None, "model.embed_tokens"),
          _k(1, "norm", E, (1,), (2,), 0, "model.layers.0.input_layernorm"),
          _k(2, "q", G, (2,), (3,), 0, "model.layers.0.self_attn.q_proj"),
          _k(3, "cache", E, (3,), (4,), 0, "model.layers.0.self_attn"),
          _k(4, "attn", A, (3, 4), (5,), 0, "model.layers.0.self_attn"),
          _k(5, "o", G, (5,), (6,), 0, "model.layers.0.self_attn.o_proj"),
          _k(6, "mlp", G, (6,), (7,), 0, "model.layers.0.mlp.down_proj"),
          _k(7, "scan", KernelKind.SCAN, (7, 8), (8, 9), 1, "model.layers.1.mixer")]
    return build_graph(model="toy", phase="decode", shape={"batch": 1}, kernels=ks, buffers=bufs)


def test_attention_predicate_is_shared_by_the_baseline_and_the_runtime() -> None:
    g = _graph()
    # by hand: the cache write and the attention touch KV, the scan is a recurrent mixer over a state
    assert [k.id for k in g.kernels if is_attention_kernel(g, k.id)] == [3, 4, 7]
    rt = attention_gemm(g)
    base = attention_ffn(g, 0, 1)
    for k in g.kernels:
        if is_attention_kernel(g, k.id):
            assert rt[k.id] == 0 and base[k.id] == 0, k.name  # both put attention-type work on the attention side
    # the baseline also keeps the rest of the attention block there (norm, q/o projections), the MLP and
    # the embedding on the FFN side; the runtime's test split sends every GEMM to device 1
    assert base == (1, 0, 0, 0, 0, 0, 1, 0)
    assert rt == (0, 0, 1, 0, 0, 1, 1, 0)


def test_cached_evaluation_equals_the_verifier() -> None:
    from tessera.plan.solver.verify import evaluate, evaluate_cached

    from .helpers import COST, POOL, chain3

    g = chain3()
    for a in ((0, 0, 0), (0, 0, 1), (1, 0, 1)):
        first = evaluate_cached(g, a, POOL.gpus, POOL.link, COST)
        assert first == evaluate(g, a, POOL.gpus, POOL.link, COST)
        assert evaluate_cached(g, a, POOL.gpus, POOL.link, COST) is first  # the second call is the memo


def test_cached_evaluation_is_never_another_cost_models() -> None:
    """Cost models made and dropped one after another (CPython reuses a freed object's address, so their
    ids repeat): each evaluation is that cost model's, by hand: kernel times scale with the factor, so the
    chain on one device is busy 9·f seconds (2 + 3 + 4 on the H100)."""
    from tessera.plan.solver.verify import evaluate_cached

    from .helpers import POOL, TIMES, TableCost, chain3

    g = chain3()
    ids = set()
    for f in range(1, 40):
        cost = TableCost(table={(k, gpu): t[i] * f for k, t in TIMES.items()
                                for i, gpu in enumerate((POOL.gpus[0].name, POOL.gpus[1].name))})
        ids.add(id(cost))
        ev = evaluate_cached(g, (0, 0, 0), POOL.gpus, POOL.link, cost)
        assert ev.device_busy_s[0] == 9.0 * f
        del cost
    assert len(ids) == 39  # every cost model outlived its turn (held by the cache), so no id came back


@pytest.mark.slow
@pytest.mark.parametrize("tpot_s", [3e-4, 1e-9])
def test_floor_skips_points_without_changing_the_search(tpot_s: float) -> None:
    """llama-tiny's MILP search with a TPOT SLO that larger micro-batch counts miss (3e-4 s), and one no
    point meets (1e-9 s): the LP floor skips placer calls, the best point is the same as without it, and
    so is the fastest fitting point when nothing meets the SLO (the only case the search's caller reads it)."""
    from tessera.plan import strategies as st
    from tessera.plan.captures import capture_source
    from tessera.plan.model.cell import Shapes
    from tessera.plan.model.serving import SearchSpace, Slo, Traffic, batch_ceiling, search, search_m
    from tessera.plan.pool import Pool, resolve_gpu, resolve_link
    from tessera.plan.search import PlannerConfig
    from tessera.plan.solver.bound import period_floor
    from tessera.plan.solver.problem import default_cost

    cfg = PlannerConfig(traffic=Traffic(prompt=16, output=8), slo=Slo(ttft_s=2.0, tpot_s=tpot_s))
    shapes = Shapes("llama-tiny", capture_source("llama-tiny"), cfg, False)
    cell = Pool(gpus=(resolve_gpu("H100"), resolve_gpu("L40S")), link=resolve_link("pcie5"))
    cost = default_cost()
    calls: list[tuple[int, int]] = []
    milp = st.milp(cell, cost, time_limit_s=5.0)

    def placer(g, b, m):
        calls.append((b, m))
        return milp(g, b, m)

    kw = dict(graph_at=shapes.graph, placer=placer, at=shapes.at, units=cell.gpus, link=cell.link, cost=cost,
              traffic=cfg.traffic, slo=cfg.slo,
              ceiling=min(64, batch_ceiling(shapes.base, cell.gpus, cfg.traffic, False, None)))
    ms = (1, 2, 4, 8)
    plain = search(SearchSpace(**kw), ms)
    n_plain = len(calls)
    calls.clear()
    space = SearchSpace(**kw, floor=lambda g, b, m: period_floor(g, cell, cost, m))
    floored = search(space, ms)
    assert len(calls) < n_plain
    # the search in parts, one per micro-batch count (as two processes share it), finds the same
    parted = search(space, ms, [search_m(space, m) for m in ms])
    for p, q in zip(floored, parted, strict=True):
        assert (p is None) == (q is None)
        if p is not None:
            assert (p.batch, p.microbatches, p.assignment, p.goodput) == (q.batch, q.microbatches, q.assignment,
                                                                          q.goodput)
    compared = plain if plain[0] is None else plain[:1]
    assert (tpot_s < 1e-6) == (plain[0] is None)
    for p, q in zip(compared, floored, strict=False):
        assert (p is None) == (q is None)
        if p is not None:
            assert (p.batch, p.microbatches, p.assignment, p.period_s) == (q.batch, q.microbatches, q.assignment,
                                                                          q.period_s)


def test_prefill_decode_on_two_tp_groups() -> None:
    """Four GPUs of two types: prefill/decode runs with each type as one tensor-parallel group of 2 (the
    devices are the groups, the price the pool's); a pool of one type keeps the pair of single GPUs."""
    from tessera.plan.baselines.prefill_decode import prefill_decode
    from tessera.plan.captures import capture_source
    from tessera.plan.model.cell import Shapes
    from tessera.plan.model.serving import Traffic
    from tessera.plan.pool import resolve_gpu, resolve_link
    from tessera.plan.search import PlannerConfig, prefill_decode_sides
    from tessera.plan.solver.problem import default_cost

    cfg = PlannerConfig(traffic=Traffic(prompt=16, output=8))
    shapes = Shapes("llama-tiny", capture_source("llama-tiny"), cfg, False)
    h, l4 = resolve_gpu("H100"), resolve_gpu("L40S")
    lk, cost = resolve_link("pcie5"), default_cost()
    r = prefill_decode_sides(shapes, (h, h, l4, l4), lk, cost, cfg, True)
    assert r.applicable and r.feasible, r.reason
    assert r.tp == (2, 2)
    assert r.usd_per_hour == pytest.approx(2 * h.usd_per_hour + 2 * l4.usd_per_hour)
    assert {d.gpu for d in r.plan.devices} == {"2xH100-SXM", "2xL40S"}
    # each side holds twice one GPU's memory: the decode side's batch is at least the single-GPU pair's
    pair = prefill_decode(shapes, (h, l4), lk, cost, cfg)
    if pair.feasible and pair.detail["orientation"].endswith(r.detail["orientation"].split("decode on 2x")[-1]):
        assert r.detail["decode_batch"] >= pair.detail["decode_batch"]
    # a pool of one type has no two-device layout of two types, only the pair of GPUs
    one = prefill_decode_sides(shapes, (h, h), lk, cost, cfg, True)
    assert one.tp == (1, 1)
