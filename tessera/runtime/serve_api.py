"""`tessera serve-run` as a function: a typed spec in, a typed result out.

Capture the batch-1 programs the workload needs, place them (a Plan's assignment carried onto them, or a
named placement), serve the stream on worker processes under the chosen schedule (and the other one with
``compare_sync``), check every request against its single-process reference, and predict the same run
from CPU profiles of the programs (the planner's serving-model formula, and tessera.sim on a Plan built
from the same profiles).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from tessera.errors import UserError, choices_error
from tessera.plan.types import Plan
from tessera.runtime.cluster import Cluster, ClusterConfig, WorkerFailure
from tessera.runtime.device import torch_device
from tessera.runtime.measure import LinkModel
from tessera.runtime.placements import MILP, PLACEMENTS, carry_over, placements
from tessera.runtime.program import Program
from tessera.runtime.recovery import replan_with
from tessera.runtime.repeats import paired_ratio
from tessera.runtime.runner import phase_of
from tessera.runtime.serve_calibrate import in_run_times
from tessera.runtime.serve_predict import (
    KernelTimes,
    predicted_period_s,
    predicted_tokens_per_s,
    profile,
    profile_plan,
    profiled_times,
    run_scheduler,
    simulated,
    step_costs,
    stream_mix,
)
from tessera.runtime.serving import (
    PLAN,
    Fault,
    Request,
    ServeConfig,
    StreamResult,
    by_key,
    capture_serving,
    check,
    group_graphs,
    key_order,
    latency_stats,
    make_requests,
    reference,
    serve_partitions,
    serve_stream,
    serve_trace,
    serving_keys,
    start_cluster,
    utilisation,
    warmup_requests,
)
from tessera.runtime.steps import LocalExecutor
from tessera.sim.workload import WorkloadSpec, generate

log = logging.getLogger("tessera.runtime")


@dataclass(frozen=True, kw_only=True)
class ServeRunSpec:
    model: str  # zoo tiny name (or the Plan's model)
    devices: tuple[str, ...]
    workload: WorkloadSpec
    serve: ServeConfig = ServeConfig()
    placement: str = "layer_split"  # when no plan is given
    plan: Plan | None = field(default=None, hash=False)
    compare_sync: bool = False
    seed: int = 0
    recover: bool = False  # a lost worker: re-plan onto the survivors, resume the requests in flight
    replan: str = "layer_split"  # placement for the survivors (a lone survivor runs everything)
    fault: Fault | None = None  # injected: kill a worker when a given request is admitted
    repeats: int = 1  # serve the stream this many times per schedule; figures from the median run
    trace: str | None = None  # Chrome trace of the (median) run here; the simulator's beside it (.sim.json)

    def __post_init__(self) -> None:
        if len(self.devices) < 1:
            raise UserError("--devices is empty; give one or more of: cpu")
        ClusterConfig(devices=self.devices, transport="gloo")  # unknown, mixed or absent devices: one line, now
        if self.repeats < 1:
            raise UserError(f"repeats={self.repeats} must be >= 1")
        if self.replan not in (*PLACEMENTS, MILP):
            raise choices_error("replan placement", self.replan, [*PLACEMENTS, MILP])
        if self.plan is not None and len(self.plan.devices) != len(self.devices):
            raise UserError(f"the plan has {len(self.plan.devices)} devices but --devices names {len(self.devices)}")


@dataclass(frozen=True, kw_only=True)
class ServeRunResult:
    model: str
    devices: tuple[str, ...]
    placement: str
    schedule: str
    requests: int
    completed: int
    lost: int
    verified: bool  # every logit bit-identical to the per-request single-process reference
    tokens_identical: bool
    max_abs_diff: float
    measured_throughput_tokens_per_s: float
    predicted_throughput_tokens_per_s: float | None
    simulated_throughput_tokens_per_s: float | None
    sync_throughput_tokens_per_s: float | None
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not 0 <= self.completed <= self.requests or self.lost < 0:
            raise ValueError(f"completed={self.completed}, lost={self.lost} of {self.requests} requests")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def summary(self) -> str:
        sync = (f", sync {self.sync_throughput_tokens_per_s:.0f}" if self.sync_throughput_tokens_per_s else "")
        ratio = self.extra.get("async_over_sync")
        if ratio and ratio["lower"] is not None:  # how sure the gain is: the bound, not the median pair
            sync += (f" (async/sync {ratio['geomean']:.2f}x over {len(ratio['pairs'])} paired repeats, "
                     f"{ratio['confidence']:.0%} lower bound {ratio['lower']:.2f}x)")
        pred = "; ".join(f"{w} {v:.0f}" for w, v in (("predicted", self.predicted_throughput_tokens_per_s),
                                                      ("simulated", self.simulated_throughput_tokens_per_s)) if v)
        return "\n".join([
            f"{self.model} on {','.join(self.devices)} ({self.placement}, {self.schedule}): "
            f"{self.completed}/{self.requests} requests, lost {self.lost}, verified={self.verified} "
            f"(tokens identical {self.tokens_identical}, max |diff| {self.max_abs_diff:.3g})",
            f"throughput {self.measured_throughput_tokens_per_s:.0f} tokens/s measured{sync}"
            f"{'; ' + pred if pred else ''}",
            f"TTFT p50 {_ms(self.ttft_s['p50'])} p99 {_ms(self.ttft_s['p99'])}; "
            f"TPOT p50 {_ms(self.tpot_s['p50'])} p99 {_ms(self.tpot_s['p99'])}"])


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def plan_assignments(plan: Plan, programs: dict[str, Program]) -> dict[str, tuple[int, ...]]:
    """Each program's assignment of its eager ops: the plan's kernels aligned with it (a serving-model plan's
    "mixed" iteration aligns with both prefill and decode; otherwise the plan's phase of the program)."""
    from tessera.capture import capture_model
    from tessera.capture.fuse import unfuse

    graphs = group_graphs(programs)
    mixed = None
    if "mixed" in plan.phases:
        from tessera.plan.serve import plan_graph

        mixed = plan_graph(plan), tuple(plan.phases["mixed"].assignment)
    out: dict[str, tuple[int, ...]] = {}
    for name, g in graphs.items():
        if mixed is not None:
            out[name] = unfuse(g, carry_over(mixed[0], mixed[1], g))
            continue
        ph = phase_of(name.split("#")[0])
        pp = plan.phases.get(ph)
        if pp is None:
            raise UserError(f"plan for {plan.model} has no {ph} phase (phases: {', '.join(sorted(plan.phases))})")
        shape = {k: v for k, v in pp.graph_shape.items() if k in ("batch", "seq", "context") and v}
        out[name] = unfuse(g, carry_over(capture_model(plan.model, ph, **shape), tuple(pp.assignment), g))
    return by_key(programs, out)


def serve_schedules(spec: ServeRunSpec, programs: dict[str, Program], assign: dict[str, tuple[int, ...]],
                    requests: list[Request], schedules: list[str]
                    ) -> tuple[dict[str, list[StreamResult]], float, Any]:
    """The same stream served under each schedule on one cluster (one placement, weights loaded once; the
    fault, if any, during the first), ``spec.repeats`` times in ABBA order (a shared machine's load drifts:
    alternating keeps it from favouring one schedule); returns each schedule's runs, the cluster's start-up
    seconds and its link."""
    out: dict[str, list[StreamResult]] = {s: [] for s in schedules}
    order = [s for r in range(spec.repeats) for s in (schedules if r % 2 == 0 else schedules[::-1])]
    t0 = time.monotonic()
    clusters = [start_cluster(programs, assign, spec.devices, spec.serve.slots)]
    devices = [spec.devices]

    def recover(failure: WorkerFailure) -> Cluster:
        survivors = tuple(d for i, d in enumerate(devices[-1]) if i != failure.rank)
        if failure.rank < 0 or not survivors:
            raise failure
        again = replan_with(spec.replan, spec.serve.microbatches)(group_graphs(programs), len(survivors))
        clusters.append(start_cluster(programs, by_key(programs, again), survivors, spec.serve.slots))
        devices.append(survivors)
        clusters[-1].start()
        log.warning("recovery: %s; re-planned (%s) onto %d surviving workers", failure, spec.replan, len(survivors))
        return clusters[-1]

    try:
        clusters[0].start()
        start_s, link = time.monotonic() - t0, clusters[0].link
        serve_stream(clusters[0], programs, warmup_requests(requests), spec.serve)  # not measured
        for i, sched in enumerate(order):
            cfg = replace(spec.serve, schedule=sched)
            out[sched].append(serve_stream(clusters[-1], programs, requests, cfg, fault=spec.fault if i == 0 else None,
                                      recover=recover if spec.recover else None))
    finally:
        for c in clusters:
            c.close()
    return out, start_s, link


def sim_trace_path(path: str) -> str:
    return str(Path(path).with_suffix("")) + ".sim.json"


def median_run(runs: list[StreamResult]) -> StreamResult:
    """The run of median throughput (the lower middle one of an even count)."""
    ranked = sorted(runs, key=lambda r: latency_stats(r)["throughput_tokens_per_s"])
    return ranked[(len(ranked) - 1) // 2]


def _link_model(link: Any, cpu: bool = True) -> LinkModel:
    """The link measured at start-up (``cpu``: with the process CPU time a message costs each end; without,
    when the kernel times already hold it, as the run's own events do)."""
    if not link:
        return LinkModel(latency_s=0.0, bytes_per_s=1e12)  # one device: nothing travels
    lat, bw, cpu_s, cpu_b = link
    return LinkModel(latency_s=lat, bytes_per_s=bw, cpu_s=cpu_s if cpu else 0.0, cpu_s_per_byte=cpu_b if cpu else 0.0)


def in_run_link(link: Any, times: KernelTimes) -> LinkModel:
    """The start-up probe's link at the latency the run's own transfers met (``KernelTimes.link_latency_s``),
    without the CPU per message (the run's kernel and dispatch times already hold it)."""
    lm = _link_model(link, cpu=False)
    if not link or times.link_latency_s is None:
        return lm
    return replace(lm, latency_s=times.link_latency_s, source="probed at start-up; latency as the run's transfers met it")


def predict_one(spec: ServeRunSpec, programs: dict[str, Program], parts: dict[tuple[str, str], Any],
                requests: list[Request], times: KernelTimes, link: LinkModel, schedule: str,
                trace: str | None = None) -> dict[str, Any]:
    """The planner's serving-model figures and tessera.sim's for one schedule, from one set of kernel times."""
    m = spec.serve.microbatches if schedule == "async" else 1
    costs = step_costs(programs, parts, PLAN, times, link, group=math.ceil(spec.serve.slots / m))
    mix = stream_mix(costs, requests)
    chunk = spec.serve.chunk_tokens or max(r.prompt.shape[1] for r in requests)
    scheduler = run_scheduler(spec.serve.slots, m, spec.serve.prefills_per_iteration, chunk)
    over = times.overheads
    sim = simulated(profile_plan(spec.model, mix, spec.serve.slots, m, over), spec.workload, spec.seed, scheduler,
                    trace)
    return {"kernel_times": times.source, "dispatch_s": times.dispatch_s, "link_latency_s": link.latency_s,
            "control_s": over.control_s,
            "step_gap_s": over.gap_s, "step_sd_s": over.step_sd_s, "control_sd_s": over.control_sd_s,
            "throughput_tokens_per_s": predicted_tokens_per_s(mix, spec.workload, spec.serve.slots, m, over),
            "tpot_s": predicted_period_s(mix, spec.serve.slots, m, over),
            "simulated": sim, "mean_step": {"busy_s": mix.step.busy_s, "latency_s": mix.step.latency_s}}


def predictions(spec: ServeRunSpec, programs: dict[str, Program], assign: dict[str, tuple[int, ...]],
                requests: list[Request], local: LocalExecutor, link: Any, runs: dict[str, StreamResult]
                ) -> dict[str, Any]:
    """Per schedule served: the serving model and tessera.sim over (a) the kernel times that schedule's
    own run measured (``in_run``, the headline figures: same load as the measurement) and (b) the
    single-process CPU profile (``profile``: independent of the run, but taken at another moment's load)."""
    parts = serve_partitions(programs, assign, len(spec.devices))
    prof = profiled_times(local)
    out: dict[str, Any] = {}
    for sched, run in runs.items():
        main = sched == spec.serve.schedule
        trace = sim_trace_path(spec.trace) if spec.trace and main else None
        times = in_run_times(run.history, programs, prof)
        out[sched] = {"in_run": predict_one(spec, programs, parts, requests, times, in_run_link(link, times), sched,
                                            trace),
                      "profile": predict_one(spec, programs, parts, requests, prof, _link_model(link), sched)}
    return out


def speedup(tput: dict[str, list[float]]) -> dict[str, Any] | None:
    """Async over sync from the paired repeats (each repeat ran both back to back): every pair's ratio,
    their geometric mean and its one-sided 90% lower bound (None from one repeat); None without sync or
    where a run generated no tokens."""
    if "sync" not in tput or "async" not in tput:
        return None
    if not all(x > 0 for x in (*tput["async"], *tput["sync"])):  # a run that generated nothing: no ratio
        return None
    return asdict(paired_ratio(tput["async"], tput["sync"]))


def serve_run(spec: ServeRunSpec) -> ServeRunResult:
    requests = make_requests(spec.model, generate(spec.workload, spec.seed), spec.seed, spec.serve.chunk_tokens)
    programs = capture_serving(spec.model, serving_keys(requests), spec.seed)
    if spec.plan is not None:
        assign, placement = plan_assignments(spec.plan, programs), f"plan ({spec.plan.strategy})"
    else:
        graphs = group_graphs(programs)
        assign = by_key(programs, placements(spec.placement, graphs, len(spec.devices), spec.serve.microbatches))
        placement = spec.placement
    schedules = [spec.serve.schedule]
    if spec.compare_sync and spec.serve.schedule != "sync":
        schedules.append("sync")
    runs, start_s, link = serve_schedules(spec, programs, assign, requests, schedules)
    results = {s: median_run(rs) for s, rs in runs.items()}
    main = results[spec.serve.schedule]
    t0 = time.monotonic()
    local = LocalExecutor(programs, torch_device(spec.devices[0]))  # the workers' device kind
    ref = reference(programs, requests, local=local)
    ref_s = time.monotonic() - t0
    if spec.trace:
        parts = serve_partitions(programs, assign, len(spec.devices))
        Path(spec.trace).write_text(json.dumps(serve_trace(main, programs, parts)))
    profile(local, programs)
    pred = predictions(spec, programs, assign, requests, local, link, results)
    head = pred[spec.serve.schedule]["in_run"]
    same, diff, tokens = True, 0.0, True
    for r in (r for rs in runs.values() for r in rs):
        s, d, t = check(r, ref)
        same, diff, tokens = same and s, max(diff, d), tokens and t
    stats = latency_stats(main)
    sync = results.get("sync")
    completed = min(sum(1 for s in r.served if s.done) for rs in runs.values() for r in rs)  # the worst run
    tput = {s: [latency_stats(r)["throughput_tokens_per_s"] for r in rs] for s, rs in runs.items()}
    extra = {"stats": stats, "sync_stats": latency_stats(sync) if sync else None,
             "cluster_start_s": start_s, "reference_s": ref_s, "link": link,
             "slots": spec.serve.slots, "microbatches": spec.serve.microbatches,
             "workload": {"kind": spec.workload.kind, "rate_per_s": spec.workload.rate_per_s,
                          "prompt": str(spec.workload.prompt), "output": str(spec.workload.output)},
             "programs": sorted(programs, key=key_order),
             "tokens": {s.request.rid: s.tokens for s in main.served},
             "mixed_iterations": sum(1 for h in main.history
                                     if len({phase_of(k) for k in h["keys"]}) > 1),
             "load_avg": os.getloadavg(), "prediction": pred, "recoveries": [x for rs in runs.values() for r in rs for x in r.recoveries],
             "runs_throughput_tokens_per_s": tput,
             "runs_load_avg": {s: [r.load_avg for r in rs] for s, rs in runs.items()},
             "async_over_sync": speedup(tput),
             "utilisation": {s: utilisation(r) for s, r in results.items()},
             "prediction_source": "serving model period (the expectation of max(m*T, L + control) over the run's "
                                  "spreads; the max itself for one group) over each program's kernel times taken "
                                  "from the same (median) run's worker events (per-kernel means, per-device time "
                                  "outside kernels per kernel, the driver's control round trip, the spreads of "
                                  "each device's step and of the round trip), the partitions and the gloo link "
                                  "probed at start-up at the latency the run's transfers met; simulated: tessera.sim on a "
                                  "mixed-phase Plan priced by the same costs; prediction.<schedule>.profile: the "
                                  "same from the single-process CPU profile instead"}
    return ServeRunResult(
        model=spec.model, devices=spec.devices, placement=placement, schedule=spec.serve.schedule,
        requests=len(requests), completed=completed, lost=len(requests) - completed, verified=same and tokens,
        tokens_identical=tokens, max_abs_diff=diff, measured_throughput_tokens_per_s=stats["throughput_tokens_per_s"],
        predicted_throughput_tokens_per_s=head["throughput_tokens_per_s"],
        simulated_throughput_tokens_per_s=head["simulated"]["throughput_tokens_per_s"],
        sync_throughput_tokens_per_s=latency_stats(sync)["throughput_tokens_per_s"] if sync else None,
        ttft_s=stats["ttft_s"], tpot_s=stats["tpot_s"], extra=extra)


__all__ = ["ServeRunResult", "ServeRunSpec", "WorkerFailure", "in_run_link", "plan_assignments", "serve_run",
           "speedup"]
