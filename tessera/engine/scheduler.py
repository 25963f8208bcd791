"""Continuous batching with chunked prefill, as vLLM v1 schedules it, over m groups of running requests.

An iteration is one group's batch. Its token budget (``max_num_batched_tokens``) goes first to every
running decode of the group (one token each), then to its requests still prefilling, then to waiting
requests it admits, each taking a chunk of its prompt as large as the budget left. A request is admitted
while fewer than ``max_num_seqs`` run in all (``group_seqs`` in the group) and the KV pages (or the
state slot) of its first chunk are free. When a running request needs a page and none is free, the
latest-arrived running request (of any group) not yet in this batch is preempted, as vLLM's recompute
policy does; if that one arrived before the request in need, the request in need is preempted instead, so
the oldest request always progresses. A preempted request's pages are freed, it goes back to the front of
the queue and later recomputes its prompt and output. An iteration that preempted admits nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from tessera.engine.cache import FreeList, pages_for
from tessera.engine.config import EngineConfig
from tessera.engine.request import Request


@dataclass(frozen=True)
class Scheduled:
    request: Request
    tokens: int  # tokens computed for it this iteration, from request.computed on


class Scheduler:
    """Holds the waiting queue and each group's running requests; pages and slots come from free lists
    (``pages`` None: the model has no KV; ``slots`` None: no per-sequence state)."""

    def __init__(self, config: EngineConfig, pages: FreeList | None, slots: FreeList | None) -> None:
        self.config = config
        self.pages = pages
        self.slots = slots
        self.waiting: deque[Request] = deque()
        self.running: list[list[Request]] = [[] for _ in range(config.microbatches)]
        self.preempted = 0

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    @property
    def num_running(self) -> int:
        return sum(len(g) for g in self.running)

    def has_work(self) -> bool:
        return bool(self.waiting) or self.num_running > 0

    def schedule(self, group: int, busy: frozenset[int] = frozenset()) -> list[Scheduled]:
        """The next batch of ``group``: decodes, then prefilling requests' chunks, then admissions. Requests
        of the ``busy`` groups (an iteration in flight writes their pages) are never preempted."""
        budget = self.config.max_num_batched_tokens
        out: list[Scheduled] = []
        run = self.running[group]
        preempted = self.preempted
        for decoding in (True, False):
            for r in list(run):
                if budget == 0:
                    break
                if r not in run or (r.remaining == 1) != decoding:
                    continue
                n = min(r.remaining, budget)
                if self._grow(r, n, out, busy):
                    out.append(Scheduled(r, n))
                    budget -= n
        while budget and self.waiting and len(run) < self.config.group_seqs \
                and self.num_running < self.config.max_num_seqs and self.preempted == preempted:
            r = self.waiting[0]
            n = min(r.remaining, budget)
            if not self._admit(r, n):
                break
            self.waiting.popleft()
            r.group = group
            run.append(r)
            out.append(Scheduled(r, n))
            budget -= n
        return out

    def _grow(self, r: Request, n: int, batch: list[Scheduled], busy: frozenset[int] = frozenset()) -> bool:
        """Give ``r`` the pages for ``n`` more tokens, preempting later arrivals if needed; False when ``r``
        itself had to be preempted."""
        if self.pages is None:
            return True
        need = pages_for(r.computed + n, self.config.page_size) - len(r.pages)
        while need > 0:
            got = self.pages.take(need)
            if got is not None:
                r.pages += got
                return True
            in_batch = {s.request for s in batch}
            later = [v for g, run in enumerate(self.running) if g not in busy for v in run
                     if v.id > r.id and v not in in_batch]
            victim = max(later, key=lambda v: v.id, default=r)
            self.preempt(victim)
            if victim is r:
                return False
        return True

    def _admit(self, r: Request, n: int) -> bool:
        if self.slots is not None:
            got = self.slots.take(1)
            if got is None:
                return False
            r.slot = got[0]
        if self.pages is not None:
            got = self.pages.take(pages_for(n, self.config.page_size))
            if got is None:
                self._release_slot(r)
                return False
            r.pages = got
        return True

    def preempt(self, r: Request) -> None:
        """Back to the front of the queue with nothing cached: it recomputes prompt and output later."""
        self._release(r)
        r.computed = 0
        r.preemptions += 1
        self.preempted += 1
        self.waiting.appendleft(r)

    def regroup(self, config: EngineConfig) -> None:
        """Take ``config``'s group count between iterations (none in flight): the running requests keep
        their pages and are dealt out in arrival order over the new groups (at most ⌈running / m⌉ each,
        within ``group_seqs``)."""
        running = sorted((r for g in self.running for r in g), key=lambda r: r.id)
        self.config = config
        self.running = [[] for _ in range(config.microbatches)]
        for i, r in enumerate(running):
            r.group = i % config.microbatches
            self.running[r.group].append(r)

    def remove(self, r: Request) -> None:
        """Out of the queue, or out of its group with its pages and slot freed."""
        if r in self.waiting:
            self.waiting.remove(r)
        self._release(r)

    def finish(self, r: Request) -> None:
        self._release(r)

    def _release(self, r: Request) -> None:
        if r.group is not None:
            self.running[r.group].remove(r)
            r.group = None
        if self.pages is not None:
            self.pages.give(r.pages)
        r.pages = []
        self._release_slot(r)

    def _release_slot(self, r: Request) -> None:
        if self.slots is not None and r.slot is not None:
            self.slots.give([r.slot])
        r.slot = None
