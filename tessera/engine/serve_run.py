"""`tessera serve-run` as a function: a request stream served by the engine on worker processes, measured,
checked against the single-process engine and predicted by the planner and the simulator.

The stream: tessera.sim's workloads (arrival times, prompt and output lengths, seeded), prompt token ids
drawn per request (``numpy.random.default_rng(seed + 1).integers(0, vocab)``), greedy, EOS ignored, each
request generating its output length; or a workload file (``bench/workloads/*.json``: explicit arrivals,
prompt ids and output lengths). Figures: output tokens per second from the first arrival to the last
completion (as tessera.sim counts it), TTFT and TPOT percentiles, the driver's host time per iteration
(scheduling, inputs, sending; taking the logits, sampling, stop checks). ``verify``: the same requests
through the single-process engine, greedy tokens compared. ``predict``: the placement priced by each worker
kind's profile (``profile``) and scored by tessera.plan (``placement.plan_engine``), and that Plan served
the same workload by tessera.sim.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tessera.contracts.plan import Plan
from tessera.cost.calibrate import default_cost_model
from tessera.engine.adaptive import AdaptiveSettings, switcher_for
from tessera.engine.cluster import ClusterSettings
from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.devices import WorkerKind
from tessera.engine.engine import Engine, load_engine, resolve_dtype
from tessera.engine.loader import ModelSource, open_model
from tessera.engine.memory import available_bytes, check_memory, memory_need
from tessera.engine.placement import choose, node_names, plan_engine
from tessera.engine.profile import ProfileCost, measure_link, profile_kinds
from tessera.engine.routes import Placement
from tessera.engine.serve import Arrival, DriveLog, Fault, Timing, WorkerPool, drive
from tessera.engine.shard import build_share
from tessera.engine.tokenizer import tokenizer_for
from tessera.errors import UserError, read_text
from tessera.hardware import LinkSpec
from tessera.plan import Traffic
from tessera.runtime.placements import GLOO_LOCAL, MILP
from tessera.sim.api import run as sim_run
from tessera.sim.model import SchedulerConfig
from tessera.sim.workload import LengthSpec, WorkloadSpec, generate


@dataclass(frozen=True, kw_only=True)
class Stream:
    """What is served: the arrivals, and the simulator's description of the same workload."""

    arrivals: tuple[Arrival, ...]
    workload: WorkloadSpec
    seed: int


def generated_stream(w: WorkloadSpec, seed: int, vocab: int) -> Stream:
    reqs = generate(w, seed)
    rng = np.random.default_rng(seed + 1)
    arrivals = tuple(
        Arrival(arrival_s=float(t), prompt_ids=tuple(int(x) for x in rng.integers(0, vocab, int(p))),
                params=SamplingParams(max_tokens=int(o), ignore_eos=True))
        for t, p, o in zip(reqs.arrival_s, reqs.prompt, reqs.output, strict=True))
    return Stream(arrivals=arrivals, workload=w, seed=seed)


def file_stream(path: str | Path, vocab: int) -> Stream:
    """A workload file: {"generator": {kind, rate_per_s, requests, prompt, output, seed}, "requests":
    [{"arrival_s", "prompt_ids", "output_len"}, ...]}; one line naming what is wrong with it."""
    text = read_text(path, "workload file")
    try:
        doc = json.loads(text)
        g = doc["generator"]
        rate = float(g.get("rate_per_s", 0))
        w = WorkloadSpec(kind=g["kind"], requests=int(g["requests"]), rate_per_s=rate,
                         prompt=LengthSpec.parse(str(g["prompt"])), output=LengthSpec.parse(str(g["output"])))
        arrivals = tuple(
            Arrival(arrival_s=float(r["arrival_s"]), prompt_ids=tuple(int(x) for x in r["prompt_ids"]),
                    params=SamplingParams(max_tokens=int(r["output_len"]), ignore_eos=True))
            for r in doc["requests"])
    except UserError as e:
        raise UserError(f"workload file {path}: {e}") from None
    except KeyError as e:
        raise UserError(f"workload file {path}: missing field {e}; it needs generator.{{kind, requests, "
                        f"prompt, output}} and requests[].{{arrival_s, prompt_ids, output_len}}") from None
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise UserError(f"workload file {path}: {e}") from None
    bad = [i for a in arrivals for i in a.prompt_ids if not 0 <= i < vocab]
    if bad:
        raise UserError(f"workload file {path}: prompt id {bad[0]} outside the model's vocabulary "
                        f"0..{vocab - 1}")
    return Stream(arrivals=arrivals, workload=w, seed=int(g.get("seed", 0)))


@dataclass(frozen=True, kw_only=True)
class ServeRunSpec:
    model: str  # zoo name or model directory
    kinds: tuple[WorkerKind, ...]
    placement: str = "layer_split"  # a rule, "plan", or a PLAN.json
    workload: WorkloadSpec | None = None
    workload_file: str | None = None
    config: EngineConfig
    dtype: str = "auto"
    load_format: str = "dummy"
    seed: int = 0
    verify: bool = False
    recover: bool = False
    replan: str = "layer_split"
    fault: Fault | None = None
    predict: bool = False
    settings: ClusterSettings = ClusterSettings()
    adaptive: AdaptiveSettings | None = None  # --adaptive: switch with a latency schedule by queue depth

    def __post_init__(self) -> None:
        if self.adaptive is not None and (self.recover or self.fault is not None):
            raise UserError("--adaptive runs without --recover / --kill-at (a lost worker would leave the "
                            "other schedule's pool behind)")
        if (self.workload is None) == (self.workload_file is None):
            raise UserError("give a workload (--workload ...) or a --workload-file, not both")
        if self.fault is not None and not (0 <= self.fault.rank < len(self.kinds)):
            raise UserError(f"--kill-rank {self.fault.rank}: valid 0..{len(self.kinds) - 1}")
        if self.fault is not None and self.fault.rank == 0 and len(self.kinds) == 1 and self.recover:
            raise UserError("--kill-rank 0 of one worker leaves no survivor to recover onto; give two "
                            "devices")


@dataclass(frozen=True, kw_only=True)
class ServeRunResult:
    model: str
    devices: tuple[str, ...]
    placement: str
    requests: int
    completed: int
    lost: int
    verified: bool | None  # greedy tokens equal the single-process engine's (None: not checked)
    throughput_tokens_per_s: float
    ttft_s: dict[str, float | None]
    tpot_s: dict[str, float | None]
    host_ms_per_iteration: dict[str, float | None]
    predicted_throughput_tokens_per_s: float | None = None
    simulated_throughput_tokens_per_s: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not 0 <= self.completed <= self.requests or self.lost != self.requests - self.completed:
            raise ValueError(f"completed={self.completed}, lost={self.lost} of {self.requests} requests")

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    def summary(self) -> str:
        figures = (("planner", self.predicted_throughput_tokens_per_s),
                   ("simulator", self.simulated_throughput_tokens_per_s))
        pred = "; ".join(f"{w} {v:.1f}" for w, v in figures if v)
        h = self.host_ms_per_iteration
        return "\n".join([
            f"{self.model} on {','.join(self.devices)} ({self.placement}): {self.completed}/{self.requests} "
            f"requests, lost {self.lost}, verified={self.verified}",
            f"throughput {self.throughput_tokens_per_s:.1f} output tokens/s measured"
            + (f" ({pred})" if pred else ""),
            f"TTFT p50 {_ms(self.ttft_s['p50'])} p99 {_ms(self.ttft_s['p99'])}; TPOT p50 "
            f"{_ms(self.tpot_s['p50'])} p99 {_ms(self.tpot_s['p99'])}; host per iteration mean "
            f"{_num(h['mean'])} ms, p99 {_num(h['p99'])} ms"])


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.1f} ms"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def percentiles(xs: list[float]) -> dict[str, float | None]:
    """p50 and p99 (nearest rank), None for no values."""
    if not xs:
        return {"p50": None, "p99": None}
    s = sorted(xs)
    return {"p50": s[max(0, math.ceil(0.5 * len(s)) - 1)], "p99": s[max(0, math.ceil(0.99 * len(s)) - 1)]}


def check_host_memory(source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                      kinds: tuple[WorkerKind, ...]) -> None:
    """Before anything is placed or allocated: CPU workers share this host, so the whole model's need (its
    weights counted on the meta device, the KV pages, the states), with one iteration's activations per
    worker, against MemAvailable (one line with the figures)."""
    if kinds[0].cuda:
        return
    need = memory_need(source.arch, config, dtype)
    check_memory(source.name, replace(need, activation_bytes=need.activation_bytes * len(kinds)),
                 available_bytes(), str(dtype).removeprefix("torch."))


def check_worker_memory(source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                        kinds: tuple[WorkerKind, ...], assignment: tuple[int, ...]) -> None:
    """Before any CUDA worker allocates: its share (sizes from the share built on the meta device) and
    one iteration's activations against the GPU's free memory (CPU workers: check_host_memory)."""
    if not kinds[0].cuda:
        return
    need = memory_need(source.arch, config, dtype)
    names = node_names(source.arch, config.page_size)
    for d, k in enumerate(kinds):
        nodes = {n for n, a in zip(names, assignment, strict=True) if a == d}
        share = build_share(source, dtype, config, nodes, "meta", load_format="dummy", seed=0).resident_bytes
        free = torch.cuda.mem_get_info(torch.device(k.device))[0]
        if share + need.activation_bytes > free:
            total = share + need.activation_bytes
            raise UserError(f"{source.name}'s share on {k.device} needs {total / 1e9:.2f} GB but "
                            f"{free / 1e9:.2f} GB is free: weights and caches {share / 1e9:.2f} GB, "
                            f"activations {need.activation_bytes / 1e9:.2f} GB")


def check_requests(arrivals: tuple[Arrival, ...], source: ModelSource, config: EngineConfig) -> None:
    """Every request fits the model's context and the cache, before any worker starts (one line)."""
    limit = config.model_len(source.arch)
    longest = max(arrivals, key=lambda a: len(a.prompt_ids) + a.params.max_tokens)
    total = len(longest.prompt_ids) + longest.params.max_tokens
    if limit is not None and total > limit:
        raise UserError(f"a request of {len(longest.prompt_ids)} prompt + {longest.params.max_tokens} output "
                        f"tokens = {total} exceeds the {limit}-token context (max_model_len)")
    bad = [i for a in arrivals for i in a.prompt_ids if not 0 <= i < source.arch.vocab_size]
    if bad:
        raise UserError(f"prompt token id {bad[0]} outside the vocabulary 0..{source.arch.vocab_size - 1}")


class Costs:
    """The worker kinds' profiles (measured as the workers of a run compute together) and the link,
    measured (or read from their files) on first use, per set of workers."""

    def __init__(self, source: ModelSource, dtype: torch.dtype, config: EngineConfig, context: int) -> None:
        self.source, self.dtype, self.config, self.context = source, dtype, config, context
        self.profiles: dict[tuple[str, ...], dict[str, Any]] = {}
        self.link: LinkSpec | None = None

    def of(self, kinds: tuple[WorkerKind, ...]) -> tuple[ProfileCost, LinkSpec]:
        """The kinds' profile cost and the link between kinds: measured for several, else the local gloo default."""
        key = tuple(k.name for k in kinds)
        if key not in self.profiles:
            self.profiles[key] = profile_kinds(self.source, self.dtype, self.config, kinds,
                                               context=self.context)
        if self.link is None and len(kinds) > 1:
            self.link = measure_link(self.source, self.dtype, self.config).spec()
        return (ProfileCost(self.profiles[key], fallback=default_cost_model() if kinds[0].cuda else None),
                self.link or GLOO_LOCAL)


def placer_for(name: str, source: ModelSource, dtype: torch.dtype, config: EngineConfig, traffic: Traffic,
               costs: Costs):
    """kinds -> Placement for ``--placement``/``--replan`` ``name`` (a lone worker runs everything)."""
    def place(kinds: tuple[WorkerKind, ...]) -> Placement:
        needs_cost = name == MILP and len(kinds) > 1 and not kinds[0].cuda
        cost, link = costs.of(kinds) if needs_cost else (ProfileCost({}, default_cost_model()), GLOO_LOCAL)
        if len(kinds) == 1 and not name.endswith(".json"):
            return Placement(assignment=(0,) * len(node_names(source.arch, config.page_size)), label=name)
        return choose(name, source, dtype, config, kinds, traffic, cost, link)
    return place


def traffic_of(arrivals: tuple[Arrival, ...]) -> Traffic:
    """The planner's traffic: the stream's mean prompt and output lengths."""
    return Traffic(prompt=max(1, round(statistics.mean(len(a.prompt_ids) for a in arrivals))),
                   output=max(1, round(statistics.mean(a.params.max_tokens for a in arrivals))))


def stream_model_len(stream: Stream, *, generated: bool) -> int:
    """The default model length (tokens): for a stream generated from length ranges, the longest request
    those ranges can draw (prompt ``hi`` + output ``hi``), whatever this seed drew; for a workload file or
    trace-sampled lengths, the longest request of the stream."""
    w = stream.workload
    if generated and not (w.prompt.trace or w.output.trace):
        return w.prompt.hi + w.output.hi
    return max(len(a.prompt_ids) + a.params.max_tokens for a in stream.arrivals)


def prepared(spec: ServeRunSpec) -> tuple[ServeRunSpec, ModelSource, torch.dtype, Stream]:
    """The spec with its model length settled (stream_model_len unless given), the model, its
    dtype and the stream, every request checked against the context before anything starts."""
    source = open_model(spec.model)
    if spec.load_format == "auto" and not source.has_weights:
        raise UserError(f"{source.name} has no safetensors weights to load; use --load-format dummy")
    vocab = source.arch.vocab_size
    stream = file_stream(spec.workload_file, vocab) if spec.workload_file else generated_stream(
        spec.workload, spec.seed, vocab)
    config = spec.config if spec.config.max_model_len else replace(
        spec.config, max_model_len=stream_model_len(stream, generated=spec.workload_file is None))
    spec = replace(spec, config=config)
    check_requests(stream.arrivals, source, spec.config)
    if spec.fault is not None and not 0 <= spec.fault.at_request < len(stream.arrivals):
        raise UserError(f"--kill-at {spec.fault.at_request}: valid 0..{len(stream.arrivals) - 1} (a request "
                        f"of the stream)")
    return spec, source, resolve_dtype(spec.dtype, source), stream


def serve_run(spec: ServeRunSpec) -> ServeRunResult:
    spec, source, dtype, stream = prepared(spec)
    traffic = traffic_of(stream.arrivals)
    costs = Costs(source, dtype, spec.config, context=traffic.prompt + traffic.output // 2)
    check_host_memory(source, dtype, spec.config, spec.kinds)
    placement = placer_for(spec.placement, source, dtype, spec.config, traffic, costs)(spec.kinds)
    check_worker_memory(source, dtype, spec.config, spec.kinds, placement.assignment)
    engine = Engine(None, source, spec.config, tokenizer_for(source),
                    devices=tuple(k.name for k in spec.kinds), placement=placement.label)
    pool = WorkerPool(source, dtype, spec.config, spec.kinds, lambda _k: placement,
                      load_format=spec.load_format, seed=spec.seed, settings=spec.settings,
                      replacer=placer_for(spec.replan, source, dtype, spec.config, traffic, costs))
    lat_pool = latency_pool(spec, source, dtype, traffic, costs)
    load_avg = os.getloadavg()
    t0 = time.monotonic()
    with pool, lat_pool or nullcontext():
        start_s = time.monotonic() - t0
        resident = pool.cluster.resident_bytes
        switch = switcher_for(spec.adaptive, spec.config, pool, lat_pool) if spec.adaptive else None
        if switch is not None:
            switch.start(engine)
        reqs, timing, log = drive(engine, pool, stream.arrivals, recover=spec.recover, fault=spec.fault,
                                  switch=switch)
    verified = verify(spec, source, stream, [r.output_ids for r in reqs]) if spec.verify else None
    plan = predicted_plan(spec, source, dtype, traffic, costs, placement) if spec.predict else placement.plan
    sim = simulated(plan, stream, spec.config) if plan is not None else None
    extra = {"start_s": start_s, "load_avg_before": load_avg, "load_avg_after": os.getloadavg(),
             "iterations": len(log.host_s), "recoveries": log.recoveries, "resident_bytes": resident,
             "preemptions": engine.scheduler.preempted, "kinds": [k.name for k in spec.kinds],
             "assignment_counts": [placement.assignment.count(d) for d in range(len(spec.kinds))],
             "worker_busy_share": busy_share(log, len(spec.kinds)),
             "iteration_wall_ms": percentiles([x * 1e3 for x in log.wall_s]), "engine": asdict(spec.config),
             "dtype": str(dtype).removeprefix("torch."), "simulated": sim,
             "plan": plan.to_dict() if plan is not None else None,
             "tokens": {r.id: r.output_ids for r in reqs}, "threads": torch.get_num_threads(),
             # per request in arrival order: arrival, first token and finish (s from the start), tokens
             "timing": [[timing[r.id].arrival_s, timing[r.id].first_s, timing[r.id].finish_s,
                         len(r.output_ids)] for r in reqs],
             "adaptive": switch.report().to_dict() if switch is not None else None}
    return result(spec, source, placement, reqs, timing, log, verified, plan, sim, extra)


def latency_pool(spec: ServeRunSpec, source: ModelSource, dtype: torch.dtype, traffic: Traffic,
                 costs: Costs) -> WorkerPool | None:
    """--adaptive with a --latency-placement other than --placement: the latency schedule's own pool
    (both kept resident; None: the schedules share the run's pool)."""
    a = spec.adaptive
    if a is None or a.latency_placement in (None, spec.placement):
        return None
    chosen = placer_for(a.latency_placement, source, dtype, spec.config, traffic, costs)(spec.kinds)
    check_worker_memory(source, dtype, spec.config, spec.kinds, chosen.assignment)
    return WorkerPool(source, dtype, spec.config, spec.kinds, lambda _k: chosen, load_format=spec.load_format,
                      seed=spec.seed, settings=spec.settings)


def result(spec: ServeRunSpec, source: ModelSource, placement: Placement, reqs: list,
           timing: dict[int, Timing], log: DriveLog, verified: bool | None, plan: Plan | None,
           sim: dict[str, Any] | None, extra: dict[str, Any]) -> ServeRunResult:
    done = [r for r in reqs if r.finished]
    tokens = sum(len(r.output_ids) for r in done)
    first = min((t.arrival_s for t in timing.values()), default=0.0)
    last = max((t.finish_s for t in timing.values() if t.finish_s is not None), default=first)
    ttft = [timing[r.id].first_s - timing[r.id].arrival_s for r in done]
    tpot = [(timing[r.id].finish_s - timing[r.id].first_s) / (len(r.output_ids) - 1) for r in done
            if len(r.output_ids) > 1]
    host = [x * 1e3 for x in log.host_s]
    return ServeRunResult(
        model=source.name, devices=tuple(k.name for k in spec.kinds), placement=placement.label,
        requests=len(reqs), completed=len(done), lost=len(reqs) - len(done), verified=verified,
        throughput_tokens_per_s=tokens / max(last - first, 1e-9), ttft_s=percentiles(ttft),
        tpot_s=percentiles(tpot),
        host_ms_per_iteration={"mean": statistics.mean(host) if host else None, **percentiles(host)},
        predicted_throughput_tokens_per_s=plan.throughput_tokens_per_s if plan is not None else None,
        simulated_throughput_tokens_per_s=sim["throughput_tokens_per_s"] if sim else None, extra=extra)


def busy_share(log: DriveLog, workers: int) -> list[float]:
    """Each worker's compute seconds (its nodes, without duty-cycle idling) over the stream's wall time, by
    its index in --devices (a lost worker's share stops where it was lost)."""
    span = max(log.end_s - log.start_s, 1e-9)
    return [sum(b.get(d, 0.0) for b in log.busy_s) / span for d in range(workers)]


def verify(spec: ServeRunSpec, source: ModelSource, stream: Stream, got: list[list[int]]) -> bool:
    """The same requests through the single-process engine (same weights, same engine settings, all at
    once): greedy tokens equal, request by request."""
    ref = load_engine(source, spec.config, dtype=spec.dtype, load_format=spec.load_format, seed=spec.seed)
    order = sorted(stream.arrivals, key=lambda a: a.arrival_s)
    want = ref.generate([list(a.prompt_ids) for a in order], [a.params for a in order])
    return [list(c.token_ids) for c in want] == got


def predicted_plan(spec: ServeRunSpec, source: ModelSource, dtype: torch.dtype, traffic: Traffic,
                   costs: Costs, placement: Placement) -> Plan:
    """The run's own placement priced by the kinds' profiles and scored by tessera.plan."""
    cost, link = costs.of(spec.kinds)
    return plan_engine(source, dtype, spec.config, spec.kinds, traffic, cost, link,
                       assignment=placement.assignment).plan


def simulated(plan: Plan, stream: Stream, config: EngineConfig) -> dict[str, Any]:
    """tessera.sim serving the stream's workload (its generator and seed: the same arrivals and lengths) on
    the plan, under the engine's settings."""
    got = sim_run(plan, stream.workload, seed=stream.seed,
                  config=SchedulerConfig(max_num_seqs=config.max_num_seqs,
                                         max_num_batched_tokens=config.max_num_batched_tokens,
                                         microbatches=config.microbatches)).result
    return {"throughput_tokens_per_s": got.throughput_tokens_per_s, "ttft_s": got.ttft_s,
            "tpot_s": got.tpot_s, "completed": got.completed}


def generate_on_workers(source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                        kinds: tuple[WorkerKind, ...], placement: str,
                        prompts: list[tuple[list[int], SamplingParams]], *, load_format: str,
                        settings: ClusterSettings = ClusterSettings()) -> tuple[Engine, list[Any], float]:
    """``tessera generate --devices A,B``: the prompts served together on workers under ``placement``;
    the driver engine, the completions in prompt order and the seconds before the first iteration (placing:
    profiles and the planner for ``plan``; starting the workers)."""
    arrivals = tuple(Arrival(arrival_s=0.0, prompt_ids=tuple(i), params=p) for i, p in prompts)
    check_requests(arrivals, source, config)
    traffic = traffic_of(arrivals)
    costs = Costs(source, dtype, config, context=traffic.prompt + traffic.output // 2)
    check_host_memory(source, dtype, config, kinds)
    t0 = time.monotonic()
    chosen = placer_for(placement, source, dtype, config, traffic, costs)(kinds)
    place_s = time.monotonic() - t0
    check_worker_memory(source, dtype, config, kinds, chosen.assignment)
    engine = Engine(None, source, config, tokenizer_for(source), devices=tuple(k.name for k in kinds),
                    placement=chosen.label)
    t0 = time.monotonic()
    with WorkerPool(source, dtype, config, kinds, lambda _k: chosen, load_format=load_format, seed=0,
                    settings=settings) as pool:
        start_s = time.monotonic() - t0
        reqs, _, _ = drive(engine, pool, arrivals)
    return engine, [engine.completion(r) for r in reqs], place_s + start_s
