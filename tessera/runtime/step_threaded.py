"""The gloo step loop: every receive posted up front, micro-batches interleaved as their data arrives.

gloo matches messages by tag, so every receive of a step is posted before the step runs: as soon as its
command reaches the worker (Worker.post), while an earlier queued step still computes. A receive posted
before its message lands takes gloo's cheap path (~25 µs against ~100 µs once the bytes wait, measured
between two local processes; several times that when both cores compute). Each micro-batch then runs
until its next kernel waits on a transfer that has not arrived, so one micro-batch computes while
another's activations travel. gloo's point-to-point Work never reports completion to is_completed()
before wait(), so a thread per micro-batch index waits on that micro-batch's receives in the order it
needs them; the threads live as long as the worker (Waiters), since starting one per step cost ~1 ms of
a step on a busy 2-core machine. A CUDA worker on gloo stages transfers through host memory
(Worker.outgoing / landed).
"""

from __future__ import annotations

import datetime
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from tessera.runtime.compiled import call
from tessera.runtime.partition import Transfer
from tessera.runtime.program import Storages


def tag(step_id: int, t: Transfer, mb: int) -> int:
    assert t.index < 1 << 16 and mb < 1 << 6, "transfer index / micro-batch exceed the tag layout"
    return ((step_id % 256) << 22) | (t.index << 6) | mb


@dataclass(frozen=True)
class Posted:
    """A step's receives, posted before it runs."""

    step_id: int
    bufs: dict[tuple[int, int], torch.Tensor]  # (transfer index, micro-batch) -> the bytes' landing buffer
    works: tuple[tuple[tuple[Transfer, int, Any], ...], ...]  # per micro-batch: (transfer, mb, Work), need order


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
    """Persistent threads, one per micro-batch index, each running the jobs handed to it in order."""

    def __init__(self) -> None:
        self._jobs: list[queue.SimpleQueue] = []

    def run(self, index: int, job: Callable[[], None]) -> None:
        while len(self._jobs) <= index:
            q: queue.SimpleQueue = queue.SimpleQueue()
            threading.Thread(target=_serve_jobs, args=(q,), daemon=True, name=f"tessera-recv-{len(self._jobs)}").start()
            self._jobs.append(q)
        self._jobs[index].put(job)


def _serve_jobs(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        try:
            job()
        except BaseException:  # noqa: BLE001 - a job's own errors reach its step; keep serving the next
            traceback.print_exc()


def run_threaded(w: Any, lps: Any, stores: list[Storages], step_id: int, posted: Posted | None = None
                 ) -> dict[str, list]:
    """One step of ``len(stores)`` micro-batches on Worker ``w``, micro-batch i running LocalPlan
    ``lps[i]`` (a list: each request its own program in a serving iteration) or all running ``lps`` (one
    LocalPlan: a round). ``posted``: its receives, if already posted (else posted now). Kernel times are
    clock tokens; sends, arrivals and waits are host times."""
    m, me = len(stores), w.rank
    if not isinstance(lps, list):
        lps = [lps] * m
    posted = posted or post_receives(w, lps, step_id)
    assert posted.step_id == step_id and len(posted.works) == m, "receives posted for another step"
    pending: dict[tuple[int, int], torch.Tensor] = dict(posted.bufs)
    done: dict[tuple[int, int], float] = {}
    errors: list[str] = []
    cond = threading.Condition()
    timeout = datetime.timedelta(seconds=w.spec.recv_timeout_s)

    def receive(works: tuple[tuple[Transfer, int, Any], ...]) -> None:
        for t, mb, work in works:
            try:
                work.wait(timeout)
            except Exception as e:  # noqa: BLE001 - the transport's error text is the diagnosis
                with cond:
                    errors.append(f"receive of buffer {t.buffer} from worker {t.src} failed: "
                                  f"{str(e).splitlines()[0] if str(e) else type(e).__name__}")
                    cond.notify_all()
                return
            with cond:
                done[(t.index, mb)] = time.perf_counter()
                cond.notify_all()

    # the wait (and its timeout) starts with the step, not when the receives were posted
    for mb, works in enumerate(posted.works):
        if works:
            w.waiters.run(mb, lambda works=works: receive(works))
    sent: list[Any] = []
    ev_kernels: list[tuple[int, int, Any, Any]] = []
    ev_sends: list[tuple[int, int, float]] = []
    ev_recvs: list[tuple[int, int, float]] = []  # (transfer, mb, arrival noticed at)
    ev_waits: list[tuple[float, float]] = []  # intervals with every micro-batch blocked on a transfer

    def post_sends(ts: tuple[Transfer, ...], mb: int) -> None:
        for t in ts:
            data = w.outgoing(stores[mb][t.buffer], t.snapshot)
            ev_sends.append((t.index, mb, time.perf_counter()))
            sent.append((dist.isend(data, dst=t.dst, tag=tag(step_id, t, mb)), data))

    def arrived(t: Transfer, mb: int) -> bool:
        key = (t.index, mb)
        if key not in pending:
            return True
        if errors:
            raise RuntimeError(errors[0])
        if key not in done:
            return False
        stores[mb][t.buffer] = w.landed(pending.pop(key))
        ev_recvs.append((t.index, mb, done[key]))
        return True

    def wait_until(keys: list[tuple[int, int]], what: str) -> None:
        t0 = time.perf_counter()
        with cond:
            ok = cond.wait_for(lambda: bool(errors) or any(k in done for k in keys), timeout=w.spec.recv_timeout_s)
        ev_waits.append((t0, time.perf_counter()))
        if errors:
            raise RuntimeError(errors[0])
        if not ok:
            raise TimeoutError(f"worker {me}: {what} timed out after {w.spec.recv_timeout_s:g} s")

    for mb in range(m):
        post_sends(lps[mb].start_sends, mb)
    clock, record = w.clock.mark, ev_kernels.append
    cursor = [0] * m
    n_of = [len(lp.ops) for lp in lps]
    while any(c < n for c, n in zip(cursor, n_of, strict=True)):
        progressed = False
        for mb in range(m):
            store, i = stores[mb], cursor[mb]
            ops, need, after, n_ops = lps[mb].ops, lps[mb].recvs, lps[mb].sends, n_of[mb]
            while i < n_ops:
                if need[i] and not all([arrived(t, mb) for t in need[i]]):
                    break
                c = ops[i]
                t0 = clock()
                call(store, c)
                record((c.kernel, mb, t0, clock()))
                if after[i]:
                    post_sends(after[i], mb)
                i += 1
            progressed |= i > cursor[mb]
            cursor[mb] = i
        if not progressed:
            blocking = [(t.index, mb) for mb in range(m) if cursor[mb] < n_of[mb]
                        for t in lps[mb].recvs[cursor[mb]] if (t.index, mb) in pending]
            assert blocking, "every micro-batch blocked but no receive pending"
            t = next(t for t in lps[blocking[0][1]].order if t.index == blocking[0][0])
            wait_until(blocking, f"receive of buffer {t.buffer} from worker {t.src}")
    for mb in range(m):  # end-of-step state syncs
        for t in lps[mb].end_recvs:
            while not arrived(t, mb):
                wait_until([(t.index, mb)], f"receive of buffer {t.buffer} from worker {t.src}")
    # The previous step's sends, not this one's: a send completes only once the peer posts its receive,
    # i.e. starts that step, and a peer still busy with an earlier queued step (the asynchronous schedule)
    # would hold this worker here instead of letting it start its next step. By the end of step N+1 every
    # peer has started step N (its step N needs only sends already made), so this wait does not deadlock.
    w.flush_sends()
    w.unsent = sent  # the works and the data they read, kept alive until they complete
    return dict(kernels=ev_kernels, sends=ev_sends, recvs=ev_recvs, waits=ev_waits)
