"""Serve a request stream on the workers: continuous batching over KV/state slots, mixed iterations,
asynchronous micro-batches, and the per-request single-process reference.

Shapes: every program is captured at batch 1 (one sequence), so a request is one micro-batch of a step
and owns one KV/state slot on the workers for its lifetime. ``prefill@P`` fills an empty cache of P
slots with a P-token prompt; ``chunk@a:n`` feeds prompt tokens [a, a+n) against a cache holding [0, a)
(chunked prefill: a prompt longer than the chunk goes in over several iterations); ``decode@c`` feeds one
token against c cached tokens (the capture's static cache of c+1 slots; the workers carry a slot's KV
into the next shape by name). An iteration of a group is one step whose micro-batches are its running
requests, each running its own program: prompt chunks beside the others' decodes.

Schedules: ``async`` splits the slots into m groups; each group's next iteration waits only for its own
previous one, and the workers run queued iterations in submission order, so one group computes while
another's outputs travel to the driver and back. ``sync`` is one group holding every slot: all running
requests advance in lock-step, re-synchronised at every iteration.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np
import torch

from tessera.capture.zoo import resolve
from tessera.errors import UserError, choices_error
from tessera.graph import KernelGraph, Role
from tessera.runtime.cluster import Cluster, ClusterConfig, WorkerFailure
from tessera.runtime.partition import Partition, partition
from tessera.runtime.program import Program
from tessera.runtime.runner import by_microbatch, phase_of
from tessera.runtime.steps import LocalExecutor, as_input, capture, input_buffer
from tessera.sim.workload import Requests

log = logging.getLogger("tessera.runtime")

SCHEDULES = ("async", "sync")
PLAN = "serve"  # the one partition set a serving run holds


@dataclass(frozen=True, kw_only=True)
class Request:
    rid: int
    arrival_s: float  # after the stream's start
    prompt: torch.Tensor  # (1, P) token ids
    output_tokens: int  # greedy tokens to generate (the first comes from the prefill's last chunk)
    chunk_tokens: int = 0  # prefill chunk: the prompt goes in over ceil(P / chunk) steps; 0 = whole

    def __post_init__(self) -> None:
        if self.output_tokens < 1 or self.chunk_tokens < 0:
            raise ValueError(f"request {self.rid}: output_tokens={self.output_tokens} must be >= 1, "
                             f"chunk_tokens={self.chunk_tokens} >= 0")

    @property
    def chunks(self) -> int:
        """Steps the prompt takes (each an iteration of its group)."""
        p = self.prompt.shape[1]
        return 1 if not self.chunk_tokens else -(-p // self.chunk_tokens)

    @property
    def steps(self) -> int:
        return self.chunks + self.output_tokens - 1

    def span(self, pos: int) -> tuple[int, int]:
        """Prompt tokens [a, b) that prefill step ``pos`` (< chunks) feeds."""
        p, c = self.prompt.shape[1], self.chunk_tokens or self.prompt.shape[1]
        return pos * c, min(p, (pos + 1) * c)

    def token_of(self, pos: int) -> int | None:
        """Which generated token step ``pos`` produces (None: a prefill chunk before the last)."""
        return pos - self.chunks + 1 if pos >= self.chunks - 1 else None

    def key(self, pos: int) -> str:
        """The program of step ``pos``: ``prefill@n`` (n prompt tokens into an empty cache), ``chunk@a:n``
        (prompt tokens [a, a+n) against a cached prefix [0, a)), ``decode@c`` (one token after c)."""
        if pos < self.chunks:
            a, b = self.span(pos)
            return f"prefill@{b}" if a == 0 else f"chunk@{a}:{b - a}"
        return f"decode@{self.prompt.shape[1] + pos - self.chunks}"


def key_tokens(key: str) -> tuple[int, int]:
    """(cached tokens before, new tokens) of a program key."""
    phase, n = key.split("@")
    if phase == "chunk":
        a, b = n.split(":")
        return int(a), int(b)
    return (0, int(n)) if phase == "prefill" else (int(n), 1)


def key_order(key: str) -> tuple[int, int, int]:
    """Sort order of program keys: prefill, chunks, decode; then by position."""
    return (("prefill", "chunk", "decode").index(phase_of(key)), *key_tokens(key))


def make_requests(model: str, reqs: Requests, seed: int = 0, chunk_tokens: int = 0) -> list[Request]:
    """The workload's arrivals and lengths with prompt ids drawn per request (seeded by its index)."""
    cfg = resolve(model).config
    vocab = int(cfg.get("text_config", cfg).get("vocab_size", cfg.get("vocab_size")))
    out = []
    for i, (a, p, o) in enumerate(zip(reqs.arrival_s, reqs.prompt, reqs.output, strict=True)):
        g = torch.Generator().manual_seed(seed * 1_000_003 + i)
        out.append(Request(rid=i, arrival_s=float(a), prompt=torch.randint(0, vocab, (1, int(p)), generator=g),
                           output_tokens=int(o), chunk_tokens=chunk_tokens))
    return out


def warmup_requests(requests: list[Request]) -> list[Request]:
    """Requests (arriving at once) that touch every program the stream uses: one per prompt length, with
    the longest output of that length. The first run of a program on a worker pays one-off costs
    (allocator growth, first dispatch) that would otherwise land on whichever schedule runs first."""
    longest: dict[int, Request] = {}
    for r in requests:
        p = r.prompt.shape[1]
        if p not in longest or r.output_tokens > longest[p].output_tokens:
            longest[p] = r
    return [Request(rid=-1 - i, arrival_s=0.0, prompt=r.prompt, output_tokens=r.output_tokens,
                    chunk_tokens=r.chunk_tokens) for i, r in enumerate(longest.values())]


def serving_keys(requests: list[Request]) -> list[str]:
    keys = {r.key(j) for r in requests for j in range(r.steps)}
    return sorted(keys, key=key_order)


def capture_serving(model: str, keys: list[str], seed: int = 0) -> dict[str, Program]:
    """One batch-1 program per key (same seed, so the same weights in every one). A chunk at an offset is
    the capture's prefill against a cache already holding its prefix."""
    family = resolve(model).family
    if family not in ("llm", "ssm", "moe"):
        raise UserError(f"model {model}: family {family} cannot be served yet; valid families: llm, moe, ssm")
    out: dict[str, Program] = {}
    weights: dict[str, torch.Tensor] = {}
    for key in keys:
        past, n = key_tokens(key)
        cap = (capture(model, "decode", batch=1, context=past, seed=seed) if phase_of(key) == "decode"
               else capture(model, "prefill", batch=1, seq=n, context=past or None, seed=seed))
        out[key] = share_weights(Program.from_capture(cap), weights)
    return out


def share_weights(prog: Program, seen: dict[str, torch.Tensor]) -> Program:
    """Point the program's weights at the equal tensors of programs captured before (name -> tensor in
    ``seen``): every program is built with the same seed, and one copy per program would hold the model
    once per prompt length and decode position (a 180 MB model over 40 programs: 7 GB)."""
    for b, t in prog.initial.items():
        if prog.role(b) is not Role.WEIGHT:
            continue
        name = prog.name(b)
        if name in seen and torch.equal(seen[name], t):
            prog.initial[b] = seen[name]
        else:
            seen.setdefault(name, t)
    return prog


def kernel_groups(programs: dict[str, Program]) -> dict[str, list[str]]:
    """Programs with one kernel sequence share one placement: group name -> keys. The first group of a
    phase is named by the phase (Mamba-2's chunked scan makes prefill's sequence depend on the prompt
    length, so a phase may have several groups: "prefill", "prefill#1", ...)."""
    groups: dict[str, list[str]] = {}
    sig: dict[tuple[str, ...], str] = {}
    for key, prog in programs.items():
        sequence = tuple(o.func for o in prog.ops)
        if sequence not in sig:
            phase = phase_of(key)
            n = sum(1 for g in groups if phase_of(g.split("#")[0]) == phase)
            sig[sequence] = phase if n == 0 else f"{phase}#{n}"
        groups.setdefault(sig[sequence], []).append(key)
    return groups


def group_graphs(programs: dict[str, Program]) -> dict[str, KernelGraph]:
    return {g: programs[keys[0]].placement_graph for g, keys in kernel_groups(programs).items()}


def by_key(programs: dict[str, Program], by_group: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each program's assignment from its group's."""
    return {k: by_group[g] for g, keys in kernel_groups(programs).items() for k in keys}


def serve_partitions(programs: dict[str, Program], assign: dict[str, tuple[int, ...]], devices: int
                     ) -> dict[tuple[str, str], Partition]:
    """Each program split by its own assignment. KV/state carry from step to step by name: every device
    that touches a cache in a decode or chunk program holds it and receives its current version after any step
    that writes it elsewhere (a prefill starts its slot from the initial contents, so needs no earlier version)."""
    holders: dict[str, set[int]] = {}
    for key, prog in programs.items():
        if phase_of(key) == "prefill":
            continue
        for k in range(len(prog.ops)):
            for b in prog.needs(k) | prog.writes(k):
                if prog.role(b) in (Role.KV, Role.STATE):
                    holders.setdefault(prog.name(b), set()).add(assign[key][k])
    frozen = {n: frozenset(d) for n, d in holders.items()}
    return {(key, PLAN): partition(prog, assign[key], devices, frozen) for key, prog in programs.items()}


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    slots: int = 8  # KV/state slots on the workers: requests running at once
    microbatches: int = 2  # groups advancing independently (async); sync runs one group of every slot
    schedule: str = "async"
    # prompts a group prefills at once (a chunk each per iteration); 0: no limit, every free slot admits the
    # next arrival (the planner's steady state: a freed slot refills at once, in either schedule)
    prefills_per_iteration: int = 0
    chunk_tokens: int = 0  # prompt tokens a request prefills per iteration (0: the whole prompt at once)

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise choices_error("schedule", self.schedule, SCHEDULES)
        if not 1 <= self.microbatches <= self.slots <= 64:
            raise UserError(f"need 1 <= microbatches ({self.microbatches}) <= slots ({self.slots}) <= 64")
        if self.prefills_per_iteration < 0:
            raise UserError(f"prefills_per_iteration={self.prefills_per_iteration} must be >= 0 (0: no limit)")
        if self.chunk_tokens < 0:
            raise UserError(f"chunk_tokens={self.chunk_tokens} must be >= 0 (0: whole prompts)")

    def groups(self) -> list[list[int]]:
        """Each group's slots: m near-equal groups (async), or one group of all slots (sync)."""
        m = self.microbatches if self.schedule == "async" else 1
        return [list(range(g, self.slots, m)) for g in range(m)]


@dataclass
class Served:
    """One request's life on the workers."""

    request: Request
    slot: int = -1
    tokens: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # per generated token: (vocab,) fp32
    admitted_s: float = 0.0
    token_s: list[float] = field(default_factory=list)  # when each token reached the driver (stream clock)
    pos: int = 0  # steps this request has run on the current workers (after a recovery: replays first)
    replay_mismatch: bool = False  # a replayed step's logits differed from the ones first produced

    @property
    def done(self) -> bool:
        return self.pos >= self.request.steps

    @property
    def prefilling(self) -> bool:
        return self.pos < self.request.chunks


@dataclass(frozen=True, kw_only=True)
class StreamResult:
    schedule: str
    served: tuple[Served, ...]
    wall_s: float  # stream start (first arrival) to the last token
    iterations: int
    history: tuple[dict[str, Any], ...]  # per iteration: keys, slots, submit/finish times, worker events
    recoveries: tuple[dict[str, Any], ...] = ()  # per lost worker: who, detection and recovery seconds
    load_avg: tuple[float, ...] = ()  # os.getloadavg() as the stream ended (the machine may be shared)
    driver_cpu_s: float = 0.0  # the driving process's CPU seconds during the stream (all its threads)


class Group:
    def __init__(self, slots: list[int]) -> None:
        self.slots = tuple(slots)
        self.free = list(slots)
        self.running: list[Served] = []
        self.step: int | None = None  # the iteration in flight
        self.batch: list[Served] = []  # its requests, in micro-batch order
        self.submitted_s = 0.0
        # when its last iteration's outputs arrived, if it had work ready then (requests running, or an
        # arrival already due) and no recovery came between: the driver's turnaround runs from there
        self.ready_s: float | None = None
        self.continued = False  # the iteration in flight was submitted straight after the previous one


def _feed(programs: dict[str, Program], s: Served) -> tuple[str, dict[int, torch.Tensor], bool]:
    """The request's next step: its program, its input ids (its prompt chunk, else the token before), reset."""
    r = s.request
    key = r.key(s.pos)
    if s.pos < r.chunks:
        a, b = r.span(s.pos)
        ids = r.prompt[:, a:b]
    else:
        ids = torch.tensor([[s.tokens[s.pos - r.chunks]]])
    return key, {input_buffer(programs[key], "input_ids"): as_input(ids)}, s.pos == 0


def _take(s: Served, logits: torch.Tensor, done_s: float) -> None:
    """A step's logits: a new token, or (replaying after a recovery) a check against the first run's; a
    prefill chunk before the prompt's last produces no token."""
    j = s.request.token_of(s.pos)
    if j is None:
        pass
    elif j < len(s.tokens):
        s.replay_mismatch |= not torch.equal(logits, s.logits[j])
    else:
        s.logits.append(logits)
        s.tokens.append(int(logits.argmax()))
        s.token_s.append(done_s)
    s.pos += 1


@dataclass(frozen=True, kw_only=True)
class Fault:
    """Fault injection for tests and benchmarks: SIGKILL (or SIGSTOP) worker ``rank`` when request
    ``at_request`` (by arrival order) is admitted."""

    at_request: int
    rank: int = 1
    signal: str = "SIGKILL"


Recover = Callable[[WorkerFailure], Cluster]  # a lost worker -> a fresh cluster on the survivors


def serve_stream(cluster: Cluster, programs: dict[str, Program], requests: list[Request], cfg: ServeConfig,
                 *, fault: Fault | None = None, recover: Recover | None = None) -> StreamResult:
    """Serve ``requests`` arriving on the clock; returns each request's tokens, logits and times.

    recover: on a lost worker, returns a cluster on the survivors; every request in flight then replays
    its prompt and the tokens it already has (the KV died with the worker) and goes on from its last
    token; a replayed step's logits must equal the first run's (Served.replay_mismatch)."""
    groups = [Group(s) for s in cfg.groups()]
    waiting = sorted(requests, key=lambda r: (r.arrival_s, r.rid))
    served: list[Served] = []
    history: list[dict[str, Any]] = []
    recoveries: list[dict[str, Any]] = []
    by_step: dict[int, Group] = {}
    t0, cpu0 = time.perf_counter(), time.process_time()
    killed_s: float | None = None
    while waiting or any(g.running for g in groups):
        now = time.perf_counter() - t0
        for g in groups:
            if g.step is not None:
                continue
            admitted = sum(1 for s in g.running if s.prefilling)  # prompts already in their chunks
            limit = cfg.prefills_per_iteration or len(g.slots)
            while waiting and g.free and waiting[0].arrival_s <= now and admitted < limit:
                s = Served(request=waiting.pop(0), slot=g.free.pop(0), admitted_s=now)
                g.running.append(s)
                served.append(s)
                admitted += 1
                if fault is not None and len(served) == fault.at_request + 1 and killed_s is None:
                    os.kill(cluster.procs[fault.rank].pid, getattr(signal, fault.signal))
                    killed_s = time.perf_counter() - t0
            if g.running:
                feeds = [_feed(programs, s) for s in g.running]
                g.batch = list(g.running)
                g.submitted_s = time.perf_counter() - t0
                g.continued, g.ready_s = g.ready_s is not None, None
                g.step = cluster.submit(PLAN, [f for _, f, _ in feeds], keys=tuple(k for k, _, _ in feeds),
                                        slots=tuple(s.slot for s in g.batch), resets=tuple(r for *_, r in feeds))
                by_step[g.step] = g
        if all(g.step is None for g in groups):  # nothing running: sleep until the next arrival
            time.sleep(max(0.0, waiting[0].arrival_s - (time.perf_counter() - t0)))
            continue
        wait_s = 0.5
        if waiting and any(g.step is None and g.free for g in groups):  # an idle group may admit the next arrival
            wait_s = min(wait_s, max(1e-3, waiting[0].arrival_s - (time.perf_counter() - t0)))
        try:
            finished = cluster.poll(wait_s)
        except WorkerFailure as failure:
            if recover is None:
                raise
            detected_s = time.perf_counter() - t0
            cluster = recover(failure)
            for g in groups:  # every iteration in flight died with the cluster: replay from the prompt
                g.step, g.ready_s = None, None
                for s in g.running:
                    s.pos = 0
            by_step.clear()
            recoveries.append(dict(failure=str(failure), rank=failure.rank, detected_s=detected_s,
                                   detection_s=None if killed_s is None else detected_s - killed_s,
                                   recovery_s=time.perf_counter() - t0 - detected_s,
                                   in_flight=sum(len(g.running) for g in groups)))
            continue
        for sid, per_worker in finished.items():
            g = by_step.pop(sid)
            done_s = time.perf_counter() - t0
            outs = by_microbatch(per_worker, 1, len(g.batch))
            keys = [s.request.key(s.pos) for s in g.batch]
            for s, out in zip(g.batch, outs, strict=True):
                _take(s, out[0].reshape(-1, out[0].shape[-1])[-1], done_s)
                if s.done:
                    g.running.remove(s)
                    g.free.append(s.slot)
            # *_abs_s: the same instants on the clock the workers stamp their events with (perf_counter)
            history.append(dict(step=sid, keys=keys, submit_s=g.submitted_s, done_s=done_s, workers=per_worker,
                                submit_abs_s=g.submitted_s + t0, done_abs_s=done_s + t0, group=groups.index(g),
                                continued=g.continued))
            g.step = None
            due = bool(waiting) and waiting[0].arrival_s <= done_s
            g.ready_s = done_s if g.running or (due and g.free) else None
    first = min((r.arrival_s for r in requests), default=0.0)
    last = max((t for s in served for t in s.token_s), default=first)
    return StreamResult(schedule=cfg.schedule, served=tuple(sorted(served, key=lambda s: s.request.rid)),
                        wall_s=last - first, iterations=len(history), history=tuple(history),
                        recoveries=tuple(recoveries), load_avg=os.getloadavg(),
                        driver_cpu_s=time.process_time() - cpu0)


def reference(programs: dict[str, Program], requests: list[Request], threads: int = 1,
              local: LocalExecutor | None = None) -> dict[int, tuple[list[int], list[torch.Tensor]]]:
    """Each request generated alone in one process (same programs, batch 1): rid -> (tokens, logits).
    ``local`` (optional) keeps the per-kernel times of these runs (CPU profiles for prediction)."""
    local = local or LocalExecutor(programs)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)  # bit-exactness needs the workers' intra-op thread count
    out = {}
    try:
        for r in requests:
            s = Served(request=r)
            while not s.done:
                key, feed, reset = _feed(programs, s)
                logits = local.step(key, PLAN, [feed], reset=reset)[0][0]
                _take(s, logits.reshape(-1, logits.shape[-1])[-1], 0.0)
            out[r.rid] = (s.tokens, s.logits)
    finally:
        torch.set_num_threads(saved)
    return out


def check(result: StreamResult, ref: dict[int, tuple[list[int], list[torch.Tensor]]]
          ) -> tuple[bool, float, bool]:
    """(every logit bit-identical, max |logit difference|, every request's tokens identical)."""
    same, diff, tokens = True, 0.0, True
    for s in result.served:
        ref_tokens, ref_logits = ref[s.request.rid]
        tokens &= s.tokens == ref_tokens
        same &= not s.replay_mismatch
        for a, b in zip(s.logits, ref_logits, strict=True):
            same &= torch.equal(a, b)
            diff = max(diff, float((a - b).abs().max()))
    return same, diff, tokens


def percentiles(xs: list[float]) -> dict[str, float | None]:
    if not xs:
        return {"p50": None, "p99": None}
    return {"p50": float(np.percentile(xs, 50)), "p99": float(np.percentile(xs, 99))}


def latency_stats(result: StreamResult) -> dict[str, Any]:
    """Throughput (generated tokens / stream seconds), TTFT and TPOT per request."""
    ttft = [s.token_s[0] - s.request.arrival_s for s in result.served if s.token_s]
    tpot = [(s.token_s[-1] - s.token_s[0]) / (len(s.token_s) - 1) for s in result.served if len(s.token_s) > 1]
    generated = sum(len(s.tokens) for s in result.served)
    return {"throughput_tokens_per_s": generated / result.wall_s if result.wall_s > 0 else 0.0,
            "ttft_s": percentiles(ttft), "tpot_s": percentiles(tpot), "generated_tokens": generated,
            "iterations": result.iterations, "wall_s": result.wall_s,
            "mean_iteration_s": statistics.mean([h["done_s"] - h["submit_s"] for h in result.history])
            if result.history else 0.0}


def union_s(intervals: Iterable[tuple[float, float]]) -> float:
    """Seconds covered by (start, end) intervals, an overlap counted once: a worker runs several steps at
    once (the asynchronous schedule), so their spans overlap, and a blocked interval is recorded in every
    step that was in flight."""
    total, reach = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


def worker_timeline(hist: Sequence[dict[str, Any]], d: int) -> tuple[float, float, float, int]:
    """Worker d over ``hist``: seconds with a step in flight, seconds of those blocked (every step in flight
    waiting on a transfer), seconds inside kernels, kernels run."""
    ws = [h["workers"][d] for h in hist if d < len(h["workers"])]
    return (union_s((w["start_s"], w["end_s"]) for w in ws), union_s(iv for w in ws for iv in w["waits"]),
            sum(b - a for w in ws for _, _, a, b in w["kernels"]), sum(len(w["kernels"]) for w in ws))


def corun_slowdown(hist: list[dict[str, Any]], d: int) -> float | None:
    """How much slower worker d's kernels ran while another worker was inside a kernel than while none was:
    Σ co-run durations / Σ the same kernels' (program, op) mean solo durations, over kernels seen both ways.
    1.0: the workers do not slow each other (the serving model's assumption); on 2 shared cores it is not."""
    others = sorted((a, b) for h in hist for e, w in enumerate(h["workers"]) if e != d for _, _, a, b in w["kernels"])
    starts = [a for a, _ in others]
    reach = list(accumulate((b for _, b in others), max))  # the latest end among intervals starting before
    solo: dict[tuple[str, int], list[float]] = {}
    corun: list[tuple[tuple[str, int], float]] = []
    for h in hist:
        for k, mb, a, b in h["workers"][d]["kernels"]:
            i = bisect.bisect_right(starts, (a + b) / 2) - 1  # another kernel covers the midpoint?
            if i >= 0 and reach[i] > (a + b) / 2:
                corun.append(((h["keys"][mb], k), b - a))
            else:
                solo.setdefault((h["keys"][mb], k), []).append(b - a)
    both = [(solo[key], t) for key, t in corun if key in solo]
    base = sum(statistics.mean(s) for s, _ in both)
    return sum(t for _, t in both) / base if base > 0 else None


def utilisation(result: StreamResult) -> dict[str, Any]:
    """Where the stream's time went, as shares of its wall time (first worker start to last worker end):
    per worker, its steps' spans (``busy``), the kernels in them, the time blocked on transfers, the idle
    gaps between steps, its process's CPU seconds (``cpu``: below ``busy`` when it waited for a core or a
    peer), and per micro-batch step the setup before the first kernel (``setup_ms``) and the time outside
    kernels and waits (``outside_ms``), ``corun_slowdown``; the driver's CPU share. Shares on 2 cores: 1.0 = one core. After
    a recovery: the survivors' iterations (a cluster's size tells them apart; workers only ever leave)."""
    if not result.history:
        return {}
    size = len(result.history[-1]["workers"])
    hist = sorted((h for h in result.history if len(h["workers"]) == size),
                  key=lambda h: min(w["start_s"] for w in h["workers"]))
    t0 = min(w["start_s"] for h in hist for w in h["workers"])
    wall = max(w["end_s"] for h in hist for w in h["workers"]) - t0
    out: dict[str, Any] = {"wall_s": wall, "driver_cpu": result.driver_cpu_s / wall, "workers": []}
    for d in range(len(hist[0]["workers"])):
        ws = [h["workers"][d] for h in hist]
        span, waits, kernels, _ = worker_timeline(hist, d)
        mbs = sum(len({k[1] for k in w["kernels"]}) for w in ws) or 1
        # cpu_s is stamped at a step's end, and overlapping steps end out of their start order
        cpu = max(w["cpu_s"] for w in ws) - min(w["cpu_s"] for w in ws) if "cpu_s" in ws[0] else None
        out["workers"].append({
            "busy": span / wall, "kernels": kernels / wall, "waits": waits / wall, "idle": 1 - span / wall,
            "cpu": None if cpu is None else cpu / wall,
            "setup_ms": 1e3 * sum(w.get("stored_s", w["start_s"]) - w["start_s"] for w in ws) / len(ws),
            "outside_ms": 1e3 * (span - kernels - waits) / mbs, "steps": len(ws),
            "corun_slowdown": corun_slowdown(hist, d) if size > 1 else None})
    return out


def serve_trace(result: StreamResult, programs: dict[str, Program], parts: dict[tuple[str, str], Partition]
                ) -> dict[str, Any]:
    """A Chrome/Perfetto trace of a served stream: process "devices" one track per worker (kernels named
    key:op, with the request and iteration), process "links" one track per directed link (each transfer
    from its send to its arrival). Times in µs from the first worker event."""
    starts = [w["start_s"] for h in result.history for w in h["workers"]]
    t0 = min(starts, default=0.0)
    us = lambda t: round((t - t0) * 1e6, 3)  # noqa: E731
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "devices"}},
                                {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "links"}}]
    devices = len(result.history[0]["workers"]) if result.history else 0
    ev += [{"ph": "M", "pid": 1, "tid": d, "name": "thread_name", "args": {"name": f"worker {d}"}}
           for d in range(devices)]
    links: set[tuple[int, int]] = set()
    for h in result.history:
        keys, posted = h["keys"], {}
        for d, w in enumerate(h["workers"]):
            for k, mb, a, b in w["kernels"]:
                ev.append({"ph": "X", "pid": 1, "tid": d, "ts": us(a), "dur": us(b) - us(a),
                           "name": f"{keys[mb]}:{programs[keys[mb]].ops[k].func}",
                           "args": {"kernel": k, "microbatch": mb, "iteration": h["step"]}})
            for idx, mb, t in w["sends"]:
                posted[(idx, mb)] = t
        for w in h["workers"]:
            for idx, mb, t in w["recvs"]:
                tr = parts[(keys[mb], PLAN)].transfers[idx]
                links.add((tr.src, tr.dst))
                a = posted.get((idx, mb), t)
                ev.append({"ph": "X", "pid": 2, "tid": tr.src * devices + tr.dst, "ts": us(a),
                           "dur": max(0.0, us(t) - us(a)), "name": f"buffer {tr.buffer}",
                           "args": {"bytes": tr.nbytes, "microbatch": mb, "iteration": h["step"]}})
    ev += [{"ph": "M", "pid": 2, "tid": a * devices + b, "name": "thread_name", "args": {"name": f"link {a}->{b}"}}
           for a, b in sorted(links)]
    return {"traceEvents": ev, "displayTimeUnit": "ms"}


def start_cluster(programs: dict[str, Program], assign: dict[str, tuple[int, ...]], devices: tuple[str, ...],
                  slots: int, recv_timeout_s: float = 5.0) -> Cluster:
    """Workers for a serving run; ``assign``: program key -> kernel -> device (see ``by_key``). Always gloo:
    an iteration runs a different program per micro-batch, which the NCCL issue order (one program per
    step) does not cover; CUDA workers stage transfers through host memory."""
    parts = serve_partitions(programs, assign, len(devices))
    cfg = ClusterConfig(devices=devices, max_microbatches=slots, recv_timeout_s=recv_timeout_s, transport="gloo")
    return Cluster(programs, parts, cfg)


__all__ = ["SCHEDULES", "Request", "ServeConfig", "StreamResult", "WorkerFailure", "by_key", "capture_serving", "check",
           "group_graphs", "kernel_groups", "serve_partitions", "serve_trace",
           "latency_stats", "make_requests", "reference", "serve_stream", "serving_keys", "share_weights", "start_cluster",
           "union_s", "utilisation", "worker_timeline"]
