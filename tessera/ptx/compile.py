"""Lowers a parsed function to bit-set transfer functions and memory access sites (see analysis.py).

Bit layout of a value (a Python int): WILD (may be a pointer of unknown origin), DATA (derives from a
value loaded from memory), UNMOD (passed an operation the analysis does not model), LOCAL (a shared /
local address), CONST (a .const address), then one bit per module .global variable from GSYM0, then
the entry's parameter values from P0 and the entry's parameter addresses from P0 + n_params.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tessera.ptx.parser import Function, Module, split_operands

if TYPE_CHECKING:
    from tessera.ptx.analysis import _EntryContext

WILD, DATA, UNMOD, LOCAL, CONST = 1, 2, 4, 8, 16
GSYM0 = 5
ACC_R, ACC_W, ACC_A, TENSOR = 1, 2, 4, 8
MEM = 0  # register id of the shared/local memory summary

# transfer codes
COPY, SCALE, MAD, PACK, SHL_HI, UNK, LOAD, LDSYM, STSYM, STMEM, ATOM_DST, CALL, CONSTV = range(13)
S_GLOBAL, S_LOCAL, S_PARAM, S_GENERIC = range(4)

_TOK = re.compile(r"(?<![\w$.%@])[A-Za-z_$%][\w$@]*")
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
_WIDE = frozenset({"u64", "s64", "b64", "f64", "b128"})
_SAFE_EXTERNS = frozenset({"vprintf", "__assertfail", "free"})
_SURFACE = frozenset({"suld", "sust", "sured", "tex", "tld4", "multimem", "txq", "suq"})


def _space(parts: list[str]) -> int:
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


@dataclass(kw_only=True)
class CompiledFunction:
    name: str
    nregs: int
    init: list[tuple[int, str, int]]  # (register id, "local"|"const"|"gsym"|"paddr", index)
    transfers: list[tuple]  # type: ignore[type-arg]
    sites: list[tuple[int, int, str]]  # (access kind, line, opcode)
    site_addrs: list[tuple[int, tuple[int, ...]]]  # (site index, address register ids)
    param_ids: tuple[int, ...]
    returns: tuple[int, ...]
    entry_init: tuple[int, ...] = field(default=())

    def evaluate(self, ctx: _EntryContext, args: tuple[int, ...], mem: int) -> tuple[tuple[int, ...], int]:
        n, p0 = ctx.n, ctx.p0
        a0 = p0 + n
        amask = ((1 << n) - 1) << a0
        vals = [0] * self.nregs
        for rid, kind, idx in self.init:
            vals[rid] = _INIT[kind] if kind in _INIT else 1 << ((GSYM0 if kind == "gsym" else a0) + idx)
        for rid, v in zip(self.param_ids, args, strict=False):
            vals[rid] |= v
        vals[MEM] |= mem
        changed = True
        while changed:
            changed = False
            for t in self.transfers:
                code = t[0]
                v = 0
                for s in t[2]:
                    v |= vals[s]
                if code == COPY:
                    pass
                elif code == SCALE:
                    v &= DATA
                elif code == LOAD:
                    space, wide = t[3], t[4]
                    if space == S_GLOBAL:
                        v = DATA | wide
                    elif space == S_LOCAL:
                        v = vals[MEM] | DATA
                    else:
                        r = ((v & amask) >> a0) << p0
                        if space == S_PARAM:
                            r |= (WILD | DATA) if v & ~amask else 0
                        else:
                            if v & LOCAL:
                                r |= vals[MEM] | DATA
                            if v & ~(amask | LOCAL) or not v:
                                r |= DATA | wide
                        v = r
                elif code == MAD:  # a * b + c: the product is an offset, c may be a pointer
                    v &= DATA
                    for s in t[3]:
                        v |= vals[s]
                elif code == PACK:
                    if v & DATA:
                        v |= WILD
                elif code == SHL_HI:
                    v = (v & DATA) | (WILD if v & DATA else 0)
                elif code == UNK:
                    if v & ~DATA:
                        v |= UNMOD
                elif code == ATOM_DST:
                    v = (vals[MEM] | DATA) if t[3] == S_LOCAL else (DATA | t[4])
                elif code == CALL:
                    if self._call(ctx, t, vals):
                        changed = True
                    continue
                for d in t[1]:
                    old = vals[d]
                    if old | v != old:
                        vals[d] = old | v
                        changed = True
        sites = ctx.sites
        name = self.name
        for site, ids in self.site_addrs:
            v = 0
            for s in ids:
                v |= vals[s]
            key = (name, site)
            sites[key] = sites.get(key, 0) | v
        return tuple(vals[r] for r in self.returns), vals[MEM]

    def _call(self, ctx: _EntryContext, t: tuple, vals: list[int]) -> bool:  # type: ignore[type-arg]
        _, rets, args, callee, line = t
        fn = ctx.compiled.get(callee)
        if fn is None or callee not in ctx.module.functions or ctx.module.functions[callee].body is None:
            if callee in _SAFE_EXTERNS:
                ret, mem_out = tuple(DATA for _ in rets), 0
            else:
                ctx.unknown.append(f"line {line}: call to {callee}, which has no body here")
                ret, mem_out = tuple(WILD | DATA for _ in rets), WILD | DATA
        else:
            ret, mem_out = ctx.run(fn, tuple(vals[a] for a in args), vals[MEM])
        changed = False
        for r, v in zip(rets, ret, strict=False):
            if vals[r] | v != vals[r]:
                vals[r] |= v
                changed = True
        if vals[MEM] | mem_out != vals[MEM]:
            vals[MEM] |= mem_out
            changed = True
        return changed


_INIT = {"local": LOCAL, "const": CONST, "wild": WILD | DATA}
_CATEGORY: dict[str, tuple[int, list[str]]] = {}
_C_IGNORE, _C_COPY, _C_SCALE, _C_MAD, _C_LD, _C_ST, _C_ATOM, _C_RED, _C_CP, _C_CALL, _C_CVTA, _C_UNK, \
    _C_WILDMEM, _C_DISCARD, _C_LOCALADDR = range(15)


def _category(op: str) -> tuple[int, list[str]]:
    hit = _CATEGORY.get(op)
    if hit is not None:
        return hit
    parts = op.split(".")
    base = parts[0]
    if base in _IGNORE or (base in _FLOAT_ARITH and parts[-1] in _FLOAT_TYPES):
        cat = _C_IGNORE
    elif base in ("ld", "ldu", "ldmatrix"):
        cat = _C_LD
    elif base in ("st", "stmatrix"):
        cat = _C_ST
    elif base == "atom":
        cat = _C_ATOM
    elif base == "red":
        cat = _C_RED
    elif base == "cp":
        cat = _C_CP
    elif base == "call":
        cat = _C_CALL
    elif base in ("cvta", "mapa"):
        cat = _C_CVTA
    elif base in _MAD:
        cat = _C_MAD
    elif base in _SCALE:
        cat = _C_SCALE
    elif base in _COPY:
        cat = _C_COPY
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


class _Builder:
    def __init__(self, module: Module, fn: Function, gindex: dict[str, int], entry: Function | None) -> None:
        self.module, self.fn = module, fn
        self.ids: dict[str, int] = {"<mem>": MEM}
        self.transfers: list[tuple] = []  # type: ignore[type-arg]
        self.sites: list[tuple[int, int, str]] = []
        self.site_addrs: list[tuple[int, tuple[int, ...]]] = []
        self.gindex = gindex
        self.entry_params = {p.name: i for i, p in enumerate(entry.params)} if entry else {}
        self.fparams = {p.name for p in (*fn.params, *fn.returns)}

    def err(self, line: int, what: str) -> Exception:
        return self.module.error(line, what)

    def reg(self, tok: str) -> int:
        ids = self.ids
        i = ids.get(tok)
        if i is None:
            i = ids[tok] = len(ids)
        return i

    def toks(self, text: str) -> tuple[int, ...]:
        ids = self.ids
        return tuple([ids.setdefault(t, len(ids)) for t in _TOK.findall(text)])

    def content(self, sym: str) -> int:
        return self.reg("=" + sym)

    def address(self, opnd: str, line: int, op: str) -> tuple[str, tuple[int, ...]]:
        """(base symbol or "", register ids) of a "[...]" operand."""
        if len(opnd) < 2 or opnd[0] != "[" or opnd[-1] != "]":
            raise self.err(line, f"{op}: expected an address operand in [...], got {opnd[:30]!r}")
        inner = opnd[1:-1]
        if "{" in inner:  # tensor map plus coordinates: the map is the address
            inner = inner.split(",", 1)[0]
        names = _TOK.findall(inner)
        if not names:
            return "", ()
        first = names[0]
        sym = first if (first in self.entry_params or first in self.fparams
                        or self.fn.locals.get(first) == ".param") else ""
        return sym, tuple(self.reg(t) for t in names)

    def site(self, kind: int, line: int, op: str, addr: tuple[int, ...]) -> None:
        self.site_addrs.append((len(self.sites), addr))
        self.sites.append((kind, line, op))


def compile_function(module: Module, fn: Function, gindex: dict[str, int], p0: int,
                     entry: Function | None) -> CompiledFunction:
    """Transfer functions and access sites of ``fn``; ``entry`` is fn itself when fn is the entry."""
    b = _Builder(module, fn, gindex, entry)
    tr = b.transfers
    ids = b.ids
    findall = _TOK.findall
    cats = _CATEGORY
    for ins in fn.body or ():
        op, args, _, line = ins
        hit = cats.get(op)
        cat, parts = hit if hit is not None else _category(op)
        if cat == _C_IGNORE:
            continue
        if (cat == _C_COPY or cat == _C_SCALE) and args and "[" not in args and "{" not in args \
                and "|" not in args and "(" not in args:
            # fast path for register arithmetic, most of a body: first name is the destination
            ops = args.split(",")
            names = findall(args)
            if not names or names[0] != ops[0].strip():
                raise b.err(line, f"{op}: destination must be a register")
            regs = [ids.setdefault(t, len(ids)) for t in names]
            code = COPY
            if cat == _C_SCALE:
                code = SHL_HI if parts[0] == "shl" and ops[-1].strip().isdigit() and int(ops[-1]) >= 32 else SCALE
            tr.append((code, (regs[0],), tuple(regs[1:])))
            continue
        ops = split_operands(args) if args else []
        if ops is None or any(not o for o in ops):
            raise b.err(line, f"{op}: malformed operands")
        if not ops and cat != _C_CP:
            raise b.err(line, f"{op}: missing operands")
        if cat == _C_COPY or cat == _C_SCALE or cat == _C_UNK:
            dst = b.toks(ops[0].replace("|", ","))
            srcs = b.toks(",".join(ops[1:]))
            if cat == _C_COPY:
                code = PACK if parts[0] == "mov" and len(ops) > 1 and ops[1][:1] == "{" else COPY
            elif cat == _C_SCALE:
                code = SCALE
                if parts[0] == "shl" and ops[-1].isdigit() and int(ops[-1]) >= 32:
                    code = SHL_HI
            else:
                code = UNK
            tr.append((code, dst, srcs))
        elif cat == _C_MAD:
            if len(ops) < 4:
                raise b.err(line, f"{op}: expected 4 operands")
            tr.append((MAD, b.toks(ops[0]), b.toks(ops[1] + "," + ops[2]), b.toks(ops[3])))
        elif cat == _C_LD:
            _load(b, op, parts, ops, line)
        elif cat == _C_ST:
            _store(b, op, parts, ops, line)
        elif cat in (_C_ATOM, _C_RED):
            _atomic(b, op, parts, ops, line, cat == _C_ATOM)
        elif cat == _C_CP:
            _copy_async(b, op, parts, ops, line)
        elif cat == _C_CALL:
            _call(b, op, ops, line)
        elif cat == _C_CVTA:
            dst, srcs = b.toks(ops[0]), b.toks(",".join(ops[1:]))
            to_generic = "to" not in parts and any(p.split("::")[0] in ("shared", "local") for p in parts)
            if to_generic:
                tr.append((COPY, dst, (b.reg("<local>"),)))
            else:
                tr.append((COPY, dst, srcs))
        elif cat == _C_LOCALADDR:
            tr.append((COPY, b.toks(ops[0]), (b.reg("<local>"),)))
        elif cat == _C_WILDMEM:
            dst = b.toks(ops[0])
            tr.append((COPY, dst, (b.reg("<wild>"),)))
            b.site(ACC_R | ACC_W, line, op, (b.reg("<wild>"),))
        elif cat == _C_DISCARD:
            if "global" in parts or not any(p.startswith("shared") for p in parts):
                _, addr = b.address(ops[0], line, op)
                b.site(ACC_W, line, op, addr)
    init: list[tuple[int, str, int]] = []
    for name, rid in b.ids.items():
        if name == "<local>":
            init.append((rid, "local", 0))
        elif name == "<wild>":
            init.append((rid, "wild", 0))
        elif name in b.entry_params:
            init.append((rid, "paddr", b.entry_params[name]))
        elif name in gindex:
            space = module.globals[name][0]
            if space == ".global":
                init.append((rid, "gsym", gindex[name]))
            else:
                init.append((rid, "const" if space == ".const" else "local", 0))
        elif fn.locals.get(name) in (".shared", ".local"):
            init.append((rid, "local", 0))
    param_ids = tuple(b.content(p.name) for p in fn.params)
    rets = tuple(b.content(p.name) for p in fn.returns)
    return CompiledFunction(name=fn.name, nregs=len(b.ids), init=init, transfers=tr, sites=b.sites,
                            site_addrs=b.site_addrs, param_ids=param_ids, returns=rets)


def _load(b: _Builder, op: str, parts: list[str], ops: list[str], line: int) -> None:
    if len(ops) < 2:
        raise b.err(line, f"{op}: expected a destination and an address")
    dst = b.toks(ops[0])
    space = S_LOCAL if parts[0] == "ldmatrix" else _space(parts)
    sym, addr = b.address(ops[1], line, op)
    if space == S_PARAM and sym:
        b.transfers.append((COPY, dst, (b.content(sym),)))
        return
    wide = WILD if any(p in _WIDE for p in parts) else 0
    b.transfers.append((LOAD, dst, addr, space, wide))
    if space in (S_GLOBAL, S_GENERIC) and "const" not in parts:
        b.site(ACC_R, line, op, addr)


def _store(b: _Builder, op: str, parts: list[str], ops: list[str], line: int) -> None:
    if len(ops) < 2:
        raise b.err(line, f"{op}: expected an address and a value")
    space = S_LOCAL if parts[0] == "stmatrix" or "async" in parts else _space(parts)
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


def _atomic(b: _Builder, op: str, parts: list[str], ops: list[str], line: int, has_dst: bool) -> None:
    k = 1 if has_dst else 0
    if len(ops) < k + 2:
        raise b.err(line, f"{op}: too few operands")
    space = _space(parts)
    _, addr = b.address(ops[k], line, op)
    srcs = b.toks(",".join(ops[k + 1:]))
    if space == S_LOCAL or space == S_GENERIC:
        b.transfers.append((COPY, (MEM,), srcs))
    if has_dst:
        wide = WILD if any(p in _WIDE for p in parts) else 0
        b.transfers.append((ATOM_DST, b.toks(ops[0]), (), space, wide))
    if space != S_LOCAL:
        b.site(ACC_A, line, op, addr)


def _copy_async(b: _Builder, op: str, parts: list[str], ops: list[str], line: int) -> None:
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
        b.transfers.append((COPY, (MEM,), (b.reg("<wild>"),)))
    if src_space == "global":
        _, addr = b.address(ops[1], line, op)
        b.site(ACC_R | tensor, line, op, addr)


def _call(b: _Builder, op: str, ops: list[str], line: int) -> None:
    ops = [o.replace("\n", " ").strip() for o in ops]
    rets: tuple[str, ...] = ()
    if ops[0].startswith("("):
        if not _CALL_LIST.match(ops[0]) or len(ops) < 2:
            raise b.err(line, f"{op}: malformed return list")
        rets = tuple(_TOK.findall(ops[0]))
        ops = ops[1:]
    target = ops[0]
    args: tuple[str, ...] = ()
    if len(ops) > 1:
        if not _CALL_LIST.match(ops[1]):
            raise b.err(line, f"{op}: malformed argument list")
        args = tuple(_TOK.findall(ops[1]))
    if not _NAME.match(target) or len(ops) > 3:
        raise b.err(line, f"{op}: malformed call target")

    def slot(name: str) -> int:
        return b.content(name) if b.fn.locals.get(name) == ".param" or name in b.fparams else b.reg(name)

    if target.startswith("%") or target not in b.module.functions:
        callee = target if not target.startswith("%") else f"<indirect {target}>"
    else:
        callee = target
    b.transfers.append((CALL, tuple(slot(r) for r in rets), tuple(slot(a) for a in args), callee, line))
