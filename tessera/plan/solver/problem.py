"""One phase's placement problem in the terms of docs/plan.md, built from a KernelGraph, a pool and a cost model.

Kernels that must share a device are contracted into *groups* first (every kernel touching one kv/state
buffer: the in-step cache write and the attention that reads it must not be split without a transfer),
so the MILP has one x[g,d] per group. Shapes: t[g,d] seconds, values carry bytes.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from tessera.cost import CostModel, default_cost_model
from tessera.graph import RESIDENT_ROLES, EdgeKind, KernelGraph, Role
from tessera.plan.pool import Pool


def default_cost() -> CostModel:
    """The cost stage's calibrated cost model (measured tables where it has them, else the fitted roofline)."""
    return default_cost_model()


@dataclass(frozen=True, kw_only=True)
class Value:
    """An activation produced by group ``src`` and read by groups ``dst``: b[v] bytes, sent once per device."""

    name: str
    src: int
    dst: tuple[int, ...]
    bytes: int
    kernel: int  # producing kernel (src of the RAW/WAW edges)


@dataclass(frozen=True, kw_only=True)
class Resident:
    """A weight / kv / state buffer w: size[w] bytes on every device running a group in touch(w)."""

    name: str
    bytes: int
    role: Role
    groups: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class Handoff:
    """A fixed-destination transfer: group ``src``'s buffer must reach ``device`` (prefill KV -> decode)."""

    name: str
    src: int
    device: int
    bytes: int


def union_groups(graph: KernelGraph) -> list[int]:
    """kernel -> group id; kernels touching one kv/state buffer share a group (union-find)."""
    parent = list(range(len(graph.kernels)))

    def find(a: int) -> int:
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    first: dict[int, int] = {}
    for k in graph.kernels:
        for b in (*k.reads, *k.writes):
            if graph.buffers[b].role in (Role.KV, Role.STATE):
                if b in first:
                    parent[find(k.id)] = find(first[b])
                else:
                    first[b] = k.id
    roots: dict[int, int] = {}
    out = []
    for k in range(len(graph.kernels)):
        out.append(roots.setdefault(find(k), len(roots)))
    return out


def activation_peak_bytes(graph: KernelGraph, kernels: set[int] | None = None) -> int:
    """Largest live set of non-resident buffers over program order (live from first to last touch).

    With ``kernels`` only the accesses of those kernels count (a device's own view of the step).
    """
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k in graph.kernels:
        if kernels is not None and k.id not in kernels:
            continue
        for b in (*k.reads, *k.writes):
            if graph.buffers[b].role not in RESIDENT_ROLES:
                first.setdefault(b, k.id)
                last[b] = k.id
    delta = np.zeros(len(graph.kernels) + 1)
    for b, s in first.items():
        delta[s] += graph.buffers[b].bytes
        delta[last[b] + 1] -= graph.buffers[b].bytes
    return int(np.cumsum(delta).max()) if first else 0


@dataclass(kw_only=True)
class PhaseProblem:
    graph: KernelGraph
    pool: Pool
    cost: CostModel
    group_of: list[int]  # kernel -> group
    groups: list[list[int]]  # group -> kernels, program order
    t: np.ndarray  # [G, D] seconds, t[g,d] = Σ_{k∈g} t[k,d]
    values: list[Value]
    residents: list[Resident]
    act_bytes: int  # activations[d]: reserved on every device (the whole step's peak live set, a bound)
    xfer_s: np.ndarray  # [V] seconds per value on the pool's link: lat + b[v]/bw
    pinned: dict[int, int] = field(default_factory=dict)  # group -> device
    handoffs: list[Handoff] = field(default_factory=list)
    # resident name -> devices where it is already counted (by another phase of the same plan)
    preresident: dict[str, frozenset[int]] = field(default_factory=dict)
    held_bytes: tuple[int, ...] = ()  # [D] bytes earlier phases already keep on each device

    def free_bytes(self, d: int) -> float:
        """capacity[d] − activations − what earlier phases hold: the right side of memory[d]."""
        held = self.held_bytes[d] if self.held_bytes else 0
        return float(self.pool.gpus[d].mem_bytes - self.act_bytes - held)

    @property
    def G(self) -> int:  # noqa: N802 - the formulation's symbol
        return len(self.groups)

    @property
    def D(self) -> int:  # noqa: N802
        return self.pool.n

    def kernel_assignment(self, group_dev: list[int] | np.ndarray) -> tuple[int, ...]:
        return tuple(int(group_dev[g]) for g in self.group_of)

    def group_assignment(self, kernel_dev: tuple[int, ...] | list[int]) -> list[int]:
        out = [kernel_dev[ks[0]] for ks in self.groups]
        for g, ks in enumerate(self.groups):
            assert all(kernel_dev[k] == out[g] for k in ks), f"group {g} split across devices"
        return out

    def handoff_s(self, h: Handoff) -> float:
        return self.cost.transfer_time_s(h.bytes, self.pool.link)


def build_problem(graph: KernelGraph, pool: Pool, cost: CostModel | None = None, *,
                  with_values: bool = True) -> PhaseProblem:
    """``with_values=False`` leaves the transfers out (a bound that frees them needs no dependency edges)."""
    cost = cost or default_cost()
    group_of = union_groups(graph)
    n_groups = max(group_of) + 1 if group_of else 0
    groups: list[list[int]] = [[] for _ in range(n_groups)]
    for k, g in enumerate(group_of):
        groups[g].append(k)
    tk = np.array([[cost.kernel_time_s(k, gpu) for gpu in pool.gpus] for k in graph.kernels])
    t = np.zeros((n_groups, pool.n))
    np.add.at(t, np.array(group_of, dtype=int), tk)
    # values: one per (producing kernel, buffer); RAW edges carry data, and so do WAW edges on
    # activations (a partial overwrite needs the earlier contents where the overwriting kernel runs).
    readers: dict[tuple[int, int], set[int]] = defaultdict(set)
    for e in graph.edges if with_values else ():
        if e.kind == EdgeKind.WAR or graph.buffers[e.buffer].role in RESIDENT_ROLES:
            continue
        readers[(e.src, e.buffer)].add(e.dst)
    values = []
    for (src, b), dsts in sorted(readers.items()):
        gs = group_of[src]
        dg = tuple(sorted({group_of[d] for d in dsts} - {gs}))
        if dg:
            buf = graph.buffers[b]
            values.append(Value(name=f"{buf.name}@{src}", src=gs, dst=dg, bytes=buf.bytes, kernel=src))
    touch: dict[int, set[int]] = defaultdict(set)
    for k in graph.kernels:
        for b in (*k.reads, *k.writes):
            if graph.buffers[b].role in RESIDENT_ROLES:
                touch[b].add(group_of[k.id])
    residents = [Resident(name=graph.buffers[b].name, bytes=graph.buffers[b].bytes, role=graph.buffers[b].role,
                          groups=tuple(sorted(gs))) for b, gs in sorted(touch.items())]
    xfer = np.array([cost.transfer_time_s(v.bytes, pool.link) for v in values])
    return PhaseProblem(graph=graph, pool=pool, cost=cost, group_of=group_of, groups=groups, t=t, values=values,
                        residents=residents, act_bytes=activation_peak_bytes(graph), xfer_s=xfer)
