"""Independent verifier: recomputes loads, transfers, memory and latency of a finished assignment.

Deliberately shares no code with the solver path (problem/milp/patterns): it walks the kernels in program
order with its own last-writer table, so a bookkeeping bug on either side shows up as a disagreement.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

from tessera.cost import CostModel
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec

RESIDENT_ROLES = (Role.WEIGHT, Role.KV, Role.STATE)


@dataclass(frozen=True, kw_only=True)
class PlacementEvaluation:
    device_busy_s: tuple[float, ...]  # [D] compute of one step at the graph's shape
    link_busy_s: dict[tuple[int, int], float]  # directed (src, dst) -> seconds, every pair present
    latency_s: float  # list schedule: kernels in program order per device, inputs must have arrived
    memory_bytes: tuple[dict[str, int], ...]  # [D] by role: weight, kv, state, activation; () if not asked
    transfers: int  # number of (value, destination) sends

    @property
    def bottleneck_s(self) -> float:
        return max([*self.device_busy_s, *self.link_busy_s.values()])

    def link_tuple(self) -> tuple[tuple[int, int, float], ...]:
        return tuple((a, b, s) for (a, b), s in sorted(self.link_busy_s.items()))


def evaluate(graph: KernelGraph, assignment: tuple[int, ...] | list[int], gpus: tuple[GpuSpec, ...],
             link: LinkSpec, cost: CostModel,
             handoffs: tuple[tuple[int, int, int], ...] = (), *, memory: bool = True) -> PlacementEvaluation:
    """``handoffs``: extra (bytes, src device, dst device) sends of this step (prefill KV to decode);
    ``memory``: False leaves memory_bytes empty (a load sampled for the knee needs only the seconds)."""
    n_dev = len(gpus)
    assert len(assignment) == len(graph.kernels), "assignment length != kernels"
    busy = [0.0] * n_dev
    links = {(a, b): 0.0 for a in range(n_dev) for b in range(n_dev) if a != b}
    dev_free = [0.0] * n_dev
    link_free = dict.fromkeys(links, 0.0)
    finish: list[float] = []
    writer: dict[int, int] = {}  # buffer -> last kernel that wrote it
    arrived: dict[tuple[int, int, int], float] = {}  # (writer, buffer, device) -> time the data is there
    sends = 0
    resident = resident_flags(graph)
    for k in graph.kernels:
        d = assignment[k.id]
        dur = cost.kernel_time_s(k, gpus[d])
        busy[d] += dur
        ready = dev_free[d]
        for b in k.touches:
            w = writer.get(b)
            if resident[b] or w is None:
                continue
            buf = graph.buffers[b]
            src = assignment[w]
            if src == d:
                ready = max(ready, finish[w])
                continue
            key = (w, b, d)
            if key not in arrived:
                xfer = cost.transfer_time_s(buf.bytes, link)
                links[src, d] += xfer
                start = max(finish[w], link_free[src, d])
                link_free[src, d] = arrived[key] = start + xfer
                sends += 1
            ready = max(ready, arrived[key])
        finish.append(ready + dur)
        dev_free[d] = ready + dur
        for b in k.writes:
            writer[b] = k.id
    for nbytes, a, b in handoffs:
        if a != b:
            links[a, b] += cost.transfer_time_s(nbytes, link)
            sends += 1
    return PlacementEvaluation(device_busy_s=tuple(busy), link_busy_s=links,
                               latency_s=max(finish, default=0.0),
                               memory_bytes=memory_by_device(graph, assignment, n_dev) if memory else (),
                               transfers=sends)


def resident_flags(graph: KernelGraph) -> list[bool]:
    """Per buffer, whether it stays where it lives (weights, KV, state: never sent between kernels)."""
    return [b.role in RESIDENT_ROLES for b in graph.buffers]


@dataclass(frozen=True)
class Message:
    """One value of one micro-batch crossing a directed link: it holds the link for ``hold_s`` (its bytes;
    a message's latency does not hold it, messages in flight overlap) and lands ``flight_s`` after it
    leaves (bytes and latency)."""

    key: Hashable  # what the kernels that need it await (one per value and destination)
    link: tuple[int, int]  # (src, dst) device
    hold_s: float
    flight_s: float


POLICIES = ("cyclic", "in_order")


def list_schedule_s(order: Sequence[Sequence[int]], dur: Sequence[float],
                    awaits: Mapping[int, Sequence[Hashable]], sends: Mapping[int, Sequence[Message]],
                    m: int, *, policy: str = "cyclic", start: Sequence[Message] = (),
                    per_mb: Sequence[tuple[Sequence[float], Mapping[int, Sequence[Message]]]] = (),
                    done: Mapping[int, list[float]] | None = None) -> float:
    """Seconds until the last kernel ends or the last message lands, for m micro-batches of one step:
    ``order[d]`` device d's kernels in program order, ``dur[k]`` kernel k's seconds, ``awaits[k]`` the
    messages (of its own micro-batch) kernel k needs, ``sends[k]`` those that leave when k ends, ``start``
    those that leave at time 0 (every micro-batch's, in turn, under either policy); ``per_mb[j]``, where
    given, replaces (dur, sends) for micro-batch j (the same kernels at another shape); ``done[k]``, for
    the kernels it names, receives the end of kernel k in each micro-batch. A kernel's inputs from its own
    device are there when it is next in program order.

    policy ``cyclic`` (the gloo workers): a device runs a micro-batch's kernels until the next one's inputs
    are not there, then turns to the next micro-batch in turn (j + 1, ..., m − 1, 0, ...); with none ready
    it waits and starts again from micro-batch 0. ``in_order`` (one CUDA stream fed in the ordered NCCL
    schedule): a device runs micro-batch 0's kernels, then 1's, ..., each waiting for its inputs."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: one of {', '.join(POLICIES)}")
    arrived: list[dict[Hashable, float]] = [{} for _ in range(m)]  # per micro-batch: message key -> seconds
    link_free: dict[tuple[int, int], float] = {}
    events: list[tuple[float, int, int]] = []  # (time, device whose kernel of micro-batch mb ends or -1, mb)
    cursor = [[0] * m for _ in order]
    idle = [True] * len(order)

    durs = [per_mb[j][0] if j < len(per_mb) else dur for j in range(m)]
    outs = [per_mb[j][1] if j < len(per_mb) else sends for j in range(m)]

    def send(msgs: Sequence[Message], mb: int, t: float) -> None:
        for s in msgs:
            t0 = max(t, link_free.get(s.link, 0.0))
            link_free[s.link] = t0 + s.hold_s
            arrived[mb][s.key] = t0 + s.flight_s
            heapq.heappush(events, (t0 + s.flight_s, -1, 0))

    turns = [(*range(first, m), *range(first)) for first in range(m)]
    cyclic = policy == "cyclic"

    def candidates(d: int, first: int) -> Sequence[int]:
        if policy == "in_order":
            return next(((mb,) for mb in range(m) if cursor[d][mb] < len(order[d])), ())
        return turns[first]

    def run(d: int, first: int, t: float) -> None:
        """Device d is free at t: the first candidate micro-batch whose next kernel has its inputs runs it."""
        od, cd = order[d], cursor[d]
        for mb in (turns[first] if cyclic else candidates(d, first)):
            c = cd[mb]
            if c >= len(od):
                continue
            k, got = od[c], arrived[mb]
            for x in awaits.get(k, ()):
                if got.get(x, math.inf) > t:
                    break  # an input is still on its way
            else:
                cd[mb] += 1
                idle[d] = False
                end = t + durs[mb][k]
                heapq.heappush(events, (end, d, mb))
                send(outs[mb].get(k, ()), mb, end)
                if done is not None and k in done:
                    done[k][mb] = end
                return
        idle[d] = True

    for mb in range(m):
        send(start, mb, 0.0)
    for d in range(len(order)):
        run(d, 0, 0.0)
    end = 0.0
    while events:
        t, d, mb = heapq.heappop(events)
        end = max(end, t)
        if d >= 0:  # a kernel of mb ended on d: d carries on from mb (cyclic), else the next in turn
            run(d, mb, t)
        for x in range(len(order)):  # an arrival (or an end) may wake a waiting device, from micro-batch 0
            if idle[x]:
                run(x, 0, t)
    stuck = [(d, mb) for d in range(len(order)) for mb in range(m) if cursor[d][mb] < len(order[d])]
    if stuck:  # a kernel awaits a message nothing sends: the inputs disagree, not a schedule
        d, mb = stuck[0]
        k = order[d][cursor[d][mb]]
        raise ValueError(f"kernel {k} of micro-batch {mb} on device {d} never gets its inputs")
    return end


def pipelined_latency_s(graph: KernelGraph, assignment: tuple[int, ...] | list[int],
                        gpus: tuple[GpuSpec, ...], link: LinkSpec, cost: CostModel,
                        microbatches: int, policy: str = "cyclic") -> float:
    """Seconds from the first kernel to the last of ``microbatches`` identical micro-batches of one step sent
    through the placement together: the synchronous schedule's iteration (m = 1: ``evaluate``'s latency
    where no two transfers contend for a link, which evaluate holds for their whole transfer time).

    Each device runs its kernels in program order per micro-batch, choosing among micro-batches by
    ``policy`` (list_schedule_s: ``cyclic``, the gloo workers'; ``in_order``, a CUDA stream's). A value
    leaves right after the kernel that writes it, holds its directed link for its transfer time less the
    link's latency (the time of an empty message) and lands a transfer time after it leaves.
    Latency + (m − 1)·bottleneck is exact for a two-stage chain; on a placement that crosses between
    devices several times per step the micro-batches interleave, better or worse."""
    ks = graph.kernels
    dev = [assignment[k.id] for k in ks]
    awaits, sends = _step_messages(graph, dev)
    wire = cost.transfer_time_s(0, link)

    def message(w: int, b: int, dst: int) -> Message:
        x = cost.transfer_time_s(graph.buffers[b].bytes, link)
        return Message(key=(w, b, dst), link=(dev[w], dst), hold_s=x - wire, flight_s=x)

    out = {w: [message(w, b, dst) for b, dst in to] for w, to in sends.items()}
    order = [[k.id for k in ks if dev[k.id] == d] for d in range(len(gpus))]
    dur = [cost.kernel_time_s(k, gpus[dev[k.id]]) for k in ks]
    return list_schedule_s(order, dur, awaits, out, microbatches, policy=policy)


def _step_messages(graph: KernelGraph, dev: list[int]
                   ) -> tuple[dict[int, list[tuple[int, int, int]]], dict[int, list[tuple[int, int]]]]:
    """Per kernel, the values it needs from another device, as (writer, buffer, its device): the last
    writer of each buffer it touches, resident ones aside (a writer on its own device ran before it in
    program order); per writer, the (buffer, device) sends those readers need, each once."""
    awaits: dict[int, list[tuple[int, int, int]]] = {}
    sends: dict[int, list[tuple[int, int]]] = {}
    writer: dict[int, int] = {}
    for k in graph.kernels:
        d = dev[k.id]
        for b in k.touches:
            w = writer.get(b)
            if graph.buffers[b].role in RESIDENT_ROLES or w is None or dev[w] == d:
                continue
            awaits.setdefault(k.id, []).append((w, b, d))
            if (b, d) not in sends.setdefault(w, []):
                sends[w].append((b, d))
        for b in k.writes:
            writer[b] = k.id
    return awaits, sends


EVAL_CACHE_SIZE = 4096  # evaluations kept; a Mixtral cell's search needs ~150 distinct ones
# key -> (graph, cost, evaluation): the key holds their ids, the entry keeps both alive and is checked
# against them, so an id reused by a later object can never return another object's evaluation
_eval_cache: OrderedDict[tuple, tuple[KernelGraph, CostModel, PlacementEvaluation]] = OrderedDict()


def evaluate_cached(graph: KernelGraph, assignment: tuple[int, ...] | list[int], gpus: tuple[GpuSpec, ...],
                    link: LinkSpec, cost: CostModel,
                    handoffs: tuple[tuple[int, int, int], ...] = (), *, memory: bool = True
                    ) -> PlacementEvaluation:
    """``evaluate`` memoised on (graph, assignment, devices, link, cost, handoffs): the search scores one
    placement of one shape several times (a rule's candidates, the MILP's starts, the chosen point, the
    Plan's step points). Graphs and costs are keyed by identity (the planner caches one graph per shape);
    the entry keeps both alive so their ids cannot be reused while it exists. Callers must not mutate the
    returned PlacementEvaluation. An entry made without memory is made again when memory is asked for."""
    key = (id(graph), tuple(assignment), tuple(gpus), link, id(cost), tuple(handoffs))
    hit = _eval_cache.get(key)
    if hit is not None and hit[0] is graph and hit[1] is cost and (hit[2].memory_bytes or not memory):
        _eval_cache.move_to_end(key)
        return hit[2]
    ev = evaluate(graph, assignment, gpus, link, cost, handoffs, memory=memory)
    _eval_cache[key] = (graph, cost, ev)
    if len(_eval_cache) > EVAL_CACHE_SIZE:
        _eval_cache.popitem(last=False)
    return ev


def memory_by_device(graph: KernelGraph, assignment: tuple[int, ...] | list[int],
                     n_dev: int) -> tuple[dict[str, int], ...]:
    """Bytes per role on each device: every resident buffer a local kernel touches, plus the device's
    own peak live set of activations (buffers live from their first to last local touch)."""
    held: list[set[int]] = [set() for _ in range(n_dev)]
    first: list[dict[int, int]] = [{} for _ in range(n_dev)]
    last: list[dict[int, int]] = [{} for _ in range(n_dev)]
    resident = resident_flags(graph)
    for k in graph.kernels:
        d = assignment[k.id]
        for b in (*k.reads, *k.writes):
            if resident[b]:
                held[d].add(b)
            else:
                first[d].setdefault(b, k.id)
                last[d][b] = k.id
    out = []
    for d in range(n_dev):
        mem = {"weight": 0, "kv": 0, "state": 0, "activation": 0}
        for b in held[d]:
            mem[str(graph.buffers[b].role)] += graph.buffers[b].bytes
        events = sorted([(s, graph.buffers[b].bytes) for b, s in first[d].items()]
                        + [(last[d][b] + 1, -graph.buffers[b].bytes) for b in first[d]])  # frees first
        live = peak = 0
        for _, delta in events:
            live += delta
            peak = max(peak, live)
        mem["activation"] = peak
        out.append(mem)
    return tuple(out)


def async_period_s(graph: KernelGraph, assignment: tuple[int, ...] | list[int], gpus: tuple[GpuSpec, ...],
                   link: LinkSpec, cost: CostModel, microbatches: int, policy: str = "cyclic",
                   iterations: tuple[int, int] = (1, 3), other: KernelGraph | None = None,
                   others: int = 0) -> tuple[float, ...]:
    """Per group, the steady period of ``microbatches`` groups each iterating back to back through the placement (the
    asynchronous schedule): every group runs ``iterations`` successive iterations of the step, the next
    one's first kernel awaiting the previous one's last (the sampled token), devices choosing among groups
    by ``policy`` (list_schedule_s). The first ``others`` groups run ``other`` instead (the same kernels at
    another shape: a group whose iterations carry a prompt chunk). A group's period is the time between
    the ends of its iterations ``iterations[0]`` and ``iterations[1]``, over their difference, so the
    pipeline's start-up does not count. On a chain
    of identical groups it is max(m·T, L); a placement that crosses between devices many times per step
    can fall short of that when the groups cannot interleave."""
    ks = graph.kernels
    n = len(ks)
    dev = [assignment[k.id] for k in ks]
    awaits, sends = _step_messages(graph, dev)
    wire = cost.transfer_time_s(0, link)

    def costs(g: KernelGraph) -> tuple[list[float], dict[tuple[int, int], float]]:
        return ([cost.kernel_time_s(k, gpus[dev[k.id]]) for k in g.kernels],
                {(w, b): cost.transfer_time_s(g.buffers[b].bytes, link) for w, to in sends.items() for b, _ in to})

    shapes = [costs(graph)] + ([costs(other)] if other is not None and others else [])

    def makespan(reps: int) -> float:
        order = [[i * n + k.id for i in range(reps) for k in ks if dev[k.id] == d] for d in range(len(gpus))]
        aw: dict[int, list] = {}
        for i in range(reps):
            for k, need in awaits.items():
                aw[i * n + k] = [(i, *x) for x in need]
            if i and dev[n - 1] != dev[0]:  # the token the last kernel samples starts the next iteration
                aw.setdefault(i * n, []).append((i, "token"))
        per = []
        for dur1, hold in shapes:
            out: dict[int, list[Message]] = {}
            for i in range(reps):
                for w, to in sends.items():
                    out[i * n + w] = [Message(key=(i, w, b, d), link=(dev[w], d), hold_s=hold[w, b] - wire,
                                              flight_s=hold[w, b]) for b, d in to]
                if i and dev[n - 1] != dev[0]:
                    out.setdefault((i - 1) * n + n - 1, []).append(
                        Message(key=(i, "token"), link=(dev[n - 1], dev[0]), hold_s=0.0, flight_s=wire))
            per.append((dur1 * reps, out))
        mb = [per[1] if j < others and len(per) > 1 else per[0] for j in range(microbatches)]
        ends = {i * n + n - 1: [0.0] * microbatches for i in range(reps)}  # each iteration's last kernel
        list_schedule_s(order, mb[0][0], aw, mb[0][1], microbatches, policy=policy, per_mb=mb, done=ends)
        return ends

    a, b = iterations
    ends = makespan(b)
    lo, hi = ends[(a - 1) * n + n - 1], ends[(b - 1) * n + n - 1]
    return tuple((y - x) / (b - a) for x, y in zip(lo, hi, strict=True))


_async_cache: OrderedDict[tuple, tuple[tuple, tuple[float, ...]]] = OrderedDict()  # key -> (keyed objects, period)


def async_period_cached(graph: KernelGraph, assignment: tuple[int, ...], gpus: tuple[GpuSpec, ...],
                        link: LinkSpec, cost: CostModel, microbatches: int, other: KernelGraph | None = None,
                        others: int = 0) -> tuple[float, ...]:
    """``async_period_s`` (cyclic policy) memoised like evaluate_cached: the search scores a placement of
    one shape several times; the entry keeps the objects keyed by id alive and is checked against them."""
    key = (id(graph), tuple(assignment), tuple(gpus), link, id(cost), microbatches, id(other), others)
    hit = _async_cache.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], (graph, cost, other), strict=True)):
        return hit[1]
    p = async_period_s(graph, assignment, gpus, link, cost, microbatches, other=other, others=others)
    _async_cache[key] = ((graph, cost, other), p)
    if len(_async_cache) > EVAL_CACHE_SIZE:
        _async_cache.popitem(last=False)
    return p
