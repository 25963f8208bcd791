"""Device loss as data, and what it costs: the throughput series, the dip and the recovery time.

A ``Failure`` is handed in by the caller (the simulator never re-plans): at ``at_s`` replica
``replica`` (a cell: the one holding the lost device) stops; after ``replan_s`` (the measured re-plan
time) the ``replacement`` cells join the pool. Replica indices: the cells of ``simulate_pool`` in
order (``count × plan.replicas`` consecutive replicas per entry), then each failure's replacement
replicas, in the order the failures are given.

Metrics (all on the windowed output series, see docs/sim.md "Failures"):
  series      output per window of ``window_s`` from the first arrival (tokens/s; images/s for images).
  pre         mean rate over the (up to) 10 whole windows before the failure, windows aligned to end at
              ``at_s``.
  steady      the new steady level: median rate of the whole windows aligned to start at the join time
              (``at_s + replan_s``; ``at_s`` without a replacement) and ending by the last completion.
  recovery_s  ``k · window_s`` for the first window ``k`` (aligned to start at ``at_s``) whose rate is at
              least 90% of ``steady``; None when no window qualifies or no steady level exists.
  dip         min rate of the windows from ``at_s`` up to and including that window, ÷ ``pre``.
  requeued_drained_s  from the failure until the last request it re-queued completes (None: none).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from tessera.contracts.plan import Plan, PoolPlan
from tessera.contracts.results import FailureReport
from tessera.errors import UserError

Cell = tuple[Plan, int]  # (plan, count): count copies of the plan, each itself plan.replicas replicas
PRE_WINDOWS = 10
RECOVERED = 0.9  # a window is recovered at this fraction of the new steady level


@dataclass(frozen=True, kw_only=True)
class Failure:
    at_s: float  # simulated time the device is lost
    replica: int  # index of the replica (cell) holding the lost device
    replacement: Cell | tuple[Cell, ...] | None = None  # cells that join after replan_s (None: none)
    replan_s: float = 0.0  # measured re-plan time the caller passes in

    def __post_init__(self) -> None:
        if not self.at_s >= 0 or not self.replan_s >= 0:
            raise UserError(f"failure at_s={self.at_s}, replan_s={self.replan_s} must both be >= 0")
        if self.replica < 0:
            raise UserError(f"failure replica={self.replica} must be >= 0")
        rep = self.replacement
        if rep is not None and len(rep) == 2 and isinstance(rep[0], Plan):
            object.__setattr__(self, "replacement", (rep,))  # one cell -> a tuple of cells
        for plan, n in self.cells:
            if not isinstance(plan, Plan) or not isinstance(n, int) or n < 1:
                raise UserError(f"failure replacement cell ({type(plan).__name__}, {n!r}) must be (Plan, count >= 1)")

    @property
    def cells(self) -> tuple[Cell, ...]:
        return self.replacement or ()  # normalised in __post_init__


def window_rates(emit_s: np.ndarray, emit_n: np.ndarray, start_s: float, window_s: float, n: int) -> np.ndarray:
    """Output per second in ``n`` windows ``[start + k·w, start + (k+1)·w)``."""
    edges = start_s + window_s * np.arange(n + 1)
    counts, _ = np.histogram(emit_s, bins=edges, weights=emit_n)
    return counts / window_s


def failure_report(f: Failure, *, emit_s: np.ndarray, emit_n: np.ndarray, t0_s: float, end_s: float,
                   window_s: float, requeued: list[int], done_s: np.ndarray) -> FailureReport:
    a = f.at_s
    join = a + f.replan_s if f.cells else a
    n_pre = max(0, min(PRE_WINDOWS, int((a - t0_s) / window_s + 1e-9)))  # none before the first arrival
    pre = float(window_rates(emit_s, emit_n, a - n_pre * window_s, window_s, n_pre).mean()) if n_pre else None
    n_post = max(0, int((end_s - a) / window_s + 1e-9))
    post = window_rates(emit_s, emit_n, a, window_s, n_post)
    n_steady = max(0, int((end_s - join) / window_s + 1e-9))
    steady = float(np.median(window_rates(emit_s, emit_n, join, window_s, n_steady))) if n_steady else None
    k_rec = None
    if steady is not None and steady > 0:
        ok = np.nonzero(post >= RECOVERED * steady)[0]
        k_rec = int(ok[0]) if ok.size else None
    upto = post[: (k_rec + 1) if k_rec is not None else None]
    low = float(upto.min()) if upto.size else None
    fin = done_s[requeued] if requeued else np.zeros(0)
    fin = fin[~np.isnan(fin)]  # a re-queued request that fits no surviving cell is lost, not drained
    drained = float(fin.max() - a) if fin.size else None
    return FailureReport(at_s=a, replica=f.replica, replan_s=f.replan_s, requeued=len(requeued), pre_per_s=pre,
                         min_per_s=low, steady_per_s=steady, dip=low / pre if pre and low is not None else None,
                         recovery_s=None if k_rec is None else k_rec * window_s, requeued_drained_s=drained)


def check_failures(failures: tuple[Failure, ...], n_initial: int, replicas_of: list[int]) -> list[tuple[float, int]]:
    """Validate the failure list against the pool; return (join time, first index) per failure's
    replacement. ``replicas_of[j]`` = replicas that failure j's replacement adds."""
    avail = {k: 0.0 for k in range(n_initial)}  # replica -> time it starts serving
    joins = []
    nxt = n_initial
    for j, f in enumerate(failures):
        if f.replica not in avail:
            raise UserError(f"failure {j} names replica {f.replica}, which does not exist or is already lost; "
                            f"valid: {sorted(avail)}")
        if f.at_s < avail[f.replica]:
            raise UserError(f"failure {j} at {f.at_s} s hits replica {f.replica} before it joins at "
                            f"{avail[f.replica]} s")
        del avail[f.replica]
        joins.append((f.at_s + f.replan_s, nxt))
        for k in range(nxt, nxt + replicas_of[j]):
            avail[k] = f.at_s + f.replan_s
        nxt += replicas_of[j]
    return joins


def replica_plan(plan: Plan | PoolPlan, replica: int, replicas: int = 1) -> Plan:
    """The cell plan serving replica index ``replica`` when ``plan`` runs ``replicas`` times: replicas are
    numbered cell by cell, each cell count × replicas × plan.replicas times (an index past the end is the
    simulator's error to give; the last cell's plan is returned)."""
    if isinstance(plan, Plan):
        return plan
    first = 0
    for c in plan.cells:
        first += c.count * replicas * c.plan.replicas
        if replica < first:
            return c.plan
    return plan.cells[-1].plan


def replica_loss(plan: Plan | PoolPlan, *, at_s: float, replica: int, spare: bool, replan_s: float,
                 replicas: int = 1) -> Failure:
    """Replica ``replica`` lost at ``at_s``; with ``spare``, one cell of the lost replica's plan joins after
    ``replan_s``, else the pool serves on with one replica fewer."""
    lost = replica_plan(plan, replica, replicas)
    cell = (replace(lost, replicas=1), 1) if spare else None
    return Failure(at_s=at_s, replica=replica, replacement=cell, replan_s=replan_s)
