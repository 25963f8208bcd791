"""ATen-level recorder: one Kernel per operator that launches work, buffers by storage identity.

The same recorder serves fake tensors (any size, no memory: the KernelGraph) and real CPU tensors (tiny
models: additionally a replayable program), so both modes see the same operator sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tessera.capture.classify import dims_of, flops_of, kernel_dtype, kind_of
from tessera.contracts.enums import Phase
from tessera.graph import Buffer, Kernel, KernelKind, Role

# Allocate without touching memory: their outputs are buffers, not kernels.
_ALLOC = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


@dataclass(frozen=True)
class TensorRef:
    """A tensor argument rebuilt at replay as a view of its buffer's storage (sizes/strides in elements)."""

    buffer: int
    dtype: torch.dtype
    size: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int


@dataclass(frozen=True)
class OpRecord:
    """One kernel's operator call: ``func`` is the qualified overload name, e.g. ``aten.mm.default``."""

    func: str
    args: tuple[Any, ...]  # TensorRef where a tensor was passed, constants otherwise
    kwargs: dict[str, Any]
    outputs: tuple[TensorRef, ...]  # flattened tensor outputs, in pytree order


@dataclass(frozen=True, kw_only=True)
class BufferAccess:
    """Bytes one kernel reads from / writes to each buffer it touches (buffer id -> bytes); they sum to
    the kernel's bytes_read / bytes_written."""

    reads: dict[int, int]
    writes: dict[int, int]

    def __post_init__(self) -> None:
        bad = {b: n for b, n in (*self.reads.items(), *self.writes.items()) if n < 0}
        if bad:
            raise ValueError(f"negative bytes per buffer: {bad}")


@dataclass
class _Buf:
    name: str
    nbytes: int
    role: Role
    dtype: str
    shape: tuple[int, ...]


def _spanned_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches through this view: broadcast (stride-0) dims count once."""
    n = math.prod(int(s) for s, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    return int(n) * t.element_size()


@dataclass
class Recorder(TorchDispatchMode):
    """Record kernels; ``module_info`` maps id(module) -> (path, layer) for the module stack."""

    phase: str
    module_info: dict[int, tuple[str, int | None]]
    keep_program: bool = False
    buffers: list[_Buf] = field(default_factory=list)
    kernels: list[Kernel] = field(default_factory=list)
    program: list[OpRecord] = field(default_factory=list)
    initial: dict[int, torch.Tensor] = field(default_factory=dict)  # real mode: starting bytes (uint8)
    stack: list[tuple[str, int | None]] = field(default_factory=list)
    access: list[BufferAccess] = field(default_factory=list)  # kernel i's bytes per buffer (for fusion)
    # the operator being run, (name, [(argument, declared written, tensors)]), while its implementation may
    # launch Triton kernels (tessera.capture.triton_launch checks its schema against their PTX)
    enclosing: tuple[str, list[tuple[str, bool, list[torch.Tensor]]]] | None = None
    findings: list[str] = field(default_factory=list)  # schema/PTX disagreements found while recording
    # runs an operator as run_op(func, args, kwargs) while recording; None: func(*args, **kwargs)
    # (tessera.capture.triton_launch sets it so a custom op under fake tensors makes its Triton launches)
    run_op: Any = None
    _ids: dict[StorageWeakRef, int] = field(default_factory=dict)
    _alive: list[torch.Tensor] = field(default_factory=list)  # storage identities must not be reused

    def __post_init__(self) -> None:
        super().__init__()

    # ---- buffers -----------------------------------------------------------------------

    def register(self, t: torch.Tensor, role: Role, name: str) -> int:
        """Declare a step buffer (weight, kv, state, input) before recording; first name wins."""
        key = StorageWeakRef(t.untyped_storage())
        if key in self._ids:
            return self._ids[key]
        return self._new(t, role, name, snapshot=True)

    def set_role(self, t: torch.Tensor, role: Role) -> None:
        self.buffers[self.buffer_of(t)].role = role

    def buffer_of(self, t: torch.Tensor) -> int:
        key = StorageWeakRef(t.untyped_storage())
        bid = self._ids.get(key)
        if bid is None:  # a tensor made outside the step (a constant): it arrives like an input
            bid = self._new(t, Role.INPUT, f"const{len(self.buffers)}", snapshot=True)
        return bid

    def _new(self, t: torch.Tensor, role: Role, name: str, *, snapshot: bool) -> int:
        bid = len(self.buffers)
        st = t.untyped_storage()
        self._ids[StorageWeakRef(st)] = bid
        self._alive.append(t)
        dtype = str(t.dtype).removeprefix("torch.")
        self.buffers.append(_Buf(name, int(st.nbytes()), role, dtype, tuple(int(s) for s in t.shape)))
        if snapshot and self.keep_program:
            self.initial[bid] = torch.empty(0, dtype=torch.uint8).set_(st.clone())
        return bid

    def knows(self, t: torch.Tensor) -> bool:
        return StorageWeakRef(t.untyped_storage()) in self._ids

    def add_kernel(self, kernel: Kernel, access: BufferAccess, op: OpRecord | None,
                   keep: list[torch.Tensor]) -> None:
        """Append a kernel recorded outside ATen dispatch (a Triton launch), its program record in real mode."""
        assert kernel.id == len(self.kernels), f"kernel id {kernel.id} is not position {len(self.kernels)}"
        self.kernels.append(kernel)
        self.access.append(access)
        if op is not None and self.keep_program:
            self.program.append(op)
        self._alive.extend(keep)

    def replicate(self, kernels: range, first_buffer: int, weights: dict[int, int],
                  rename: tuple[str, str]) -> None:
        """Append a copy of the kernels ``kernels`` (recorded last-but-some, in fake mode only) as another
        instance of the same computation: weight buffer ``w`` becomes ``weights[w]``, each buffer the range
        created (ids >= ``first_buffer``) a fresh buffer of the same size, and module paths ending in
        ``rename[0]`` end in ``rename[1]`` instead. Every other buffer (the shared input, the output added
        into, the routing indices) is touched as in the original."""
        assert not self.keep_program, "replicated kernels have no program: fake mode only"
        fresh: dict[int, int] = {}
        for k in kernels:
            for b in (*self.kernels[k].reads, *self.kernels[k].writes):
                if b >= first_buffer and b not in fresh:
                    old = self.buffers[b]
                    fresh[b] = len(self.buffers)
                    self.buffers.append(_Buf(f"{old.name}@{rename[1]}", old.nbytes, old.role, old.dtype, old.shape))
        remap = {**weights, **fresh}
        for k in kernels:
            src, acc = self.kernels[k], self.access[k]
            module = src.module[: -len(rename[0])] + rename[1] if src.module.endswith(rename[0]) else src.module
            self.kernels.append(replace(
                src, id=len(self.kernels), reads=tuple(remap.get(b, b) for b in src.reads),
                writes=tuple(remap.get(b, b) for b in src.writes), module=module))
            self.access.append(BufferAccess(reads={remap.get(b, b): n for b, n in acc.reads.items()},
                                      writes={remap.get(b, b): n for b, n in acc.writes.items()}))

    def ref(self, t: torch.Tensor) -> TensorRef:
        return TensorRef(self.buffer_of(t), t.dtype, tuple(t.shape), tuple(t.stride()), int(t.storage_offset()))

    def graph_buffers(self) -> tuple[Buffer, ...]:
        return tuple(Buffer(id=i, name=b.name, bytes=b.nbytes, role=b.role, dtype=b.dtype, shape=b.shape)
                     for i, b in enumerate(self.buffers))

    # ---- module stack (global forward hooks call these) ---------------------------------

    def push(self, module: torch.nn.Module) -> None:
        info = self.module_info.get(id(module))
        if info is not None:
            self.stack.append(info)

    def pop(self, module: torch.nn.Module) -> None:
        if id(module) in self.module_info and self.stack:
            self.stack.pop()

    # ---- dispatch ----------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        reads: list[torch.Tensor] = []
        writes: list[torch.Tensor] = []
        declared: list[tuple[str, bool, list[torch.Tensor]]] = []
        schema = func._schema
        for i, a in enumerate(schema.arguments):
            val = args[i] if i < len(args) and not a.kwarg_only else kwargs.get(a.name)
            tensors = [t for t in tree_flatten(val)[0] if isinstance(t, torch.Tensor)]
            written = a.alias_info is not None and a.alias_info.is_write
            declared.append((a.name, written, tensors))
            if written:
                writes += tensors
            # out= is write-only, and so is copy_'s destination (it overwrites what it covers: a slice of a
            # fresh buffer, as MLA builds its keys); any other in-place self is read and written
            if not (written and (a.kwarg_only or func.overloadpacket.__name__ == "copy_")):
                reads += tensors
        for t in reads + writes:
            self.buffer_of(t)  # first sight before the op runs: a constant's starting contents
        arg_refs = self._refs((args, kwargs)) if self.keep_program else None
        before = len(self.kernels)
        self.enclosing = (str(func), declared)
        try:
            out = func(*args, **kwargs) if self.run_op is None else self.run_op(func, args, kwargs)
        finally:
            self.enclosing = None
        launched = len(self.kernels) > before
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        fresh = [t for t in outs if StorageWeakRef(t.untyped_storage()) not in self._ids]
        name = str(func)
        if launched:
            writes = []  # the Triton kernels it launched are its kernels, with their PTX reads/writes
        if not writes and not fresh:
            return out  # a view or metadata op: its outputs alias an existing buffer
        for t in fresh:
            self._new(t, Role.ACTIVATION, f"{name}#{len(self.kernels)}", snapshot=False)
        if func.overloadpacket.__name__ in _ALLOC or launched:
            self._alive.extend(outs)
            return out
        self._kernel(func, args, kwargs, out, reads, writes, outs, fresh)
        if arg_refs is not None:
            a_refs, k_refs = arg_refs
            self.program.append(OpRecord(name, a_refs, k_refs, tuple(self.ref(t) for t in outs)))
        self._alive.extend(outs)
        return out

    def _refs(self, tree: Any) -> Any:
        if isinstance(tree, torch.Tensor):
            return self.ref(tree)
        if isinstance(tree, tuple | list):
            return type(tree)(self._refs(x) for x in tree)
        if isinstance(tree, dict):
            return {k: self._refs(v) for k, v in tree.items()}
        return tree

    def _kernel(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any,
                reads: list[torch.Tensor], writes: list[torch.Tensor], outs: list[torch.Tensor],
                fresh: list[torch.Tensor]) -> None:
        kind, indirect = kind_of(func)
        dims = dims_of(kind, func, args, outs)
        if kind is KernelKind.ATTENTION and (dims["q_len"] == 1 or self.phase == Phase.DECODE):
            kind = KernelKind.ATTENTION_DECODE
            if dims["q_len"] > 1 and dims["heads"] == dims["kv_heads"]:
                # transformers packs the query heads of one KV head into q_len for a 1-token step
                # (pack_gqa): report the logical shape, heads = kv_heads · group, q_len = 1
                dims = {**dims, "heads": dims["heads"] * dims["q_len"], "q_len": 1}
        written_ids = [self.buffer_of(t) for t in writes + outs]
        rb, wb = self._access(reads, writes, fresh, indirect)
        self.access.append(BufferAccess(reads=rb, writes=wb))
        path, layer = self.stack[-1] if self.stack else ("", None)
        self.kernels.append(Kernel(
            id=len(self.kernels), name=str(func), kind=kind, flops=flops_of(func, args, kwargs, out),
            bytes_read=sum(rb.values()), bytes_written=sum(wb.values()),
            reads=tuple(dict.fromkeys(self.buffer_of(t) for t in reads)),
            writes=tuple(dict.fromkeys(written_ids)),
            layer=layer, module=path, phase=self.phase,
            dtype=kernel_dtype(func, args, kwargs, outs[0] if outs else writes[0]), dims=dims, indirect=indirect,
        ))

    def _access(self, reads: list[torch.Tensor], writes: list[torch.Tensor], fresh: list[torch.Tensor],
                indirect: bool) -> tuple[dict[int, int], dict[int, int]]:
        """Bytes per buffer read and written (buffer id -> bytes); every touched buffer has an entry."""
        rb: dict[int, int] = {self.buffer_of(t): 0 for t in reads}
        wb: dict[int, int] = {self.buffer_of(t): 0 for t in writes + fresh}
        if indirect and writes:
            # scatter-like in-place writes touch only as many bytes as the source, not the whole target
            for t in reads:
                if not any(t is w for w in writes):
                    rb[self.buffer_of(t)] += _spanned_bytes(t)
            wb[self.buffer_of(writes[0])] += sum(rb.values())
        elif indirect:  # a gather reads the rows it returns and its indices, not the whole table
            for t in fresh:
                wb[self.buffer_of(t)] += _spanned_bytes(t)
            table = next((t for t in reads if t.is_floating_point()), reads[0] if reads else None)
            if table is not None:
                rb[self.buffer_of(table)] += sum(wb.values())
            for t in reads:
                if not t.is_floating_point():
                    rb[self.buffer_of(t)] += _spanned_bytes(t)
        else:  # outputs of in-place / out= ops alias the written arguments: count those once
            for t in reads:
                rb[self.buffer_of(t)] += _spanned_bytes(t)
            for t in writes + fresh:
                wb[self.buffer_of(t)] += _spanned_bytes(t)
        return rb, wb
