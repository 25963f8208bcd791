"""Dataflow stage: the fixpoint evaluation of a lowered function (transfer functions + access sites).

Values are bit sets (Python ints, layout in lower.py) keyed by register / symbol *name*: keying by
the names the scanner already holds saves mapping every token to an integer id, which cost more than
the whole fixpoint. Slots that are not names: "<mem>" (the shared/local memory summary), "=p" (the
content of parameter p), "<local>" / "<wild>" (constant sources).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

from tessera.ptx.body import PtxSyntaxError
from tessera.ptx.lower import (
    ATOM_DST,
    CALL,
    CONST,
    COPY,
    DATA,
    GSYM0,
    LOAD,
    LOCAL,
    MAD,
    MEM,
    PACK,
    S_GLOBAL,
    S_LOCAL,
    S_PARAM,
    SCALE,
    SCALE1,
    SHL_HI,
    UNK,
    UNMOD,
    WILD,
    LoweredFunction,
)


class EntryContext(Protocol):
    """What evaluation needs of the entry being analysed (tessera.ptx.analysis implements it)."""

    module: Any
    compiled: dict[str, Any]
    n: int
    p0: int
    sites: dict[str, list[int]]
    unknown: list[str]
    # an accelerated first pass (fast.py), run before the fixpoint loop; None: the loop alone
    first_pass: Callable[..., bool] | None

    def run(self, fn: Any, args: tuple[int, ...], mem: int) -> tuple[tuple[int, ...], int]: ...

_SAFE_EXTERNS = frozenset({"vprintf", "__assertfail", "free"})
_INIT_FLAGS = {"local": LOCAL, "const": CONST, "wild": WILD | DATA}


def prepare(fn: LoweredFunction, globals_: dict[str, tuple[str, int]]) -> None:
    """Initial values of names that are addresses: own parameters (entry), module globals, locals.
    Precedence as in a lookup: entry parameter, then module variable, then body declaration."""
    init: dict[str, tuple[str, int]] = {}
    for name, space in fn.locals.items():
        if space in (".shared", ".local"):
            init[name] = ("local", 0)
    for j, (name, (space, _)) in enumerate(globals_.items()):
        init[name] = ("gsym", j) if space == ".global" else ("const" if space == ".const" else "local", 0)
    for name, i in fn.entry_params.items():
        init[name] = ("paddr", i)
    init["<local>"] = ("local", 0)
    init["<wild>"] = ("wild", 0)
    fn.init = init
    fn.init_vals = {}


def initial_values(fn: LoweredFunction, a0: int) -> dict[str, int]:
    hit = fn.init_vals.get(a0)
    if hit is None:
        hit = fn.init_vals[a0] = {
            name: _INIT_FLAGS[kind] if kind in _INIT_FLAGS else 1 << ((GSYM0 if kind == "gsym" else a0) + i)
            for name, (kind, i) in fn.init.items()}
    return hit


def evaluate(fn: LoweredFunction, ctx: EntryContext, args: tuple[int, ...], mem: int
             ) -> tuple[tuple[int, ...], int]:
    """``fn``'s results and memory summary for these argument values; ORs its sites' addresses into ctx."""
    n, p0 = ctx.n, ctx.p0
    a0 = p0 + n
    amask = ((1 << n) - 1) << a0
    vals: defaultdict[str, int] = defaultdict(int, initial_values(fn, a0))
    for slot, v in zip(fn.params, args, strict=False):
        vals[slot] |= v
    if mem:  # absent when 0: the accelerated first pass treats a present name as possibly read
        vals[MEM] |= mem
    if ctx.first_pass is None or ctx.first_pass(ctx, fn.transfers, vals, amask, a0, p0):
        fixpoint(ctx, fn.transfers, vals, amask, a0, p0)
    # one list per function (site index -> OR of address bit sets) rather than a dict keyed by
    # (function, site): no key tuple per site per evaluation; the dict keeps first-evaluation order
    got = []
    for _, addr in fn.site_addrs:
        v = 0
        for s in addr:
            v |= vals[s]
        got.append(v)
    old = ctx.sites.get(fn.name)
    ctx.sites[fn.name] = got if old is None else [a | b for a, b in zip(old, got, strict=True)]
    return tuple(vals[r] for r in fn.returns), vals[MEM]


# An accelerated first pass (fast.py, in C) may stand before the loop: one pass over the transfers in
# order that reports whether a second could change anything. It can tell because reading a name through
# the defaultdict inserts it: "the name is absent" means nothing has read or assigned it yet, so if every
# change of the pass assigns an absent name, a second pass would see exactly the first pass's inputs and
# change nothing. The loop then adds nothing either, so the result is the loop's alone.


def fixpoint(ctx: EntryContext, transfers: list[tuple], vals: defaultdict[str, int],  # type: ignore[type-arg]
              amask: int, a0: int, p0: int) -> None:
    changed = True
    while changed:
        changed = False
        for t in transfers:
            if type(t) is list:  # COPY1
                v = 0
                for s in t:
                    v |= vals[s]
                if v and vals[t[0]] != v:
                    vals[t[0]] = v
                    changed = True
                continue
            code = t[0]
            if code == SCALE1:
                v = 0
                for s in t[1]:
                    v |= vals[s]
                v &= DATA
                if v:
                    d = t[1][0]
                    if vals[d] | v != vals[d]:
                        vals[d] |= v
                        changed = True
                continue
            if code == CALL:
                if call_join(ctx, t, vals, False):
                    changed = True
                continue
            v = transfer_value(t, code, vals, amask, a0, p0)
            if v:
                for d in t[1]:
                    old = vals[d]
                    if old | v != old:
                        vals[d] = old | v
                        changed = True


def transfer_value(t: tuple, code: int, vals: defaultdict[str, int], amask: int, a0: int, p0: int  # type: ignore[type-arg]
              ) -> int:
    """The value a non-COPY1/SCALE1/CALL transfer joins into its destinations (0: nothing)."""
    v = 0
    for s in t[2]:
        v |= vals[s]
    if code == COPY:
        return v
    if code == SCALE:
        return v & DATA
    if code == LOAD:
        return load_value(t, v, vals, amask, a0, p0)
    if code == MAD:  # a * b + c: the product is an offset, c may be a pointer
        v &= DATA
        for s in t[3]:
            v |= vals[s]
        return v
    if code == PACK:
        return v | WILD if v & DATA else v
    if code == SHL_HI:
        return (v & DATA) | (WILD if v & DATA else 0)
    if code == UNK:
        return v | UNMOD if v & ~DATA else v
    if code == ATOM_DST:
        return (vals[MEM] | DATA) if t[3] == S_LOCAL else (DATA | t[4])
    return v


def load_value(t: tuple, v: int, vals: dict[str, int], amask: int, a0: int, p0: int) -> int:  # type: ignore[type-arg]
    space, wide = t[3], t[4]
    if space == S_GLOBAL:
        return DATA | wide
    if space == S_LOCAL:
        return vals[MEM] | DATA
    r = ((v & amask) >> a0) << p0  # a parameter's address read back: its value
    if space == S_PARAM:
        return r | ((WILD | DATA) if v & ~amask else 0)
    if v & LOCAL:
        r |= vals[MEM] | DATA
    if v & ~(amask | LOCAL) or not v:
        r |= DATA | wide
    return r


def call_join(ctx: EntryContext, t: tuple, vals: dict[str, int], first: bool) -> bool:  # type: ignore[type-arg]
    """Joins the callee's results into ``vals``; True when a value changed (in the first pass: changed
    a name that was already present, see first_pass)."""
    _, rets, args, callee, line = t
    fn = ctx.compiled.get(callee)
    if fn is None:
        if callee in _SAFE_EXTERNS:
            ret, mem_out = tuple(DATA for _ in rets), 0
        else:
            ctx.unknown.append(f"line {line}: call to {callee}, which has no body here")
            ret, mem_out = tuple(WILD | DATA for _ in rets), WILD | DATA
    else:
        if len(args) != len(fn.params) or len(rets) != len(fn.returns):  # ptxas rejects it; zip would not
            raise PtxSyntaxError(f"{ctx.module.source}:{line}: call to {callee} passes {len(args)} argument(s) "
                                 f"and {len(rets)} result(s); {callee} takes {len(fn.params)} and returns "
                                 f"{len(fn.returns)}")
        ret, mem_out = ctx.run(fn, tuple(vals[a] for a in args), vals[MEM])
    changed = False
    for r, v in zip((*rets, MEM), (*ret, mem_out), strict=True):
        old = vals.get(r) if first else vals[r]
        if old is None:
            if v:
                vals[r] = v
        elif old | v != old:
            vals[r] = old | v
            changed = True
    return changed
