"""Fused fast path: scans a well-formed function body straight into transfers and access sites.

The analysis must sustain >= 20 MB/s of PTX in pure Python, so the common body (one statement per
line, as nvcc and Triton write it, no nested `{ }` scopes and no calls) is lowered in a single pass
without building `Instruction`s: one strip, a split and one dict lookup on the opcode per line, and
for register arithmetic the operand tokens straight into a transfer. Memory instructions reuse the
reference lowering (compile.lower_instruction). Anything else — a brace scope, a call, an unknown
directive, a malformed line or operand — returns None, and the parser redoes the body with the
reference scanner (body.py) and the analysis lowers it with compile.py: errors, their line numbers
and their order stay exactly those of the reference path.
"""

from __future__ import annotations

import re

from tessera.ptx.body import _GUARD, _IGNORED_DIRECTIVES, _OPCODE, _SPACES, declare
from tessera.ptx.compile import (
    _C_CALL,
    _C_COPY,
    _C_CVTA,
    _C_IGNORE,
    _C_LD,
    _C_SCALE,
    _CATEGORY,
    _TOK,
    _WIDE,
    ACC_R,
    _Builder,
    _category,
    _shift_ge_32,
    _space,
    lower_instruction,
)
from tessera.ptx.evaluate import (
    COPY,
    LOAD,
    S_GENERIC,
    S_GLOBAL,
    S_LOCAL,
    S_PARAM,
    SCALE,
    SHL_HI,
    WILD,
    CompiledFunction,
)
from tessera.ptx.parser import Param, split_operands

_LABEL = re.compile(r"[A-Za-z_$%][\w$]*:\Z")
# register arithmetic whose operands are all plain names or numbers: "%rd6, %rd4, 16"
_PLAIN = re.compile(r"[A-Za-z_$%][\w$@]*(?:\s*,\s*(?:[A-Za-z_$%][\w$@]*|-?\d[\w]*))*\s*\Z")
# "dst, [base]" / "{d0, d1}, [base+16]": a load whose address is one name plus an optional offset
_LD_PLAIN = re.compile(r"([A-Za-z_$%][\w$@]*|\{[\w$@%,\s]*\})\s*,\s*\[\s*([A-Za-z_$%][\w$@]*)\s*(?:\+\s*-?\d+\s*)?\]\s*\Z")
_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_$%")


class _Bail(Exception):
    """The body needs the reference path."""


def _bail(line: int, what: str) -> Exception:
    return _Bail()


def lower_body(src: str, text: str, start: int, end: int, first_line: int, name: str,
               params: tuple[Param, ...], returns: tuple[Param, ...], is_entry: bool) -> tuple[CompiledFunction, dict[str, str]] | None:
    """(lowered function, declarations) of the body between ``start`` ("{") and ``end`` (past "}"),
    or None when the body needs the reference scanner."""
    decls: dict[str, str] = {}
    b = _Builder(_bail, tuple(p.name for p in params), tuple(p.name for p in returns),
                 {p.name: i for i, p in enumerate(params)} if is_entry else {}, decls)
    tr = b.transfers
    cats = _CATEGORY
    plain = _PLAIN.match
    ld_plain = _LD_PLAIN.match
    name_start = _NAME_START
    lineno = first_line - 1
    try:
        for raw in text[start + 1 : end - 1].split("\n"):
            lineno += 1
            s = raw.strip()
            if not s:
                continue
            c = s[0]
            if s[-1] != ";" or s.find(";") != len(s) - 1 or c == "{" or c == "}":
                if c == "." and s.split(None, 1)[0] in _IGNORED_DIRECTIVES or _LABEL.match(s):
                    continue
                return None  # braces, calls spanning lines, several statements, malformed lines
            if c == ".":
                if s.startswith(".reg"):
                    continue
                space = s.split(None, 1)[0]
                if space in _SPACES and space != ".param":  # a body .param only comes with calls
                    declare(s, space, [], decls, 0)
                    continue
                if space in _IGNORED_DIRECTIVES:
                    continue
                return None
            if c == "@":
                parts = s.split(None, 1)
                if len(parts) < 2 or _GUARD.match(parts[0]) is None:
                    return None
                s = parts[1]
            parts = s[:-1].split(None, 1)
            if not parts:
                return None
            op = parts[0]
            hit = cats.get(op)
            if hit is None:
                if _OPCODE.match(op) is None:
                    return None
                hit = _category(op)
            cat = hit[0]
            if cat == _C_IGNORE:
                continue
            if cat == _C_CALL:
                return None
            args = parts[1] if len(parts) > 1 else ""
            if (cat == _C_COPY or cat == _C_SCALE) and args and args[0] in name_start and plain(args) is not None:
                # plain register arithmetic: the first operand is the destination; numbers in the
                # source list are harmless (no name ever writes them)
                ops = args.replace(",", " ").split()
                if cat == _C_COPY:
                    tr.append((COPY, (ops[0],), ops[1:]))
                elif hit[1][0] == "shl" and _shift_ge_32(ops[-1]):
                    tr.append((SHL_HI, (ops[0],), tuple(o for o in ops[1:] if o[0] in name_start)))
                else:
                    tr.append((SCALE, (ops[0],), ops[1:]))
                continue
            if cat == _C_LD and args:
                m = ld_plain(args)
                if m is not None and _lower_load(b, op, hit[1], m.group(1), m.group(2), lineno):
                    continue
            elif cat == _C_CVTA and args and args[0] in name_start and plain(args) is not None:
                ops = args.replace(",", " ").split()
                tr.append((COPY, (ops[0],), ("<local>",) if _to_generic(hit[1]) else ops[1:]))
                continue
            lower_instruction(b, op, args, lineno, cat, hit[1])
    except Exception:  # _Bail, PtxSyntaxError, or anything else: the reference path reproduces it in order
        return None
    return b.finish(name), decls


def _to_generic(parts: list[str]) -> bool:
    return "to" not in parts and any(p.split("::")[0] in ("shared", "local") for p in parts)


_LD_INFO: dict[str, tuple[int, int, bool]] = {}  # opcode -> (state space, WILD if 64-bit, is an access site)


def _lower_load(b: _Builder, op: str, parts: list[str], dst_text: str, base: str, line: int) -> bool:
    """compile._load for a plain "dst, [base(+imm)]" operand pair; False when it must take that path."""
    info = _LD_INFO.get(op)
    if info is None:
        space = S_LOCAL if parts[0] == "ldmatrix" else _space(parts)
        info = _LD_INFO[op] = (space, WILD if any(p in _WIDE for p in parts) else 0,
                               space in (S_GLOBAL, S_GENERIC) and "const" not in parts)
    dst = (dst_text,) if dst_text[0] != "{" else tuple(_TOK.findall(dst_text))
    if dst_text[0] == "{" and split_operands(dst_text[1:-1]) is None:
        return False
    space = info[0]
    addr = (base,)
    if space == S_PARAM and (base in b.entry_params or base in b.fparams or b.locals.get(base) == ".param"):
        b.transfers.append((COPY, dst, ("=" + base,)))
        return True
    b.transfers.append((LOAD, dst, addr, space, info[1]))
    if info[2]:
        b.site(ACC_R, line, op, addr)
    return True
