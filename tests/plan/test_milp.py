"""The flat MILP and LP bound on a 3-kernel, 2-device chain worked by hand (see helpers.TIMES)."""

from __future__ import annotations

import pytest

from tessera.plan.solver.milp import build_flat, loads, lp_bound, lp_bound_memory, solve_flat, weighted_costs
from tessera.plan.solver.problem import build_problem
from tessera.plan.solver.solve import check_agreement
from tessera.plan.solver.verify import evaluate

from .helpers import COST, POOL, chain3

GB = 1_000_000_000


def test_throughput_optimum_by_hand() -> None:
    # all on H100: 9 s; all on L40S: 9 s; {a,b}|{c}: max(5, 2, 0.5) = 5; {a}|{b,c}: max(2, 5, 0.5) = 5;
    # {a,c}|{b}: max(6, 3) = 6. Optimum T = 5.
    p = build_problem(chain3(), POOL, COST)
    r = solve_flat(p, mip_rel_gap=0.0)
    assert r.status == "optimal"
    assert r.objective == pytest.approx(5.0, rel=1e-3)
    dev, link = loads(p, r.group_dev)
    assert max(dev + list(link.values())) == pytest.approx(5.0)
    assert sum(link.values()) == pytest.approx(0.5)  # exactly one cut of one 0.5 GB value


def test_lp_bound_by_hand() -> None:
    # relaxed: a -> H100 (2), c -> L40S (2), b split half/half (1.5 + 1.5): T = 3.5
    p = build_problem(chain3(), POOL, COST)
    assert lp_bound([(p.t, 1.0)], 2) == pytest.approx(3.5)


def test_latency_objective_by_hand() -> None:
    # sequential sum: all H100 9; a,b on H100 + c on L40S: 2 + 3 + 0.5 + 2 = 7.5 (best)
    p = build_problem(chain3(), POOL, COST)
    r = solve_flat(p, objective="weighted", mip_rel_gap=0.0)
    assert r.objective == pytest.approx(7.5)
    ev = evaluate(p.graph, p.kernel_assignment(r.group_dev), POOL.gpus, POOL.link, COST)
    assert ev.latency_s == pytest.approx(7.5)  # list schedule agrees on a chain


def test_memory_aware_plan_fits_where_replication_does_not() -> None:
    # three 30 GB weights = 90 GB: no single GPU holds it (80 GB, 48 GB), full replication needs 90 GB on each;
    # the memory-aware optimum keeps T = 5 with {a,b} on H100 (60 GB) and c on L40S (30 GB).
    p = build_problem(chain3(weight_bytes=30 * GB), POOL, COST)
    r = solve_flat(p, mip_rel_gap=0.0)
    assert r.objective == pytest.approx(5.0, rel=1e-3)
    ev = evaluate(p.graph, p.kernel_assignment(r.group_dev), POOL.gpus, POOL.link, COST)
    assert [m["weight"] for m in ev.memory_bytes] == [60 * GB, 30 * GB]
    check_agreement(p, p.kernel_assignment(r.group_dev), COST, m=1)


def test_memory_forces_a_worse_split_or_infeasible() -> None:
    # 45 GB weights: H100 holds one... only one per GPU fits with 80/48 -> at most one on each: infeasible
    p = build_problem(chain3(weight_bytes=45 * GB), POOL, COST)
    assert solve_flat(p, mip_rel_gap=0.0).status == "infeasible"


def test_shared_weight_is_replicated_and_counted_twice() -> None:
    # a and c share a 30 GB weight; with {a,b}|{c} it lives on both GPUs
    p = build_problem(chain3(weight_bytes=30 * GB, shared=True), POOL, COST)
    assign = (0, 0, 1)
    ev = evaluate(p.graph, assign, POOL.gpus, POOL.link, COST)
    assert [m["weight"] for m in ev.memory_bytes] == [60 * GB, 30 * GB]
    check_agreement(p, assign, COST, m=1)


def test_memory_aware_bound_by_hand() -> None:
    # 30 GB weights, no transfers: memory allows at most 2 kernels' weights on H100 (80) and 1 on L40S (48);
    # the relaxation still reaches T = 3.5 (b split), so both bounds agree here; with 45 GB weights the
    # relaxed memory rows (z = x fractional) allow 80/45 of a kernel on H100 and 48/45 on L40S.
    from tessera.plan.solver.milp import lp_bound_memory

    p = build_problem(chain3(weight_bytes=30 * GB), POOL, COST)
    assert lp_bound_memory(p) == pytest.approx(3.5)
    # 40 GB weights: L40S has room (its 48 GiB − activation reserve) for c and a fraction f of b; moving c
    # there saves H100 more per GB (4 s) than b (3 s), so H100 = a + (1 − f)·b = 2 + 3·(1 − f)
    p = build_problem(chain3(weight_bytes=40 * GB), POOL, COST)
    f = (48 * 2**30 - p.act_bytes - 40 * GB) / (40 * GB)
    assert lp_bound_memory(p) == pytest.approx(2 + 3 * (1 - f))


@pytest.mark.parametrize(("alpha", "beta", "gamma"), [((1.0, 1.0), 1.0, None), ((1.0, 0.25), 0.05, None),
                                                      ((0.5, 1.0), 0.0, (2e-9, 0.0))])
def test_sweep_costs_and_resolver_equal_a_fresh_build(alpha, beta, gamma) -> None:
    """The pattern sweep re-solves one model under new costs: same costs, same optimum as building anew."""
    p = build_problem(chain3(shared=True), POOL, COST)
    base, idx = build_flat(p, objective="weighted", memory=False, mem_price=(0.0, 0.0))
    fresh, _ = build_flat(p, objective="weighted", alpha=alpha, beta=beta, memory=False, mem_price=gamma)
    costs = weighted_costs(p, idx, base.n_cols, alpha=alpha, beta=beta, mem_price=gamma)
    assert costs.tolist() == pytest.approx(fresh.col_cost)
    solver = base.resolver()
    for _ in range(2):  # a re-solve after another point must not depend on the previous one
        assert solver.solve(costs).objective == pytest.approx(fresh.solve().objective, rel=1e-9)
        solver.solve(costs[::-1].copy())


def test_resolver_time_limit_is_per_solve_not_per_sweep() -> None:
    """HiGHS counts a time limit over every run of one instance: a long sweep must not run the LP out of
    time and fall back to the MILP for the rest of it."""
    p = build_problem(chain3(), POOL, COST)
    model, idx = build_flat(p, objective="weighted", memory=False, mem_price=(0.0, 0.0))
    # one solve takes ~30 µs; 4000 take over 0.1 s in all, so a limit counted over the whole sweep (0.05 s)
    # would run out, while one solve stays far under it even on a loaded machine
    solver = model.resolver(time_limit_s=0.05)
    for k in range(4000):
        a = (1.0, 0.5 + k / 2000)
        assert solver.solve(weighted_costs(p, idx, model.n_cols, alpha=a, beta=1.0)).status == "optimal"
    assert solver._mip is None  # every point answered by the (integral) LP


def test_memory_bound_of_a_model_that_fits_nowhere_is_infinite() -> None:
    p = build_problem(chain3(weight_bytes=200 * GB), POOL, COST)  # 200 GB weights: neither GPU holds one
    assert lp_bound_memory(p) == float("inf")
