"""Fused fast path: scans a well-formed function body straight into transfers and access sites.

The analysis must sustain >= 20 MB/s of PTX in pure Python, so the common body (one statement per
line, as nvcc and Triton write it) is lowered in a single pass without building `Instruction`s: one
strip, a find and one dict lookup on the opcode per line (ignored opcodes stop there); the opcode's
fast kind (computed once per distinct opcode) picks a handler for the operand shapes nvcc and Triton
emit (register arithmetic "a, b, 16" as one split, special registers, `ld`/`st` through
"[name+imm]", `mad`, `shfl` with a predicate destination, `cvta`, `cp.async` bookkeeping). nvcc's call
sequences (`{ .param ...; call ...; }`) are scoped and renamed exactly as body.parse_body does. A shape
a handler does not recognise goes to the reference lowering (compile.lower_instruction) for that one
instruction. Anything else — several statements on a line, braces around a statement, an unknown
directive, a malformed line or operand — returns None, and the parser redoes the body with the
reference scanner (body.py) and the analysis lowers it with compile.py: errors, their line numbers
and their order stay exactly those of the reference path.
"""

from __future__ import annotations

import re

from tessera.ptx.body import _GUARD, _IGNORED_DIRECTIVES, _OPCODE, _SPACES, _apply_renames, declare
from tessera.ptx.compile import (
    _C_CALL,
    _C_COPY,
    _C_CP,
    _C_CVTA,
    _C_IGNORE,
    _C_LD,
    _C_MAD,
    _C_SCALE,
    _C_ST,
    _TOK,
    _WIDE,
    ACC_R,
    ACC_W,
    _Builder,
    _category,
    _shift_ge_32,
    _space,
    lower_instruction,
)
from tessera.ptx.evaluate import (
    COPY,
    COPY1,
    LOAD,
    MAD,
    MEM,
    S_GENERIC,
    S_GLOBAL,
    S_LOCAL,
    S_PARAM,
    SCALE1,
    SHL_HI,
    WILD,
)
from tessera.ptx.parser import Param

_N = r"[A-Za-z_$%][\w$@]*"  # a name, as compile._TOK reads it
_V = rf"(?:{_N}|-?\d\w*)"  # a name or a number
_LABEL = re.compile(r"[A-Za-z_$%][\w$]*:\Z")
# register arithmetic whose operands are all plain names or numbers: "%rd6, %rd4, 16"
_PLAIN = re.compile(rf"{_N}(?:\s*,\s*{_V})*\s*\Z")
# "dst, [base]" / "{d0, d1}, [base+16]": a load whose address is one name plus an optional offset
_LD_PLAIN = re.compile(rf"({_N}|\{{[\w$@%,\s]*\}})\s*,\s*\[\s*({_N})\s*(?:\+\s*-?\d+\s*)?\]\s*\Z")
# "[base+16], %f1" / "[base], {%f1, %f2}": a store through one name plus an optional offset
_ST_PLAIN = re.compile(rf"\[\s*({_N})\s*(?:\+\s*-?\d+\s*)?\]\s*,\s*([^,\[\]{{}}()|]+|\{{[^{{}}\[\]()]*\}})\s*\Z")
# register arithmetic on names and numbers written "a, b, c" (as nvcc and Triton do): each
# ", "-separated piece is one whole name for _TOK, or a number, which has no name in it
_ARITH = re.compile(rf"{_N}(?:, (?:{_N}|-?\d\w*))*\Z")
# "%r3, %ctaid.x": a special register's component; _TOK reads "%ctaid"
_SPECIAL_RE = re.compile(rf"({_N}), ({_N})\.\w+\Z")
_MAD_PLAIN = re.compile(rf"({_N})\s*,\s*({_V})\s*,\s*({_V})\s*,\s*({_V})\s*\Z")
# shfl's "%r9|%p1, %r8, 16, 31, -1": two destinations, plain sources
_PIPE_PLAIN = re.compile(rf"({_N}\s*\|\s*{_N})\s*,\s*({_V}(?:\s*,\s*{_V})*)\s*\Z")
_NAME_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_$%")

# fast kinds of an opcode; _KINDS: opcode -> (kind, detail, category, opcode parts)
K_IGNORE, K_COPY, K_SCALE, K_SHL, K_MAD, K_LD, K_ST, K_CVTA, K_CP_NOP, K_CALL, K_OTHER = range(11)
_KINDS: dict[str, tuple[int, object, int, list[str]]] = {}


def _kind(op: str) -> tuple[int, object, int, list[str]]:
    cat, parts = _category(op)
    detail: object = None
    if cat == _C_IGNORE:
        kind = K_IGNORE
    elif cat == _C_COPY:
        kind = K_COPY
    elif cat == _C_SCALE:
        kind = K_SHL if parts[0] == "shl" else K_SCALE
    elif cat == _C_MAD:
        kind = K_MAD
    elif cat == _C_LD:
        kind = K_LD
        space = S_LOCAL if parts[0] == "ldmatrix" else _space(parts)
        detail = (space, WILD if any(p in _WIDE for p in parts) else 0,
                  space in (S_GLOBAL, S_GENERIC) and "const" not in parts)
    elif cat == _C_ST:
        kind = K_ST
        detail = S_LOCAL if parts[0] == "stmatrix" or "async" in parts else _space(parts)
    elif cat == _C_CVTA:
        kind = K_CVTA
        detail = "to" not in parts and any(p.split("::")[0] in ("shared", "local") for p in parts)
    elif cat == _C_CP and any(p in ("commit_group", "wait_group", "wait_all") for p in parts[1:4]):
        kind = K_CP_NOP  # bookkeeping: no memory effect (compile._copy_async)
    elif cat == _C_CALL:
        kind = K_CALL
    else:
        kind = K_OTHER
    hit = _KINDS[op] = (kind, detail, cat, parts)
    return hit


class _Bail(Exception):
    """The body needs the reference path."""


def _bail(line: int, what: str) -> Exception:
    return _Bail()


def lower_body(src: str, text: str, start: int, end: int, first_line: int, name: str,
               params: tuple[Param, ...], returns: tuple[Param, ...], is_entry: bool
               ) -> tuple[object, dict[str, str]] | None:
    """(lowered function, declarations) of the body between ``start`` ("{") and ``end`` (past "}"),
    or None when the body needs the reference scanner."""
    decls: dict[str, str] = {}
    entry_params = {p.name: i for i, p in enumerate(params)} if is_entry else {}
    b = _Builder(_bail, tuple(p.name for p in params), tuple(p.name for p in returns), entry_params, decls)
    append = b.transfers.append
    sites, site_addrs = b.sites, b.site_addrs
    fparams = b.fparams
    kinds = _KINDS.get
    findall = _TOK.findall
    arith = _ARITH.match
    _SPECIAL = _SPECIAL_RE.match
    name_start = _NAME_START
    scopes: list[dict[str, str]] = []  # brace scopes (call sequences), renamed as body.parse_body does
    rename: dict[str, str] = {}
    n_scopes = 0
    pending = ""  # a call whose operand lists continue on the next lines
    pending_k = 0
    try:
        for k, raw in enumerate(text[start + 1 : end - 1].split("\n")):
            s = raw.strip()
            if not s:
                continue
            if pending:
                pending += "\n" + s
                if s[-1] != ";":
                    continue
                s, pending, k = pending, "", pending_k
            c = s[0]
            if s[-1] != ";" or s.find(";") != len(s) - 1 or c == "{" or c == "}":
                if s == "{":
                    n_scopes += 1
                    scopes.append({})
                elif s == "}":
                    if not scopes:
                        return None
                    scopes.pop()
                    rename = {a: b for sc in scopes for a, b in sc.items()}
                elif c == "." and s.split(None, 1)[0] in _IGNORED_DIRECTIVES or _LABEL.match(s):
                    pass
                elif (c == "c" or c == "@") and s.startswith(("call", "@")) and "{" not in s and "}" not in s \
                        and ";" not in s:
                    pending, pending_k = s, k
                else:
                    return None  # several statements on a line, braces around a statement, malformed
                continue
            if c == ".":
                if s.startswith(".reg") and not scopes:
                    continue
                space = s.split(None, 1)[0]
                if space in _SPACES:
                    n_scopes = declare(s, space, scopes, decls, n_scopes)
                    if scopes:
                        rename = {a: b for sc in scopes for a, b in sc.items()}
                    continue
                if space in _IGNORED_DIRECTIVES:
                    continue
                return None
            if c == "@":
                parts = s.split(None, 1)
                if len(parts) < 2 or _GUARD.match(parts[0]) is None:
                    return None
                s = parts[1]
            sp = s.find(" ")  # nvcc and Triton write "op \targs;": a known opcode before the space is it
            h = kinds(s[:sp]) if sp > 0 else None
            if h is not None:
                if h[0] == K_IGNORE:
                    continue
                op, args = s[:sp], s[sp + 1 : -1].lstrip()  # as s[:-1].split(None, 1) would give them
            else:
                parts = s[:-1].split(None, 1)
                if not parts:
                    return None
                op = parts[0]
                h = kinds(op)
                if h is None:
                    if _OPCODE.match(op) is None:
                        return None
                    h = _kind(op)
                if h[0] == K_IGNORE:
                    continue
                args = parts[1] if len(parts) > 1 else ""
            kind = h[0]
            if rename:
                args = _apply_renames(args, rename)
            if kind <= K_SHL:  # K_COPY, K_SCALE, K_SHL
                if "." not in args and arith(args) is not None:  # "%rd6, %rd4, 16": as _TOK reads it
                    ops = args.split(", ")  # numbers among the sources never hold a value
                    if kind == K_COPY:
                        append((COPY1, ops))
                    elif kind == K_SHL and _shift_ge_32(ops[-1]):
                        append((SHL_HI, ops[:1], ops[1:]))
                    else:
                        append((SCALE1, ops))
                    continue
                m = _SPECIAL(args)
                if m is not None:  # "%r3, %ctaid.x"
                    append((COPY1 if kind == K_COPY else SCALE1, m.groups()))
                    continue
                if kind == K_COPY and "|" in args:
                    m = _PIPE_PLAIN.match(args)
                    if m is not None:
                        append((COPY, findall(m.group(1)), findall(m.group(2))))
                        continue
            elif kind == K_LD:
                m = _LD_PLAIN.match(args)
                if m is not None:
                    dst_text, base = m.groups()
                    dst = (dst_text,) if dst_text[0] != "{" else tuple(findall(dst_text))
                    space, wide, is_site = h[1]  # type: ignore[misc]
                    if space == S_PARAM and (base in entry_params or base in fparams
                                             or decls.get(base) == ".param"):
                        append((COPY, dst, ("=" + base,)))
                        continue
                    addr = (base,)
                    append((LOAD, dst, addr, space, wide))
                    if is_site:
                        site_addrs.append((len(sites), addr))
                        sites.append((ACC_R, first_line + k, op))
                    continue
            elif kind == K_ST:
                m = _ST_PLAIN.match(args)
                if m is not None:
                    base, srcs_text = m.groups()
                    space = h[1]
                    srcs = findall(srcs_text)
                    if space == S_PARAM:
                        if base in entry_params or base in fparams or decls.get(base) == ".param":
                            append((COPY, ("=" + base,), srcs))
                        continue
                    if space != S_GLOBAL:
                        append((COPY, (MEM,), srcs))
                    if space == S_GLOBAL or space == S_GENERIC:
                        site_addrs.append((len(sites), (base,)))
                        sites.append((ACC_W, first_line + k, op))
                    continue
            elif kind == K_CVTA:
                if args and args[0] in name_start and _PLAIN.match(args) is not None:
                    ops = args.replace(",", " ").split()
                    append((COPY, (ops[0],), ("<local>",) if h[1] else ops[1:]))
                    continue
            elif kind == K_MAD:
                m = _MAD_PLAIN.match(args)
                if m is not None:
                    d, x, y, z = m.groups()
                    append((MAD, (d,), findall(x + "," + y), findall(z)))
                    continue
            elif kind == K_CP_NOP:
                if not args or ("," not in args and "[" not in args and "{" not in args and "(" not in args
                                and "]" not in args and "}" not in args and ")" not in args):
                    continue
            lower_instruction(b, op, args, first_line + k, h[2], h[3])  # type: ignore[arg-type]
        if pending or scopes:
            return None
    except Exception:  # _Bail, PtxSyntaxError, or anything else: the reference path reproduces it in order
        return None
    return b.finish(name), decls
