"""The pool's router: sends each request to one replica, holds it while none can take it, re-queues
a lost replica's requests and rebalances queued requests onto a replica that joins.

Least loaded: the replica with the smallest ``outstanding requests × weight`` (ties to the lowest
index), where ``weight = fastest cell's speed / this cell's`` (1.0 for every replica of a homogeneous pool,
so it is then exactly "fewest outstanding requests"); a cell's speed is its plan's goodput per replica
where the plan has one (the share of traffic the plan says it serves at the SLO), else its steady-state
throughput. Round robin: request ``i``
goes to the ``i mod k``-th of the ``k`` active replicas it fits (speed ignored: the simple case).
Only replicas where the request fits (prompt + output within the KV capacity) are candidates. When no
active replica fits but one that joins later does, the request waits at the router; when none ever
fits, it is ``lost``.
"""

from __future__ import annotations

from collections import deque

from tessera.sim.replica import LOST, Replica, RequestArrays


class Router:
    def __init__(self, st: RequestArrays, replicas: list[Replica], weights: list[float], active: list[bool],
                 round_robin: bool) -> None:
        self.st, self.reps, self.w, self.rr = st, replicas, weights, round_robin
        self.active = [k for k, a in enumerate(active) if a]  # sorted replica indices now serving
        self.future = [k for k, a in enumerate(active) if not a]  # replacements that have not joined yet
        self.hold: list[int] = []  # requests waiting for a replica that fits them to join
        self.requeued: dict[int, list[int]] = {}  # lost replica -> the requests it re-queued

    def dispatch(self, r: int) -> int | None:
        """Queue request ``r`` at a replica; its index, or None when held or lost."""
        reps = self.reps
        cands = [k for k in self.active if reps[k].fits(r)]
        if cands:
            if self.rr:
                k = cands[r % len(cands)]
            else:
                k = min(cands, key=lambda k: (reps[k].load() * self.w[k], k))
            reps[k].waiting.append(r)
            return k
        if any(reps[k].fits(r) for k in self.future):
            self.hold.append(r)
        else:
            self.st.status[r] = LOST  # fits no replica the pool will ever have
        return None

    def fail(self, k: int) -> set[int]:
        """Replica ``k`` is lost: re-queue its requests (in arrival order); the replicas that got work."""
        self.active.remove(k)
        self.requeued[k] = self.reps[k].evacuate()
        return {j for r in self.requeued[k] if (j := self.dispatch(r)) is not None}

    def join(self, k: int) -> set[int]:
        """Replica ``k`` starts serving: held requests first, then queued (not yet admitted) requests
        move from the back of the most loaded queues while that lowers the largest weighted load."""
        self.future.remove(k)
        self.active = sorted([*self.active, k])
        held, self.hold = self.hold, []
        got = {j for r in held if (j := self.dispatch(r)) is not None}
        new, reps, w = self.reps[k], self.reps, self.w
        while True:
            donors = [d for d in self.active if d != k and reps[d].waiting and new.fits(reps[d].waiting[-1])]
            if not donors:
                break
            d = max(donors, key=lambda d: (reps[d].load() * w[d], -d))
            if reps[d].load() * w[d] <= (new.load() + 1) * w[k]:
                break
            new.waiting.append(reps[d].waiting.pop())
        new.waiting = deque(sorted(new.waiting))  # FCFS: request ids are in arrival order
        return got | {k}
