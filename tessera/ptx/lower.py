"""Fused fast path: scans a function body straight into transfers and access sites.

The analysis must sustain >= 20 MB/s of PTX in pure Python, so the per-line work is cut to the bone
for the form nvcc and Triton write ("\top \targs;", one statement per line): the line's text up to its
first space is looked up in scan.PREFIX_TABLE (a prefix learnt from an earlier line: an opcode with its fast
kind, a guard, `.reg`, `.loc`), ignored opcodes stop there, and one regex per operand shape, matched on
the raw line from the opcode through the final ";", both checks the line is one statement and yields
its operands: register arithmetic "a, b, 16" (one split into a single COPY1 / SCALE1 transfer), special
registers (`%ctaid.x`), shfl's `%r|%p` destinations, `mad`, `cvta`, `ld`/`st` through "[name+imm]",
`cp.async` bookkeeping. A shape no regex takes goes to the reference lowering
(compile.lower_instruction) for that one instruction; a line no prefix settles (blank lines, labels,
declarations, call sequences, calls spanning lines, inline asm in braces, the first line of a new
opcode) is read by scan.LineScan exactly as body.parse_body reads it. Anything that would be an error, or
that the reference scanner reads differently (several statements on a line, an unknown directive, a
malformed line or operand), returns None, and the parser redoes the body with the reference scanner
(body.py) and the analysis lowers it with compile.py: errors, their line numbers and their order stay
exactly those of the reference path. tests/ptx/test_ptx_lower.py and test_ptx_fast.py hold both paths
to the same results.
"""

from __future__ import annotations

import re

from tessera.ptx.compile import ACC_R, ACC_W, TOKEN, Builder, lower_instruction
from tessera.ptx.evaluate import COPY, LOAD, MAD, MEM, S_GENERIC, S_GLOBAL, S_LOCAL, S_PARAM, SCALE1, SHL_HI
from tessera.ptx.native import load as load_native
from tessera.ptx.parser import Param
from tessera.ptx.scan import (
    BLANK_ENTRY,
    K_BLANK,
    K_CALL,
    K_COPY,
    K_CP_NOP,
    K_CVTA,
    K_GUARD,
    K_IGNORE,
    K_LD,
    K_MAD,
    K_OTHER,
    K_REG,
    K_SCALE,
    K_SHL,
    K_SKIPDIR,
    K_ST,
    KINDS,
    LABEL,
    PREFIX_TABLE,
    LineScan,
)


def native_scanner() -> type | None:
    """The C scanner (native.py), or None."""
    mod = load_native("LAYOUT", (K_COPY, K_SCALE, K_SHL, K_LD, K_ST, K_CVTA, K_MAD, K_CP_NOP, K_CALL, K_OTHER,
                                 K_IGNORE, K_GUARD, K_REG, K_SKIPDIR, K_BLANK, COPY, MAD, SHL_HI, LOAD, SCALE1,
                                 S_GLOBAL, S_LOCAL, S_PARAM, S_GENERIC, ACC_R, ACC_W, MEM, "<local>"))
    return None if mod is None else mod.Scanner  # type: ignore[no-any-return]


class _Bail(Exception):
    """The body needs the reference path."""


def _bail(line: int, what: str) -> Exception:
    return _Bail()


# Operand shapes checked on the raw line from the space after the opcode through the final ";" (so one
# match also proves the line is one statement ending in ";"). ASCII-only and at most as permissive as the
# reference reading (compile.TOKEN, split_operands): a line they do not match takes the reference
# lowering for that instruction, so being strict only costs speed.
_NA = r"[A-Za-z_$%][\w$@]*+"
_ARITH_RAW = re.compile(rf"[ \t]*+({_NA}(?:, (?:{_NA}|-?\d\w*+))*+);\Z", re.A)
_SPECIAL_RAW = re.compile(rf"[ \t]*+({_NA}), ({_NA})\.\w++;\Z", re.A)
# _ARITH_RAW, else _SPECIAL_RAW (group 2, 3), in one call: a special register line ("%r3, %ctaid.x", one
# register-arithmetic line in five) costs one regex call instead of a failed one and a second one
ARITH_OR_SPECIAL = re.compile(rf"[ \t]*+(?:({_NA}(?:, (?:{_NA}|-?\d\w*+))*+)|({_NA}), ({_NA})\.\w++);\Z", re.A)
_PIPE_RAW = re.compile(rf"[ \t]*+({_NA})\|({_NA}), ({_NA}(?:, (?:{_NA}|-?\d\w*+))*+);\Z", re.A)
_LD_RAW = re.compile(rf"[ \t]*+({_NA}|\{{[\w$@%, \t]*+\}})[ \t]*+,[ \t]*+\[[ \t]*+({_NA})[ \t]*+"
                     rf"(?:\+[ \t]*+-?\d++[ \t]*+)?\][ \t]*+;\Z", re.A)
_ST_RAW = re.compile(rf"[ \t]*+\[[ \t]*+({_NA})[ \t]*+(?:\+[ \t]*+-?\d++[ \t]*+)?\][ \t]*+,[ \t]*+"
                     rf"([^,\[\]{{}}()|;\n]+|\{{[^{{}}\[\]();\n]*+\}})[ \t]*+;\Z", re.A)


NATIVE_SCANNER = native_scanner()


def lower_body(src: str, text: str, start: int, end: int, first_line: int, name: str,
               params: tuple[Param, ...], returns: tuple[Param, ...], is_entry: bool
               ) -> tuple[object, dict[str, str], int] | None:
    """(lowered function, declarations, newlines in the body) of the body between ``start`` ("{") and
    ``end`` (past "}"), or None when the body needs the reference scanner."""
    decls: dict[str, str] = {}
    entry_params = {p.name: i for i, p in enumerate(params)} if is_entry else {}
    b = Builder(_bail, tuple(p.name for p in params), tuple(p.name for p in returns), entry_params, decls)
    append = b.transfers.append
    sites, site_addrs = b.sites, b.site_addrs
    fparams = b.fparams
    rawk = PREFIX_TABLE.get
    findall = TOKEN.findall
    arith, ld_raw, st_raw = _ARITH_RAW.match, _LD_RAW.match, _ST_RAW.match
    arith_special = ARITH_OR_SPECIAL.match
    st = LineScan(src, b, decls, first_line)
    body_lines = text[start + 1 : end - 1].split("\n")
    lines = enumerate(body_lines)
    renaming: dict[str, str] = {}  # st.rename, refreshed after each line the general code reads
    # the native scanner settles the lines this loop would settle by prefix + operand regex, the same
    # way, and yields the rest; st.line reads a call's continuation lines from `lines` either way
    it = lines if NATIVE_SCANNER is None else NATIVE_SCANNER(lines, st.scopes, PREFIX_TABLE, KINDS, b.transfers, sites, site_addrs,
                                                 entry_params, fparams, decls, first_line)
    try:
        for k, raw in it:
            # nvcc and Triton write "\top \targs;": a known prefix up to the first space settles the line
            # with one dict lookup, and the operand regex below checks the rest through the final ";".
            # Anything else (blank lines, labels, a new opcode, blanks after the ";") takes LineScan.line.
            # partition, not find + slice: str.find parses its arguments with PyArg_ParseTuple (~1,000
            # machine instructions a call here), partition takes one argument and yields the prefix.
            if not raw:  # an empty line (one in six): before any other work
                continue
            pre, sep, post = raw.partition(" ")  # post: the text after the first space, from which the
            h = rawk(pre)  # operand regexes match; no space: a whole line learnt as ignorable ("\tret;")
            line = raw
            if h is not None:
                kind = h[0]
                if kind >= K_IGNORE:  # an ignored opcode or a marker: one test on the common path
                    # "one statement": the first ";" after the first space is the line's last character
                    if kind == K_IGNORE:
                        if (post.find(";") == len(post) - 1 >= 0) if sep else raw[-1] == ";":
                            continue
                        h = None
                    elif kind == K_SKIPDIR and ";" not in raw:  # .loc / .file lines
                        continue
                    elif kind == K_GUARD and sep and post.find(";") == len(post) - 1 >= 0:
                        line = post.lstrip()  # as s.split(None, 1)[1] gives it
                        op, sep, post = line.partition(" ")
                        h = KINDS.get(op) if sep else None
                        if h is not None:
                            kind = h[0]
                            if kind == K_IGNORE:
                                continue
                            h = (*h, op)
                    elif kind == K_REG and sep and not st.scopes and post.find(";") == len(post) - 1 >= 0:
                        continue
                    elif kind == K_BLANK and not sep:  # the line is the key: blanks and tabs only
                        continue
                    else:
                        h = None
            if h is None or renaming:
                if raw.isspace():  # a blank line; one without a space is learnt as such
                    if not sep and len(PREFIX_TABLE) < 50_000:
                        PREFIX_TABLE[raw] = BLANK_ENTRY
                    continue
                if raw[-1] == ":" and LABEL.match(raw) is not None:
                    continue  # a label in column 0
                got = st.line(raw, k, lines)
                renaming = st.rename
                if got is None:
                    continue
                if got is False:
                    return None
                line, sp, h, k = got
                post, sep = line[sp + 1 :], " "
                kind = h[0]
            if kind <= K_SHL:  # K_COPY, K_SCALE, K_SHL: "%rd6, %rd4, 16" as TOKEN reads it
                m = arith_special(post)
                if m is not None:
                    text_ = m[1]
                    if text_ is None:  # "%r3, %ctaid.x"
                        ops = [m[2], m[3]]
                        append(ops if kind == K_COPY else (SCALE1, ops))
                        continue
                    ops = text_.split(", ")  # numbers among the sources never hold a value
                    if kind == K_COPY:
                        append(ops)  # a COPY1 transfer is the bare list (evaluate.py): no tuple per line
                    elif kind == K_SHL and ops[-1].isdecimal() and int(ops[-1]) >= 32:  # _shift_ge_32
                        append((SHL_HI, ops[:1], ops[1:]))
                    else:
                        append((SCALE1, ops))
                    continue
                if kind == K_COPY:
                    m = _PIPE_RAW.match(post)
                    if m is not None:  # shfl's "%r9|%p1, %r8, 16, 31, -1"
                        append((COPY, m.groups()[:2], m[3].split(", ")))
                        continue
            elif kind == K_LD:
                m = ld_raw(post)
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
                        sites.append((ACC_R, first_line + k, h[4]))
                    continue
            elif kind == K_ST:
                m = st_raw(post)
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
                        sites.append((ACC_W, first_line + k, h[4]))
                    continue
            elif kind == K_CVTA:
                m = arith(post)
                if m is not None:
                    ops = m[1].split(", ")
                    append((COPY, ops[:1], ("<local>",) if h[1] else ops[1:]))
                    continue
            elif kind == K_MAD:
                m = arith(post)
                if m is not None:
                    ops = m[1].split(", ")
                    if len(ops) == 4:
                        append((MAD, ops[:1], ops[1:3], ops[3:]))
                        continue
            elif kind == K_CP_NOP and sep and post.find(";") == len(post) - 1 >= 0:
                args = post[:-1]
                if ("," not in args and "[" not in args and "{" not in args and "(" not in args
                        and "]" not in args and "}" not in args and ")" not in args):
                    continue
            if line is raw and not (sep and post.find(";") == len(post) - 1 >= 0):  # not one statement: general code
                got = st.line(raw, k, lines)
                renaming = st.rename
                if got is None:
                    continue
                if got is False:
                    return None
                line, sp, h, k = got
                post = line[sp + 1 :]
            lower_instruction(b, h[4], post[:-1].lstrip(), first_line + k, h[2], h[3])  # type: ignore[arg-type]
        if st.scopes:
            return None
    except Exception:  # _Bail, PtxSyntaxError, or anything else: the reference path reproduces it in order
        return None
    return b.finish(name), decls, len(body_lines) - 1
