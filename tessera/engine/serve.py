"""Serving over worker processes: the driver keeps the scheduler, sampling and stop checks (``Engine``) and
keeps up to m iterations in flight on the workers (``EngineCluster``), one per group.

``drive`` runs requests that arrive on the clock: each arrival joins the engine's queue at its time; while
fewer than m iterations are in flight, the next group not in flight with work is scheduled and its inputs
sent to every worker (a group is scheduled again only once its logits are back; the scheduler never
preempts a request of a group in flight, whose pages are being written); every finished iteration's
logits are sampled and its requests advanced. A lost worker (``WorkerFailure``) ends its cluster; with
``recover`` the pool re-places the program on the survivors (``WorkerPool.recover``, fresh workers
loading only their new shares), every running request goes back to the queue with nothing cached
(``Engine.restart``: its prompt and tokens so far are recomputed) and the stream goes on: nothing is lost,
and greedy tokens are those of an uninterrupted run.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from tessera.engine.cluster import ClusterSettings, EngineCluster
from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.devices import WorkerKind
from tessera.engine.engine import Batch, Engine
from tessera.engine.loader import ModelSource
from tessera.engine.request import Request
from tessera.engine.routes import Placement
from tessera.runtime.cluster import WorkerFailure
from tessera.text import plural

log = logging.getLogger("tessera.engine")

Placer = Callable[[tuple[WorkerKind, ...]], Placement]  # the workers there are -> where each node runs


@dataclass(frozen=True, kw_only=True)
class Arrival:
    """A request as the stream delivers it: when (seconds from the start), its prompt and sampling."""

    arrival_s: float
    prompt_ids: tuple[int, ...]
    params: SamplingParams

    def __post_init__(self) -> None:
        if not self.arrival_s >= 0:
            raise ValueError(f"arrival at {self.arrival_s} s must be >= 0")


@dataclass(frozen=True, kw_only=True)
class Fault:
    """Injected: SIGKILL the worker of device ``rank`` (its --devices index) when request ``at_request``
    (arrival index) is first scheduled."""

    at_request: int
    rank: int


@dataclass
class Timing:
    """One request's clock (seconds from the start of the stream)."""

    arrival_s: float
    first_s: float | None = None
    finish_s: float | None = None


@dataclass
class DriveLog:
    """What a run did: per iteration the driver's host seconds (scheduling, inputs, sending; taking the
    logits, sampling, stop checks) and its wall seconds from submit to logits; each worker's busy and idle
    (duty cycle) seconds, by its index in --devices; recoveries."""

    host_s: list[float] = field(default_factory=list)
    wall_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    busy_s: list[dict[int, float]] = field(default_factory=list)
    idle_s: list[dict[int, float]] = field(default_factory=list)
    recoveries: list[str] = field(default_factory=list)
    # per iteration: (group, submitted, logits taken) on the driver's perf_counter and each worker's
    # (start, end) of its share on its own (one host: the same monotonic clock)
    spans: list[tuple[int, float, float, dict[int, tuple[float, float]]]] = field(default_factory=list)
    start_s: float = 0.0
    end_s: float = 0.0


class WorkerPool:
    """The engine's workers under a placement, and their replacement when one is lost. A device the
    placement gives no node is not started (it would only answer every iteration's command)."""

    def __init__(self, source: ModelSource, dtype: torch.dtype, config: EngineConfig,
                 kinds: tuple[WorkerKind, ...], placer: Placer, *, load_format: str, seed: int,
                 settings: ClusterSettings = ClusterSettings(), replacer: Placer | None = None) -> None:
        self.source, self.dtype, self.config, self.kinds = source, dtype, config, kinds
        self.placer, self.replacer = placer, replacer or placer
        self.load_format, self.seed, self.settings = load_format, seed, settings
        self.placement: Placement | None = None
        self.cluster: EngineCluster | None = None
        self.devices = list(range(len(kinds)))  # the --devices index of each of self.kinds
        self.original: list[int] = []  # the --devices index of each started worker (cluster rank)

    def __enter__(self) -> WorkerPool:
        self.start(self.placer(self.kinds))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.cluster is not None:
            self.cluster.close()

    def start(self, placement: Placement) -> None:
        self.placement = placement
        used = sorted(set(placement.assignment))
        rank = {d: r for r, d in enumerate(used)}
        self.original = [self.devices[d] for d in used]
        self.cluster = EngineCluster(self.source, self.dtype, self.config, tuple(self.kinds[d] for d in used),
                                     tuple(rank[d] for d in placement.assignment),
                                     load_format=self.load_format, seed=self.seed, settings=self.settings)
        self.cluster.start()

    def recover(self, failure: WorkerFailure) -> str:
        """Re-place onto the survivors of ``failure`` and start them (fresh processes, each loading its new
        share); raises the failure again when none survive. Returns what happened, in one line."""
        t0 = time.monotonic()
        if failure.rank < 0:
            raise failure
        lost = self.original[failure.rank]
        survivors = [i for i, d in enumerate(self.devices) if d != lost]
        if not survivors:
            raise failure
        self.kinds = tuple(self.kinds[i] for i in survivors)
        self.devices = [self.devices[i] for i in survivors]
        self.start(self.replacer(self.kinds))
        onto = plural(len(survivors), "surviving worker")
        msg = (f"{failure}; re-placed ({self.placement.label}) onto {onto} "
               f"(devices {self.devices}) and started {'it' if len(self.original) == 1 else 'them'} in "
               f"{time.monotonic() - t0:.1f} s")
        log.warning("recovery: %s", msg)
        return msg


def drive(engine: Engine, pool: WorkerPool, arrivals: Sequence[Arrival], *, recover: bool = False,
          fault: Fault | None = None) -> tuple[list[Request], dict[int, Timing], DriveLog]:
    """Serve ``arrivals`` (module docstring); the requests in arrival order, each one's timing by id."""
    clock = time.perf_counter
    t0 = clock()
    pending = deque(sorted(arrivals, key=lambda a: a.arrival_s))
    reqs: list[Request] = []
    timing: dict[int, Timing] = {}
    inflight: dict[int, tuple[Batch, float, float]] = {}  # step id -> (batch, submitted at, host s so far)
    out = DriveLog(start_s=min((a.arrival_s for a in arrivals), default=0.0))
    m = engine.config.microbatches
    killed = fault is None
    while pending or inflight or engine.scheduler.has_work():
        now = clock() - t0
        while pending and pending[0].arrival_s <= now:
            a = pending.popleft()
            r = engine.add_request(a.prompt_ids, a.params)
            reqs.append(r)
            timing[r.id] = Timing(arrival_s=a.arrival_s)
        while len(inflight) < m:
            h0 = clock()
            batch = engine.schedule(frozenset(b.group for b, _, _ in inflight.values()))
            if batch is None:
                break
            sid = pool.cluster.submit(batch.inputs)
            inflight[sid] = (batch, clock(), clock() - h0)
            if not killed and any(s.request.id == fault.at_request for s in batch.scheduled):
                if fault.rank in pool.original:  # a device the placement left empty runs no worker
                    os.kill(pool.cluster.procs[pool.original.index(fault.rank)].pid, signal.SIGKILL)
                killed = True
        if not inflight:
            if not pending:
                break
            time.sleep(max(0.0, min(0.05, pending[0].arrival_s - (clock() - t0))))
            continue
        wait = 0.05 if not pending else max(1e-3, min(0.05, pending[0].arrival_s - (clock() - t0)))
        try:
            done = pool.cluster.poll(wait)
        except WorkerFailure as e:
            if not recover:
                raise
            inflight.clear()
            engine.restart()
            out.recoveries.append(pool.recover(e))
            continue
        for sid, fin in done.items():
            batch, submitted, host = inflight.pop(sid)
            h0 = clock()
            finished = engine.complete(batch, fin.logits)
            t = clock() - t0
            for s in batch.scheduled:
                tm = timing[s.request.id]
                if tm.first_s is None and s.request.output_ids:
                    tm.first_s = t
            for r in finished:
                timing[r.id].finish_s = t
            out.host_s.append(host + clock() - h0)
            out.wall_s.append(clock() - submitted)
            out.tokens.append(batch.inputs.tokens)
            out.spans.append((batch.group, submitted, clock(), {pool.original[d]: (w["start_s"], w["end_s"])
                                                                for d, w in enumerate(fin.workers)}))
            out.busy_s.append({pool.original[d]: w["busy_s"] for d, w in enumerate(fin.workers)})
            out.idle_s.append({pool.original[d]: w["idle_s"] for d, w in enumerate(fin.workers)})
    out.end_s = clock() - t0
    return reqs, timing, out
