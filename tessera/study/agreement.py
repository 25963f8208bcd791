"""The check `tessera compare` and `tessera evaluate` run on every strategy they score: the simulator's SLO
knee of its deployment beside the planner's goodput (tessera.report.agreement summarises the checks)."""

from __future__ import annotations

from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.study import KneeCheck
from tessera.errors import UserError
from tessera.sim.knee import KneeConfig, find_knee

KNEE = KneeConfig(rel_tol=0.03)  # bisection to 3% of the rate: a third of report.agreement's TOLERANCE


def knee_check(deployment: Plan | PoolPlan | None, goodput: float) -> KneeCheck | None:
    """The simulator's knee of a strategy's deployment beside the planner's goodput (output tokens/s or
    images/s); None where the strategy serves nothing."""
    if deployment is None or goodput <= 0:
        return None
    try:
        k = find_knee(deployment, config=KNEE)
    except (UserError, ValueError) as e:
        return KneeCheck(planner_per_s=goodput, error=str(e).splitlines()[0])
    return KneeCheck(planner_per_s=goodput, knee_per_s=k.per_s, ratio=k.per_s / goodput, attainment=k.attainment,
                     rates=k.rates, requests=k.requests, wall_s=k.wall_s, note=k.note or None)
