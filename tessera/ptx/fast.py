"""The accelerated path: the optional C module `_fastscan` (built by setup.py), behind one interface.

Two functions stand in for the reference path's hot loops, with the same results:

- `lower_function(module, fn)` reads a body straight from the module text into transfers and access
  sites. The C scanner settles the lines nvcc and Triton write most ("\\top \\targs;" whose opcode it
  has seen before, with a plain operand shape); every other line (labels, declarations, brace scopes,
  calls spanning lines, the first line of each opcode, unusual operands) goes to the parse stage's
  `BodyReader` and the lowering stage's `lower_instruction`, exactly as on the reference path. Any
  trouble (a malformed line, an unclosed scope) returns None and the caller lowers the function by the
  reference path, so errors, their text and their order are always the reference path's.
- `first_pass` runs the dataflow's first pass in C (see dataflow.py for why it may end the loop).

`ENABLED` says whether the module was built, matches this Python (its layout constants), and
TESSERA_PTX_NATIVE is not "0". tests/ptx/test_ptx_differential.py holds both paths to equal results.
"""

from __future__ import annotations

import os
from collections import defaultdict
from types import ModuleType

from tessera.ptx.body import GUARD, IGNORED_DIRECTIVES, BodyReader
from tessera.ptx.dataflow import EntryContext, call_join, load_value, transfer_value
from tessera.ptx.lower import (
    ACC_R,
    ACC_W,
    C_CALL,
    C_COPY,
    C_CP,
    C_CVTA,
    C_IGNORE,
    C_LD,
    C_MAD,
    C_SCALE,
    C_ST,
    COPY,
    DATA,
    LOAD,
    MAD,
    MEM,
    S_GENERIC,
    S_GLOBAL,
    S_LOCAL,
    S_PARAM,
    SCALE1,
    SHL_HI,
    WIDE,
    WILD,
    Builder,
    LoweredFunction,
    category_of,
    lower_instruction,
    space_of,
)
from tessera.ptx.lower import CALL as T_CALL
from tessera.ptx.parser import Function, Module

# The C scanner's kinds of an opcode; KINDS: opcode -> (kind, detail, category, opcode parts).
K_COPY, K_SCALE, K_SHL, K_LD, K_ST, K_CVTA, K_MAD, K_CP_NOP, K_CALL, K_OTHER, K_IGNORE = range(11)
# Markers for raw-line prefixes that are no opcode: a guard, `.reg`, `.loc`-like directives, and a
# whole line of blanks/tabs (the key is then the line itself).
K_GUARD, K_REG, K_SKIPDIR, K_BLANK = 100, 101, 102, 103
_BLANK_ENTRY: tuple[int, object, int, list[str], str] = (K_BLANK, None, 0, [], "")
KINDS: dict[str, tuple[int, object, int, list[str]]] = {}
# A raw line's text up to its first space ("\tadd.s64", "\t@%p1", "\t.reg") -> (kind, detail, category,
# opcode parts, opcode) or a marker, learnt from lines the BodyReader read, only where the prefix alone
# fixes how the reference path reads such a line; the C scanner settles a line only through this table.
PREFIX_TABLE: dict[str, tuple[int, object, int, list[str], str]] = {}
_TABLE_LIMIT = 50_000  # distinct prefixes are few (opcodes x indentation); a cap against odd inputs


def _load_module() -> ModuleType | None:
    if os.environ.get("TESSERA_PTX_NATIVE", "1") == "0":
        return None
    try:
        from tessera.ptx import _fastscan
    except ImportError:
        return None
    layout = (K_COPY, K_SCALE, K_SHL, K_LD, K_ST, K_CVTA, K_MAD, K_CP_NOP, K_CALL, K_OTHER, K_IGNORE, K_GUARD,
              K_REG, K_SKIPDIR, K_BLANK, COPY, MAD, SHL_HI, LOAD, SCALE1, S_GLOBAL, S_LOCAL, S_PARAM, S_GENERIC,
              ACC_R, ACC_W, MEM, "<local>")
    eval_layout = (DATA, COPY, LOAD, T_CALL, SCALE1, S_GLOBAL)
    # a module left over from another version of the Python is ignored rather than trusted
    if getattr(_fastscan, "LAYOUT", None) != layout or getattr(_fastscan, "EVAL_LAYOUT", None) != eval_layout:
        return None
    return _fastscan


_C = _load_module()
ENABLED = _C is not None


def _kind(op: str) -> tuple[int, object, int, list[str]]:
    hit = KINDS.get(op)
    if hit is not None:
        return hit
    cat, parts = category_of(op)
    detail: object = None
    kind = {C_IGNORE: K_IGNORE, C_COPY: K_COPY, C_MAD: K_MAD, C_CALL: K_CALL}.get(cat, K_OTHER)
    if cat == C_SCALE:
        kind = K_SHL if parts[0] == "shl" else K_SCALE
    elif cat == C_LD:
        kind = K_LD
        space = S_LOCAL if parts[0] == "ldmatrix" else space_of(parts)
        detail = (space, WILD if any(p in WIDE for p in parts) else 0,
                  space in (S_GLOBAL, S_GENERIC) and "const" not in parts)
    elif cat == C_ST:
        kind = K_ST
        detail = S_LOCAL if parts[0] == "stmatrix" or "async" in parts else space_of(parts)
    elif cat == C_CVTA:
        kind = K_CVTA
        detail = "to" not in parts and any(p.split("::")[0] in ("shared", "local") for p in parts)
    elif cat == C_CP and any(p in ("commit_group", "wait_group", "wait_all") for p in parts[1:4]):
        kind = K_CP_NOP  # bookkeeping: no memory effect (lower._copy_async)
    hit = KINDS[op] = (kind, detail, cat, parts)
    return hit


def lower_function(module: Module, fn: Function) -> LoweredFunction | None:
    """``fn``'s transfers and sites read from the module text, or None (the reference path decides)."""
    if _C is None or fn.span is None:
        return None
    start, end, first_line = fn.span
    reader = BodyReader(module.source, first_line)
    entry_params = {p.name: i for i, p in enumerate(fn.params)} if fn.is_entry else {}
    b = Builder(_bail, tuple(p.name for p in fn.params), tuple(p.name for p in fn.returns), entry_params,
                reader.decls)
    lines = enumerate(module.text[start + 1 : end - 1].split("\n"))
    # the scanner appends to b's lists and reads reader.scopes (it settles nothing while one is open)
    scanner = _C.Scanner(lines, reader.scopes, PREFIX_TABLE, KINDS, b.transfers, b.sites, b.site_addrs,
                         entry_params, b.fparams, reader.decls, first_line)
    try:
        for k, raw in scanner:
            _read(reader, b, raw, k, continued=False)
            while reader.pending:  # a call spanning lines: its continuation lines are read here
                k, raw = next(lines)
                _read(reader, b, raw, k, continued=True)
        reader.finish("")
    except Exception:  # a malformed body: the reference path reproduces the error in order
        return None
    return b.finish(fn.name)


def _bail(line: int, what: str) -> Exception:
    return ValueError(what)


def _read(reader: BodyReader, b: Builder, raw: str, k: int, continued: bool) -> None:
    """One line through the reference reading and lowering; learns its prefix for the scanner."""
    reader.line(raw, k)
    if not continued and len(PREFIX_TABLE) < _TABLE_LIMIT:
        _learn_line(raw, reader)
    for op, args, _, line in reader.body:
        cat, parts = category_of(op)
        if cat != C_IGNORE:
            lower_instruction(b, op, args, line, cat, parts)
    reader.body.clear()


def _learn_line(raw: str, reader: BodyReader) -> None:
    """Teaches PREFIX_TABLE what the line just read (without error) says about lines sharing its prefix."""
    if raw.partition(" ")[0] in PREFIX_TABLE:  # learnt already (lines in brace scopes come here every time)
        return
    s = raw.strip()
    if not s:
        if " " not in raw:
            PREFIX_TABLE[raw] = _BLANK_ENTRY
        return
    c = s[0]
    if not (s[-1] == ";" and s.find(";") == len(s) - 1 and c != "{" and c != "}"):
        if c == "." and ";" not in s and s.split(None, 1)[0] in IGNORED_DIRECTIVES:
            _learn(raw, None, "")
        return
    if c == "@":  # the guard's prefix, and the guarded opcode's kind for the scanner's guard lines
        _learn(raw, None, "")
        _kind(s[:-1].split(None, 2)[1])
    elif c == "." and s.startswith(".reg") and not reader.scopes:
        _learn(raw, None, "")
    elif c != ".":
        op = s[:-1].split(None, 1)[0]
        _learn(raw, _kind(op), op)


def _learn(raw: str, h: tuple[int, object, int, list[str]] | None, op: str) -> None:
    sp = raw.find(" ")
    if sp < 0:  # a whole statement without operands ("\tret;"), learnt as the line itself
        if h is not None and h[0] == K_IGNORE and raw.lstrip(" \t") == op + ";":
            PREFIX_TABLE[raw] = (*h, op)
        return
    pre = raw[:sp]
    word = pre.lstrip(" \t")
    if not word or pre in PREFIX_TABLE:
        return
    if h is not None and word == op:
        PREFIX_TABLE[pre] = (*h, op)
    elif word[0] == "@" and GUARD.match(word) is not None:
        PREFIX_TABLE[pre] = (K_GUARD, None, 0, [], "")
    elif word == ".reg":
        PREFIX_TABLE[pre] = (K_REG, None, 0, [], "")
    elif word.split(None, 1)[0] in IGNORED_DIRECTIVES:
        PREFIX_TABLE[pre] = (K_SKIPDIR, None, 0, [], "")


def first_pass(ctx: EntryContext, transfers: list[tuple], vals: defaultdict[str, int],  # type: ignore[type-arg]
               amask: int, a0: int, p0: int) -> bool:
    """One pass over ``transfers`` in C; True when another pass may change something."""
    assert _C is not None
    return _C.first_pass(ctx, transfers, vals, amask, a0, p0, load_value,  # type: ignore[no-any-return]
                         call_join, transfer_value)
