"""The executable program the runtime runs, built on ``tessera.capture``'s records.

``tessera.capture`` records op i <-> kernel i with tensor arguments as ``TensorRef`` views of buffer
storages; this module wraps a Capture with what partitioning and execution need: the buffers each op
must hold (every buffer its arguments view), the buffers it writes, which buffers start with contents
(``initial``: raw bytes) and which start as zeroed allocations (made by ``empty``, then written in place).
Storages are untyped (bytes), so a buffer travels between processes as one uint8 tensor.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from tessera.capture.program import Capture, materialise, run_op, view_of
from tessera.capture.recorder import OpRecord, TensorRef
from tessera.graph import KernelGraph, Role
from tessera.runtime.device import HOST, as_bytes, zero_storage

Storages = dict[int, torch.UntypedStorage]


@dataclass(frozen=True, kw_only=True)
class CapturedProgram:
    """One model step replayed from its capture's op records, executable in pieces (the engine's
    ``program.Program`` is a torch.fx trace of the model instead). ``initial``: starting bytes (flat uint8)
    per buffer."""

    graph: KernelGraph
    ops: tuple[OpRecord, ...]
    initial: dict[int, torch.Tensor] = field(hash=False)
    outputs: tuple[TensorRef, ...] = ()
    # the production-fused view of ``graph`` (each of its kernels a group of ops); placements are made on
    # it and run as the ops of each group on the group's device (tessera.capture.fuse.unfuse)
    fused: KernelGraph | None = field(default=None, hash=False, compare=False)

    def __post_init__(self) -> None:
        assert len(self.ops) == len(self.graph.kernels), (
            f"program has {len(self.ops)} ops but graph {len(self.graph.kernels)} kernels")

    @classmethod
    def from_capture(cls, cap: Capture) -> CapturedProgram:
        return cls(graph=cap.graph, ops=tuple(cap.program), initial=dict(cap.initial), outputs=tuple(cap.outputs),
                   fused=cap.fused)

    @property
    def placement_graph(self) -> KernelGraph:
        """The graph placements are made on: the fused view where there is one."""
        return self.fused or self.graph

    def role(self, buffer: int) -> Role:
        return self.graph.buffers[buffer].role

    def nbytes(self, buffer: int) -> int:
        return self.graph.buffers[buffer].bytes

    def name(self, buffer: int) -> str:
        return self.graph.buffers[buffer].name

    def needs(self, k: int) -> set[int]:
        """Buffers kernel k must hold current before it runs: every buffer its arguments view."""
        op = self.ops[k]
        return {r.buffer for r in iter_refs((op.args, op.kwargs))}

    def writes(self, k: int) -> set[int]:
        return set(self.graph.kernels[k].writes) | {r.buffer for r in self.ops[k].outputs}

    def zeroed(self) -> frozenset[int]:
        """Buffers with no starting contents that no op returns fresh: allocations written in place."""
        produced = {r.buffer for op in self.ops for r in op.outputs}
        return frozenset(b.id for b in self.graph.buffers if b.id not in self.initial and b.id not in produced)

    def stripped(self, keep: set[int] | frozenset[int]) -> CapturedProgram:
        """The same program holding starting contents only for ``keep`` (what one device may hold)."""
        return CapturedProgram(graph=self.graph, ops=self.ops,
                               initial={b: t for b, t in self.initial.items() if b in keep},
                               outputs=self.outputs, fused=self.fused)


def iter_refs(x: Any) -> Iterator[TensorRef]:
    if isinstance(x, TensorRef):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from iter_refs(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from iter_refs(y)


Wire = tuple[str, tuple[int, ...], Any]  # (dtype name, shape, numpy uint8 array)


def to_wire(t: torch.Tensor) -> Wire:
    """A tensor as plain bytes for the control queues. Tensors pickled by torch.multiprocessing go through
    shared-memory files and an fd-passing thread; those stalled the next step by ~5 ms (a GIL switch
    interval) after every large output, measured in the worker traces."""
    flat = t.detach().contiguous().reshape(-1).to(HOST)  # a device tensor comes back to host bytes here
    return str(flat.dtype).removeprefix("torch."), tuple(t.shape), flat.view(torch.uint8).numpy()


def from_wire(w: Wire) -> torch.Tensor:
    dtype, shape, data = w
    return torch.from_numpy(data).view(getattr(torch, dtype)).reshape(shape)


def replay_step(program: CapturedProgram, storages: Storages) -> list[torch.Tensor]:
    """Single-process execution of every op in order against ``storages`` (updated in place); zeroed
    allocations are made on the host."""
    for b in program.zeroed():
        storages.setdefault(b, zero_storage(program.nbytes(b), HOST))
    for op in program.ops:
        run_op(storages, op)
    return [view_of(storages, r).clone() for r in program.outputs]


__all__ = ["CapturedProgram", "Storages", "Wire", "as_bytes", "from_wire", "iter_refs", "materialise", "replay_step", "run_op",
           "to_wire", "view_of", "zero_storage"]
