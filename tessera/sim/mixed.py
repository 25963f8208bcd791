"""One replica of a serving-model ("mixed") plan: m groups of sequences, one shared FCFS queue, stages along
the route contending for the replica's devices and links (docs/sim.md "Serving-model plans").

Per group g: its running decodes (lazy, as in tessera.sim.replica: a request's KV is ``base + it_g``, ``it_g``
the group's iteration counter, and it finishes when ``it_g`` reaches its precomputed finish iteration), and
the prompts it is prefilling (admission order). A group starting an iteration schedules as vLLM v1 does:
every running decode first (one token each), then prompt chunks (prompts already mid-prefill first, then
newly admitted waiting requests) until the iteration holds ``max_num_batched_tokens`` tokens. A request is
admitted while the group holds fewer than ``group_seqs`` sequences, the replica fewer than ``max_num_seqs``,
and its tokens fit the replica's KV beside what is in use (the whole prompt is reserved at admission). When
the group's next decode tokens do not fit, it gives up its most recent prompt in prefill, then preempts its
most recently joined decode (recompute: its KV dropped, it re-queues at the front with prompt + generated
tokens to prefill). The iteration completing a prompt's last chunk emits its first token.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from tessera.sim.model import PlanModel
from tessera.sim.replica import DONE, PREFILLING, RUNNING, WAITING, RequestArrays, wants_switch
from tessera.sim.stages import Pipeline

GROUPS = 1 << 20  # a STAGE event's arg is generation·GROUPS + group: stages of a replaced pipeline are stale


class Group:
    __slots__ = ("chunks", "dec", "fin", "it", "joined", "n", "prefilling", "S", "t0")

    def __init__(self) -> None:
        self.it = self.S = self.n = self.dec = 0  # iterations done, Σ base of decodes, decodes, in flight
        self.fin: list[tuple[int, int, int]] = []  # (finish iteration, request, epoch)
        self.joined: list[tuple[int, int]] = []  # join order (request, epoch) for preemption
        self.prefilling: list[int] = []  # admitted, prompt not yet complete, admission order
        self.chunks: list[tuple[int, int]] = []  # the iteration in flight: (request, prompt tokens)
        self.t0 = 0.0  # its start


class MixedReplica:
    """The engine's replica interface (see tessera.sim.replica.Replica) over m groups: a group is a lane."""

    def __init__(self, idx: int, st: RequestArrays, models: dict[str, PlanModel], mode: str, policy=None,
                 switch_s: float = 0.0) -> None:
        self.idx, self.st, self.models, self.policy, self.switch_s = idx, st, models, policy, switch_s
        self.kv_cap = min(m.kv_cap for m in models.values())
        self.waiting: deque[int] = deque()
        self.kv = 0  # KV tokens reserved (prompts admitted) or written (decodes), all groups
        self.nseq = 0  # sequences admitted (prefilling or decoding), all groups
        self.switching, self.switch_to, self.switches = False, None, 0
        self.dead = False
        self.completed = 0
        self.generation = 0  # bumped per pipeline: events of a replaced pipeline are ignored
        self.groups: list[Group] = []
        self.dev_busy = np.zeros(len(next(iter(models.values())).plan.devices))  # of replaced pipelines
        self._set_mode(mode, 0.0)

    def _set_mode(self, mode: str, t: float) -> None:
        if self.groups:  # a switch: the old pipeline's busy seconds and spans are kept
            self.dev_busy += self._pipe_device_busy()
            self.flush_trace()
        self.mode, self.pm = mode, self.models[mode]
        eng = self.pm.engine
        assert eng is not None and self.pm.route is not None
        self.m, self.group_seqs, self.budget = eng.microbatches, eng.group_seqs, eng.max_num_batched_tokens
        self.generation += 1
        spans = [] if self.st.trace_window_s is not None else None
        self.pipe = Pipeline(self.pm.route, self.m, t, spans)
        self.rows = self.pm.route.rows(self.pm.plan)
        self.groups = self._regroup(self.m)
        self.busy, self.kick_pending = [False] * self.m, [False] * self.m

    def _pipe_device_busy(self) -> np.ndarray:
        out = np.zeros(len(self.dev_busy))
        for (d, to), b in zip(self.pm.route.resources, self.pipe.busy_s, strict=True):
            if to is None:
                out[d] += b
        return out

    def _regroup(self, m: int) -> list[Group]:
        """The sequences of the old groups dealt over m new ones in join (admission) order, their KV kept."""
        st, new = self.st, [Group() for _ in range(m)]
        running, prefilling = [], []
        for grp in self.groups:
            for r, ep in grp.joined:
                if st.status[r] == RUNNING and st.epoch[r] == ep:
                    st.gen[r] += grp.it - st.join_it[r]
                    running.append((r, st.base[r] + grp.it))
            prefilling += grp.prefilling
        for k, (r, kv) in enumerate(running):
            st.need[r] = kv  # base = KV at join
            self._join(new[k % m], r)
        for k, r in enumerate(prefilling):
            new[k % m].prefilling.append(r)
        return new

    # -- router / engine interface

    def load(self) -> int:
        return len(self.waiting) + self.nseq

    def fits(self, r: int) -> bool:
        return self.st.prompt[r] + self.st.output[r] <= self.kv_cap

    def device_busy_s(self) -> np.ndarray:
        return self.dev_busy + self._pipe_device_busy()

    def evacuate(self) -> list[int]:
        st = self.st
        self.dead = True
        out = list(self.waiting)
        for grp in self.groups:
            out += grp.prefilling
            for r, ep in grp.joined:
                if st.status[r] == RUNNING and st.epoch[r] == ep:
                    st.gen[r] += grp.it - st.join_it[r]
                    out.append(r)
        self.waiting.clear()
        self.groups = [Group() for _ in range(self.m)]
        self.kv = self.nseq = 0
        self.flush_trace()
        return st.requeue(out)

    def kick_lanes(self, all_lanes: bool = False) -> list[int]:
        out = [g for g in range(self.m) if not self.busy[g] and not self.kick_pending[g]]
        for g in out:
            self.kick_pending[g] = True
        return out

    def wants_switch(self) -> bool:
        return wants_switch(self)

    def complete_switch(self, t: float) -> None:
        self._set_mode(self.switch_to, t)
        self.switching, self.switch_to = False, None
        self.switches += 1

    def start(self, g: int, t: float) -> float | list[tuple[float, int]] | None:
        """Schedule group g's next iteration: its duration (chain routes), or its first STAGE event
        (tessera.sim.engine; arg generation·GROUPS + g); None when the group has no work."""
        grp, st = self.groups[g], self.st
        while grp.n and self.kv + grp.n > self.kv_cap:
            self._preempt(grp)
        n = grp.n
        chunks = self._chunks(grp, self.budget - n)
        if not n and not chunks:
            return None
        tokens = sum(c for _, c in chunks)
        ctx = grp.S / n + grp.it if n else sum(st.need[r] for r, _ in chunks) / len(chunks)
        holds, lat = self.pm.stage_times.at(n, tokens, ctx)
        self.kv += n  # this iteration's decode tokens
        grp.dec, grp.chunks, grp.t0 = n, chunks, t
        if self.pipe.chain:
            return self.pipe.book(g, t, holds, lat) - t
        return [(self.pipe.begin(g, t, holds, lat), self.generation * GROUPS + g)]

    def stage(self, t: float, arg: int) -> tuple[float | None, bool]:
        """A stage of group ``arg % GROUPS``'s iteration lets the next start at t: (when the next one does,
        False), or (the iteration's end, True); (None, False) for a stage of a replaced pipeline."""
        if arg // GROUPS != self.generation:
            return None, False
        return self.pipe.advance(arg % GROUPS, t)

    def finish(self, g: int, t: float) -> None:
        grp, st = self.groups[g], self.st
        grp.it += 1
        emitted = grp.dec
        while grp.fin and grp.fin[0][0] <= grp.it:
            _, r, ep = heapq.heappop(grp.fin)
            if ep != st.epoch[r] or st.status[r] != RUNNING:
                continue
            self.kv -= st.base[r] + grp.it
            grp.S -= st.base[r]
            grp.n -= 1
            self.nseq -= 1
            st.gen[r] = st.output[r]
            self._complete(r, t)
        for r, c in grp.chunks:
            st.pf_done[r] += c
            if st.pf_done[r] < st.need[r]:
                continue
            grp.prefilling.remove(r)
            st.gen[r] += 1
            emitted += 1
            if math.isnan(st.first_s[r]):
                st.first_s[r] = t
            if st.gen[r] >= st.output[r]:
                self.kv -= st.need[r]
                self.nseq -= 1
                self._complete(r, t)
            else:
                self._join(grp, r)
        self._trace(g, t, grp.dec + len(grp.chunks))
        grp.chunks, grp.dec = [], 0
        if emitted:
            st.emit_s.append(t)
            st.emit_n.append(emitted)

    # -- scheduling

    def _chunks(self, grp: Group, budget: int) -> list[tuple[int, int]]:
        """Prompt chunks of this iteration within ``budget`` tokens: prompts mid-prefill first, then
        admissions."""
        st, cap, pm = self.st, self.pm.chunk_cap, self.pm
        out = []
        for r in grp.prefilling:
            if budget <= 0:
                break
            c = min(st.need[r] - st.pf_done[r], budget, cap or budget)
            out.append((r, c))
            budget -= c
        limit = pm.partial_prefills or self.group_seqs
        while (self.waiting and budget > 0 and grp.n + len(grp.prefilling) < self.group_seqs
               and self.nseq < self.pm.max_batch and len(grp.prefilling) < limit):
            r = self.waiting[0]
            need = st.need[r]
            if self.kv + need > self.kv_cap:
                break
            self.waiting.popleft()
            grp.prefilling.append(r)
            st.status[r], st.pf_done[r] = PREFILLING, 0
            self.kv += need
            self.nseq += 1
            c = min(need, budget, cap or budget)
            out.append((r, c))
            budget -= c
        return out

    def _join(self, grp: Group, r: int) -> None:
        st = self.st
        st.base[r] = st.need[r] - grp.it
        st.join_it[r] = grp.it
        st.status[r] = RUNNING
        grp.S += st.base[r]
        grp.n += 1
        heapq.heappush(grp.fin, (grp.it + st.output[r] - st.gen[r], r, st.epoch[r]))
        grp.joined.append((r, st.epoch[r]))

    def _preempt(self, grp: Group) -> None:
        """Free KV in this group: its most recent prompt in prefill, else its most recently joined decode."""
        st = self.st
        if grp.prefilling:
            r = grp.prefilling.pop()
            self.kv -= st.need[r]
        else:
            while grp.joined:
                r, ep = grp.joined.pop()
                if st.status[r] == RUNNING and st.epoch[r] == ep:
                    break
            else:
                raise AssertionError("preemption with no running request")
            st.gen[r] += grp.it - st.join_it[r]
            self.kv -= st.base[r] + grp.it
            grp.S -= st.base[r]
            grp.n -= 1
            st.epoch[r] += 1
            st.need[r] = st.prompt[r] + st.gen[r]  # recompute: prefill prompt + what was generated
        self.nseq -= 1
        st.pf_done[r] = 0
        st.status[r] = WAITING
        self.waiting.appendleft(r)
        st.preemptions += 1

    def _complete(self, r: int, t: float) -> None:
        self.st.done_s[r] = t
        self.st.status[r] = DONE
        self.completed += 1

    # -- trace

    def _trace(self, g: int, t: float, batch: int) -> None:
        win = self.st.trace_window_s
        if win is not None and win[0] <= self.groups[g].t0 <= win[1]:
            t0 = self.groups[g].t0
            self.st.trace.append((self.idx, g, self.mode, "mixed", t0, t - t0, None, batch))

    def flush_trace(self) -> None:
        """Stage spans inside the trace window go to RequestArrays.spans as (replica, mode, row, group, start,
        hold)."""
        spans, win = self.pipe.spans, self.st.trace_window_s
        if spans is None or win is None:
            return
        self.st.spans += [(self.idx, self.mode, self.rows[r], g, s, h) for r, g, s, h in spans
                          if win[0] <= s <= win[1]]
        spans.clear()
