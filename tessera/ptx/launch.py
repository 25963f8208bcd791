"""Launch log + allocation table -> KernelGraph (format: docs/ptx.md).

Buffers are the allocations; a parameter value resolves to the allocation whose [base, base + bytes)
range holds it, so interior pointers (a view, a row of a cache) resolve too. Each launch becomes one
Kernel whose reads/writes come from the analysis of its entry: read -> reads, written -> writes,
read-write and atomic -> both. An indirect kernel already has every pointer parameter widened to
read-write by the analysis; with ``indirect_scope="all"`` it reads and writes every allocation, for
programs whose pointer tables point outside the launch's own arguments.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.errors import UserError, choices_error, read_text
from tessera.graph.ir import Buffer, Kernel, KernelGraph, KernelKind, Role, build_graph
from tessera.ptx.analysis import EntryAccess, analyze_ptx

INDIRECT_SCOPES = ("params", "all")


@dataclass(frozen=True, kw_only=True)
class Allocation:
    name: str
    base: int
    bytes: int
    role: Role
    dtype: str = "bfloat16"

    def __post_init__(self) -> None:
        if self.base <= 0 or self.bytes <= 0:
            raise UserError(f"allocation {self.name!r}: base={self.base} and bytes={self.bytes} must be > 0")


def _int(v: Any, what: str) -> int:
    if isinstance(v, bool):
        raise UserError(f"{what}: expected an integer, got {v!r}")
    if isinstance(v, int):
        return v
    if isinstance(v, str):
        try:
            return int(v, 0)
        except ValueError:
            pass
    raise UserError(f"{what}: expected an integer or a hex string, got {v!r}")


def load_allocations(path: str | Path) -> list[Allocation]:
    """Read an allocation table: {"allocations": [{"name", "base", "bytes", "role", "dtype"?}]}."""
    text = read_text(path, "allocation table")
    try:
        doc = json.loads(text)
        rows = doc["allocations"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise UserError(f"cannot read allocation table {path}: {e}") from None
    out = []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or not {"name", "base", "bytes", "role"} <= r.keys():
            raise UserError(f"{path}: allocation {i} needs name, base, bytes and role")
        if r["role"] not in [x.value for x in Role]:
            raise choices_error("buffer role", str(r["role"]), [x.value for x in Role])
        out.append(Allocation(name=str(r["name"]), base=_int(r["base"], f"allocation {r['name']} base"),
                              bytes=_int(r["bytes"], f"allocation {r['name']} bytes"), role=Role(r["role"]),
                              dtype=str(r.get("dtype", "bfloat16"))))
    out.sort(key=lambda a: a.base)
    for a, b in zip(out, out[1:], strict=False):
        if a.base + a.bytes > b.base:
            raise UserError(f"{path}: allocations {a.name!r} and {b.name!r} overlap")
    return out


class _Resolver:
    def __init__(self, allocs: list[Allocation]) -> None:
        self.allocs = allocs
        self.bases = [a.base for a in allocs]

    def __call__(self, ptr: int) -> int | None:
        """Index of the allocation holding ``ptr`` (interior pointers included), or None."""
        i = bisect.bisect_right(self.bases, ptr) - 1
        if i >= 0 and ptr < self.allocs[i].base + self.allocs[i].bytes:
            return i
        return None


def _words(v: Any, what: str) -> list[int]:
    """A parameter's value as integers: a scalar, or the 8-byte words of a struct passed by value."""
    if isinstance(v, list):
        return [_int(x, what) for x in v]
    if isinstance(v, float):
        return []  # a float scalar is never a pointer
    return [_int(v, what)]


def build_from_log(log_path: str | Path, alloc_path: str | Path, *, indirect_scope: str = "params",
                   model: str = "ptx") -> KernelGraph:
    """KernelGraph of a JSON-lines launch log; modules are resolved relative to the log's folder."""
    if indirect_scope not in INDIRECT_SCOPES:
        raise choices_error("indirect scope", indirect_scope, INDIRECT_SCOPES)
    allocs = load_allocations(alloc_path)
    resolve = _Resolver(allocs)
    log_path = Path(log_path)
    modules: dict[Path, dict[str, EntryAccess]] = {}
    kernels: list[Kernel] = []
    unresolved_all: list[str] = []  # "kernel id:name:params" whose accessed pointers hit no allocation
    for lineno, raw in enumerate(read_text(log_path, "launch log").splitlines(), 1):
        if not raw.strip():
            continue
        where = f"{log_path}:{lineno}"
        try:
            rec = json.loads(raw)
        except json.JSONDecodeError as e:
            raise UserError(f"{where}: not JSON ({e.msg})") from None
        if not isinstance(rec, dict) or not {"kernel", "module", "args"} <= rec.keys():
            raise UserError(f"{where}: a launch needs kernel, module and args")
        mod_path = (log_path.parent / str(rec["module"])).resolve()
        if mod_path not in modules:
            modules[mod_path] = analyze_ptx(read_text(mod_path, f"PTX module of {where}"), str(mod_path))
        entries = modules[mod_path]
        entry = entries.get(str(rec["kernel"]))
        if entry is None:
            raise choices_error(f"kernel in {rec['module']}", str(rec["kernel"]), list(entries))
        args = rec["args"]
        if not isinstance(args, list) or len(args) != len(entry.params):
            raise UserError(f"{where}: {entry.name} takes {len(entry.params)} arguments, "
                            f"the log gives {len(args) if isinstance(args, list) else args!r}")
        reads: dict[int, None] = {}
        writes: dict[int, None] = {}
        unresolved: list[str] = []
        for p, v in zip(entry.params, args, strict=True):
            if p.access.value == "untouched":
                continue
            hits = [b for w in _words(v, f"{where} {p.name}") if (b := resolve(w)) is not None]
            if not hits:
                unresolved.append(p.name)
            for b in hits:
                if p.access.reads:
                    reads[b] = None
                if p.access.writes:
                    writes[b] = None
        if entry.indirect and indirect_scope == "all":
            for b in range(len(allocs)):
                reads[b] = writes[b] = None
        if unresolved:
            unresolved_all.append(f"{len(kernels)}:{entry.name}:{','.join(unresolved)}")
        kind = str(rec.get("kind", "other"))
        if kind not in [k.value for k in KernelKind]:
            raise choices_error(f"{where}: kernel kind", kind, [k.value for k in KernelKind])
        grid, block = rec.get("grid", [1, 1, 1]), rec.get("block", [1, 1, 1])
        kernels.append(Kernel(
            id=len(kernels), name=entry.name, kind=KernelKind(kind),
            flops=int(rec.get("flops", 0)),
            bytes_read=sum(allocs[b].bytes for b in reads), bytes_written=sum(allocs[b].bytes for b in writes),
            reads=tuple(reads), writes=tuple(writes), layer=rec.get("layer"), module=str(rec["module"]),
            phase=str(rec.get("phase", "")), indirect=entry.indirect,
            dims={"grid": _prod(grid), "block": _prod(block)},
        ))
    buffers = [Buffer(id=i, name=a.name, bytes=a.bytes, role=a.role, dtype=a.dtype) for i, a in enumerate(allocs)]
    return build_graph(model=model, phase="ptx", shape={}, kernels=kernels, buffers=buffers,
                       meta={"source": str(log_path), "indirect_scope": indirect_scope,
                             "unresolved": unresolved_all})


def _prod(xs: Any) -> int:
    out = 1
    for x in xs if isinstance(xs, list) else [xs]:
        out *= _int(x, "grid/block")
    return out
