"""One replica of a two-phase plan (prefill + decode, decode only, image): vLLM-style continuous batching over
one or two lanes. A serving-model ("mixed") plan's replica is tessera.sim.mixed.MixedReplica.

Lane 0 runs the first phase (prefill/encode); lane 1 the iterative phase (decode/denoise) when the two
phases use disjoint devices (a prefill/decode split), otherwise lane 0 runs both, serialised.
Per request: ``need`` tokens to prefill (prompt, or prompt + generated after a recompute preemption),
``gen`` tokens produced. While decoding, a request's KV length is ``base + it`` (``it`` the replica's
decode-iteration counter) and it finishes when ``it`` reaches its precomputed finish iteration.
KV admission: a request is admitted to prefill while its ``need`` tokens fit beside the KV in use;
before each decode iteration, while the batch's next tokens do not fit, the most recently joined
request is preempted (its KV dropped, recomputed later: vLLM's recompute policy).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from tessera.sim.model import PlanModel

WAITING, PREFILLING, PENDING, RUNNING, DONE, LOST = range(6)


@dataclass
class RequestArrays:
    """Per-request arrays shared by all replicas (plain lists: scalar access is what the loop does)."""

    arrival: list[float]
    prompt: list[int]
    output: list[int]
    need: list[int] = field(default_factory=list)
    gen: list[int] = field(default_factory=list)
    pf_done: list[int] = field(default_factory=list)
    epoch: list[int] = field(default_factory=list)
    base: list[int] = field(default_factory=list)
    join_it: list[int] = field(default_factory=list)
    first_s: list[float] = field(default_factory=list)
    done_s: list[float] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    preemptions: int = 0
    trace_window_s: tuple[float, float] | None = None
    trace: list[tuple] = field(default_factory=list)  # (replica, lane, mode, phase, start_s, dur_s, weights, batch)
    # mixed plans: (replica, mode, row, group, start_s, hold_s) of each stage inside the trace window
    spans: list[tuple] = field(default_factory=list)
    # output produced at each iteration end (tokens; images for image plans): the throughput series
    emit_s: list[float] = field(default_factory=list)
    emit_n: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.arrival)
        self.need = list(self.prompt)
        self.gen, self.pf_done, self.epoch, self.base, self.join_it = ([0] * n for _ in range(5))
        self.first_s, self.done_s = [math.nan] * n, [math.nan] * n
        self.status = [WAITING] * n

    def requeue(self, out: list[int]) -> list[int]:
        """Requests ``out`` lost with their replica restart from prefill: KV lost, tokens already generated
        kept as part of the prompt (as a recompute preemption does). Returns them sorted."""
        for r in out:
            self.epoch[r] += 1
            self.need[r] = self.prompt[r] + self.gen[r]
            self.pf_done[r] = 0
            self.status[r] = WAITING
        return sorted(out)


def wants_switch(rep) -> bool:
    """Whether a replica's policy wants the other mode at its current load; sets ``rep.switch_to``."""
    if rep.policy is None:
        return False
    target = rep.policy.target(rep.mode, rep.load())
    rep.switch_to = target if target != rep.mode else None
    return rep.switch_to is not None


class Replica:
    def __init__(self, idx: int, st: RequestArrays, models: dict[str, PlanModel], mode: str, policy=None,
                 switch_s: float = 0.0) -> None:
        self.idx, self.st, self.models, self.policy, self.switch_s = idx, st, models, policy, switch_s
        self.kv_cap = min(m.kv_cap for m in models.values())
        self.waiting: deque[int] = deque()
        self.prefilling: list[int] = []
        self.pending: list[int] = []
        self.fin: list[tuple[int, int, int]] = []  # (finish iteration, request, epoch)
        self.joined: list[tuple[int, int]] = []  # join order (request, epoch) for preemption
        self.S = self.n = self.it = self.kv_other = 0  # S: sum of base over running; kv_other: prefill KV
        self.busy, self.kick_pending = [False, False], [False, False]
        self.inflight: list[tuple] = [(), ()]
        self.new: list[tuple[int, int]] = []  # joined this iteration (request, epoch)
        self.pf_batch: list[tuple[int, int]] = []  # prefill iteration in flight: (request, tokens)
        self.acc: dict[tuple[str, str], list[float]] = {}
        self.switching, self.switch_to, self.switches = False, None, 0
        self.dead = False  # lost to a failure: its pending events are ignored, it never serves again
        self.completed = 0  # requests this replica completed
        self._set_mode(mode)

    def _set_mode(self, mode: str) -> None:
        self.mode, self.pm = mode, self.models[mode]
        self.split = self.pm.first is not None and not self.pm.shared
        for t in (self.pm.first, self.pm.iter):
            if t is not None:
                self.acc.setdefault((mode, t.phase), [0.0] * len(t.step_s))

    # -- router / engine interface

    def device_busy_s(self) -> np.ndarray:
        """Seconds each device of the cell was busy (interpolated busy time of every iteration run)."""
        out = 0.0
        for (mode, phase), acc in self.acc.items():
            pm = self.models[mode]
            table = pm.first if pm.first and pm.first.phase == phase else pm.iter
            out = out + np.asarray(acc) @ table.busy_s
        return np.asarray(out, dtype=float)

    def flush_trace(self) -> None:
        """Nothing to flush: iteration records go to the shared RequestArrays as they happen."""

    def load(self) -> int:
        return len(self.waiting) + len(self.prefilling) + len(self.pending) + self.n

    def fits(self, r: int) -> bool:
        """Whether request ``r`` can ever complete here (alone, its whole KV resident)."""
        return self.pm.image or self.st.prompt[r] + self.st.output[r] <= self.kv_cap

    def evacuate(self) -> list[int]:
        """The replica is lost: every request queued or in flight here, reset to restart from prefill
        (KV lost; tokens already generated are kept and become part of the prompt, as in a recompute
        preemption). The in-flight iteration is lost with the device. Returns request ids, sorted."""
        st = self.st
        self.dead = True
        out = list(self.waiting) + self.prefilling + self.pending
        for r, ep in self.joined:
            if st.status[r] == RUNNING and st.epoch[r] == ep:
                st.gen[r] += self.it - st.join_it[r]
                out.append(r)
        self.waiting.clear()
        self.prefilling, self.pending, self.fin, self.joined = [], [], [], []
        self.S = self.n = self.kv_other = 0
        return st.requeue(out)

    def kick_lanes(self, all_lanes: bool = False) -> list[int]:
        lanes = [0, 1] if (self.split and all_lanes) else [0]
        out = [k for k in lanes if not self.busy[k] and not self.kick_pending[k]]
        for k in out:
            self.kick_pending[k] = True
        return out

    def wants_switch(self) -> bool:
        return wants_switch(self)

    def complete_switch(self, t: float) -> None:
        self._set_mode(self.switch_to)
        self.switching, self.switch_to = False, None
        self.switches += 1

    def start(self, lane: int, t: float) -> float | None:
        """Pick and start the next iteration on ``lane``; its duration, or None when there is no work."""
        pm, parts = self.pm, []
        if self.split and lane == 0:
            parts.append(("first", self._start_first(t, pm.max_prefill_tokens)))
        elif self.split or pm.first is None:
            parts.append(("iter", self._start_iter(t)))
        elif pm.chunked:  # one mixed iteration: every running decode + prefill chunks up to the budget
            d = self._start_iter(t)
            parts += [("iter", d), ("first", self._start_first(t + (d or 0.0), pm.max_prefill_tokens - self.n))]
        else:  # vLLM's default: a prefill iteration whenever a waiting request can be admitted
            p = self._start_first(t, pm.max_prefill_tokens)
            parts.append(("first", p) if p is not None else ("iter", self._start_iter(t)))
        parts = [(k, d) for k, d in parts if d is not None]
        if not parts:
            return None
        self.inflight[lane] = tuple(k for k, _ in parts)
        return sum(d for _, d in parts)

    def finish(self, lane: int, t: float) -> None:
        kinds = self.inflight[lane]
        if "iter" in kinds:
            self._finish_iter(t)
        if "first" in kinds:
            self._finish_first(t)

    # -- phases

    def _record(self, lane: int, phase: str, t: float, dur: float, w, batch: int) -> None:
        acc = self.acc[(self.mode, phase)]
        for i, wi in w:
            acc[i] += wi
        win = self.st.trace_window_s
        if win is not None and win[0] <= t <= win[1]:
            self.st.trace.append((self.idx, lane, self.mode, phase, t, dur, w, batch))

    def _start_first(self, t: float, budget: int) -> float | None:
        """Admit and chunk prompts up to ``budget`` tokens; the step's duration, None when there is nothing
        to prefill."""
        st, pm = self.st, self.pm
        batch: list[tuple[int, int]] = []
        tokens = 0
        for r in self.prefilling:  # partial prefills first (chunked): already admitted, KV reserved
            rem = st.need[r] - st.pf_done[r]
            c = min(rem, budget - tokens, pm.chunk_cap or rem) if pm.chunked else rem
            if c <= 0 or (not pm.chunked and batch and tokens + rem > budget):
                break
            batch.append((r, c))
            tokens += c
        # A split replica's prefill devices are an instance of their own (DistServe): they prefill the next
        # batch while decode runs, finished prefills holding their KV in `pending` until decode has room.
        in_decode = 0 if self.split else self.n
        slots = pm.max_batch - in_decode - len(self.pending) - len(self.prefilling)
        while self.waiting and slots > 0:
            r = self.waiting[0]
            nd = st.need[r]
            if self.kv_other + self.S + self.n * self.it + nd > self.kv_cap:
                break
            c = min(nd, budget - tokens, pm.chunk_cap or nd) if pm.chunked else nd
            if c <= 0 or (not pm.chunked and batch and tokens + nd > budget):
                break
            self.waiting.popleft()
            self.prefilling.append(r)
            st.status[r] = PREFILLING
            st.pf_done[r] = 0
            self.kv_other += nd
            slots -= 1
            batch.append((r, c))
            tokens += c
        if not batch:
            return None
        ctx = sum(st.need[r] for r, _ in batch) / len(batch)
        self.pf_batch = batch
        dur, w = pm.first.time(tokens, ctx)
        self._record(0, pm.first.phase, t, dur, w, len(batch))
        return dur

    def _finish_first(self, t: float) -> None:
        st, pm = self.st, self.pm
        done = set()
        emitted = 0
        for r, c in self.pf_batch:
            st.pf_done[r] += c
            if st.pf_done[r] < st.need[r]:
                continue
            done.add(r)
            if pm.emits_token:
                st.gen[r] += 1
                emitted += 1
                if st.first_s[r] != st.first_s[r]:  # nan: first token of this request
                    st.first_s[r] = t
            if st.gen[r] >= st.output[r]:
                self.kv_other -= st.need[r]
                self._complete(r, t)
            else:
                st.status[r] = PENDING
                self.pending.append(r)
        self.prefilling = [r for r in self.prefilling if r not in done]
        if emitted:
            st.emit_s.append(t)
            st.emit_n.append(emitted)

    def _join(self, r: int) -> None:
        st = self.st
        st.base[r] = st.need[r] - self.it
        st.join_it[r] = self.it
        st.status[r] = RUNNING
        self.S += st.base[r]
        self.n += 1
        heapq.heappush(self.fin, (self.it + st.output[r] - st.gen[r], r, st.epoch[r]))
        self.joined.append((r, st.epoch[r]))
        self.new.append((r, st.epoch[r]))

    def _start_iter(self, t: float) -> float | None:
        """Join pending requests and start a decode step: its duration, None when nothing runs."""
        st, pm = self.st, self.pm
        self.new = []
        room = max(0, pm.max_batch - self.n) if self.split else len(self.pending)
        for r in self.pending[:room]:
            self.kv_other -= st.need[r]
            self._join(r)
        del self.pending[:room]
        if pm.first is None:  # diffusion without an encode phase: admission straight into the batch
            while self.waiting and self.n < pm.max_batch:
                r = self.waiting.popleft()
                st.need[r] = 0
                self._join(r)
        while self.n and self.kv_other + self.S + self.n * (self.it + 1) > self.kv_cap:
            if self.pending:  # a prefilled request not yet decoding gives its KV up before a running one
                r = self.pending.pop()
                self.kv_other -= st.need[r]
                st.status[r] = WAITING
                self.waiting.appendleft(r)
                st.preemptions += 1
                continue
            self._preempt()
        if not self.n:
            return None
        ctx = self.S / self.n + self.it
        dur, w = pm.iter.time(self.n * pm.iter.tokens_per_item, ctx)
        self._record(1 if self.split else 0, pm.iter.phase, t, dur, w, self.n)
        return dur

    def _finish_iter(self, t: float) -> None:
        st = self.st
        self.it += 1
        emitted = 0 if self.pm.image else self.n  # every running sequence produced one token
        for r, ep in self.new:  # diffusion: the first denoising step is the "first token"
            if st.status[r] == RUNNING and st.epoch[r] == ep and st.first_s[r] != st.first_s[r]:
                st.first_s[r] = t
        while self.fin and self.fin[0][0] <= self.it:
            _, r, ep = heapq.heappop(self.fin)
            if ep != st.epoch[r] or st.status[r] != RUNNING:
                continue
            self.S -= st.base[r]
            self.n -= 1
            st.gen[r] = st.output[r]
            self._complete(r, t)
            emitted += int(self.pm.image)
        if emitted:
            st.emit_s.append(t)
            st.emit_n.append(emitted)

    def _preempt(self) -> None:
        st = self.st
        while self.joined:
            r, ep = self.joined.pop()
            if st.status[r] == RUNNING and st.epoch[r] == ep:
                break
        else:
            raise AssertionError("preemption with no running request")
        st.gen[r] += self.it - st.join_it[r]
        self.S -= st.base[r]
        self.n -= 1
        st.epoch[r] += 1
        st.need[r] = st.prompt[r] + st.gen[r]  # recompute: prefill prompt + what was generated
        st.status[r] = WAITING
        self.waiting.appendleft(r)
        st.preemptions += 1

    def _complete(self, r: int, t: float) -> None:
        self.st.done_s[r] = t
        self.st.status[r] = DONE
        self.completed += 1
