"""One micro-batch's iteration as stages along the plan's route, and the devices and links they hold.

A mixed plan's ``PhasePlan.route`` is one micro-batch's path through the placement in program order: runs of
kernels on a device and crossings of a directed link, each with its ``share`` of that device's (link's) busy
seconds. Each stretch becomes a *stage*: at a shape (decode sequences, chunk tokens, context) it holds its
resource for ``share × busy`` of the interpolated point, where busy is the device's (link's) seconds.

The route as the engine uses it (``route_of``):
- empty route (a hand-made plan, one device): the devices in the order the phase's kernels first reach them
  (``assignment`` is in program order), then any other busy device, each followed by the links leaving it
  (by destination); every resource once, share 1;
- a resource busy at some point but absent from the route gets one stage at the end (share 1); stretches of a
  resource never busy are dropped; each resource's shares are scaled to sum to 1;
- adjacent stretches of one resource merge; a route longer than ``MAX_STAGES`` stages is coarsened by
  halving (``_coarsen``: every second visit of a resource hands its share to the visit before it, adjacent
  stages merge) until it fits. Per-resource busy seconds and one micro-batch's latency are unchanged by
  both; a route that repeats a layer's pattern keeps the pattern, repeated fewer times.

Latency: an iteration alone must take the point's ``latency_s`` L, while its stages' holds sum to H. Where
L ≥ H the difference is a delay after the last stage that holds nothing (messages in flight, the driver's
turnaround); where L < H (transfers overlapping compute inside one micro-batch) each stage lets the next one
start after ``hold × L/H`` while it keeps its resource for the whole hold.

Contention (``Pipeline``): every device and link of a replica is a resource that serves the stages waiting
for it first come, first served, in the order they became ready, one at a time, never preempted. A stage is
ready when the previous stage of its iteration lets it start; an iteration starts when its group's previous
one has ended. When every resource appears once in the route (a chain) stages keep the order in which their
iterations started at every resource, so an iteration's stages are booked at once when it starts (no events
per stage); otherwise each stage becoming ready is an event.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tessera.contracts.plan import Plan
from tessera.errors import UserError
from tessera.sim.timing import MixedTable

MAX_STAGES = 32
Resource = tuple[int, int | None]  # (device, None) or a directed link (src, dst)


@dataclass(frozen=True)
class Route:
    resources: tuple[Resource, ...]  # distinct, in order of first visit
    stages: tuple[tuple[int, float], ...]  # (resource index, share of that resource's busy seconds)

    @property
    def chain(self) -> bool:
        """Every resource visited once: stages keep their iterations' start order at every resource."""
        return len({r for r, _ in self.stages}) == len(self.stages)

    def rows(self, plan: Plan) -> tuple[str, ...]:
        """Per resource, its row name in traces and Gantt charts."""
        return tuple(f"dev{d} {plan.devices[d].gpu}" if to is None else f"link {d}->{to}"
                     for d, to in self.resources)


def resource_busy(plan: Plan, phase: str) -> dict[Resource, list[float]]:
    """Seconds each device and directed link is busy at each point of ``phase`` (one micro-batch)."""
    pts = plan.phases[phase].points
    out: dict[Resource, list[float]] = {(d, None): [s.device_busy_s[d] for s in pts]
                                        for d in range(len(plan.devices))}
    for i, s in enumerate(pts):
        for a, b, sec in s.link_busy_s:
            out.setdefault((int(a), int(b)), [0.0] * len(pts))[i] += sec
    return out


Stretch = tuple[int, int | None, float]  # (device, to, share) as in a route Segment


def _fallback(plan: Plan, phase: str, busy: dict[Resource, list[float]]) -> list[Stretch]:
    devs = list(dict.fromkeys(plan.phases[phase].assignment))
    devs += [d for d in range(len(plan.devices)) if d not in devs and max(busy[(d, None)]) > 0]
    out: list[Stretch] = []
    for d in devs:
        out.append((d, None, 1.0))
        out += [(d, b, 1.0) for a, b in sorted(r for r in busy if r[1] is not None and r[0] == d)]
    return out


def _check(plan: Plan, phase: str, segs: Sequence[Stretch]) -> None:
    n = len(plan.devices)
    for d, to, _ in segs:
        if not 0 <= d < n or (to is not None and (not 0 <= to < n or to == d)):
            raise UserError(f"plan phase {phase!r}: route stretch (device={d}, to={to}) names no device or "
                            f"link of the plan's {n} devices")


def _merge(stages: list[list]) -> list[list]:
    out: list[list] = []
    for r, s in stages:
        if out and out[-1][0] == r:
            out[-1][1] += s
        else:
            out.append([r, s])
    return out


def _coarsen(stages: list[list], max_stages: int) -> list[list]:
    """Halve the visits while there are more than ``max_stages`` stages: each resource's visits pair up in
    route order (1st with 2nd, 3rd with 4th, ...) and the second of a pair hands its share to the first;
    adjacent stages of one resource then merge. A periodic route (a layer's stretches repeated) keeps its
    pattern with half the repeats."""
    while len(stages) > max_stages:
        seen: dict[int, int] = {}
        keep: list[list] = []
        first: dict[int, list] = {}
        for r, s in stages:
            seen[r] = seen.get(r, 0) + 1
            if seen[r] % 2 == 0:
                first[r][1] += s
            else:
                first[r] = [r, s]
                keep.append(first[r])
        merged = _merge(keep)
        if len(merged) == len(stages):
            break
        stages = merged
    return stages


def route_of(plan: Plan, phase: str = "mixed", max_stages: int = MAX_STAGES) -> Route:
    """The stages the engine runs one micro-batch's iteration through (rules in the module docstring)."""
    busy = resource_busy(plan, phase)
    segs = [(s.device, s.to, s.share) for s in plan.phases[phase].route]
    _check(plan, phase, segs)
    if not segs:
        segs = _fallback(plan, phase, busy)
    live = {r for r, b in busy.items() if max(b, default=0.0) > 0}
    seen = {(d, to) for d, to, _ in segs}
    segs = [x for x in segs if (x[0], x[1]) in live] + [(d, to, 1.0) for d, to in sorted(
        live - seen, key=lambda r: (r[1] is not None, r[0], -1 if r[1] is None else r[1]))]
    total: dict[Resource, float] = {}
    for d, to, s in segs:
        total[(d, to)] = total.get((d, to), 0.0) + s
    count = Counter((d, to) for d, to, _ in segs)
    resources = list(dict.fromkeys((d, to) for d, to, _ in segs))
    stages = _merge([[resources.index((d, to)), s / total[(d, to)] if total[(d, to)] > 0
                      else 1.0 / count[(d, to)]] for d, to, s in segs])
    stages = _coarsen(stages, max_stages)
    return Route(resources=tuple(resources), stages=tuple((r, s) for r, s in stages))


@dataclass(frozen=True)
class StageTimes:
    """Each stage's hold and the iteration's latency at a shape, interpolated on the mixed grid; per point a
    vector (hold of stage 1, ..., hold of stage S, latency). Lookups of one (decode, chunk) are cached per
    context slice, so an iteration costs a combination of two vectors."""

    table: MixedTable
    vec: tuple[tuple[float, ...], ...]  # [P][S + 1]
    _cache: dict[tuple[float, float], list[list[float]]] = field(default_factory=dict, compare=False,
                                                                 repr=False)

    @classmethod
    def build(cls, plan: Plan, phase: str, route: Route, table: MixedTable) -> StageTimes:
        busy = resource_busy(plan, phase)
        cols = [(busy[route.resources[r]], s) for r, s in route.stages]
        vec = tuple(tuple([b[i] * s for b, s in cols] + [p.latency_s])
                    for i, p in enumerate(plan.phases[phase].points))
        return cls(table=table, vec=vec)

    def _combine(self, w: Sequence[tuple[int, float]]) -> list[float]:
        vec = self.vec
        out = [0.0] * len(vec[0])
        for i, wi in w:
            for k, x in enumerate(vec[i]):
                out[k] += wi * x
        if any(wi < 0 for _, wi in w):  # extrapolated above the grid: never below the samples it comes from
            floor = [min(vec[i][k] for i, _ in w) for k in range(len(out))]
            out = [a if a > b else b for a, b in zip(out, floor, strict=True)]
        return out

    def _slices(self, decode: float, chunk: float) -> list[list[float]]:
        key = (decode, chunk)
        got = self._cache.get(key)
        if got is None:
            if len(self._cache) > 200_000:
                self._cache.clear()
            t = self.table
            got = [self._combine(t.weights2(decode, chunk, c)) for c in range(len(t.contexts))]
            self._cache[key] = got
        return got

    def at(self, decode: float, chunk: float, context: float) -> tuple[list[float], float]:
        """(hold of each stage, latency) of one micro-batch's iteration of ``decode`` sequences and ``chunk``
        prompt tokens at mean decode context ``context``."""
        sl = self._slices(decode, chunk)
        cw = self.table.context_weights(context)
        if len(cw) == 1:
            v = sl[cw[0][0]]
        else:
            (i0, w0), (i1, w1) = cw
            a, b = sl[i0], sl[i1]
            v = [w0 * x + w1 * y for x, y in zip(a, b, strict=True)]
            if w0 < 0:  # above the sampled contexts: never falling
                v = [x if x > lo else lo for x, lo in zip(v, map(min, a, b), strict=True)]
        return v[:-1], v[-1]


def alone_s(holds: Sequence[float], latency_s: float) -> tuple[float, float]:
    """(advance factor, delay at the end) of an iteration: alone it takes ``latency_s`` (module docstring)."""
    total = sum(holds)
    if latency_s >= total:
        return 1.0, latency_s - total
    return latency_s / total, 0.0


class Pipeline:
    """One replica's devices and links as FIFO resources, and its groups' iterations through them.

    A resource serves stages in the order they become ready, each for its whole hold: a stage ready at t
    starts at max(t, the end of the last stage booked on its resource). Stages are booked at the instant
    they become ready, in time order (the caller's event loop), so booking is first come, first served.
    ``book`` (chain routes) places a whole iteration when it starts and returns its end. ``begin`` and
    ``advance`` (any route) run it stage by stage: each returns when group g's next stage becomes ready,
    which the caller hands back to ``advance`` at that time, until the iteration's end comes back."""

    def __init__(self, route: Route, groups: int, t0_s: float = 0.0, spans: list | None = None) -> None:
        self.res = tuple(r for r, _ in route.stages)
        self.chain = route.chain
        self.free_at = [t0_s] * len(route.resources)  # end of the last stage booked on each resource
        self.busy_s = [0.0] * len(route.resources)  # seconds each resource was held
        self.cur: list[list] = [[(), 1.0, 0.0, 0] for _ in range(groups)]  # [holds, advance factor, end delay,
        # stage] of each group's iteration in flight
        self.spans = spans  # when a list: (resource, group, start_s, hold_s) of every stage

    def book(self, g: int, t: float, holds: Sequence[float], latency_s: float) -> float:
        f, extra = alone_s(holds, latency_s)
        ready = t
        for k in range(len(holds)):
            ready = self._take(g, k, ready, holds[k], f)
        return ready + extra

    def begin(self, g: int, t: float, holds: Sequence[float], latency_s: float) -> float:
        """Start group g's iteration at t; when its first stage lets the next start."""
        f, extra = alone_s(holds, latency_s)
        self.cur[g] = [holds, f, extra, 0]
        return self._take(g, 0, t, holds[0], f)

    def advance(self, g: int, t: float) -> tuple[float, bool]:
        """Group g's current stage lets the next start at t: (when that one lets the next start, False), or
        (the iteration's end, True) after the last stage."""
        c = self.cur[g]
        k = c[3] = c[3] + 1
        if k == len(self.res):
            return t + c[2], True
        hold, r = c[0][k], self.res[k]  # _take's body, inline: the hot path of stage-by-stage routes
        start = t if t > self.free_at[r] else self.free_at[r]
        self.free_at[r] = start + hold
        self.busy_s[r] += hold
        if self.spans is not None:
            self.spans.append((r, g, start, hold))
        return start + hold * c[1], False

    def _take(self, g: int, k: int, ready: float, hold: float, f: float) -> float:
        """Book stage k of group g, ready at ``ready``; when the next stage may start."""
        r = self.res[k]
        start = ready if ready > self.free_at[r] else self.free_at[r]
        self.free_at[r] = start + hold
        self.busy_s[r] += hold
        if self.spans is not None:
            self.spans.append((r, g, start, hold))
        return start + hold * f


def run_groups(route: Route, shapes: Sequence[tuple[Sequence[float], float]], iterations: int,
               spans: list | None = None) -> list[list[float]]:
    """Groups iterating back to back through ``route`` alone: group g runs ``iterations`` iterations of holds
    and latency ``shapes[g]``, all starting at 0 in group order. Each group's iteration end times."""
    pipe = Pipeline(route, len(shapes), spans=spans)
    ends: list[list[float]] = [[] for _ in shapes]
    heap = [(pipe.begin(g, 0.0, *shape), g, g, False) for g, shape in enumerate(shapes)]  # (t, seq, g, end)
    heapq.heapify(heap)
    seq = len(shapes)
    while heap:
        t, _, g, end = heapq.heappop(heap)
        if end:  # the group's iteration ended at t: its next one starts
            ends[g].append(t)
            if len(ends[g]) == iterations:
                continue
            when, done = pipe.begin(g, t, *shapes[g]), False
        else:
            when, done = pipe.advance(g, t)
        seq += 1
        heapq.heappush(heap, (when, seq, g, done))
    return ends
