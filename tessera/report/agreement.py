"""The planner's goodput against the simulator's SLO knee, summarised: the check `tessera compare` and
`tessera evaluate` run on every strategy they score (tessera.study.agreement.knee_check) is read here.

The planner works its goodput out in closed form (tessera.plan.model.knee); the simulator is a second engine
that takes from a plan only what an operator gives an engine (placement costs, sequences, micro-batches,
token budget, KV capacity) and finds the highest Poisson rate at which the target share of requests meets
the SLO by simulating it (tessera.sim.knee). Where the two agree within ``TOLERANCE``, the figure rests on
more than the closed form's own assumptions.
"""

from __future__ import annotations

import statistics

from tessera.contracts.study import CheckSummary, KneeCheck

TOLERANCE = 0.10  # |simulator knee / planner goodput − 1| the check allows


def summary(checks: list[KneeCheck | None]) -> CheckSummary:
    """How many checks agree within TOLERANCE, and the spread of knee / planner."""
    ratios = [c.ratio for c in checks if c is not None and c.ratio is not None]
    if not ratios:
        return CheckSummary(checked=0)
    within = [r for r in ratios if abs(r - 1) <= TOLERANCE]
    return CheckSummary(checked=len(ratios), within=len(within), tolerance=TOLERANCE, min=min(ratios),
                        median=statistics.median(ratios), max=max(ratios),
                        errors=sum(1 for c in checks if c is not None and c.error is not None))


def summary_line(s: CheckSummary) -> str:
    if not s.checked:
        return "Planner vs simulator: nothing to check."
    return (f"Planner vs simulator (SLO knee by bisection over simulated Poisson runs): {s.within} of "
            f"{s.checked} strategies within {s.tolerance:.0%}; knee / planner {s.min:.2f}–{s.max:.2f}, "
            f"median {s.median:.2f}" + (f"; {s.errors} could not be simulated" if s.errors else "")
            + ".")
