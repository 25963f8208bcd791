"""Ops resolved once per partition, so the hot loop is a flat list of (callable, argument slots).

``tessera.capture.program.run_op`` resolves ``aten.x.y`` by name and walks the argument tree on every
call; a worker runs ~200 ops per step, so that walk, and the per-op set/dict look-ups around it, was a
measured 10-20 µs per op. A ``CompiledOp`` keeps the resolved callable, the constant arguments, the
positions of tensor arguments (their ``TensorRef``), and the buffers the op's outputs create. Weights are
the same storage every step, so their views are built once (``bind_weights``); everything else is a view
built at call time (activations are fresh storages every step). Every view and zeroed allocation is
made on the op's ``device`` (the executing process's one device), so a CUDA op never sees a host tensor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from tessera.capture.program import resolve
from tessera.capture.recorder import OpRecord, TensorRef
from tessera.runtime.device import zero_storage
from tessera.runtime.program import CapturedProgram, Storages, materialise, view_of


@dataclass(frozen=True, kw_only=True)
class CompiledOp:
    kernel: int
    func: Any  # torch.ops overload
    record: OpRecord
    flat: bool  # every TensorRef is a top-level positional or keyword argument
    args: tuple[Any, ...]  # constants, TensorRef placeholders where a tensor goes
    arg_refs: tuple[tuple[int, TensorRef], ...]
    kwargs: dict[str, Any]
    kw_refs: tuple[tuple[str, TensorRef], ...]
    outputs: tuple[int, ...]  # buffer id of each flattened tensor output
    zeroed: tuple[tuple[int, int], ...]  # (buffer, bytes) allocated as zeros if absent (empty + in-place fill)
    device: torch.device  # where the argument views and zeroed allocations are made


def _is_flat(op: OpRecord) -> bool:
    """No TensorRef inside a list/tuple/dict argument (e.g. aten.cat's tensor list needs the tree walk)."""
    return not any(isinstance(x, (list, tuple, dict)) and any(isinstance(y, TensorRef) for y in tree_flatten(x)[0])
                   for x in [*op.args, *op.kwargs.values()])


def on(device: torch.device, x: Any) -> Any:
    """A recorded constant with every device in it replaced by ``device``: the capture ran on the host, so
    factory ops (aten.arange, aten.ones, aten.scalar_tensor) carry ``device=cpu``."""
    if isinstance(x, torch.device):
        return device
    if isinstance(x, tuple | list):
        return type(x)(on(device, y) for y in x)
    if isinstance(x, dict):
        return {k: on(device, v) for k, v in x.items()}
    return x


def compile_op(program: CapturedProgram, k: int, zeroed: frozenset[int], device: torch.device) -> CompiledOp:
    op = program.ops[k]
    args, kwargs = on(device, tuple(op.args)), on(device, dict(op.kwargs))
    return CompiledOp(
        kernel=k, func=resolve(op.func), record=op, flat=_is_flat(op), args=args,
        arg_refs=tuple((i, a) for i, a in enumerate(args) if isinstance(a, TensorRef)),
        kwargs=kwargs, kw_refs=tuple((n, a) for n, a in kwargs.items() if isinstance(a, TensorRef)),
        outputs=tuple(r.buffer for r in op.outputs),
        zeroed=tuple((b, program.nbytes(b)) for b in sorted(program.needs(k) & zeroed)), device=device)


def compile_program(program: CapturedProgram, kernels: tuple[int, ...] | range, device: torch.device) -> list[CompiledOp]:
    zeroed = program.zeroed()
    return [compile_op(program, k, zeroed, device) for k in kernels]


def bind_weights(ops: list[CompiledOp], weights: Storages) -> list[CompiledOp]:
    """The ops with views of ``weights`` (buffer -> storage, stable across steps) built in."""
    out = []
    for c in ops:
        assert all(weights[r.buffer].device == c.device for _, r in (*c.arg_refs, *c.kw_refs) if r.buffer in weights), (
            f"kernel {c.kernel}: weights not on {c.device}")
        if not c.flat or not any(r.buffer in weights for _, r in (*c.arg_refs, *c.kw_refs)):
            out.append(c)
            continue
        args, kwargs = list(c.args), dict(c.kwargs)
        for i, r in c.arg_refs:
            if r.buffer in weights:
                args[i] = view_of(weights, r)
        for n, r in c.kw_refs:
            if r.buffer in weights:
                kwargs[n] = view_of(weights, r)
        out.append(CompiledOp(
            kernel=c.kernel, func=c.func, record=c.record, flat=True, args=tuple(args),
            arg_refs=tuple((i, r) for i, r in c.arg_refs if r.buffer not in weights), kwargs=kwargs,
            kw_refs=tuple((n, r) for n, r in c.kw_refs if r.buffer not in weights), outputs=c.outputs,
            zeroed=c.zeroed, device=c.device))
    return out


def call(store: Storages, c: CompiledOp) -> None:
    """``run_op`` for a compiled op: same operator, same argument views, so bit-identical results."""
    for b, nbytes in c.zeroed:
        if b not in store:
            store[b] = zero_storage(nbytes, c.device)
    if c.flat:
        dev, args = c.device, list(c.args)
        for i, r in c.arg_refs:
            args[i] = torch.empty(0, dtype=r.dtype, device=dev).set_(store[r.buffer], r.storage_offset, r.size, r.stride)
        kwargs = c.kwargs
        if c.kw_refs:
            kwargs = dict(kwargs)
            for n, r in c.kw_refs:
                kwargs[n] = torch.empty(0, dtype=r.dtype, device=dev).set_(store[r.buffer], r.storage_offset, r.size,
                                                                          r.stride)
        out = c.func(*args, **kwargs)
    else:
        out = c.func(*materialise(store, c.args), **materialise(store, c.kwargs))
    if not c.outputs:
        return
    if isinstance(out, torch.Tensor):
        store.setdefault(c.outputs[0], out.untyped_storage())
        return
    flat = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    assert len(flat) == len(c.outputs), f"{c.record.func}: {len(flat)} outputs, recorded {len(c.outputs)}"
    for t, b in zip(flat, c.outputs, strict=True):
        store.setdefault(b, t.untyped_storage())


__all__ = ["CompiledOp", "bind_weights", "call", "compile_op", "compile_program", "on"]
