"""Access stage: which pointer parameters each entry reads, writes or updates atomically.

A may-analysis over bit sets (Python ints). Every register, symbol and parameter slot holds the set of
things its value may derive from: bit ``P + i`` = the value of entry parameter i, ``A + i`` = the address
of parameter i (tensor maps, structs read through their address), plus flags. Values only grow, so a
flow-insensitive fixpoint over all instructions (branches and loops included) is sound. Multiplicative
operations (mul, shl, div, ...) turn a value into an offset: the result drops its pointer bits, so
``base + idx * 4`` is attributed to ``base`` alone. Calls are analysed in the callee with the actual
arguments' bit sets (context-sensitive, memoised), so accesses in ``.func``s count against the entry.

An address whose base may be a pointer loaded from memory (any 64-bit load from global/const memory),
or that no parameter reaches, is *wild*: every pointer parameter becomes read-write and the kernel
``indirect``. An address produced by an operation the analysis does not model makes the parameters
it derives from read-write (and the kernel indirect). A data-dependent offset from a known base
(gather/scatter, a paged-KV block table of indices) stays inside that base's allocation (CUDA's
in-bounds rule), so it keeps its precise class and is only flagged ``data_dependent``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from tessera.errors import read_text
from tessera.ptx import fast
from tessera.ptx.dataflow import evaluate, prepare
from tessera.ptx.lower import (
    ACC_A,
    ACC_R,
    ACC_W,
    CONST,
    DATA,
    GSYM0,
    LOCAL,
    TENSOR,
    UNMOD,
    WILD,
    LoweredFunction,
    lower_function,
)
from tessera.ptx.parser import Function, Module, Param, make, parse_ptx

# whether analyze_module uses the accelerated path (fast.py) where it is built; reference_path() clears it
_use_fast = [True]


class Access(StrEnum):
    UNTOUCHED = "untouched"
    READ = "read"
    WRITTEN = "written"
    READ_WRITE = "read-write"
    ATOMIC = "atomic"

    @property
    def reads(self) -> bool:
        return self in (Access.READ, Access.READ_WRITE, Access.ATOMIC)

    @property
    def writes(self) -> bool:
        return self in (Access.WRITTEN, Access.READ_WRITE, Access.ATOMIC)


@dataclass(frozen=True, kw_only=True)
class ParamAccess:
    name: str
    type: str
    access: Access
    reads: int = 0  # memory instructions that read through this parameter
    writes: int = 0
    atomics: int = 0
    conservative: int = 0  # wild/unmodelled accesses that widened it to read-write
    data_dependent: bool = False  # some address adds a value loaded from memory (gather/scatter)


@dataclass(frozen=True, kw_only=True)
class EntryAccess:
    name: str
    params: tuple[ParamAccess, ...]
    indirect: bool
    reasons: tuple[str, ...] = ()  # why indirect, e.g. "line 812: ld.global.f32 through a loaded pointer"
    globals: dict[str, Access] = field(default_factory=dict)  # module-scope .global variables touched

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name, "indirect": self.indirect, "reasons": list(self.reasons),
            "globals": {k: str(v) for k, v in self.globals.items()},
            "params": [{"name": p.name, "type": p.type, "access": str(p.access), "reads": p.reads,
                        "writes": p.writes, "atomics": p.atomics, "conservative": p.conservative,
                        "data_dependent": p.data_dependent} for p in self.params],
        }


# access class of an OR of ACC_R (1), ACC_W (2), ACC_A (4): an index instead of a chain of tests
_CLASS = (Access.UNTOUCHED, Access.READ, Access.WRITTEN, Access.READ_WRITE, Access.ATOMIC, Access.READ_WRITE,
          Access.READ_WRITE, Access.READ_WRITE)


def _classify(flags: int) -> Access:
    return _CLASS[flags]


class _EntryContext:
    """Evaluates one entry and the functions it calls, memoising callees by their argument bit sets."""

    def __init__(self, module: Module, compiled: dict[str, LoweredFunction], entry: Function,
                 accelerated: bool) -> None:
        self.module = module
        self.first_pass = fast.first_pass if accelerated else None
        self.compiled = compiled
        self.n = len(entry.params)
        self.p0 = GSYM0 + len(module.globals)
        self.memo: dict[tuple[str, tuple[int, ...], int], tuple[tuple[int, ...], int]] = {}
        self.active: dict[str, list[object]] = {}  # recursion: name -> [args, mem, ret estimate, mem est, used]
        # results: function -> per access site (index in its LoweredFunction.sites), OR of address bit sets
        self.sites: dict[str, list[int]] = {}
        self.unknown: list[str] = []  # reasons that make everything wild

    def run(self, fn: LoweredFunction, args: tuple[int, ...], mem: int) -> tuple[tuple[int, ...], int]:
        key = (fn.name, args, mem)
        hit = self.memo.get(key)
        if hit is not None:
            return hit
        act = self.active.get(fn.name)
        if act is not None:  # recursion: reuse the running estimate when the arguments are covered
            a_args, a_mem, est_ret, est_mem, _ = act
            if all(x | y == y for x, y in zip(args, a_args, strict=True)) and mem | a_mem == a_mem:
                act[4] = True
                return est_ret, est_mem  # type: ignore[return-value]
            args = tuple(x | y for x, y in zip(args, a_args, strict=True))  # widen and evaluate afresh
            mem |= a_mem
        state: list[object] = [args, mem, tuple(0 for _ in fn.returns), 0, False]
        prev = self.active.get(fn.name)
        self.active[fn.name] = state
        try:
            while True:
                state[4] = False
                ret, mem_out = evaluate(fn, self, args, mem)
                if not state[4] or (ret == state[2] and mem_out == state[3]):
                    break
                state[2] = tuple(a | b for a, b in zip(ret, state[2], strict=True))  # type: ignore[arg-type]
                state[3] = mem_out | state[3]  # type: ignore[operator]
        finally:
            if prev is None:
                del self.active[fn.name]
            else:
                self.active[fn.name] = prev
        self.memo[key] = (ret, mem_out)
        return ret, mem_out


def analyze_module(module: Module) -> dict[str, EntryAccess]:
    """Access classes of every entry's parameters."""
    gindex = {name: i for i, name in enumerate(module.globals)}
    out: dict[str, EntryAccess] = {}
    p0 = GSYM0 + len(gindex)
    compiled: dict[str, LoweredFunction] = {}
    accelerated = fast.ENABLED and _use_fast[0]
    for fn in module.functions.values():
        if not fn.defined:
            continue
        cf = fast.lower_function(module, fn) if accelerated else None
        if cf is None:
            cf = lower_function(module, fn)
        prepare(cf, module.globals)
        compiled[fn.name] = cf
    holds = _HOLDS
    for entry in module.entries:
        if entry.name not in compiled:
            continue
        ctx = _EntryContext(module, compiled, entry, accelerated)
        cf = compiled[entry.name]
        ptrs = []  # _holds_pointer per parameter, inlined: a call per parameter showed up
        init_l = []
        for i, p in enumerate(entry.params):
            ptr = holds.get((p.type, p.count, p.ptr_space))
            if ptr is None:
                ptr = _holds_pointer(p)
            ptrs.append(ptr)
            init_l.append(1 << (p0 + i) if ptr else 0)
        init = tuple(init_l)
        ctx.run(cf, init, 0)
        out[entry.name] = _summarise(module, entry, ctx, gindex, p0, ptrs)
    return out


_HOLDS: dict[tuple[str, int | None, str | None], bool] = {}


def _holds_pointer(p: Param) -> bool:
    """Param.may_hold_pointer, memoised on what it depends on (a property call per parameter showed up)."""
    key = (p.type, p.count, p.ptr_space)
    hit = _HOLDS.get(key)
    if hit is None:
        hit = _HOLDS[key] = p.may_hold_pointer
    return hit


def _summarise(module: Module, entry: Function, ctx: _EntryContext, gindex: dict[str, int], p0: int,
               ptrs: list[bool]) -> EntryAccess:
    n = len(entry.params)
    flags = [0] * n
    reads, writes, atomics, conservative = [0] * n, [0] * n, [0] * n, [0] * n
    datadep = [False] * n
    gflags: dict[str, int] = {}
    reasons: list[str] = list(ctx.unknown)
    pmask = (1 << n) - 1
    a0 = p0 + n
    nonparam_space = LOCAL | CONST | ((1 << p0) - (1 << GSYM0))
    wild_any = bool(ctx.unknown)
    gmask = nonparam_space & ~(LOCAL | CONST)
    compiled = ctx.compiled
    for fname, addrs in ctx.sites.items():
        for (kind, line, op), addr in zip(compiled[fname].sites, addrs, strict=True):
            if kind & TENSOR:  # a tensor map passed by value is read through the parameter's address
                bits = (addr >> a0) & pmask
                wild = bool(addr & WILD or (addr >> p0) & pmask or not bits)
                kind &= ACC_R | ACC_W | ACC_A
            else:
                bits = (addr >> p0) & pmask
                wild = bool(addr & WILD) or not (bits or addr & nonparam_space or (addr >> a0) & pmask)
            if addr & gmask:
                for g, j in gindex.items():
                    if addr >> (GSYM0 + j) & 1:
                        gflags[g] = gflags.get(g, 0) | kind
            if wild:
                wild_any = True
                reasons.append(f"line {line}: {op} through an address loaded from memory or unknown")
                continue
            if not bits:
                if addr & UNMOD:
                    reasons.append(f"line {line}: {op} through an address from an unmodelled operation")
                continue
            if addr & UNMOD:
                reasons.append(f"line {line}: {op} through an address from an unmodelled operation")
                kind = ACC_R | ACC_W
                count = conservative
            else:
                count = reads if kind == ACC_R else writes if kind == ACC_W else atomics if kind == ACC_A else None
            dd = addr & DATA
            while bits:  # each parameter the address derives from, lowest first
                low = bits & -bits
                i = low.bit_length() - 1
                flags[i] |= kind
                if count is not None:
                    count[i] += 1
                if dd:
                    datadep[i] = True
                bits ^= low
    if wild_any:
        for i, ptr in enumerate(ptrs):
            if ptr:
                flags[i] |= ACC_R | ACC_W
                conservative[i] += 1
    cls = _CLASS
    params = [make(ParamAccess, {"name": p.name, "type": p.type, "access": cls[flags[i]], "reads": reads[i],
                                 "writes": writes[i], "atomics": atomics[i], "conservative": conservative[i],
                                 "data_dependent": datadep[i]})
              for i, p in enumerate(entry.params)]
    return make(EntryAccess, {"name": entry.name, "params": tuple(params), "indirect": bool(reasons),
                              "reasons": tuple(dict.fromkeys(reasons)),
                              "globals": {g: cls[f] for g, f in gflags.items()}})


def analyze_ptx(text: str, source: str = "<string>") -> dict[str, EntryAccess]:
    """Parse and analyse PTX text; raises PtxSyntaxError (a ValueError) on malformed input."""
    return analyze_module(parse_ptx(text, source, read_bodies=False))


def analyze_ptx_file(path: Path) -> dict[str, EntryAccess]:
    """``analyze_ptx`` of the PTX module at ``path`` (`tessera ptx analyze`); a file that cannot be read is
    one UserError naming it."""
    return analyze_ptx(read_text(path, "PTX module"), str(path))


@contextmanager
def reference_path() -> Iterator[None]:
    """Analyse through the pure-Python reference path for the duration (the accelerated path off): the
    one switch between the two paths; the differential test and the benchmark use it."""
    saved = _use_fast[0]
    _use_fast[0] = False
    try:
        yield
    finally:
        _use_fast[0] = saved


def accelerated() -> bool:
    """Whether analyze_ptx takes the accelerated path (the C module built, TESSERA_PTX_NATIVE not 0)."""
    return fast.ENABLED and _use_fast[0]
