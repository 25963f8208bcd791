"""A replayable program (real-mode capture of a tiny model) and its single-process replay."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tessera.capture import ops  # noqa: F401  (registers the tessera:: ops a replayed program may call)
from tessera.capture.recorder import OpRecord, TensorRef
from tessera.graph import KernelGraph


@dataclass(frozen=True, kw_only=True)
class Capture:
    """``program[i]`` is the operator call of ``graph.kernels[i]``.

    ``initial`` holds the starting bytes (a uint8 tensor over the whole storage) of every buffer that
    exists before the step: weights, inputs, KV cache, SSM state and constants. ``outputs`` are the
    views that make up the step's result, in the order the module returns them.
    """

    graph: KernelGraph
    program: tuple[OpRecord, ...]
    initial: dict[int, torch.Tensor]
    outputs: tuple[TensorRef, ...]
    expected: tuple[torch.Tensor, ...]  # the module's own outputs from the capturing run
    # the production-fused view of ``graph`` (tessera.capture.fuse): meta["fused_from"] maps its kernels to ops
    fused: KernelGraph | None = None

    def __post_init__(self) -> None:
        assert len(self.program) == len(self.graph.kernels), "one op record per kernel"
        if self.fused is not None:
            covered = sorted(i for g in self.fused.meta["fused_from"] for i in g)
            assert covered == list(range(len(self.program))), "the fused view must cover every op exactly once"
        for op, k in zip(self.program, self.graph.kernels, strict=True):
            assert op.func == k.name, f"op {op.func} does not match kernel {k.id} {k.name}"


def resolve(qualified: str) -> Any:
    """``"aten.mm.default"`` -> ``torch.ops.aten.mm.default``; ``"triton:<kernel>"`` -> its launcher."""
    if qualified.startswith("triton:"):
        from tessera.capture.triton_launch import launcher

        return launcher(qualified)
    ns, name, overload = qualified.split(".")
    return getattr(getattr(getattr(torch.ops, ns), name), overload)


def view_of(storages: dict[int, torch.UntypedStorage], ref: TensorRef) -> torch.Tensor:
    """The recorded view over a storage, on the storage's device (``set_`` refuses a device mismatch)."""
    st = storages[ref.buffer]
    return torch.empty(0, dtype=ref.dtype, device=st.device).set_(st, ref.storage_offset, ref.size, ref.stride)


def materialise(storages: dict[int, torch.UntypedStorage], tree: Any) -> Any:
    if isinstance(tree, TensorRef):
        return view_of(storages, tree)
    if isinstance(tree, tuple | list):
        return type(tree)(materialise(storages, x) for x in tree)
    if isinstance(tree, dict):
        return {k: materialise(storages, v) for k, v in tree.items()}
    return tree


def run_op(storages: dict[int, torch.UntypedStorage], op: OpRecord, func: Any | None = None) -> None:
    """Execute one record; a buffer an op creates takes its output's storage."""
    out = (func or resolve(op.func))(*materialise(storages, op.args), **materialise(storages, op.kwargs))
    flat = [t for t in torch.utils._pytree.tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    assert len(flat) == len(op.outputs), f"{op.func}: {len(flat)} outputs, recorded {len(op.outputs)}"
    for t, ref in zip(flat, op.outputs, strict=True):
        storages.setdefault(ref.buffer, t.untyped_storage())


def initial_storages(capture: Capture) -> dict[int, torch.UntypedStorage]:
    """Fresh copies of the starting bytes, plus zeroed storage for buffers allocated by ``empty``."""
    storages = {b: t.untyped_storage().clone() for b, t in capture.initial.items()}
    produced = {r.buffer for op in capture.program for r in op.outputs}
    for buf in capture.graph.buffers:
        if buf.id not in storages and buf.id not in produced:
            storages[buf.id] = torch.zeros(buf.bytes, dtype=torch.uint8).untyped_storage()
    return storages


def replay(capture: Capture) -> tuple[torch.Tensor, ...]:
    """Run the program op by op in this process from the initial contents; returns the step's outputs."""
    storages = initial_storages(capture)
    for op in capture.program:
        run_op(storages, op)
    return tuple(view_of(storages, r).clone() for r in capture.outputs)
