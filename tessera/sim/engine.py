"""Discrete-event core: one heap loop; each handler returns the events it causes.

Events are per *iteration* (one batched model step of a replica lane), per arrival and per plan
switch; token progress inside a decode batch is tracked lazily (a request's KV length is
``base + iteration counter``), so no Python work is done per generated token.

Event tuple: (time_s, priority, seq, kind, replica, arg). At equal times arrivals (priority 0) are
handled before iteration ends (1) and lane kicks (2): an offline burst at t=0 is one batch, not many.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.sim.replica import Replica, State

ARRIVE, DONE, KICK, SWITCHED = range(4)
PRIO = {ARRIVE: 0, DONE: 1, SWITCHED: 1, KICK: 2}


@dataclass
class Engine:
    state: State
    replicas: list[Replica]
    round_robin: bool = False

    def run(self) -> None:
        heap: list[tuple[float, int, int, int, int, int]] = []
        seq = 0
        n = len(self.state.arrival)
        if n:
            heap.append((self.state.arrival[0], 0, 0, ARRIVE, -1, 0))
        handlers = (self._arrive, self._done, self._kick, self._switched)
        while heap:
            t, _, _, kind, rep, arg = heapq.heappop(heap)
            for et, ek, er, ea in handlers[kind](t, rep, arg):
                seq += 1
                heapq.heappush(heap, (et, PRIO[ek], seq, ek, er, ea))

    # -- handlers: (time, replica, arg) -> new events (time, kind, replica, arg)

    def _arrive(self, t: float, _rep: int, i: int) -> Iterable[tuple[float, int, int, int]]:
        st = self.state
        out: list[tuple[float, int, int, int]] = []
        if i + 1 < len(st.arrival):
            out.append((st.arrival[i + 1], ARRIVE, -1, i + 1))
        if self.round_robin:
            r = i % len(self.replicas)
        else:  # least loaded: fewest requests queued or in flight; ties to the lowest index
            r = min(range(len(self.replicas)), key=lambda k: (self.replicas[k].load(), k))
        rep = self.replicas[r]
        if rep.admit_arrival(i):
            out.extend((t, KICK, r, lane) for lane in rep.kick_lanes())
        return out

    def _kick(self, t: float, r: int, lane: int) -> Iterable[tuple[float, int, int, int]]:
        rep = self.replicas[r]
        rep.kick_pending[lane] = False
        if rep.busy[lane] or rep.switching:
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
        return ((t + dur, DONE, r, lane),)

    def _done(self, t: float, r: int, lane: int) -> Iterable[tuple[float, int, int, int]]:
        rep = self.replicas[r]
        rep.busy[lane] = False
        rep.finish(lane, t)
        return [(t, KICK, r, k) for k in rep.kick_lanes(all_lanes=True)]

    def _switched(self, t: float, r: int, _arg: int) -> Iterable[tuple[float, int, int, int]]:
        rep = self.replicas[r]
        rep.complete_switch(t)
        return [(t, KICK, r, k) for k in rep.kick_lanes(all_lanes=True)]
