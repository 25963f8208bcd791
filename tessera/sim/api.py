"""`simulate(plan, workload, ...)`: the entry point other stages call: one cell's Plan or a PoolPlan of
different cells, N replicas of it."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError
from tessera.sim.adaptive import AdaptivePolicy
from tessera.sim.failure import Failure
from tessera.sim.metrics import SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.pool import Run, run_pool
from tessera.sim.workload import WorkloadSpec

__all__ = ["Run", "run", "simulate"]


def run(plan: Plan | PoolPlan, workload: WorkloadSpec, *, replicas: int = 1,
        policy: AdaptivePolicy | None = None, seed: int = 0, slo: LatencyTargets | None = None,
        config: SchedulerConfig | None = None, trace_window_s: tuple[float, float] | None = None,
        failures: Sequence[Failure] = (), window_s: float | None = None) -> Run:
    if replicas < 1:
        raise UserError(f"replicas={replicas} must be >= 1")
    if isinstance(plan, PoolPlan) and policy is not None:
        raise UserError(f"plan switching needs one cell's plan; this is a pool of {len(plan.cells)} different "
                        "cells (each would switch on its own placement)")
    if policy is not None and policy.latency_plan is None:
        raise UserError("plan switching in the simulator needs the latency plan (--latency-plan)")
    cells = PoolPlan.of(plan, replicas).sim_cells() if isinstance(plan, PoolPlan) else [(plan, replicas)]
    return run_pool(cells, workload, seed=seed, slo=slo, config=config, failures=failures,
                    policy=policy, window_s=window_s, trace_window_s=trace_window_s)


def simulate(plan: Plan | PoolPlan, workload: WorkloadSpec, *, replicas: int = 1, policy: AdaptivePolicy | None = None,
             seed: int = 0, slo: LatencyTargets | None = None, config: SchedulerConfig | None = None,
             failures: Sequence[Failure] = ()) -> SimResult:
    """Serve ``workload`` on ``replicas`` copies of ``plan`` (each itself ``plan.replicas`` cells; a PoolPlan:
    every cell ``count`` × ``replicas`` times) behind a router; with ``policy``, each replica switches between
    ``policy.latency_plan`` and ``plan`` (one cell's plan only)."""
    return run(plan, workload, replicas=replicas, policy=policy, seed=seed, slo=slo, config=config,
               failures=failures).result
