"""Independent verifier: recomputes loads, transfers, memory and latency of a finished assignment.

Deliberately shares no code with the solver path (problem/milp/patterns): it walks the kernels in program
order with its own last-writer table, so a bookkeeping bug on either side shows up as a disagreement.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tessera.cost import CostModel
from tessera.graph import KernelGraph, Role
from tessera.hardware import GpuSpec, LinkSpec

_RESIDENT = (Role.WEIGHT, Role.KV, Role.STATE)


@dataclass(frozen=True, kw_only=True)
class Evaluation:
    device_busy_s: tuple[float, ...]  # [D] compute of one step at the graph's shape
    link_busy_s: dict[tuple[int, int], float]  # directed (src, dst) -> seconds, every pair present
    latency_s: float  # list schedule: kernels in program order per device, inputs must have arrived
    memory_bytes: tuple[dict[str, int], ...]  # [D] by role: weight, kv, state, activation
    transfers: int  # number of (value, destination) sends

    @property
    def bottleneck_s(self) -> float:
        return max([*self.device_busy_s, *self.link_busy_s.values()])

    def link_tuple(self) -> tuple[tuple[int, int, float], ...]:
        return tuple((a, b, s) for (a, b), s in sorted(self.link_busy_s.items()))


def evaluate(graph: KernelGraph, assignment: tuple[int, ...] | list[int], gpus: tuple[GpuSpec, ...],
             link: LinkSpec, cost: CostModel,
             handoffs: tuple[tuple[int, int, int], ...] = ()) -> Evaluation:
    """``handoffs``: extra (bytes, src device, dst device) sends of this step (prefill KV to decode)."""
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
    for k in graph.kernels:
        d = assignment[k.id]
        dur = cost.kernel_time_s(k, gpus[d])
        busy[d] += dur
        ready = dev_free[d]
        for b in sorted(set(k.reads) | set(k.writes)):
            buf = graph.buffers[b]
            w = writer.get(b)
            if buf.role in _RESIDENT or w is None:
                continue
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
    return Evaluation(device_busy_s=tuple(busy), link_busy_s=links, latency_s=max(finish, default=0.0),
                      memory_bytes=memory_by_device(graph, assignment, n_dev), transfers=sends)


EVAL_CACHE_SIZE = 4096  # evaluations kept; a Mixtral cell's search needs ~150 distinct ones
_eval_cache: OrderedDict[tuple, tuple[KernelGraph, Evaluation]] = OrderedDict()


def evaluate_cached(graph: KernelGraph, assignment: tuple[int, ...] | list[int], gpus: tuple[GpuSpec, ...],
                    link: LinkSpec, cost: CostModel,
                    handoffs: tuple[tuple[int, int, int], ...] = ()) -> Evaluation:
    """``evaluate`` memoised on (graph, assignment, devices, link, cost, handoffs): the search scores one
    placement of one shape several times (a rule's candidates, the MILP's starts, the chosen point, the
    Plan's step points). Graphs are keyed by identity (the planner caches one graph per shape); the entry
    keeps the graph alive so its id cannot be reused while the entry exists. Callers must not mutate the
    returned Evaluation."""
    key = (id(graph), tuple(assignment), tuple(gpus), link, id(cost), tuple(handoffs))
    hit = _eval_cache.get(key)
    if hit is not None and hit[0] is graph:
        _eval_cache.move_to_end(key)
        return hit[1]
    ev = evaluate(graph, assignment, gpus, link, cost, handoffs)
    _eval_cache[key] = (graph, ev)
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
    for k in graph.kernels:
        d = assignment[k.id]
        for b in (*k.reads, *k.writes):
            if graph.buffers[b].role in _RESIDENT:
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
