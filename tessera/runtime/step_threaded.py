"""The gloo step loop: every receive posted up front, micro-batches interleaved as their data arrives.

gloo matches messages by tag, so every receive of a step is posted before the step runs: as soon as its
command reaches the worker (``post``), while an earlier queued step still computes. A receive posted
before its message lands takes gloo's cheap path (~25 µs against ~100 µs once the bytes wait, measured
between two local processes; several times that when both cores compute). Each micro-batch then runs
until its next kernel waits on a transfer that has not arrived, so one micro-batch computes while
another's activations travel; a serving worker holds several steps (ThreadedStep) in flight at once
and advances each in turn, so one group's step computes while another group's waits. gloo's
point-to-point Work never reports completion to is_completed() before wait(), so a thread per
micro-batch index waits on that micro-batch's receives in the order it needs them; the threads live as
long as the worker (Waiters), since starting one per step cost ~1 ms of a step on a busy 2-core machine.
A CUDA worker on gloo stages transfers through host memory (PartitionWorker.outgoing / landed).
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
import traceback
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tessera.runtime.compiled import call
from tessera.runtime.partition import BufferTransfer
from tessera.runtime.program import Storages


def tag(step_id: int, t: BufferTransfer, mb: int) -> int:
    assert t.index < 1 << 16 and mb < 1 << 6, "transfer index / micro-batch exceed the tag layout"
    return ((step_id % 256) << 22) | (t.index << 6) | mb


@dataclass(frozen=True)
class Posted:
    """A step's receives, posted before it runs."""

    step_id: int
    bufs: dict[tuple[int, int], torch.Tensor]  # (transfer index, micro-batch) -> the bytes' landing buffer
    # per micro-batch: (transfer, mb, Work), in need order
    works: tuple[tuple[tuple[BufferTransfer, int, Any], ...], ...]


def post_receives(w: Any, lps: list[Any], step_id: int) -> Posted:
    """Post every receive of one step of ``len(lps)`` micro-batches (micro-batch i runs LocalPlan lps[i])."""
    bufs: dict[tuple[int, int], torch.Tensor] = {}
    works = []
    for mb, lp in enumerate(lps):
        mine = []
        for t in lp.order:
            buf = w.recv_buffer(t.nbytes)
            bufs[(t.index, mb)] = buf
            mine.append((t, mb, dist.irecv(buf, src=t.src, tag=tag(step_id, t, mb))))
        works.append(tuple(mine))
    return Posted(step_id=step_id, bufs=bufs, works=tuple(works))


class Waiters:
    """Persistent threads, one per key (a micro-batch index, or (lane, micro-batch) for steps in flight
    together), each running the jobs handed to it in order."""

    def __init__(self) -> None:
        self._jobs: dict[Hashable, queue.SimpleQueue] = {}

    def run(self, key: Hashable, job: Callable[[], None]) -> None:
        q = self._jobs.get(key)
        if q is None:
            q = self._jobs[key] = queue.SimpleQueue()
            threading.Thread(target=_serve_jobs, args=(q,), daemon=True, name=f"tessera-recv-{key}").start()
        q.put(job)


def _serve_jobs(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        try:
            job()
        except BaseException:  # noqa: BLE001 - a job's own errors reach its step; keep serving the next
            traceback.print_exc()


class ThreadedStep:
    """One step of ``len(stores)`` micro-batches on worker ``w``, resumable: ``advance`` runs every kernel
    whose data is there and returns; the caller waits on ``w.wake`` (notified by every arrival) until
    ``ready()`` (``wait_for``). Micro-batch i runs LocalPlan ``lps[i]`` (a list: each request its own
    program in a serving iteration) or all run ``lps`` (one LocalPlan: a round). ``posted``: its receives,
    if already posted (else posted now). Kernel times are clock tokens; sends and arrivals are host times."""

    def __init__(self, w: Any, lps: Any, stores: list[Storages], step_id: int, posted: Posted | None = None,
                 lane: int = 0) -> None:
        m = len(stores)
        self.w, self.stores, self.step_id = w, stores, step_id
        self.lps = lps if isinstance(lps, list) else [lps] * m
        posted = posted or post_receives(w, self.lps, step_id)
        assert posted.step_id == step_id and len(posted.works) == m, "receives posted for another step"
        self.pending: dict[tuple[int, int], torch.Tensor] = dict(posted.bufs)
        self.done: dict[tuple[int, int], float] = {}
        self.errors: list[str] = []
        self.sent: list[Any] = []
        self.kernels: list[tuple[int, int, Any, Any]] = []
        self.sends: list[tuple[int, int, float]] = []
        self.recvs: list[tuple[int, int, float]] = []  # (transfer, mb, arrival noticed at)
        self.waits: list[tuple[float, float]] = []  # intervals with nothing the worker could run
        self.cursor = [0] * m
        self.n_of = [len(lp.ops) for lp in self.lps]
        self.synced = [not lp.end_recvs for lp in self.lps]  # end-of-step state syncs all in
        # the wait (and its timeout) starts with the step, not when the receives were posted; ``lane``
        # keeps the receive threads of steps in flight together apart (one thread per (lane, mb))
        for mb, works in enumerate(posted.works):
            if works:
                w.waiters.run(mb if lane == 0 else (lane, mb), lambda works=works: self._receive(works))
        for mb in range(m):
            self._post_sends(self.lps[mb].start_sends, mb)

    def _receive(self, works: tuple[tuple[BufferTransfer, int, Any], ...]) -> None:
        cond, timeout = self.w.wake, datetime.timedelta(seconds=self.w.spec.recv_timeout_s)
        for t, mb, work in works:
            try:
                work.wait(timeout)
            except Exception as e:  # noqa: BLE001 - the transport's error text is the diagnosis
                with cond:
                    self.errors.append(f"receive of buffer {t.buffer} from worker {t.src} failed: "
                                       f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
                    cond.notify_all()
                return
            with cond:
                self.done[(t.index, mb)] = time.perf_counter()
                cond.notify_all()

    def _post_sends(self, ts: tuple[BufferTransfer, ...], mb: int) -> None:
        for t in ts:
            data = self.w.outgoing(self.stores[mb][t.buffer], t.snapshot)
            self.sends.append((t.index, mb, time.perf_counter()))
            self.sent.append((dist.isend(data, dst=t.dst, tag=tag(self.step_id, t, mb)), data))

    def _arrived(self, t: BufferTransfer, mb: int) -> bool:
        key = (t.index, mb)
        if key not in self.pending:
            return True
        if self.errors:
            raise RuntimeError(self.errors[0])
        if key not in self.done:
            return False
        self.stores[mb][t.buffer] = self.w.landed(self.pending.pop(key))
        self.recvs.append((t.index, mb, self.done[key]))
        return True

    def advance(self) -> bool:
        """Run every micro-batch until its next kernel waits on a transfer not yet in (then its end-of-step
        syncs); whether anything ran or landed."""
        clock, record, progressed = self.w.clock.mark, self.kernels.append, False
        for mb, lp in enumerate(self.lps):
            store, i, n_ops = self.stores[mb], self.cursor[mb], self.n_of[mb]
            ops, need, after = lp.ops, lp.recvs, lp.sends
            while i < n_ops:
                if need[i] and not all([self._arrived(t, mb) for t in need[i]]):
                    break
                c = ops[i]
                t0 = clock()
                call(store, c)
                record((c.kernel, mb, t0, clock()))
                if after[i]:
                    self._post_sends(after[i], mb)
                i += 1
            progressed |= i > self.cursor[mb]
            self.cursor[mb] = i
            if i == n_ops and not self.synced[mb] and all([self._arrived(t, mb) for t in lp.end_recvs]):
                self.synced[mb] = progressed = True
        return progressed

    @property
    def finished(self) -> bool:
        return all(self.synced) and all(c == n for c, n in zip(self.cursor, self.n_of, strict=True))

    def blocking(self) -> list[tuple[int, int]]:
        """The receives every unfinished micro-batch waits on next: (transfer index, micro-batch)."""
        out = []
        for mb, lp in enumerate(self.lps):
            ts = lp.recvs[self.cursor[mb]] if self.cursor[mb] < self.n_of[mb] else lp.end_recvs
            out += [(t.index, mb) for t in ts if (t.index, mb) in self.pending]
        return out

    def ready(self) -> bool:
        """Whether ``advance`` could do something now (call under ``w.wake``): an error to raise or a
        blocking receive landed."""
        return bool(self.errors) or any(k in self.done for k in self.blocking())

    def describe_wait(self) -> str:
        idx, mb = self.blocking()[0]
        t = next(t for t in self.lps[mb].order if t.index == idx)
        return f"receive of buffer {t.buffer} from worker {t.src}"

    def events(self) -> dict[str, list]:
        return dict(kernels=self.kernels, sends=self.sends, recvs=self.recvs, waits=self.waits)


def wait_for(w: Any, steps: list[ThreadedStep], more: Callable[[], bool] = lambda: False) -> None:
    """Block until one of ``steps`` can advance (or ``more()``: new work arrived), recording the blocked
    interval in every step's waits. A receive that stays out raises: here after the worker's timeout with
    nothing arriving, and in its receive thread (the transport's own timeout) whatever else arrives."""
    blocked = [s for s in steps if s.blocking()]
    assert blocked, "every step blocked but no receive pending"
    t0 = time.perf_counter()
    with w.wake:
        ok = w.wake.wait_for(lambda: more() or any(s.ready() for s in steps), timeout=w.spec.recv_timeout_s)
    for s in steps:
        s.waits.append((t0, time.perf_counter()))
        if s.errors:
            raise RuntimeError(s.errors[0])
    if not ok:
        raise TimeoutError(f"worker {w.rank}: {blocked[0].describe_wait()} timed out after "
                           f"{w.spec.recv_timeout_s:g} s")


def finish_sends(w: Any, step: ThreadedStep) -> None:
    """Wait on the sends of the step finished before this one, not this one's: a send completes only once
    the peer posts its receive, i.e. takes that step's command, and a peer that takes it late would hold
    this worker here instead of letting it go on. By the time a later step ends every peer has taken the
    earlier step's command (the driver queues every worker's commands at once), so this does not deadlock."""
    w.flush_sends()
    w.unsent = step.sent  # the works and the data they read, kept alive until they complete


def run_threaded(w: Any, lps: Any, stores: list[Storages], step_id: int, posted: Posted | None = None
                 ) -> dict[str, list]:
    """One ThreadedStep run to its end on its own (the worker's only step in flight)."""
    step = ThreadedStep(w, lps, stores, step_id, posted)
    while not step.finished:
        if not step.advance() and not step.finished:
            wait_for(w, [step])
    finish_sends(w, step)
    return step.events()
