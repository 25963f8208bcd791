"""Share a plan's search between this process and forked child processes.

Why fork: a child inherits the captured model, the cost tables and every cache as they are, so nothing is
captured, loaded or pickled on the way in; only answers come back, pickled through a pipe. A child runs
the planner's pure-Python search and HiGHS (one thread per solve), never torch, so the parent's torch
threads are not needed in it. Off Linux (no fork on Windows; on macOS a forked process may not use the
system frameworks the parent loaded) every task runs in this process: the answers are the same, only later.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def run_shared(tasks: Sequence[Callable[[], T]], workers: int = 1,
               on_start: Callable[[int], None] | None = None) -> list[T]:
    """Every task run once, by this process or by one of ``workers`` − 1 forked children, each process
    taking the next task no one has taken yet (list the longest first: the last ones fill the gaps).
    Answers in task order. A task's exception is re-raised here; a child that dies without answering (a
    crash in native code) is a RuntimeError naming its exit code. ``on_start(i)`` is called in this
    process as it starts task i (a progress line)."""
    if workers <= 1 or len(tasks) <= 1 or not sys.platform.startswith("linux"):
        return [_start(i, t, on_start) for i, t in enumerate(tasks)]
    ctx = multiprocessing.get_context("fork")
    taken = ctx.Value("i", 0)  # the next task no process has taken; shared memory, inherited by the fork

    def take() -> int:
        with taken.get_lock():
            i = taken.value
            taken.value += 1
        return i

    def work(report: Callable[[int], None] | None) -> dict[int, T]:
        done: dict[int, T] = {}
        while (i := take()) < len(tasks):
            done[i] = _start(i, tasks[i], report)
        return done

    # the collector would visit (and so copy, page by page) every object the children inherit: moved out of
    # its sight while they fork, then back in this process only
    gc.freeze()
    try:
        children = [_Child(lambda: work(None), ctx) for _ in range(workers - 1)]
    finally:
        gc.unfreeze()
    try:
        answers = work(on_start)
    except BaseException:
        for c in children:
            c.kill()
        raise
    for c in children:
        answers.update(c.result())
    return [answers[i] for i in range(len(tasks))]


def _start(i: int, task: Callable[[], T], on_start: Callable[[int], None] | None) -> T:
    if on_start is not None:
        on_start(i)
    return task()


class _Child:
    """``fn()`` started in a forked child at construction; ``result()`` waits for its answer."""

    def __init__(self, fn: Callable[[], Any], ctx: Any) -> None:
        self._recv, send = ctx.Pipe(duplex=False)

        def child() -> None:
            try:
                answer = (True, fn())
            except BaseException as e:  # noqa: BLE001 - handed to the parent, which re-raises it
                answer = (False, e)
            try:
                send.send(answer)
            except Exception as e:  # noqa: BLE001 - an answer or exception that does not pickle
                send.send((False, RuntimeError(f"the planner's worker could not send its answer: {e!r}")))
            send.close()
            os._exit(0)  # skip the parent's atexit hooks and buffered streams inherited by the fork

        self._proc = ctx.Process(target=child, daemon=True)
        self._proc.start()
        send.close()

    def kill(self) -> None:
        self._proc.kill()
        self._proc.join()
        self._recv.close()

    def result(self) -> Any:
        try:
            ok, value = self._recv.recv()
        except EOFError:
            self._proc.join()
            raise RuntimeError(f"the planner's worker process died without an answer (exit code "
                               f"{self._proc.exitcode})") from None
        finally:
            self._recv.close()
        self._proc.join()
        if not ok:
            raise value
        return value
