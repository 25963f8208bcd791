"""`tessera run` as a function: capture, partition, serve on workers, verify, measure, predict."""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from tessera.contracts.enums import Objective
from tessera.contracts.results import RUN_CONTRACT_KEYS, RunFigures, RunResult
from tessera.errors import UserError
from tessera.graph import Role
from tessera.runtime.budget import check_job
from tessera.runtime.cluster import ClusterConfig, WorkerFailure
from tessera.runtime.device import torch_device
from tessera.runtime.measure import (
    LinkModel,
    charged_kernel_s,
    chrome_trace,
    measure,
    plan_step_s,
    predict_step_s,
    write_trace,
)
from tessera.runtime.partition import Partition
from tessera.runtime.placements import placements, plan_placements
from tessera.runtime.program import CapturedProgram
from tessera.runtime.recovery import RecoveringExecutor, placement_graphs, replan_with
from tessera.runtime.runner import RoundResult, SwitchPolicy, compare, phase_of, serve
from tessera.runtime.state import load_weights, weight_files
from tessera.runtime.steps import Job, LocalExecutor, capture_steps
from tessera.runtime.target import run_target
from tessera.text import plural


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    job: Job
    devices: tuple[str, ...]
    plans: dict[str, dict[str, tuple[int, ...]]] = field(hash=False)  # "latency"/"throughput" -> phase -> assign
    microbatches: int = 2  # throughput mode; latency mode runs one
    requests: int = 2
    threads: int = 1
    weights_dir: str | None = None
    trace: str | None = None
    recv_timeout_s: float = 5.0
    recover: bool = False  # a lost worker: re-plan onto the survivors and finish the requests (else fail)
    replan: str = "layer_split"  # placement for the survivors (PLACEMENTS name or "plan")
    transport: str = "auto"  # auto | gloo | nccl (tessera.runtime.device.choose_backend)

    def __post_init__(self) -> None:
        if self.microbatches < 1 or self.requests < 1:
            raise UserError(f"--microbatches={self.microbatches} and --requests={self.requests} must be >= 1")
        if set(self.plans) != {Objective.LATENCY, Objective.THROUGHPUT}:
            raise UserError(f"plans must be named latency and throughput, got {sorted(self.plans)}")
        if self.weights_dir is not None:
            weight_files(self.weights_dir)  # a wrong path is one line now, not a worker's failure later

    @property
    def policy(self) -> SwitchPolicy:
        return SwitchPolicy(throughput_microbatches=self.microbatches, threshold=self.microbatches)


@dataclass(frozen=True, kw_only=True)
class RunRequest:
    """What `tessera run` was asked: each field a flag of the same name (docs/runtime.md)."""

    target: str  # a plan file, or a model: zoo name, config.json, checkpoint folder (run_target)
    devices: tuple[str, ...]  # one worker each: cpu or cuda:N
    placement: str = "layer_split"  # for a model: a PLACEMENTS name or MILP
    microbatches: int = 2
    requests: int = 8  # one micro-batch each
    batch: int = 1  # sequences per micro-batch
    prompt: int = 8  # tokens per sequence
    output: int = 4  # tokens per sequence, greedy
    verify: bool = False  # a run whose outputs differ from single-process execution is an error
    weights_dir: str | None = None
    trace: str | None = None  # Chrome trace file to write
    recover: bool = False
    replan: str = "layer_split"
    transport: str = "auto"

    def __post_init__(self) -> None:
        if self.weights_dir is not None:
            weight_files(self.weights_dir)  # a wrong path: one line now, before capture and workers


@dataclass(frozen=True, kw_only=True)
class RunOutcome:
    """What `tessera run` did: the ``result`` (None when a worker was lost and not recovered) and the
    ``error`` that makes the command fail with exit status 1 (a lost worker; outputs that differ from
    single-process execution under ``verify``), one line without the "error: " prefix."""

    result: RunResult | None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.result is None and self.error is None:
            raise ValueError("RunOutcome without a result must say why (error)")


def run_job(req: RunRequest) -> RunOutcome:
    """`tessera run TARGET ...`: capture the steps, place them (the plan's placement, or the one named),
    serve the requests on the workers and compare with single-process execution."""
    plan = run_target(req.target)
    if plan is not None and len(plan.devices) != len(req.devices):
        raise ValueError(f"plan {req.target} has {plural(len(plan.devices), 'device')} but --devices names "
                         f"{len(req.devices)}")
    job = Job(model=req.target if plan is None else plan.model, batch=req.batch, seq=req.prompt,
              new_tokens=req.output)
    check_job(job)  # before any real weights exist: a model too big for this machine is one line
    programs = capture_steps(job)
    by_phase = plan_placements(plan, programs) if plan is not None else \
        placements(req.placement, placement_graphs(programs), len(req.devices), req.microbatches)
    spec = RunSpec(job=job, devices=req.devices,
                   plans={Objective.LATENCY: by_phase, Objective.THROUGHPUT: by_phase}, microbatches=req.microbatches, requests=req.requests, weights_dir=req.weights_dir,
                   trace=req.trace, recover=req.recover, replan=req.replan, transport=req.transport)
    try:
        out = run(spec, programs)
    except WorkerFailure as e:
        return RunOutcome(result=None, error=str(e))
    if req.verify and not out.verified:
        return RunOutcome(result=out, error="outputs differ from single-process execution "
                                            f"(max |diff| {out.max_abs_diff:.3g})")
    return RunOutcome(result=out)


def with_weights(programs: dict[str, CapturedProgram], directory: str) -> dict[str, CapturedProgram]:
    """The programs with their weights replaced by a checkpoint's (for the single-process reference)."""
    out = {}
    for key, p in programs.items():
        wanted = {p.name(b): p.graph.buffers[b] for b in p.initial if p.role(b) is Role.WEIGHT}
        got = load_weights(directory, wanted)
        init = {b: (torch.empty(0, dtype=torch.uint8).set_(got[p.name(b)]) if p.role(b) is Role.WEIGHT else t)
                for b, t in p.initial.items()}
        out[key] = replace(p, initial=init)
    return out


def run(spec: RunSpec, programs: dict[str, CapturedProgram] | None = None) -> RunResult:
    job = spec.job
    programs = programs or capture_steps(job)
    for mode, by_phase in spec.plans.items():
        for key, prog in programs.items():
            a = by_phase.get(phase_of(key))
            if a is None or len(a) != len(prog.ops):
                raise UserError(f"{mode} plan has no assignment of {len(prog.ops)} kernels for phase "
                                f"{phase_of(key)}; the plan must come from a capture of {job.model}")
    cfg = ClusterConfig(devices=spec.devices, threads=spec.threads, weights_dir=spec.weights_dir,
                        max_microbatches=spec.microbatches, recv_timeout_s=spec.recv_timeout_s,
                        transport=spec.transport)
    with RecoveringExecutor(programs, spec.plans, cfg, replan_with(spec.replan, spec.microbatches)) as rex:
        rounds, switches = serve(rex, job, programs, spec.requests, spec.policy,
                                 recover=rex.recover if spec.recover else None)
        resident, link = rex.cluster.resident, rex.cluster.link
    history, parts, final = rex.runs[-1]  # measured and predicted: the run's last cluster (after recovery)
    return summarise(spec, programs, Served(rounds=rounds, switches=switches, history=history, parts=parts,
                                            devices=final.devices, link=link, resident=resident,
                                            recoveries=rex.events, transport=cfg.backend))


@dataclass(frozen=True, kw_only=True)
class Served:
    """What serving on workers produced, however they were started (a Cluster, or torchrun's ranks)."""

    rounds: list[RoundResult]
    switches: list[str]
    history: list[dict[str, Any]]  # per step: key, plan, m, each worker's events (as Cluster.history)
    parts: dict[tuple[str, str], Partition]
    devices: tuple[str, ...]
    link: tuple[float, float, float, float] | None  # probe_link's measurement between workers 0 and 1
    resident: list[dict[str, int]]  # per worker: weight name -> bytes
    recoveries: list[str]
    transport: str


def summarise(spec: RunSpec, programs: dict[str, CapturedProgram], served: Served) -> RunResult:
    """The result: compare with single-process execution of the same rounds, measure, predict."""
    job, rounds, history, parts = spec.job, served.rounds, served.history, served.parts
    ref_programs = with_weights(programs, spec.weights_dir) if spec.weights_dir else programs
    local = LocalExecutor(ref_programs, torch_device(spec.devices[0]))  # single process on the workers' kind
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)  # exactness needs the workers' thread count
    try:
        ref_rounds, _ = serve(local, job, ref_programs, spec.requests, spec.policy)
    finally:
        torch.set_num_threads(threads)
    same, diff, tokens = compare(rounds, ref_rounds)
    meas = measure(history, parts)
    link_model = LinkModel(latency_s=0.0, bytes_per_s=1e12)  # one device: nothing travels
    if served.link:
        lat, bw, cpu_s, cpu_b = served.link
        link_model = LinkModel(latency_s=lat, bytes_per_s=bw, cpu_s=cpu_s, cpu_s_per_byte=cpu_b)
    med = statistics.median
    kernel_s = {k: [med(v) if v else 0.0 for v in ks] for k, ks in local.kernel_s.items()}
    overhead_s = {k: med(v) if v else 0.0 for k, v in local.overhead_s.items()}
    plan_pred, event_pred = [], []
    for h in history:
        part, m = parts[(h["key"], h["plan"])], h["m"]
        ks = charged_kernel_s(part, kernel_s[h["key"]], link_model, m * overhead_s[h["key"]])
        plan_pred.append(plan_step_s(programs[h["key"]].graph, part, ks, link_model, m))
        event_pred.append(predict_step_s(part, ks, link_model, m))
    skip = 1 if len(history) > 1 else 0  # the first step pays one-off warm-up (allocator, first dispatch)
    if spec.trace:
        names = {k: [o.func for o in p.ops] for k, p in programs.items()}
        write_trace(spec.trace, chrome_trace(history, parts, names))
    tokens_total = sum(r.processed_tokens for r in rounds)
    out = {
        "devices": tuple(served.devices),
        "microbatches": spec.microbatches,
        "verified": bool(same and tokens is not False),
        "max_abs_diff": diff,
        "tokens_identical": tokens,
        "measured_step_s": statistics.mean(meas.step_s[skip:]),
        "predicted_step_s": statistics.mean(plan_pred[skip:]),
        "throughput_tokens_per_s": tokens_total / sum(meas.step_s),
        "link_bytes": sum(meas.link_bytes.values()),
        # beyond the contract
        "model": job.model,
        "steps": len(history),
        "switches": served.switches,
        "recoveries": served.recoveries,
        "overlap": meas.overlap,
        "wait_s": meas.wait_s,
        "busy_s": meas.busy_s,
        "kernels_by_worker": kernels_by_worker(history, len(served.devices)),
        "transport": served.transport,
        "link_bytes_by_link": {f"{a}->{b}": n for (a, b), n in sorted(meas.link_bytes.items())},
        "predicted_event_step_s": statistics.mean(event_pred[skip:]),
        "measured_steps_s": meas.step_s,
        "predicted_steps_s": plan_pred,
        "link_model": {"latency_s": link_model.latency_s, "bytes_per_s": link_model.bytes_per_s,
                       "cpu_s": link_model.cpu_s, "cpu_s_per_byte": link_model.cpu_s_per_byte},
        "dispatch_s_per_op": {k: med(v) for k, v in local.dispatch_s.items() if v},
        "step_overhead_s": overhead_s,
        "resident_weight_bytes": [sum(r.values()) for r in served.resident],
        "tokens": [t.tolist() for r in rounds for t in r.tokens],
        "prediction_source": ("tessera.plan evaluation + the synchronous chain formula max(m*T, latency + "
                              "(m-1)*T) over CPU-profile kernel times (single process, 1 thread, the "
                              "runtime's dispatch path) and the gloo link measured at start-up (latency, "
                              "bandwidth, CPU per message)"),
    }
    return RunResult(**{k: out[k] for k in RUN_CONTRACT_KEYS},
                     extra=RunFigures(**{k: v for k, v in out.items() if k not in RUN_CONTRACT_KEYS}))


def kernels_by_worker(history: list[dict[str, Any]], devices: int) -> list[int]:
    """Kernel launches each worker ran over the run (every micro-batch of every step)."""
    counts = [0] * devices
    for h in history:
        for d, w in enumerate(h["workers"]):
            counts[d] += len(w["kernels"])
    return counts


def share_line(*, devices: Sequence[str], kernels_by_worker: list[int], busy_s: list[float]) -> str:
    """Each worker's share of the kernels and of the busy time; a worker given nothing is named idle (a
    placement may rightly keep a small model on one device: transfers would cost more than they save)."""
    kernels, busy = kernels_by_worker, busy_s
    shares = [f"worker {d} ({dev}) {k / max(1, sum(kernels)):.0%} of kernels, {b / max(1e-12, sum(busy)):.0%} "
              f"of busy time" for d, (dev, k, b) in enumerate(zip(devices, kernels, busy, strict=True))]
    idle = [str(d) for d, k in enumerate(kernels) if k == 0]
    note = (f"; worker{'s' if len(idle) > 1 else ''} {', '.join(idle)} idle: the placement gives "
            f"{'them' if len(idle) > 1 else 'it'} no kernel" if idle else "")
    return "share: " + "; ".join(shares) + note


def render(out: RunResult, *, as_json: bool) -> str:
    """`tessera run`'s output: the JSON contract (the rest under "extra"), or a short summary."""
    if as_json:
        return json.dumps(out.to_json())
    x = out.extra
    lines = [f"{x.model} on {','.join(out.devices)}: {plural(x.steps, 'step')}, "
             f"verified={out.verified} (max |diff| {out.max_abs_diff:.3g}, "
             f"tokens identical {out.tokens_identical})",
             f"step {out.measured_step_s * 1e3:.2f} ms measured, {out.predicted_step_s * 1e3:.2f} ms "
             f"predicted; {out.throughput_tokens_per_s:.0f} tokens/s; {out.link_bytes} link bytes; "
             f"overlap {x.overlap:.0%}",
             share_line(devices=out.devices, kernels_by_worker=x.kernels_by_worker, busy_s=x.busy_s)]
    return "\n".join([*lines, *(f"switch: {s}" for s in x.switches)])
