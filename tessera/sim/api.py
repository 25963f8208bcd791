"""`simulate(plan, workload, ...)`: the entry point other stages call (one plan, N replicas)."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.errors import UserError
from tessera.plan.types import Plan
from tessera.sim.adaptive import AdaptivePolicy
from tessera.sim.failure import Failure
from tessera.sim.metrics import SLO, SimResult
from tessera.sim.model import SchedulerConfig
from tessera.sim.pool import Run, run_pool
from tessera.sim.workload import WorkloadSpec

__all__ = ["Run", "run", "simulate"]


def run(plan: Plan, workload: WorkloadSpec, *, replicas: int = 1, policy: AdaptivePolicy | None = None,
        seed: int = 0, slo: SLO | None = None, config: SchedulerConfig | None = None,
        trace_window_s: tuple[float, float] | None = None, failures: Sequence[Failure] = (),
        window_s: float | None = None) -> Run:
    if replicas < 1:
        raise UserError(f"replicas={replicas} must be >= 1")
    return run_pool([(plan, replicas)], workload, seed=seed, slo=slo, config=config, failures=failures,
                    policy=policy, window_s=window_s, trace_window_s=trace_window_s)


def simulate(plan: Plan, workload: WorkloadSpec, *, replicas: int = 1, policy: AdaptivePolicy | None = None,
             seed: int = 0, slo: SLO | None = None, config: SchedulerConfig | None = None,
             failures: Sequence[Failure] = ()) -> SimResult:
    """Serve ``workload`` on ``replicas`` copies of ``plan`` (each itself ``plan.replicas`` cells) behind
    a router; with ``policy``, each replica switches between ``policy.latency_plan`` and ``plan``."""
    return run(plan, workload, replicas=replicas, policy=policy, seed=seed, slo=slo, config=config,
               failures=failures).result
