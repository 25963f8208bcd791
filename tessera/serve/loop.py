"""The engine thread: the only thread that touches the Engine and its workers.

Handlers ``submit`` a ``Ticket`` (its prompt, sampling, and the asyncio queue its events go to) and may
``abort`` it; both travel on one thread-safe queue, read between loop steps. After each step every
ticket whose request advanced gets an ``Event`` with its new token ids (``Ticket.sent`` counts those
already sent: a request restarted after a lost worker recomputes its tokens without sending them
again), the last one with the finish reason and the engine's final text. Events cross into the event
loop with ``call_soon_threadsafe``.

A request aborted while an iteration in flight holds it is dropped once that iteration is back (its
pages are being written until then).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from tessera.engine.adaptive import Switcher
from tessera.engine.config import SamplingParams
from tessera.engine.engine import Engine
from tessera.engine.request import Request
from tessera.engine.serve import Completed, InProcess, Loop, WorkerPool
from tessera.errors import UserError
from tessera.serve.metrics import Metrics

log = logging.getLogger("tessera.serve")

IDLE_WAIT_S = 0.1  # with nothing to run, wake this often (window roll, stop flag)
POLL_WAIT_S = 0.002  # with iterations in flight, how long a step waits for one before taking new requests


@dataclass(frozen=True)
class Event:
    """What a request's stream receives: new token ids; at the end the finish reason and the final text
    (EOS left out, cut at a stop string); or an error line."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    text: str | None = None
    error: str | None = None


@dataclass(eq=False)
class Ticket:
    key: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    events: asyncio.Queue
    loop: asyncio.AbstractEventLoop
    arrival_s: float = field(default_factory=time.perf_counter)
    # the engine thread's own
    request: Request | None = None
    sent: int = 0
    first_s: float | None = None

    def push(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass


class EngineThread:
    """Owns ``engine`` and ``pool``; at most ``max_outstanding`` requests accepted and not finished."""

    def __init__(self, engine: Engine, pool: WorkerPool | InProcess, metrics: Metrics, *,
                 max_outstanding: int, recover: bool = True, switch: Switcher | None = None) -> None:
        self.engine, self.metrics, self.switch = engine, metrics, switch
        # with the adaptive switch, iterations go to the pool of its current schedule
        self.loop = Loop(engine, switch.pool if switch else pool, recover=recover, switch=switch)
        self.switches_seen = 0
        self.max_outstanding = max_outstanding
        self.commands: queue.SimpleQueue[tuple[str, object]] = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.outstanding = 0
        self.tickets: dict[str, Ticket] = {}
        self.by_id: dict[int, Ticket] = {}
        self.aborts: set[str] = set()
        self.stop_flag = threading.Event()
        self.error: str | None = None
        self.thread = threading.Thread(target=self.run, name="tessera-engine-loop", daemon=True)
        pages = engine.scheduler.pages
        metrics.pages_total.set(pages.count if pages is not None else 0)

    # ---- handler side (any thread) -------------------------------------------------------------

    def submit(self, ticket: Ticket) -> bool:
        """Queue a request; False (nothing queued) when the server already holds its limit."""
        with self.lock:
            if self.outstanding >= self.max_outstanding or self.error is not None:
                return False
            self.outstanding += 1
        self.commands.put(("add", ticket))
        return True

    def abort(self, key: str) -> None:
        self.commands.put(("abort", key))

    def start(self) -> None:
        self.thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self.stop_flag.set()
        self.thread.join(timeout_s)

    # ---- the engine thread -------------------------------------------------------------------

    def run(self) -> None:
        try:
            while not self.stop_flag.is_set():
                busy = bool(self.loop.inflight) or self.engine.scheduler.has_work()
                self.take_commands(block=not busy)
                self.apply_aborts()
                for c in self.loop.step(POLL_WAIT_S):
                    self.publish(c)
                self.account()
        except Exception as e:  # the engine cannot go on (e.g. every worker lost): fail every request
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.error("engine loop stopped: %s", self.error)
            for t in list(self.tickets.values()):
                self.end(t, Event(error=self.error), "error")
            self.drain_commands_after_error()

    def take_commands(self, block: bool) -> None:
        try:
            cmd = self.commands.get(timeout=IDLE_WAIT_S) if block else self.commands.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, arg = cmd
            if kind == "add":
                self.add(arg)  # type: ignore[arg-type]
            else:
                self.aborts.add(arg)  # type: ignore[arg-type]
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                return

    def add(self, t: Ticket) -> None:
        try:
            t.request = self.engine.add_request(t.prompt_ids, t.params)
        except UserError as e:
            self.end(t, Event(error=str(e)), "error")
            return
        self.tickets[t.key] = t
        self.by_id[t.request.id] = t
        self.metrics.prompt_tokens.inc(len(t.prompt_ids))

    def apply_aborts(self) -> None:
        busy = self.loop.busy_groups()
        for key in list(self.aborts):
            t = self.tickets.get(key)
            if t is None:  # finished meanwhile, or never added
                self.aborts.discard(key)
                continue
            if t.request.group is not None and t.request.group in busy:
                continue  # its iteration in flight writes its pages: drop it when that is back
            self.aborts.discard(key)
            self.engine.abort(t.request)
            self.end(t, None, "abort")

    def publish(self, c: Completed) -> None:
        finished = {r.id for r in c.finished}
        for s in c.batch.scheduled:
            t = self.by_id.get(s.request.id)
            if t is None:
                continue
            r = s.request
            new = tuple(r.output_ids[t.sent:])
            if new and t.first_s is None:
                t.first_s = time.perf_counter()
                self.metrics.ttft.observe(t.first_s - t.arrival_s)
            t.sent += len(new)
            self.metrics.generation_tokens.inc(len(new))
            if r.id in finished:
                self.observe_finish(t)
                self.end(t, Event(token_ids=new, finish_reason=r.finish_reason, text=r.text), r.finish_reason)
            elif new:
                t.push(Event(token_ids=new))

    def observe_finish(self, t: Ticket) -> None:
        now = time.perf_counter()
        self.metrics.e2e.observe(now - t.arrival_s)
        if t.first_s is not None and t.sent > 1:
            self.metrics.tpot.observe((now - t.first_s) / (t.sent - 1))

    def end(self, t: Ticket, event: Event | None, reason: str) -> None:
        """The ticket is done: counts released, then its last event (none for an abort: nobody listens).
        Released first: a client that sends its next request as soon as this one's answer arrives must find
        the slot free and the metrics counted."""
        self.tickets.pop(t.key, None)
        if t.request is not None:
            self.by_id.pop(t.request.id, None)
            self.engine.requests.pop(t.request.id, None)  # a server runs for days: keep only live requests
        self.metrics.requests.labels(reason).inc()
        with self.lock:
            self.outstanding -= 1
        if event is not None:
            t.push(event)

    def account(self) -> None:
        """Gauges, busy seconds and recoveries from what the loop logged; the log is then emptied (a
        server's log would otherwise grow without end)."""
        sched, log_ = self.engine.scheduler, self.loop.log
        running = sched.num_running
        self.metrics.running.set(running)
        with self.lock:
            self.metrics.waiting.set(max(0, self.outstanding - running))
        if sched.pages is not None:
            self.metrics.pages_used.set(sched.pages.count - sched.pages.free)
        for b in log_.busy_s:
            self.metrics.add_busy(b)
        for msg in log_.recoveries:
            self.metrics.recoveries.inc()
            log.warning("recovered: %s", msg)
        for lst in (log_.host_s, log_.wall_s, log_.tokens, log_.busy_s, log_.idle_s, log_.spans,
                    log_.recoveries):
            lst.clear()
        self.engine.history.clear()
        if self.switch is not None:
            self.metrics.throughput_mode.set(1 if self.switch.mode == "throughput" else 0)
            self.metrics.switches.inc(len(self.switch.switches) - self.switches_seen)
            self.switches_seen = len(self.switch.switches)
        self.metrics.roll_window()

    def drain_commands_after_error(self) -> None:
        """After a fatal error: answer whatever arrives until stopped, so no handler waits forever."""
        while not self.stop_flag.is_set():
            try:
                kind, arg = self.commands.get(timeout=IDLE_WAIT_S)
            except queue.Empty:
                continue
            if kind == "add":
                self.end(arg, Event(error=self.error), "error")  # type: ignore[arg-type]
