"""What each worker does per iteration under a placement: its nodes in program order, the values it
receives before a node and sends after one, and when it may drop a value.

The transfers are ``program.values_crossing`` without its last entry's meaning for one process (the
logits back to device 0): on workers the logits go from the worker that computes them to the driver,
over the result queue. Transfer i carries one value from its producer's worker to one consumer's worker,
posted right after the producer, awaited right before the first consumer there.

``ordered_actions`` is the one issue order NCCL needs (it pairs a link's sends and receives in issue
order and ignores tags): running node k at key (k, 1), and transfer i of a value produced by node a at
(a, 2, i) on both ends (sent after a; its receive posted then too, awaited before the consumer), so both
ends of a link issue in the same (a, i) order and every action waits only on smaller keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch.fx as fx

from tessera.engine.program import Program

if TYPE_CHECKING:  # the plan stage (and its solver) is needed only where placements are planned
    from tessera.contracts.plan import Plan


@dataclass(frozen=True)
class Placement:
    """Which worker runs each program node, what asked for it (a rule's name, "plan", a plan file), and
    the Plan with its predictions when the planner made (or a file gave) one."""

    assignment: tuple[int, ...]
    label: str
    plan: Plan | None = None


@dataclass(frozen=True)
class Transfer:
    index: int  # position in the iteration's transfer list: its message tag
    value: str  # the producing node's name
    src: int
    dst: int


@dataclass(frozen=True)
class WorkerRoute:
    """One worker's share: ``nodes`` (program indices, in order); per position, the transfers to await
    before it, those to post after it, and the values no longer needed once it ran."""

    rank: int
    nodes: tuple[int, ...]
    recvs: tuple[tuple[Transfer, ...], ...]
    sends: tuple[tuple[Transfer, ...], ...]
    drops: tuple[tuple[str, ...], ...]
    transfers: tuple[Transfer, ...]  # every transfer of the iteration (all workers)
    output: str  # the logits node
    has_output: bool  # this worker computes the logits

    @property
    def incoming(self) -> tuple[Transfer, ...]:
        return tuple(t for ts in self.recvs for t in ts)


def transfers(program: Program, assignment: Sequence[int]) -> tuple[Transfer, ...]:
    """Every value that crosses between workers in one iteration, in program order of its first
    consumer on each receiving worker."""
    dev = dict(zip(program.kernels, assignment, strict=True))
    out: list[Transfer] = []
    seen: set[tuple[str, int]] = set()
    for n in program.kernels:
        for a in dict.fromkeys(a for a in n.all_input_nodes if a in dev):
            if dev[a] != dev[n] and (a.name, dev[n]) not in seen:
                seen.add((a.name, dev[n]))
                out.append(Transfer(len(out), a.name, dev[a], dev[n]))
    return tuple(out)


def route(program: Program, assignment: Sequence[int], rank: int) -> WorkerRoute:
    if len(assignment) != len(program.kernels):
        raise ValueError(f"assignment of {len(assignment)} nodes; the program has {len(program.kernels)}")
    ts = transfers(program, assignment)
    index = {n: i for i, n in enumerate(program.kernels)}
    mine = [i for i, d in enumerate(assignment) if d == rank]
    pos = {i: p for p, i in enumerate(mine)}
    recvs: list[list[Transfer]] = [[] for _ in mine]
    sends: list[list[Transfer]] = [[] for _ in mine]
    by_name = {n.name: n for n in program.kernels}
    for t in ts:
        if t.src == rank:
            sends[pos[index[by_name[t.value]]]].append(t)
        if t.dst == rank:
            users = by_name[t.value].users
            first = min(index[u] for u in users if u in index and assignment[index[u]] == rank)
            recvs[pos[first]].append(t)
    out_node = _output(program)
    return WorkerRoute(rank=rank, nodes=tuple(mine), recvs=tuple(map(tuple, recvs)),
                       sends=tuple(map(tuple, sends)), drops=_drops(program, mine, out_node), transfers=ts,
                       output=out_node.name, has_output=assignment[index[out_node]] == rank)


def _output(program: Program) -> fx.Node:
    return next(n for n in program.gm.graph.nodes if n.op == "output").args[0]


def _drops(program: Program, mine: list[int], out_node: fx.Node) -> tuple[tuple[str, ...], ...]:
    """Per position of ``mine``: values (held here, produced or received) whose last local use it is; a
    value produced here and used only elsewhere is dropped right after it (its send keeps its bytes)."""
    last: dict[str, int] = {}
    for p, i in enumerate(mine):
        node = program.kernels[i]
        last.setdefault(node.name, p)  # produced here: kept at least until sent
        for a in node.all_input_nodes:
            if a.op not in ("placeholder", "get_attr"):
                last[a.name] = p
    last.pop(out_node.name, None)  # the logits stay for the driver
    out: list[list[str]] = [[] for _ in mine]
    for name, p in last.items():
        out[p].append(name)
    return tuple(map(tuple, out))


@dataclass(frozen=True, order=True)
class Action:
    """One entry of the ordered schedule: ("run", position) or ("send"/"recv", transfer)."""

    key: tuple[int, int, int]
    kind: str
    position: int = -1  # into WorkerRoute.nodes, for "run"
    transfer: Transfer | None = None


def ordered_actions(program: Program, r: WorkerRoute) -> tuple[Action, ...]:
    index = {n.name: i for i, n in enumerate(program.kernels)}
    acts = [Action(key=(k, 1, 0), kind="run", position=p) for p, k in enumerate(r.nodes)]
    for t in r.transfers:
        if rank_side := ("send" if t.src == r.rank else "recv" if t.dst == r.rank else ""):
            acts.append(Action(key=(index[t.value], 2, t.index), kind=rank_side, transfer=t))
    return tuple(sorted(acts, key=lambda a: a.key))
