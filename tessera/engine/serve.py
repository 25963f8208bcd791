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

``Loop`` is that loop one step at a time, shared with the HTTP server (``tessera.serve``), which adds
requests as they come instead of on a clock; ``InProcess`` stands in for the pool when a lone ``cpu`` runs
the program in this process.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from tessera.engine import remote
from tessera.engine.cluster import ClusterSettings, EngineCluster, Finished
from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.devices import WorkerKind
from tessera.engine.engine import Batch, Engine
from tessera.engine.inputs import IterationInputs
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
                                     load_format=self.load_format, seed=self.seed, settings=self.settings,
                                     link=remote.installed())
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


@dataclass(frozen=True)
class Completed:
    """One iteration's logits taken: its batch, the requests it finished, and when (seconds from the start)."""

    batch: Batch
    finished: tuple[Request, ...]
    at_s: float


class InProcess:
    """The whole program run by this process (a lone ``cpu``), behind the worker pool's interface: an
    iteration runs when it is submitted and its logits wait for the next poll. It cannot lose a worker."""

    def __init__(self, engine: Engine) -> None:
        assert engine.executor is not None, "an engine with a program"
        self.engine = engine
        self.cluster = self
        self.original = [0]
        self.placement: Placement | None = None
        self.next_id = 0
        self.done: dict[int, Finished] = {}

    def submit(self, inputs: IterationInputs) -> int:
        start = time.perf_counter()
        with torch.no_grad():
            logits = self.engine.executor(inputs)
        end = time.perf_counter()
        sid, self.next_id = self.next_id, self.next_id + 1
        report = {"busy_s": end - start, "idle_s": 0.0, "start_s": start, "end_s": end}
        self.done[sid] = Finished(logits=logits, workers=[report])
        return sid

    def poll(self, timeout_s: float) -> dict[int, Finished]:
        done, self.done = self.done, {}
        return done

    def recover(self, failure: WorkerFailure) -> str:
        raise failure


class Switch(Protocol):
    """A schedule switch the loop consults (``tessera.engine.adaptive.Switcher``): ``gate`` before
    scheduling (False: drain, schedule nothing new), ``pool`` the pool iterations go to now; times in
    seconds from the start of the stream."""

    @property
    def pool(self) -> WorkerPool: ...
    def gate(self, engine: Engine, inflight: int, now_s: float) -> bool: ...
    def submitted(self, sid: int, now_s: float) -> None: ...
    def completed(self, sid: int, now_s: float) -> None: ...
    def finish(self, end_s: float) -> None: ...


class Loop:
    """The driver's loop, one step at a time, shared by ``drive`` (arrivals on a clock) and the HTTP server
    (arrivals from requests): a step submits the next groups' iterations while fewer than m are in flight,
    waits up to ``wait_s`` for finished ones and completes them (sampling, stop checks); a lost worker
    is recovered from here (``recover``) or raised. Requests are added to ``engine`` by the caller, between
    steps, from the same thread."""

    def __init__(self, engine: Engine, pool: WorkerPool | InProcess, *, recover: bool = False,
                 fault: Fault | None = None, start_s: float = 0.0, switch: Switch | None = None) -> None:
        self.engine, self.pool, self.recover, self.fault = engine, pool, recover, fault
        self.switch = switch  # the adaptive switch: m and the pool follow its schedule
        self.clock = time.perf_counter
        self.t0 = self.clock()
        self.inflight: dict[int, tuple[Batch, float, float]] = {}  # step id -> (batch, submitted, host s)
        self.log = DriveLog(start_s=start_s)
        self.killed = fault is None

    def now(self) -> float:
        return self.clock() - self.t0

    def busy_groups(self) -> frozenset[int]:
        return frozenset(b.group for b, _, _ in self.inflight.values())

    def submit(self) -> None:
        """Schedule and send iterations while fewer than m are in flight and a free group has work."""
        if self.switch is not None:
            if not self.switch.gate(self.engine, len(self.inflight), self.now()):
                return
            self.pool = self.switch.pool
        while len(self.inflight) < self.engine.config.microbatches:
            h0 = self.clock()
            batch = self.engine.schedule(self.busy_groups())
            if batch is None:
                break
            sid = self.pool.cluster.submit(batch.inputs)
            self.inflight[sid] = (batch, self.clock(), self.clock() - h0)
            if self.switch is not None:
                self.switch.submitted(sid, self.now())
            self.inject(batch)

    def inject(self, batch: Batch) -> None:
        f = self.fault
        if not self.killed and any(s.request.id == f.at_request for s in batch.scheduled):
            if f.rank in self.pool.original:  # a device the placement left empty runs no worker
                os.kill(self.pool.cluster.procs[self.pool.original.index(f.rank)].pid, signal.SIGKILL)
            self.killed = True

    def step(self, wait_s: float) -> list[Completed]:
        """Submit, then (if anything is in flight) take what finishes within ``wait_s``."""
        self.submit()
        if not self.inflight:
            return []
        try:
            done = self.pool.cluster.poll(wait_s)
        except WorkerFailure as e:
            if not self.recover:
                raise
            self.inflight.clear()
            self.engine.restart()
            self.log.recoveries.append(self.pool.recover(e))
            return []
        return [self.take(sid, fin) for sid, fin in done.items()]

    def take(self, sid: int, fin: Finished) -> Completed:
        batch, submitted, host = self.inflight.pop(sid)
        h0 = self.clock()
        finished = self.engine.complete(batch, fin.logits)
        at_s = self.now()
        if self.switch is not None:
            self.switch.completed(sid, at_s)
        out, ranks = self.log, self.pool.original
        out.host_s.append(host + self.clock() - h0)
        out.wall_s.append(self.clock() - submitted)
        out.tokens.append(batch.inputs.tokens)
        out.spans.append((batch.group, submitted, self.clock(), {ranks[d]: (w["start_s"], w["end_s"])
                                                                 for d, w in enumerate(fin.workers)}))
        out.busy_s.append({ranks[d]: w["busy_s"] for d, w in enumerate(fin.workers)})
        out.idle_s.append({ranks[d]: w["idle_s"] for d, w in enumerate(fin.workers)})
        return Completed(batch=batch, finished=tuple(finished), at_s=at_s)


def drive(engine: Engine, pool: WorkerPool | InProcess, arrivals: Sequence[Arrival], *, recover: bool = False,
          fault: Fault | None = None, switch: Switch | None = None
          ) -> tuple[list[Request], dict[int, Timing], DriveLog]:
    """Serve ``arrivals`` (module docstring); the requests in arrival order, each one's timing by id. With
    ``switch``, the micro-batch count and the pool follow its schedule (``tessera.engine.adaptive``)."""
    pending = deque(sorted(arrivals, key=lambda a: a.arrival_s))
    reqs: list[Request] = []
    timing: dict[int, Timing] = {}
    loop = Loop(engine, pool, recover=recover, fault=fault, switch=switch,
                start_s=min((a.arrival_s for a in arrivals), default=0.0))
    while pending or loop.inflight or engine.scheduler.has_work():
        now = loop.now()
        while pending and pending[0].arrival_s <= now:
            a = pending.popleft()
            r = engine.add_request(a.prompt_ids, a.params)
            reqs.append(r)
            timing[r.id] = Timing(arrival_s=a.arrival_s)
        loop.submit()
        if not loop.inflight:
            if not pending:
                break
            time.sleep(max(0.0, min(0.05, pending[0].arrival_s - loop.now())))
            continue
        wait = 0.05 if not pending else max(1e-3, min(0.05, pending[0].arrival_s - loop.now()))
        for c in loop.step(wait):
            for s in c.batch.scheduled:
                tm = timing[s.request.id]
                if tm.first_s is None and s.request.output_ids:
                    tm.first_s = c.at_s
            for r in c.finished:
                timing[r.id].finish_s = c.at_s
    loop.log.end_s = loop.now()
    if switch is not None:
        switch.finish(loop.log.end_s)
    return reqs, timing, loop.log
