"""The plan's search shared between processes (forked.run_shared): the same answer as one process, a
task's failure and a child's crash reported; the rescaled kernels' derived keys; the MILP's node limit."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tessera.graph import Kernel, KernelKind
from tessera.plan import PlannerConfig, default_cost, plan_serving, resolve_gpu, result_json
from tessera.plan.forked import run_shared
from tessera.plan.model.serving import Traffic
from tessera.plan.model.shapes import scaled_kernel
from tessera.plan.model.units import UnitCost
from tessera.plan.solver.highs import Model


def test_tasks_shared_answer_in_task_order() -> None:
    tasks = [lambda i=i: (i, os.getpid()) for i in range(12)]
    got = run_shared(tasks, workers=2)
    assert [i for i, _ in got] == list(range(12))
    assert run_shared(tasks, workers=1) == [(i, os.getpid()) for i in range(12)]


def test_a_tasks_exception_is_raised_here() -> None:
    def bad() -> int:
        raise KeyError("no such shape")
    tasks = [lambda: 1, bad, lambda: 3, lambda: 4]
    with pytest.raises(KeyError, match="no such shape"):
        run_shared(tasks, workers=2)


def test_a_child_that_dies_is_named() -> None:
    parent = os.getpid()

    def die_in_child() -> int:
        if os.getpid() != parent:
            os._exit(7)
        return 0
    # the parent takes task 0 first and sleeps on it long enough for the child to take a dying one
    tasks = [lambda: __import__("time").sleep(1.0)] + [die_in_child] * 4
    with pytest.raises(RuntimeError, match="exit code 7"):
        run_shared(tasks, workers=2)


def test_two_processes_plan_what_one_plans() -> None:
    cfg = PlannerConfig(traffic=Traffic(prompt=16, output=8), microbatches=(1, 2))
    one = json.loads(result_json(plan_serving("llama-tiny", "H100,L40S", cfg), cfg))
    two = json.loads(result_json(plan_serving("llama-tiny", "H100,L40S", cfg, workers=2), cfg))
    for r in (one, two):  # measured seconds, not answers
        r.pop("wall_s", None)
        r.pop("solve_s", None)
    assert one == two


def test_a_rescaled_kernel_is_priced_at_its_own_size() -> None:
    # a GEMM priced once (its cost signature is then kept beside its fields), rescaled to 64× its rows:
    # the copy must not carry the original's signature, or it is priced at the original's size
    gemm = Kernel(id=0, name="aten.mm.default", kind=KernelKind.GEMM, flops=2 * 16 * 4096 * 4096,
                  bytes_read=2 * (16 * 4096 + 4096 * 4096), bytes_written=2 * 16 * 4096, reads=(0, 1),
                  writes=(2,), dims={"m": 16, "n": 4096, "k": 4096})
    cost, h100 = UnitCost.over(default_cost()), resolve_gpu("H100")
    small = cost.kernel_time_s(gemm, h100)
    big = scaled_kernel(gemm, 64.0, resident_read=2 * 4096 * 4096, kid=0)
    assert big.dims["m"] == 1024 and big.cost_signature != gemm.cost_signature
    assert cost.kernel_time_s(big, h100) > small
    assert big.touches == (0, 1, 2)


def test_the_node_limit_stops_at_the_root() -> None:
    # a knapsack whose LP relaxation is fractional: max 5a + 4b + 3c, 2a + 3b + c ≤ 5 over binaries.
    # By hand: the optimum is a + c... take a, b: weight 5, value 9; a, c: 3, 8; all three: 6 > 5.
    # So 9. HiGHS may close it at the root; either way the answer with a limit is a feasible vector
    # of value ≤ 9, and without one exactly 9.
    m = Model("knap")
    cols = [m.var(n, ub=1, cost=-v, integer=True) for n, v in (("a", 5), ("b", 4), ("c", 3))]
    m.row("w", dict(zip(cols, (2.0, 3.0, 1.0), strict=True)), ub=5.0)
    free = m.solve()
    assert free.status == "optimal" and -free.objective == pytest.approx(9.0)
    root = m.solve(max_nodes=1)
    assert root.ok and -root.objective <= 9.0 + 1e-9
    x = np.round(root.values)
    assert 2 * x[0] + 3 * x[1] + x[2] <= 5


def test_node_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="mip_max_nodes=0"):
        PlannerConfig(mip_max_nodes=0)
