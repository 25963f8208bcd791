"""The planner's goodput against the simulator's SLO knee: the check `tessera compare` and `tessera evaluate`
run on every strategy they score.

The planner works its goodput out in closed form (tessera.plan.knee); the simulator is a second engine
that takes from a plan only what an operator gives an engine (placement costs, sequences, micro-batches,
token budget, KV capacity) and finds the highest Poisson rate at which the target share of requests meets
the SLO by simulating it (tessera.sim.knee). Where the two agree within ``TOLERANCE``, the figure rests on
more than the closed form's own assumptions.
"""

from __future__ import annotations

import statistics
from typing import Any

from tessera.errors import UserError
from tessera.plan.types import Plan, PoolPlan
from tessera.sim.knee import KneeConfig, find_knee

TOLERANCE = 0.10  # |simulator knee / planner goodput − 1| the check allows
KNEE = KneeConfig(rel_tol=0.03)  # bisection to 3% of the rate: a third of the tolerance


def knee_check(deployment: Plan | PoolPlan | None, goodput: float) -> dict[str, Any] | None:
    """The simulator's knee of a strategy's deployment beside the planner's goodput (output tokens/s or
    images/s); None where the strategy serves nothing."""
    if deployment is None or goodput <= 0:
        return None
    try:
        k = find_knee(deployment, config=KNEE)
    except (UserError, ValueError) as e:
        return {"planner_per_s": goodput, "error": str(e).splitlines()[0]}
    return {"planner_per_s": goodput, "knee_per_s": k.per_s, "ratio": k.per_s / goodput,
            "attainment": k.attainment, "rates": k.rates, "requests": k.requests, "wall_s": k.wall_s,
            "note": k.note or None}


def summary(checks: list[dict[str, Any] | None]) -> dict[str, Any]:
    """How many checks agree within TOLERANCE, and the spread of knee / planner."""
    ratios = [c["ratio"] for c in checks if c and c.get("ratio") is not None]
    if not ratios:
        return {"checked": 0}
    within = [r for r in ratios if abs(r - 1) <= TOLERANCE]
    return {"checked": len(ratios), "within": len(within), "tolerance": TOLERANCE, "min": min(ratios),
            "median": statistics.median(ratios), "max": max(ratios),
            "errors": sum(1 for c in checks if c and "error" in c)}


def summary_line(s: dict[str, Any]) -> str:
    if not s.get("checked"):
        return "Planner vs simulator: nothing to check."
    return (f"Planner vs simulator (SLO knee by bisection over simulated Poisson runs): {s['within']} of "
            f"{s['checked']} strategies within {s['tolerance']:.0%}; knee / planner {s['min']:.2f}–{s['max']:.2f}, "
            f"median {s['median']:.2f}" + (f"; {s['errors']} could not be simulated" if s.get("errors") else "")
            + ".")
