"""Continuous batching by hand: decodes first, then chunks up to the token budget; admission limits;
preemption of the latest arrival; pages back on the free list."""

from __future__ import annotations

import pytest

from tessera.engine.cache import FreeList
from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.request import Request
from tessera.engine.scheduler import Scheduler
from tessera.errors import UserError

PARAMS = SamplingParams(max_tokens=4)


def running(s: Scheduler, rid: int, prompt: int, group: int = 0) -> Request:
    """A request whose prompt is computed and which has sampled one token: it decodes next."""
    r = Request(id=rid, prompt_ids=[7] * prompt, params=PARAMS, output_ids=[9], computed=prompt, group=group)
    r.pages = s.pages.take(-(-prompt // s.config.page_size))
    s.running[group].append(r)
    return r


def plan(batch) -> list[tuple[int, int]]:
    return [(x.request.id, x.tokens) for x in batch]


def test_decodes_first_then_a_chunk_within_the_budget():
    s = Scheduler(EngineConfig(max_num_batched_tokens=5, page_size=4), FreeList(32), None)
    running(s, 0, 3)
    running(s, 1, 6)
    s.add(Request(id=2, prompt_ids=[1] * 10, params=PARAMS))
    assert plan(s.schedule(0)) == [(0, 1), (1, 1), (2, 3)]  # 2 decodes, then 3 of the 10 prompt tokens
    s.running[0][2].computed = 3
    s.running[0][0].computed += 1
    s.running[0][1].computed += 1
    s.running[0][0].output_ids.append(9)
    s.running[0][1].output_ids.append(9)
    assert plan(s.schedule(0)) == [(0, 1), (1, 1), (2, 3)]  # the prompt continues where it stopped


def test_admission_limits():
    config = EngineConfig(max_num_seqs=3, max_num_batched_tokens=100, microbatches=2)
    s = Scheduler(config, FreeList(64), None)
    for i in range(4):
        s.add(Request(id=i, prompt_ids=[1] * 5, params=PARAMS))
    assert plan(s.schedule(0)) == [(0, 5), (1, 5)]  # a group holds ceil(3 / 2) = 2
    assert plan(s.schedule(1)) == [(2, 5)]  # 3 running in all
    assert [r.id for r in s.waiting] == [3]


def test_no_free_page_preempts_the_latest_arrival():
    s = Scheduler(EngineConfig(max_num_batched_tokens=8, page_size=4, microbatches=2), FreeList(3), None)
    old = running(s, 0, 4, group=0)  # 1 page, full: its decode needs a second page
    young = running(s, 5, 8, group=1)  # 2 pages: the pool is empty
    assert plan(s.schedule(0)) == [(0, 1)]
    assert young.computed == 0 and young.pages == [] and list(s.waiting) == [young] and s.preempted == 1
    assert len(old.pages) == 2 and s.pages.free == 1


def test_an_older_request_is_not_preempted_for_a_younger_one():
    """The older request was preempted once and readmitted behind the younger: the younger, first in the
    group, needs a page and gives up its own rather than the older one's."""
    s = Scheduler(EngineConfig(max_num_batched_tokens=8, page_size=4), FreeList(2), None)
    young = running(s, 1, 4)
    old = running(s, 0, 4)  # both full: each decode needs a second page, none is free
    assert plan(s.schedule(0)) == [(0, 1)]
    assert list(s.waiting) == [young] and len(old.pages) == 2


def test_finish_returns_pages_and_slots():
    pages, slots = FreeList(8), FreeList(2)
    s = Scheduler(EngineConfig(max_num_batched_tokens=16, page_size=4, max_num_seqs=2), pages, slots)
    s.add(Request(id=0, prompt_ids=[1] * 9, params=PARAMS))
    (only,) = s.schedule(0)
    assert len(only.request.pages) == 3 and only.request.slot == 0
    s.finish(only.request)
    assert pages.free == 8 and slots.free == 2 and not s.running[0]


def test_settings_are_checked():
    with pytest.raises(UserError, match="max-num-seqs=0"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(UserError, match="microbatches=3 must be <= max-num-seqs=2"):
        EngineConfig(max_num_seqs=2, microbatches=3)
    with pytest.raises(UserError, match="top-p=0"):
        SamplingParams(top_p=0)
