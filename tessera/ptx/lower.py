"""Lowering stage: a function's statements to bit-set transfer functions and memory access sites.

Bit layout of a value (a Python int): WILD (may be a pointer of unknown origin), DATA (derives from a
value loaded from memory), UNMOD (passed an operation the analysis does not model), LOCAL (a shared /
local address), CONST (a .const address), then one bit per module .global variable from GSYM0, then
the entry's parameter values from P0 and the entry's parameter addresses from P0 + n_params.

This is the reference lowering, from the parse stage's `Instruction`s; fast.py (the optional C
accelerated path) reads well-formed bodies straight into equivalent transfers and uses this module's
`lower_instruction` for every statement its C scanner does not settle.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tessera.ptx.body import parse_body
from tessera.ptx.parser import Function, Module, make, split_operands

WILD, DATA, UNMOD, LOCAL, CONST = 1, 2, 4, 8, 16
GSYM0 = 5
MEM = "<mem>"

# transfer codes; a transfer is (code, destination names, source names, *extra), except SCALE1:
# (SCALE1, [destination, sources...]) for register arithmetic with one destination, the form the C
# scanner (fast.py) builds from one split, and COPY1, the most common transfer, which is that list itself
# ([destination, sources...], told apart by being a list: no tuple allocated per line). Reading the
# destination's own value as a source changes nothing there.
COPY, SCALE, MAD, PACK, SHL_HI, UNK, LOAD, ATOM_DST, CALL, COPY1, SCALE1 = range(11)
S_GLOBAL, S_LOCAL, S_PARAM, S_GENERIC = range(4)


@dataclass(kw_only=True)
class LoweredFunction:
    """One function lowered: its transfers and access sites, and (dataflow.prepare) its initial values."""

    name: str
    transfers: list[tuple]  # type: ignore[type-arg]
    sites: list[tuple[int, int, str]]  # (access kind, line, opcode)
    site_addrs: list[tuple[int, tuple[str, ...]]]  # (site index, address names)
    params: tuple[str, ...]  # content slots of the parameters, in order
    returns: tuple[str, ...]
    locals: dict[str, str]  # body declarations: name -> state space
    entry_params: dict[str, int]  # the function's own parameters by index when it is an entry, else {}
    init: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> ("local"|"const"|"gsym"|"paddr", i)
    # initial values by a0 (where the parameter-address bits start), cached by dataflow.initial_values
    init_vals: dict[int, dict[str, int]] = field(default_factory=dict, repr=False)


ACC_R, ACC_W, ACC_A, TENSOR = 1, 2, 4, 8

TOKEN = re.compile(r"(?<![\w$.%@])[A-Za-z_$%][\w$@]*")
_CALL_LIST = re.compile(r"\(\s*(?:[A-Za-z_$%][\w$@]*(?:\s*,\s*[A-Za-z_$%][\w$@]*)*)?\s*\)\Z")
_NAME = re.compile(r"[A-Za-z_$%][\w$@]*\Z")
_FLOAT_TYPES = frozenset({"f16", "f16x2", "bf16", "bf16x2", "f32", "f64", "f32x2", "tf32", "rn", "approx"})
_IGNORE = frozenset({
    "bra", "brx", "ret", "exit", "bar", "barrier", "membar", "fence", "trap", "brkpt", "nanosleep",
    "pmevent", "griddepcontrol", "setmaxnreg", "setp", "set", "vote", "activemask", "elect", "match",
    "testp", "isspacep", "mbarrier", "prefetch", "prefetchu", "applypriority", "createpolicy", "getctarank",
    "stackrestore", "cnot", "wgmma", "tcgen05",
})
_FLOAT_ARITH = frozenset({
    "add", "sub", "mul", "fma", "mad", "div", "min", "max", "abs", "neg", "rcp", "sqrt", "rsqrt", "ex2",
    "lg2", "sin", "cos", "tanh", "copysign",
})
_SCALE = frozenset({"mul", "mul24", "shl", "shr", "div", "rem", "sad", "popc", "clz", "bfind", "brev", "ex2",
                    "lg2", "sqrt", "rsqrt", "rcp", "sin", "cos", "tanh", "fns", "bmsk", "dp4a", "dp2a"})
_MAD = frozenset({"mad", "mad24", "madc", "fma"})
_COPY = frozenset({"mov", "add", "sub", "addc", "subc", "and", "or", "xor", "not", "neg", "abs", "min",
                   "max", "selp", "slct", "cvt", "shfl", "prmt", "lop3", "bfe", "bfi", "redux", "copysign"})
WIDE = frozenset({"u64", "s64", "b64", "f64", "b128"})
_SURFACE = frozenset({"suld", "sust", "sured", "tex", "tld4", "multimem", "txq", "suq"})


def space_of(parts: list[str]) -> int:
    for p in parts:
        q = p.split("::", 1)[0]
        if q == "global":
            return S_GLOBAL
        if q in ("shared", "local"):
            return S_LOCAL
        if q == "const":
            return S_GLOBAL  # a .const bank: read-only data, possibly pointers the host put there
        if q == "param":
            return S_PARAM
    return S_GENERIC


_CATEGORY: dict[str, tuple[int, list[str]]] = {}
C_IGNORE, C_COPY, C_SCALE, C_MAD, C_LD, C_ST, _C_ATOM, _C_RED, C_CP, C_CALL, C_CVTA, _C_UNK, \
    _C_WILDMEM, _C_DISCARD, _C_LOCALADDR = range(15)


def category_of(op: str) -> tuple[int, list[str]]:
    hit = _CATEGORY.get(op)
    if hit is not None:
        return hit
    parts = op.split(".")
    base = parts[0]
    if base in _IGNORE or (base in _FLOAT_ARITH and parts[-1] in _FLOAT_TYPES):
        cat = C_IGNORE
    elif base in ("ld", "ldu", "ldmatrix"):
        cat = C_LD
    elif base in ("st", "stmatrix"):
        cat = C_ST
    elif base == "atom":
        cat = _C_ATOM
    elif base == "red":
        cat = _C_RED
    elif base == "cp":
        cat = C_CP
    elif base == "call":
        cat = C_CALL
    elif base in ("cvta", "mapa"):
        cat = C_CVTA
    elif base in _MAD:
        cat = C_MAD
    elif base in _SCALE:
        cat = C_SCALE
    elif base in _COPY:
        cat = C_COPY
    elif base in _SURFACE:
        cat = _C_WILDMEM
    elif base in ("discard", "tensormap"):
        cat = _C_DISCARD
    elif base in ("alloca", "stacksave"):
        cat = _C_LOCALADDR
    else:
        cat = _C_UNK
    _CATEGORY[op] = (cat, parts)
    return cat, parts


class Builder:
    """Collects transfers and access sites of one function; values are keyed by name (dataflow.py)."""

    def __init__(self, err: Callable[[int, str], Exception], params: tuple[str, ...], returns: tuple[str, ...],
                 entry_params: dict[str, int], locals_: dict[str, str]) -> None:
        self.err = err
        self.transfers: list[tuple] = []  # type: ignore[type-arg]
        self.sites: list[tuple[int, int, str]] = []
        self.site_addrs: list[tuple[int, tuple[str, ...]]] = []
        self.entry_params = entry_params
        self.fparams = {*params, *returns}
        self.params, self.returns = params, returns
        self.locals = locals_

    @staticmethod
    def reg(tok: str) -> str:
        return tok

    @staticmethod
    def toks(text: str) -> tuple[str, ...]:
        return tuple(TOKEN.findall(text))

    @staticmethod
    def content(sym: str) -> str:
        return "=" + sym

    def address(self, opnd: str, line: int, op: str) -> tuple[str, tuple[str, ...]]:
        """(base symbol or "", names) of a "[...]" operand."""
        if len(opnd) < 2 or opnd[0] != "[" or opnd[-1] != "]":
            raise self.err(line, f"{op}: expected an address operand in [...], got {opnd[:30]!r}")
        inner = opnd[1:-1]
        if "{" in inner:  # tensor map plus coordinates: the map is the address
            inner = inner.split(",", 1)[0]
        names = TOKEN.findall(inner)
        if not names:
            return "", ()
        first = names[0]
        sym = first if (first in self.entry_params or first in self.fparams
                        or self.locals.get(first) == ".param") else ""
        return sym, tuple(names)

    def site(self, kind: int, line: int, op: str, addr: tuple[str, ...]) -> None:
        self.site_addrs.append((len(self.sites), addr))
        self.sites.append((kind, line, op))

    def finish(self, name: str) -> LoweredFunction:
        return make(LoweredFunction, {
            "name": name, "transfers": self.transfers, "sites": self.sites, "site_addrs": self.site_addrs,
            "params": tuple("=" + p for p in self.params), "returns": tuple("=" + p for p in self.returns),
            "locals": self.locals, "entry_params": self.entry_params, "init": {}, "init_vals": {}})


def lower_instruction(b: Builder, op: str, args: str, line: int, cat: int, parts: list[str]) -> None:
    """Appends the transfers / sites of one non-ignored instruction; raises on malformed operands."""
    tr = b.transfers
    if (cat == C_COPY or cat == C_SCALE) and args and "[" not in args and "{" not in args \
            and "|" not in args and "(" not in args:
        # register arithmetic, most of a body: the first operand must be the destination
        ops = args.split(",")
        names = TOKEN.findall(args)
        if not names or names[0] != ops[0].strip():
            raise b.err(line, f"{op}: destination must be a register")
        code = COPY
        if cat == C_SCALE:
            code = SHL_HI if parts[0] == "shl" and _shift_ge_32(ops[-1]) else SCALE
        tr.append((code, (names[0],), tuple(names[1:])))
        return
    ops = split_operands(args) if args else []
    if ops is None or any(not o for o in ops):
        raise b.err(line, f"{op}: malformed operands")
    if not ops and cat != C_CP:
        raise b.err(line, f"{op}: missing operands")
    if cat == C_COPY or cat == C_SCALE or cat == _C_UNK:
        dst = b.toks(ops[0].replace("|", ","))
        srcs = b.toks(",".join(ops[1:]))
        if cat == C_COPY:
            code = PACK if parts[0] == "mov" and len(ops) > 1 and ops[1][:1] == "{" else COPY
        elif cat == C_SCALE:
            code = SHL_HI if parts[0] == "shl" and _shift_ge_32(ops[-1]) else SCALE
        else:
            code = UNK
        tr.append((code, dst, srcs))
    elif cat == C_MAD:
        if len(ops) < 4:
            raise b.err(line, f"{op}: expected 4 operands")
        tr.append((MAD, b.toks(ops[0]), b.toks(ops[1] + "," + ops[2]), b.toks(ops[3])))
    elif cat == C_LD:
        _load(b, op, parts, ops, line)
    elif cat == C_ST:
        _store(b, op, parts, ops, line)
    elif cat in (_C_ATOM, _C_RED):
        _atomic(b, op, parts, ops, line, cat == _C_ATOM)
    elif cat == C_CP:
        _copy_async(b, op, parts, ops, line)
    elif cat == C_CALL:
        _call(b, op, ops, line)
    elif cat == C_CVTA:
        dst, srcs = b.toks(ops[0]), b.toks(",".join(ops[1:]))
        to_generic = "to" not in parts and any(p.split("::")[0] in ("shared", "local") for p in parts)
        tr.append((COPY, dst, ("<local>",) if to_generic else srcs))
    elif cat == _C_LOCALADDR:
        tr.append((COPY, b.toks(ops[0]), ("<local>",)))
    elif cat == _C_WILDMEM:
        tr.append((COPY, b.toks(ops[0]), ("<wild>",)))
        b.site(ACC_R | ACC_W, line, op, ("<wild>",))
    elif cat == _C_DISCARD:
        if "global" in parts or not any(p.startswith("shared") for p in parts):
            _, addr = b.address(ops[0], line, op)
            b.site(ACC_W, line, op, addr)


def _shift_ge_32(amount: str) -> bool:
    """A shift by an immediate of 32 or more moves the low word into the high word (pointer halves)."""
    amount = amount.strip()
    return amount.isdecimal() and int(amount) >= 32


def lower_function(module: Module, fn: Function) -> LoweredFunction:
    """Transfer functions and access sites of the defined function ``fn``, from its statements (read
    here from its span when parse_ptx did not read bodies); raises PtxSyntaxError on malformed input."""
    body, decls = fn.body, fn.locals
    if body is None and fn.span is not None:
        body, decls = parse_body(module.source, module.text, *fn.span)
    entry_params = {p.name: i for i, p in enumerate(fn.params)} if fn.is_entry else {}
    b = Builder(module.error, tuple(p.name for p in fn.params), tuple(p.name for p in fn.returns),
                 entry_params, decls)
    cats = _CATEGORY
    for op, args, _, line in body or ():
        hit = cats.get(op)
        cat, parts = hit if hit is not None else category_of(op)
        if cat != C_IGNORE:
            lower_instruction(b, op, args, line, cat, parts)
    return b.finish(fn.name)


def _load(b: Builder, op: str, parts: list[str], ops: list[str], line: int) -> None:
    if len(ops) < 2:
        raise b.err(line, f"{op}: expected a destination and an address")
    dst = b.toks(ops[0])
    space = S_LOCAL if parts[0] == "ldmatrix" else space_of(parts)
    sym, addr = b.address(ops[1], line, op)
    if space == S_PARAM and sym:
        b.transfers.append((COPY, dst, (b.content(sym),)))
        return
    wide = WILD if any(p in WIDE for p in parts) else 0
    b.transfers.append((LOAD, dst, addr, space, wide))
    if space in (S_GLOBAL, S_GENERIC) and "const" not in parts:
        b.site(ACC_R, line, op, addr)


def _store(b: Builder, op: str, parts: list[str], ops: list[str], line: int) -> None:
    if len(ops) < 2:
        raise b.err(line, f"{op}: expected an address and a value")
    space = S_LOCAL if parts[0] == "stmatrix" or "async" in parts else space_of(parts)
    sym, addr = b.address(ops[0], line, op)
    srcs = b.toks(",".join(ops[1:]))
    if space == S_PARAM:
        if sym:
            b.transfers.append((COPY, (b.content(sym),), srcs))
        return
    if space != S_GLOBAL:
        b.transfers.append((COPY, (MEM,), srcs))
    if space in (S_GLOBAL, S_GENERIC):
        b.site(ACC_W, line, op, addr)


def _atomic(b: Builder, op: str, parts: list[str], ops: list[str], line: int, has_dst: bool) -> None:
    k = 1 if has_dst else 0
    if len(ops) < k + 2:
        raise b.err(line, f"{op}: too few operands")
    space = space_of(parts)
    _, addr = b.address(ops[k], line, op)
    srcs = b.toks(",".join(ops[k + 1:]))
    if space == S_LOCAL or space == S_GENERIC:
        b.transfers.append((COPY, (MEM,), srcs))
    if has_dst:
        wide = WILD if any(p in WIDE for p in parts) else 0
        b.transfers.append((ATOM_DST, b.toks(ops[0]), (), space, wide))
    if space != S_LOCAL:
        b.site(ACC_A, line, op, addr)


def _copy_async(b: Builder, op: str, parts: list[str], ops: list[str], line: int) -> None:
    if any(p in ("commit_group", "wait_group", "wait_all", "prefetch", "mbarrier") for p in parts[1:4]):
        return  # bookkeeping and prefetches: no semantic memory effect
    spaces = [p.split("::")[0] for p in parts if p.split("::")[0] in ("global", "shared", "local")]
    if len(spaces) < 2 or len(ops) < 2:
        raise b.err(line, f"{op}: unrecognised asynchronous copy")
    dst_space, src_space = spaces[0], spaces[1]
    tensor = TENSOR if "tensor" in parts else 0
    kind = ACC_A if parts[1] == "reduce" else ACC_W
    if dst_space == "global":
        _, addr = b.address(ops[0], line, op)
        b.site(kind | tensor, line, op, addr)
    else:  # raw bytes land in shared memory: whatever they hold may be a pointer
        b.transfers.append((COPY, (MEM,), ("<wild>",)))
    if src_space == "global":
        _, addr = b.address(ops[1], line, op)
        b.site(ACC_R | tensor, line, op, addr)


def _call(b: Builder, op: str, ops: list[str], line: int) -> None:
    ops = [o.replace("\n", " ").strip() for o in ops]
    rets: tuple[str, ...] = ()
    if ops[0].startswith("("):
        if not _CALL_LIST.match(ops[0]) or len(ops) < 2:
            raise b.err(line, f"{op}: malformed return list")
        rets = tuple(TOKEN.findall(ops[0]))
        ops = ops[1:]
    target = ops[0]
    args: tuple[str, ...] = ()
    if len(ops) > 1:
        if not _CALL_LIST.match(ops[1]):
            raise b.err(line, f"{op}: malformed argument list")
        args = tuple(TOKEN.findall(ops[1]))
    if not _NAME.match(target) or len(ops) > 3:
        raise b.err(line, f"{op}: malformed call target")

    def slot(name: str) -> str:
        return b.content(name) if b.locals.get(name) == ".param" or name in b.fparams else name

    callee = f"<indirect {target}>" if target.startswith("%") else target
    b.transfers.append((CALL, tuple(slot(r) for r in rets), tuple(slot(a) for a in args), callee, line))
