"""Triton launches inside a traced step: recorded as kernels whose reads and writes come from their PTX.

While ``capturing(recorder)`` is active, every ``JITFunction`` launch (``kernel[grid](...)``, from an autograd
Function, a ``torch.library`` custom op or plain Python) is bound to the kernel's parameters and recorded
instead of launched: tensor arguments become buffers, the rest scalars or constexprs, with the grid. The
launch's specialisation is compiled to PTX once (``tessera.ptx.triton_ptx``, cached by content hash) and
the analyser's access class of each pointer parameter decides which of the launch's buffers the kernel
reads and writes (``Kernel.deps_from = "ptx"``). An indirect kernel (addresses through loaded pointers)
has every pointer parameter read-write over its whole buffer.

When the launch happens inside an operator's implementation (a custom op dispatched through the
recorder), that operator's declared schema is checked against the PTX: an argument the PTX writes but
the schema declares read-only is reported (``Recorder.findings``) and the kernel keeps the write.

With real tensors (a tiny model's replayable capture) the launch also runs, through the kernel's PyTorch
reference when one is registered (``tessera.capture.triton_refs``), else through Triton's interpreter;
replay runs the same callable (``launcher``), so every execution of the program agrees bit for bit.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from tessera.capture.recorder import BufferAccess, OpRecord, Recorder
from tessera.capture.triton_refs import REFERENCES
from tessera.graph import Kernel, KernelKind, Role
from tessera.ptx.triton_ptx import KernelAccess, Specialisation, kernel_access, target_arch

PREFIX = "triton:"  # kernel and program-record names: "triton:<module>.<qualname>"

# torch dtype -> Triton's pointer element type
_PTR_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.float64: "fp64",
              torch.int8: "i8", torch.uint8: "u8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
              torch.bool: "i1"}

# Kind and FLOPs per element written, by a word in the kernel's name (first match). FLOPs per element:
# RMSNorm square + sum + scale + weight = 4; LayerNorm adds the mean and its subtraction = 7; SwiGLU/GeGLU
# sigmoid (exp, add, divide) + two multiplies = 5; rotary two multiplies + one add = 3; anything else 1.
_BY_NAME = (
    ("rms_norm", KernelKind.NORM, 4), ("layer_norm", KernelKind.NORM, 7), ("norm", KernelKind.NORM, 4),
    ("softmax", KernelKind.NORM, 5), ("attn", KernelKind.ATTENTION, 0), ("attention", KernelKind.ATTENTION, 0),
    ("matmul", KernelKind.GEMM, 0), ("swiglu", KernelKind.ELEMENTWISE, 5), ("geglu", KernelKind.ELEMENTWISE, 5),
    ("rope", KernelKind.ELEMENTWISE, 3), ("rotary", KernelKind.ELEMENTWISE, 3),
)


@dataclass(frozen=True, kw_only=True)
class BoundLaunch:
    """One bound launch: ``values[i]`` is the argument of the kernel's parameter ``spec.params[i]``."""

    fn: Any  # the JITFunction
    qualname: str
    values: tuple[Any, ...]
    grid: tuple[int, int, int]
    options: dict[str, Any]  # launch options (num_warps, num_stages, ...)
    spec: Specialisation

    def tensors(self) -> dict[str, torch.Tensor]:
        return {n: v for n, v in zip(self.spec.params, self.values, strict=True) if isinstance(v, torch.Tensor)}


def qualname_of(fn: Any) -> str:
    return f"{fn.fn.__module__}.{fn.fn.__qualname__}"


def kind_and_flops_per_element(qualname: str) -> tuple[KernelKind, int]:
    name = qualname.rsplit(".", 1)[-1].lower()
    for word, kind, per in _BY_NAME:
        if word in name:
            return kind, per
    return KernelKind.OTHER, 1


# ---- binding -----------------------------------------------------------------------------------------------


def bind(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], grid: Any,
         arch: int | None = None) -> BoundLaunch:
    """The launch ``fn[grid](*args, **kwargs)`` bound to the kernel's parameters, with its specialisation
    for ``arch`` (default: ``TESSERA_PTX_ARCH``, else sm_90)."""
    names = [p.name for p in fn.params]
    options = {k: v for k, v in kwargs.items() if k not in names}
    bound = fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    values = tuple(bound.arguments[n] for n in names)
    if callable(grid):
        grid = grid(dict(bound.arguments))
    g = tuple(int(x) for x in grid) + (1, 1)
    types, constexprs, aligned = [], [], []
    for i, (p, v) in enumerate(zip(fn.params, values, strict=True)):
        t, aligned_i = _specialise(p, v)
        types.append(t)
        if t == "constexpr":
            constexprs.append((i, v))
        if aligned_i:
            aligned.append(i)
    qualname = qualname_of(fn)
    spec = Specialisation(kernel=qualname, params=tuple(names), types=tuple(types), constexprs=tuple(constexprs),
                          aligned=tuple(aligned), num_warps=int(options.get("num_warps", 4)),
                          arch=arch or target_arch())
    return BoundLaunch(fn=fn, qualname=qualname, values=values, grid=(g[0], g[1], g[2]), options=options,
                       spec=spec)


def _specialise(param: Any, value: Any) -> tuple[str, bool]:
    """Triton's type of one argument and whether it is 16-byte divisible (Triton's rules, CUDA allocator
    alignment assumed for a tensor's storage)."""
    if param.is_constexpr:
        return "constexpr", False
    if isinstance(value, torch.Tensor):
        if value.dtype not in _PTR_TYPES:
            raise ValueError(f"Triton argument {param.name}: dtype {value.dtype} not in {sorted(map(str, _PTR_TYPES))}")
        offset_bytes = int(value.storage_offset()) * value.element_size()
        return "*" + _PTR_TYPES[value.dtype], offset_bytes % 16 == 0 and not param.do_not_specialize_on_alignment
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import native_specialize_impl

    t, attr = native_specialize_impl(BaseBackend, value, False, not param.do_not_specialize,
                                     not param.do_not_specialize_on_alignment)
    return t, attr == "D"


# ---- recording ---------------------------------------------------------------------------------------------


def _spanned_bytes(t: torch.Tensor) -> int:
    n = math.prod(int(s) for s, st in zip(t.shape, t.stride(), strict=True) if st != 0)
    return int(n) * t.element_size()


def record_launch(rec: Recorder, launch: BoundLaunch) -> KernelAccess:
    """Append the launch to ``rec`` as a kernel (reads/writes from its PTX) and, with real tensors, as a
    program record; check the enclosing operator's schema against the PTX."""
    ka = kernel_access(launch.fn, launch.spec)
    tensors = launch.tensors()
    read, written = [], []
    for name, t in tensors.items():
        acc = ka.access.get(name)
        if acc is None:
            continue
        bid = _buffer(rec, t, name, acc.writes and not acc.reads)
        if acc.reads or ka.indirect:
            read.append((bid, t))
        if acc.writes or ka.indirect:
            written.append((bid, t))
    _check_schema(rec, launch, [t for _, t in written])
    rb = {b: _bytes(rec, b, t, ka.indirect) for b, t in read}
    wb = {b: _bytes(rec, b, t, ka.indirect) for b, t in written}
    kind, per_element = kind_and_flops_per_element(launch.qualname)
    numel = max((t.numel() for _, t in written), default=0)
    path, layer = rec.stack[-1] if rec.stack else ("", None)
    dtype = next(iter(tensors.values())).dtype if tensors else torch.float32
    kernel = Kernel(
        id=len(rec.kernels), name=PREFIX + launch.qualname, kind=kind, flops=per_element * numel,
        bytes_read=sum(rb.values()), bytes_written=sum(wb.values()), reads=tuple(rb), writes=tuple(wb),
        layer=layer, module=path, phase=rec.phase, dtype=str(dtype).removeprefix("torch."),
        dims={"numel": int(numel), "programs": math.prod(launch.grid)}, indirect=ka.indirect, deps_from="ptx")
    op = None
    if rec.keep_program:
        args = tuple(rec.ref(v) if isinstance(v, torch.Tensor) else v for v in launch.values)
        op = OpRecord(PREFIX + launch.qualname, args, {"grid": launch.grid, **launch.options}, ())
    rec.add_kernel(kernel, BufferAccess(reads=rb, writes=wb), op, list(tensors.values()))
    return ka


def _buffer(rec: Recorder, t: torch.Tensor, name: str, write_only: bool) -> int:
    """The tensor's buffer; one first seen as a kernel's write-only output is an activation it makes."""
    if write_only and not rec.knows(t):
        return rec.register(t, Role.ACTIVATION, f"{name}#{len(rec.kernels)}")
    return rec.buffer_of(t)


def _bytes(rec: Recorder, bid: int, t: torch.Tensor, indirect: bool) -> int:
    """Bytes moved through a pointer: the tensor view it was given, or the whole buffer when indirect."""
    whole = rec.buffers[bid].nbytes
    return whole if indirect else min(whole, _spanned_bytes(t))


def _check_schema(rec: Recorder, launch: BoundLaunch, written: list[torch.Tensor]) -> None:
    """Report each argument of the enclosing operator its schema calls read-only that the PTX writes."""
    if rec.enclosing is None or not written:
        return
    op, arguments = rec.enclosing
    keys = {StorageWeakRef(t.untyped_storage()) for t in written}
    for arg_name, declared_write, tensors in arguments:
        if not declared_write and any(StorageWeakRef(t.untyped_storage()) in keys for t in tensors):
            rec.findings.append(f"{op}: argument {arg_name!r} is declared read-only but its Triton kernel "
                                f"{launch.qualname.rsplit('.', 1)[-1]} writes it (PTX); the graph keeps the write")


# ---- capture context -----------------------------------------------------------------------------------------


_ACTIVE: list[Recorder] = []


@contextmanager
def capturing(rec: Recorder) -> Iterator[None]:
    """Record Triton launches into ``rec`` instead of launching them (no-op without Triton installed)."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # no Triton: no Triton kernels to capture
        yield
        return
    original, original_run_op = JITFunction.run, rec.run_op
    _ACTIVE.append(rec)
    JITFunction.run = _captured_run
    rec.run_op = run_custom_op
    try:
        yield
    finally:
        _ACTIVE.pop()
        rec.run_op = original_run_op
        JITFunction.run = original if not _ACTIVE else _captured_run


def run_custom_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Runs an operator for the recorder. Under fake tensors a custom op would run its fake (shape-only)
    implementation, which launches nothing; where its CPU implementation is Python (``torch.library``),
    that implementation runs instead, on the fake tensors, so its Triton launches are recorded with their
    PTX (and its schema checked against them) at any model size. An implementation that needs real data
    fails on fake tensors before launching anything, and the fake implementation runs as before."""
    if not _python_cpu_impl_on_fake(func, args, kwargs):
        return func(*args, **kwargs)
    rec = _ACTIVE[-1]
    before = len(rec.kernels)
    try:
        return func._op_dk(torch._C.DispatchKey.CPU, *args, **kwargs)
    except Exception:
        if len(rec.kernels) > before:
            raise
        return func(*args, **kwargs)


def _python_cpu_impl_on_fake(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    ns = getattr(func, "namespace", "aten")
    if ns in ("aten", "prims") or not any(isinstance(t, FakeTensor) for t in tree_flatten((args, kwargs))[0]):
        return False
    name = func._schema.name.split("::")[-1]
    # torch.library's registry of Python implementations, "ns/op/dispatch key": a C++ CPU kernel would
    # read the fake tensors' (absent) data
    return any(f"{ns}/{name}/{key}" in torch.library._impls for key in ("CPU", "CompositeExplicitAutograd"))


@contextmanager
def unrecorded() -> Iterator[None]:
    """Triton launches outside a recorded step (the warm-up run that makes transformers allocate its cache
    tensors): run through their PyTorch reference on real tensors, skipped on fake ones (nothing to compute,
    and no GPU driver to launch on)."""
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        yield
        return
    original = JITFunction.run

    def run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
        launch = bind(self, args, kwargs, grid)
        if not any(isinstance(t, FakeTensor) for t in launch.tensors().values()):
            with _disable_current_modes():
                execute(launch.fn, launch.values, launch.grid, launch.options)

    JITFunction.run = run
    try:
        yield
    finally:
        JITFunction.run = original


def _captured_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> None:
    rec = _ACTIVE[-1]
    launch = bind(self, args, kwargs, grid)
    record_launch(rec, launch)
    if rec.keep_program and not any(isinstance(t, FakeTensor) for t in launch.tensors().values()):
        with _disable_current_modes():  # the reference's ATen ops are this kernel, not kernels of the step
            execute(launch.fn, launch.values, launch.grid, launch.options)


# ---- execution ---------------------------------------------------------------------------------------------------


def load(qualname: str) -> Any:
    """The JITFunction named ``module.qualname``."""
    module, _, name = qualname.rpartition(".")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def execute(fn: Any, values: tuple[Any, ...], grid: tuple[int, int, int], options: dict[str, Any]) -> None:
    """Run one launch of the JITFunction ``fn`` on CPU tensors: its PyTorch reference if registered, else
    Triton's interpreter."""
    names = [p.name for p in fn.params]
    ref = REFERENCES.get(qualname_of(fn))
    if ref is not None:
        ref(**dict(zip(names, values, strict=True)), grid=grid)
        return
    from triton.runtime.interpreter import InterpretedFunction

    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    InterpretedFunction(fn.fn)[grid](**dict(zip(names, values, strict=True)), **options)


@dataclass(frozen=True)
class TritonLauncher:
    """The callable a ``triton:`` program record resolves to (see ``tessera.capture.program.resolve``)."""

    qualname: str
    fn: Any  # the JITFunction, imported when the launcher is made (a worker's set-up, not its first step)

    def __call__(self, *values: Any, grid: tuple[int, int, int], **options: Any) -> None:
        execute(self.fn, values, tuple(grid), options)


def launcher(qualified: str) -> TritonLauncher:
    if not qualified.startswith(PREFIX):
        raise ValueError(f"{qualified!r} is not a Triton launch (no {PREFIX!r} prefix)")
    qualname = qualified.removeprefix(PREFIX)
    return TritonLauncher(qualname, load(qualname))
