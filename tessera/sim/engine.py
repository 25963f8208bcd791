"""Discrete-event core: one heap loop; each handler returns the events it causes.

Events are per *iteration* (one batched model step of a replica lane), per arrival, per plan
switch and per pool change (a replica lost, a replacement joining); token progress inside a decode batch is tracked lazily (a request's KV length is
``base + iteration counter``), so no Python work is done per generated token.

A mixed plan's iteration whose route revisits a device or link runs stage by stage (tessera.sim.stages):
its replica answers a kick with STAGE events, and the STAGE event that completes it brings its DONE.

Event tuple: (time_s, priority, seq, kind, replica, arg). At equal times pool changes (priority -1)
come first (an iteration ending at the instant its replica is lost is lost with it), then arrivals (0),
iteration ends and stages (1) and lane kicks (2): an offline burst at t=0 is one batch, not many.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.sim.mixed import GROUPS, MixedReplica
from tessera.sim.replica import Replica, RequestArrays
from tessera.sim.router import Router

ARRIVE, DONE, KICK, SWITCHED, FAIL, JOIN, STAGE = range(7)
PRIO = {ARRIVE: 0, DONE: 1, SWITCHED: 1, KICK: 2, FAIL: -1, JOIN: -1, STAGE: 1}


@dataclass
class EventLoop:
    state: RequestArrays
    replicas: list[Replica | MixedReplica]
    router: Router
    pool_events: tuple[tuple[float, int, int], ...] = ()  # (time_s, FAIL | JOIN, replica)

    def run(self) -> None:
        heap: list[tuple[float, int, int, int, int, int]] = []
        seq = 0
        n = len(self.state.arrival)
        if n:
            heap.append((self.state.arrival[0], 0, 0, ARRIVE, -1, 0))
        for t, kind, rep in self.pool_events:
            seq += 1
            heapq.heappush(heap, (t, PRIO[kind], seq, kind, rep, 0))
        handlers = (self._arrive, self._done, self._kick, self._switched, self._fail, self._join)
        reps, pop, push = self.replicas, heapq.heappop, heapq.heappush
        while heap:
            t, _, _, kind, rep, arg = pop(heap)
            if kind == STAGE:  # the most frequent event (mixed plans), handled here without a handler call
                r = reps[rep]
                when, done = (None, False) if r.dead else r.stage(t, arg)  # type: ignore[union-attr]
                if when is not None:
                    seq += 1
                    push(heap, (when, 1, seq, DONE, rep, arg % GROUPS) if done else (when, 1, seq, STAGE, rep, arg))
                continue
            for et, ek, er, ea in handlers[kind](t, rep, arg):
                seq += 1
                push(heap, (et, PRIO[ek], seq, ek, er, ea))

    # -- handlers: (time, replica, arg) -> new events (time, kind, replica, arg)

    def _arrive(self, t: float, _rep: int, i: int) -> Iterable[tuple[float, int, int, int]]:
        st = self.state
        out: list[tuple[float, int, int, int]] = []
        if i + 1 < len(st.arrival):
            out.append((st.arrival[i + 1], ARRIVE, -1, i + 1))
        r = self.router.dispatch(i)
        if r is not None:
            out.extend((t, KICK, r, lane) for lane in self.replicas[r].kick_lanes())
        return out

    def _pool_change(self, t: float, touched: set[int]) -> list[tuple[float, int, int, int]]:
        return [(t, KICK, r, lane) for r in sorted(touched) for lane in self.replicas[r].kick_lanes(all_lanes=True)]

    def _fail(self, t: float, r: int, _arg: int) -> Iterable[tuple[float, int, int, int]]:
        return self._pool_change(t, self.router.fail(r))

    def _join(self, t: float, r: int, _arg: int) -> Iterable[tuple[float, int, int, int]]:
        return self._pool_change(t, self.router.join(r))

    def _kick(self, t: float, r: int, lane: int) -> Iterable[tuple[float, int, int, int]]:
        rep = self.replicas[r]
        if lane >= len(rep.kick_pending):  # queued for a lane of the schedule before a switch to fewer lanes
            return ()
        rep.kick_pending[lane] = False
        if rep.dead or rep.busy[lane] or rep.switching:
            return ()
        if rep.wants_switch():  # drain: start nothing new; switch once every lane is idle
            if not any(rep.busy):
                rep.switching = True
                return ((t + rep.switch_s, SWITCHED, r, 0),)
            return ()
        dur = rep.start(lane, t)
        if dur is None:
            return ()
        rep.busy[lane] = True
        if isinstance(dur, list):  # stage by stage (a mixed plan's route that revisits a resource)
            return [(et, STAGE, r, a) for et, a in dur]
        return ((t + dur, DONE, r, lane),)

    def _done(self, t: float, r: int, lane: int) -> Iterable[tuple[float, int, int, int]]:
        rep = self.replicas[r]
        if rep.dead:  # the iteration was lost with the replica
            return ()
        rep.busy[lane] = False
        rep.finish(lane, t)
        return [(t, KICK, r, k) for k in rep.kick_lanes(all_lanes=True)]

    def _switched(self, t: float, r: int, _arg: int) -> Iterable[tuple[float, int, int, int]]:
        rep = self.replicas[r]
        if rep.dead:
            return ()
        rep.complete_switch(t)
        return [(t, KICK, r, k) for k in rep.kick_lanes(all_lanes=True)]
