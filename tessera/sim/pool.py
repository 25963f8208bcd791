"""`simulate_pool(cells, workload, ...)`: replicas of different plans behind one router, with device
loss injected as data (``Failure``). `simulate(plan, replicas=N)` is the one-entry case; a PoolPlan's
``sim_cells()`` are the cells."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from tessera.contracts.enums import Objective
from tessera.contracts.plan import Plan
from tessera.contracts.slo import LatencyTargets
from tessera.errors import UserError, choices_error
from tessera.sim.adaptive import AdaptivePolicy, check_switchable
from tessera.sim.engine import FAIL, JOIN, EventLoop
from tessera.sim.failure import Cell, Failure, check_failures, failure_report, window_rates
from tessera.sim.metrics import SimResult, summarise
from tessera.sim.mixed import MixedReplica
from tessera.sim.model import PlanModel, SchedulerConfig
from tessera.sim.replica import LOST, Replica, RequestArrays
from tessera.sim.router import Router
from tessera.sim.workload import WorkloadSpec, generate

SERIES_WINDOWS = 100  # default window_s = simulated span / this
MAX_WINDOWS = 1_000_000  # a finer series is a mistake (and gigabytes of bins)


@dataclass(frozen=True)
class PerRequest:
    """Each request's arrival, first token and completion (NaN: never), and output length: what an SLO is
    judged on (tessera.sim.knee reads it without a warm-up share)."""

    arrival_s: np.ndarray
    first_s: np.ndarray
    done_s: np.ndarray
    output: np.ndarray


@dataclass(frozen=True)
class Run:
    """A finished simulation: the metrics plus what the trace and Gantt writers need."""

    result: SimResult
    models: dict[str, PlanModel] = field(hash=False)  # of the first cell entry
    trace: list[tuple] = field(hash=False)
    # mixed plans' stage spans (RequestArrays.spans)
    spans: list[tuple] = field(default_factory=list, hash=False)
    requests: PerRequest | None = field(default=None, hash=False)


def router_speed(pm: PlanModel) -> float:
    """What the router weighs a replica by: the traffic its plan says one copy serves at the SLO (the
    planner's goodput per replica, the share an operator following the plan gives each cell's load
    balancer weight), else its steady-state rate (cell_speed)."""
    p = pm.plan
    if p.goodput_per_s:
        return p.goodput_per_s / p.replicas
    return cell_speed(pm)


def cell_speed(pm: PlanModel) -> float:
    """A cell's steady-state rate for the router's weights: items (sequences or images) per second of
    the iterative phase at its max batch and the median sampled context (the step table's own figure,
    so cells planned by different tools are weighed the same way). A mixed plan: m groups of decodes only,
    each iteration alone taking its latency L and loading its busiest resource T: max(m·T, L) apart."""
    ctx = statistics.median(pm.iter.contexts)
    if not pm.mixed:
        it = pm.iter
        return pm.max_batch / it.time(pm.max_batch * it.tokens_per_item, ctx)[0]
    eng, route, times = pm.engine, pm.route, pm.stage_times
    assert eng is not None and route is not None and times is not None
    b = min(eng.group_seqs, eng.max_num_seqs)
    holds, lat = times.at(b, 0, ctx)
    per = [0.0] * len(route.resources)
    for (r, _), h in zip(route.stages, holds, strict=True):
        per[r] += h
    period = max(eng.microbatches * max(per, default=0.0), lat, 1e-12)
    return min(eng.max_num_seqs, b * eng.microbatches) / period


def _models(plan: Plan, cfg: SchedulerConfig, policy: AdaptivePolicy | None) -> dict[str, PlanModel]:
    models = {Objective.THROUGHPUT: PlanModel.build(plan, cfg)}
    if policy is not None:
        check_switchable(plan, policy.latency_plan)
        models[Objective.LATENCY] = PlanModel.build(policy.latency_plan, cfg)
        if models[Objective.LATENCY].image != models[Objective.THROUGHPUT].image:
            raise UserError("adaptive plans must both serve images or both serve tokens")
        if models[Objective.LATENCY].mixed != models[Objective.THROUGHPUT].mixed:
            raise UserError("adaptive plans must both be serving-model (mixed) plans or both two-phase plans")
    return models


def run_pool(cells: Sequence[Cell], workload: WorkloadSpec, *, seed: int = 0, slo: LatencyTargets | None = None,
             config: SchedulerConfig | None = None, failures: Sequence[Failure] = (),
             policy: AdaptivePolicy | None = None, window_s: float | None = None,
             trace_window_s: tuple[float, float] | None = None) -> Run:
    cfg = config or SchedulerConfig()
    cells = tuple(cells)
    failures = tuple(failures)
    if not cells:
        raise UserError("a pool needs at least one (plan, count) cell")
    for plan, n in cells:
        if not isinstance(plan, Plan) or not isinstance(n, int) or n < 1:
            raise UserError(f"pool cell ({type(plan).__name__}, {n!r}) must be (Plan, count >= 1)")
    if window_s is not None and not window_s > 0:
        raise UserError(f"window_s={window_s} must be > 0")
    built: dict[int, dict[str, PlanModel]] = {}  # by id(plan): a plan repeated in the pool is built once
    groups = [(plan, n) for plan, n in cells] + [c for f in failures for c in f.cells]
    for plan, _ in groups:
        if id(plan) not in built:
            built[id(plan)] = _models(plan, cfg, policy)
    if len({m[Objective.THROUGHPUT].image for m in built.values()}) > 1:
        raise UserError("a pool's plans must all serve images or all serve tokens")
    n_initial = sum(n * p.replicas for p, n in cells)
    joins = check_failures(failures, n_initial, [sum(n * p.replicas for p, n in f.cells) for f in failures])
    switch_s = max((policy.switch_cost_s(p) for p, _ in groups), default=0.0) if policy else 0.0
    start_mode = Objective.LATENCY if policy is not None else Objective.THROUGHPUT

    reqs = generate(workload, seed)
    st = RequestArrays(arrival=reqs.arrival_s.tolist(), prompt=reqs.prompt.tolist(),
                       output=reqs.output.tolist(), trace_window_s=trace_window_s)
    reps: list[Replica | MixedReplica] = []
    owner: list[int] = []  # replica -> group index
    for g, (plan, n) in enumerate(groups):
        for _ in range(n * plan.replicas):  # plan.replicas: identical cells inside the plan
            kind = MixedReplica if built[id(plan)][Objective.THROUGHPUT].mixed else Replica
            reps.append(kind(len(reps), st, built[id(plan)], start_mode, policy, switch_s))
            owner.append(g)
    speed = [router_speed(r.models[Objective.THROUGHPUT]) for r in reps]
    fastest = max(speed)
    router = Router(st, reps, [fastest / s for s in speed], [k < n_initial for k in range(len(reps))],
                    round_robin=cfg.router == "round_robin")
    events = []
    for f, (t_join, first) in zip(failures, joins, strict=True):
        events.append((f.at_s, FAIL, f.replica))
        n_new = sum(n * p.replicas for p, n in f.cells)
        events += [(t_join, JOIN, k) for k in range(first, first + n_new)]
    t0 = time.perf_counter()
    EventLoop(st, reps, router, tuple(events)).run()
    runtime_s = time.perf_counter() - t0

    busy = [(np.zeros(len(p.devices)), n * p.replicas) for p, n in groups]
    for rep, g in zip(reps, owner, strict=True):
        busy[g][0][:] += rep.device_busy_s()
        rep.flush_trace()
    done = np.array(st.done_s)
    t_first = float(reqs.arrival_s.min())
    end = float(np.nanmax(done)) if not np.isnan(done).all() else t_first
    # the series spans the arrivals and the failures too: when nothing completes (the only replica lost
    # before the first arrival) the span of completions is empty, and a window cut from it would be a
    # nanosecond (billions of windows between the failure and the first arrival)
    at = [f.at_s for f in failures]
    span = max([end, float(reqs.arrival_s.max()), *at]) - min([t_first, *at])
    win = window_s or max(span, 1e-9) / SERIES_WINDOWS
    if span / win > MAX_WINDOWS:
        raise UserError(f"--window-s {win:g} cuts the {span:g} s run into more than {MAX_WINDOWS:,} windows; "
                        f"valid: >= {span / MAX_WINDOWS:g} s")
    emit_s, emit_n = np.array(st.emit_s), np.array(st.emit_n, dtype=float)
    n_win = max(1, int(np.ceil((end - t_first) / win - 1e-9)))
    reports = tuple(failure_report(f, emit_s=emit_s, emit_n=emit_n, t0_s=t_first, end_s=end, window_s=win,
                                   requeued=router.requeued.get(f.replica, []), done_s=done) for f in failures)
    res = summarise(
        arrival=reqs.arrival_s, first_s=np.array(st.first_s), done_s=done, output=reqs.output.astype(float),
        lost=sum(1 for s in st.status if s == LOST), image=built[id(cells[0][0])][Objective.THROUGHPUT].image, slo=slo,
        usd_per_hour=sum(p.usd_per_hour * n for p, n in cells), busy_s=busy,
        preemptions=st.preemptions, switches=sum(r.switches for r in reps), replicas=n_initial,
        runtime_s=runtime_s, replica_completed=tuple(r.completed for r in reps), series_start_s=t_first,
        series_window_s=win,
        series_per_s=tuple(window_rates(emit_s, emit_n, t_first, win, n_win).tolist()), failures=reports)
    per = PerRequest(arrival_s=reqs.arrival_s, first_s=np.array(st.first_s), done_s=done,
                     output=reqs.output.astype(float))
    return Run(result=res, models=built[id(cells[0][0])], trace=st.trace, spans=st.spans, requests=per)


def simulate_pool(cells: Sequence[Cell], workload: WorkloadSpec, *, seed: int = 0, slo: LatencyTargets | None = None,
                  config: SchedulerConfig | None = None, router: str | None = None,
                  failures: Sequence[Failure] = (), window_s: float | None = None) -> SimResult:
    """Serve ``workload`` on a pool of cells ``[(plan, count), ...]`` (each plan itself ``plan.replicas``
    identical cells) behind one router, losing replicas as ``failures`` say. ``router`` overrides
    ``config.router`` (least_loaded | round_robin; least loaded weighs each replica by its speed).
    ``window_s``: width of the throughput series and failure windows (default: span / 100)."""
    cfg = config or SchedulerConfig()
    if router is not None:
        if router not in ("least_loaded", "round_robin"):
            raise choices_error("router", router, ("least_loaded", "round_robin"))
        cfg = replace(cfg, router=router)
    return run_pool(cells, workload, seed=seed, slo=slo, config=cfg, failures=failures, window_s=window_s).result
