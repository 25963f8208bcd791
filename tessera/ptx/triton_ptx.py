"""PTX of one Triton kernel specialisation, compiled once and cached, and its parameters' access classes.

Triton compiles for a GPU target it does not need to see: ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", arch, 32))`` runs the whole pipeline down to PTX on a CPU-only machine. A
*specialisation* is what Triton itself keys a compilation on: the kernel's source, each argument's type
(``*bf16``, ``i32``, ``fp32`` or ``constexpr``), the constexpr values, the 16-byte divisibility attributes,
``num_warps`` and the architecture. Its PTX is cached in memory and on disk under the SHA-256 of those
(``TESSERA_PTX_CACHE``, default ``~/.cache/tessera/ptx``), so a 32-layer model compiles each distinct
kernel once.

Triton's PTX entry takes the non-constexpr arguments in order, then scratch pointers of its own; an
argument that is a ``constexpr`` (declared so, or specialised, as an integer 1 is) has no parameter.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tessera.errors import choices_error
from tessera.ptx.analysis import Access, EntryAccess, analyze_ptx

ARCHES = (80, 90)  # sm_80 (A100) and sm_90 (H100, the default)
DEFAULT_ARCH = 90


@dataclass(frozen=True, kw_only=True)
class Specialisation:
    """One compilation of a Triton kernel: ``types[i]`` and ``values`` follow the kernel's parameters."""

    kernel: str  # module.qualname of the @triton.jit function
    params: tuple[str, ...]  # parameter names, declaration order
    types: tuple[str, ...]  # "*bf16", "i32", "fp32", "u1", "constexpr"
    constexprs: tuple[tuple[int, Any], ...]  # (parameter index, value) of every constexpr parameter
    aligned: tuple[int, ...]  # parameter indices known 16-byte divisible (Triton's "D" attribute)
    num_warps: int = 4
    arch: int = DEFAULT_ARCH

    def __post_init__(self) -> None:
        if len(self.types) != len(self.params):
            raise ValueError(f"{self.kernel}: {len(self.types)} types for {len(self.params)} parameters")
        if self.arch not in ARCHES:
            raise ValueError(f"{self.kernel}: arch sm_{self.arch} not in {[f'sm_{a}' for a in ARCHES]}")

    def key(self, source_hash: str) -> str:
        """Content hash: the kernel's source hash plus everything Triton specialises on."""
        blob = json.dumps([source_hash, self.kernel, self.types, [[i, repr(v)] for i, v in self.constexprs],
                           self.aligned, self.num_warps, self.arch])
        return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class KernelAccess:
    """The analyser's verdict on one specialisation, by kernel parameter name (pointer parameters only)."""

    entry: str
    access: dict[str, Access]
    indirect: bool
    ptx_bytes: int


def target_arch() -> int:
    """The architecture captured Triton kernels compile for: ``TESSERA_PTX_ARCH`` (80 or 90), default 90."""
    raw = os.environ.get("TESSERA_PTX_ARCH", str(DEFAULT_ARCH)).removeprefix("sm_")
    if raw not in {str(a) for a in ARCHES}:
        raise choices_error("TESSERA_PTX_ARCH", raw, [str(a) for a in ARCHES])
    return int(raw)


def clear_memory_cache() -> None:
    """Forget compiled PTX held in memory (the disk cache stays)."""
    _MEMORY.clear()


def cache_dir() -> Path:
    return Path(os.environ.get("TESSERA_PTX_CACHE", Path.home() / ".cache" / "tessera" / "ptx"))


_MEMORY: dict[str, str] = {}
COMPILES = {"count": 0}  # compilations actually run in this process (cache misses of both caches)


def compile_ptx(fn: Any, spec: Specialisation) -> str:
    """PTX text of ``spec`` for the JITFunction ``fn`` (memory cache, then disk cache, then Triton)."""
    key = spec.key(fn.cache_key)
    if key in _MEMORY:
        return _MEMORY[key]
    path = cache_dir() / f"{key}.ptx"
    if path.is_file():
        text = path.read_text()
    else:
        text = _triton_compile(fn, spec)
        COMPILES["count"] += 1
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)  # atomic: concurrent captures never read half a file
    _MEMORY[key] = text
    return text


def _triton_compile(fn: Any, spec: Specialisation) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # Triton 3.9 warns when this is unset; 1 is its current default (fused multiply-add allowed)
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    backend = _backend(spec.arch)
    signature = dict(zip(spec.params, spec.types, strict=True))
    src = ASTSource(fn=fn, signature=signature, constexprs={(i,): v for i, v in spec.constexprs},
                    attrs={(i,): backend.parse_attr("D") for i in spec.aligned})
    compiled = triton.compile(src, target=GPUTarget("cuda", spec.arch, 32), options={"num_warps": spec.num_warps})
    return compiled.asm["ptx"]


@cache
def _backend(arch: int) -> Any:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend

    return CUDABackend(GPUTarget("cuda", arch, 32))


def kernel_access(fn: Any, spec: Specialisation) -> KernelAccess:
    """Compile (or fetch) ``spec``'s PTX and map each pointer parameter's access class back to its name."""
    text = compile_ptx(fn, spec)
    return _access_of(text, spec)


@cache
def _access_of_cached(text: str, params: tuple[str, ...], types: tuple[str, ...]) -> KernelAccess:
    runtime = [i for i, t in enumerate(types) if t != "constexpr"]
    entries = analyze_ptx(text, "triton")
    if len(entries) != 1:
        raise ValueError(f"expected one PTX entry from a Triton kernel, got {sorted(entries)}")
    entry: EntryAccess = next(iter(entries.values()))
    if len(entry.params) < len(runtime):
        raise ValueError(f"{entry.name}: {len(entry.params)} PTX parameters for {len(runtime)} arguments")
    access = {params[i]: p.access for i, p in zip(runtime, entry.params, strict=False) if types[i].startswith("*")}
    return KernelAccess(entry=entry.name, access=access, indirect=entry.indirect, ptx_bytes=len(text))


def _access_of(text: str, spec: Specialisation) -> KernelAccess:
    return _access_of_cached(text, spec.params, spec.types)
