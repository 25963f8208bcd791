"""The general per-line reading of a body for the fast lowering (lower.py), and its opcode tables.

`LineScan.line` reads one line exactly as body.parse_body does and hands back one statement, written
"op args;", for lower.py's operand handlers; it settles on its own what has nothing to lower (blank
lines, labels, directives, brace scopes with nvcc's call-sequence renaming, calls spanning lines) and
lowers statements in braces (inline asm) with the reference lowering. Every line it classifies also
teaches `PREFIX_TABLE` the line's prefix, so the next line with that prefix skips this reading.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tessera.ptx.body import (
    GUARD,
    IGNORED_DIRECTIVES,
    OPCODE,
    SPACES,
    STMT,
    Instruction,
    apply_renames,
    declare,
    merge_sub,
    parse_body,
)
from tessera.ptx.compile import (
    C_CALL,
    C_COPY,
    C_CP,
    C_CVTA,
    C_IGNORE,
    C_LD,
    C_MAD,
    C_SCALE,
    C_ST,
    WIDE,
    Builder,
    category_of,
    lower_instruction,
    space_of,
)
from tessera.ptx.evaluate import S_GENERIC, S_GLOBAL, S_LOCAL, WILD

LABEL = re.compile(r"[A-Za-z_$%][\w$]*:\Z")

# fast kinds of an opcode; KINDS: opcode -> (kind, detail, category, opcode parts). Ordered by how
# lower.py tests them: register arithmetic first (most lines), K_IGNORE last so `kind >= K_IGNORE` also
# catches the prefix markers below with one comparison on the common path.
K_COPY, K_SCALE, K_SHL, K_LD, K_ST, K_CVTA, K_MAD, K_CP_NOP, K_CALL, K_OTHER, K_IGNORE = range(11)
KINDS: dict[str, tuple[int, object, int, list[str]]] = {}


def _kind(op: str) -> tuple[int, object, int, list[str]]:
    cat, parts = category_of(op)
    detail: object = None
    if cat == C_IGNORE:
        kind = K_IGNORE
    elif cat == C_COPY:
        kind = K_COPY
    elif cat == C_SCALE:
        kind = K_SHL if parts[0] == "shl" else K_SCALE
    elif cat == C_MAD:
        kind = K_MAD
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
        kind = K_CP_NOP  # bookkeeping: no memory effect (compile._copy_async)
    elif cat == C_CALL:
        kind = K_CALL
    else:
        kind = K_OTHER
    hit = KINDS[op] = (kind, detail, cat, parts)
    return hit


# Markers in PREFIX_TABLE for raw-line prefixes that are no opcode (values share KINDS' shape). K_BLANK keys a
# whole line of blanks/tabs (a comment-only line once comments are stripped); it applies only to a line
# without a space that equals the key.
K_GUARD, K_REG, K_SKIPDIR, K_BLANK = 100, 101, 102, 103
BLANK_ENTRY: tuple[int, object, int, list[str], str] = (K_BLANK, None, 0, [], "")
# The text of a raw line up to its first space ("\tadd.s64", "\t@%p1", "\t.reg") -> (kind, detail, category,
# opcode parts, opcode), or a marker. Filled from lines the general per-line code classified, only with
# prefixes that are blanks and tabs followed by a checked opcode or guard, so a hit means exactly what the
# general code would have concluded for the same line (lower.py also learns whole lines of blanks and tabs
# as K_BLANK). It caches opcode classification, not results.
PREFIX_TABLE: dict[str, tuple[int, object, int, list[str], str]] = {}

class LineScan:
    """body.parse_body's reading of one line, for the lines the prefix dispatch does not settle: blank
    lines, labels, directives, brace scopes (nvcc's call sequences, renamed as parse_body renames them),
    calls spanning lines, statements in braces (inline asm), and the first line of each opcode."""

    def __init__(self, src: str, b: Builder, decls: dict[str, str], first_line: int) -> None:
        self.src, self.b, self.decls, self.first_line = src, b, decls, first_line
        self.scopes: list[dict[str, str]] = []
        self.rename: dict[str, str] = {}
        self.n_scopes = 0

    def line(self, raw: str | None, k: int, lines: Iterator[tuple[int, str]], s: str = ""
             ) -> tuple[str, int, tuple, int] | bool | None:  # type: ignore[type-arg]
        """None: nothing to lower; False: the body needs the reference path; else (line, position of the
        space after the opcode, kind, line index) of one statement, written "op args;"."""
        s = s or raw.strip()  # type: ignore[union-attr]
        if not s:
            return None
        c = s[0]
        if s[-1] == ";" and s.find(";") == len(s) - 1 and c != "{" and c != "}":
            return self.statement(raw, s, k)
        if s == "{":
            self.n_scopes += 1
            self.scopes.append({})
        elif s == "}":
            if not self.scopes:
                return False
            self.scopes.pop()
            self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
        elif c == "." and ";" not in s and s.split(None, 1)[0] in IGNORED_DIRECTIVES:
            if raw is not None:
                _learn(raw, None, "")
        elif LABEL.match(s):
            pass
        elif (c == "c" or c == "@") and s.startswith(("call", "@")) and "{" not in s and "}" not in s \
                and ";" not in s:  # a call whose operand lists continue on the next lines: read to its ";"
            for _, more in lines:
                t = more.strip()
                if t:
                    s += "\n" + t
                    if t[-1] == ";":
                        return self.line(None, k, lines, s)
            return False
        else:
            return self.braces(s, k)
        return None

    def statement(self, raw: str | None, s: str, k: int) -> tuple[str, int, tuple, int] | bool | None:  # type: ignore[type-arg]
        c = s[0]
        if c == ".":
            if s.startswith(".reg") and not self.scopes:
                if raw is not None:
                    _learn(raw, None, "")
                return None
            space = s.split(None, 1)[0]
            if space in SPACES:
                self.n_scopes = declare(s, space, self.scopes, self.decls, self.n_scopes)
                if self.scopes:
                    self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
                return None
            return None if space in IGNORED_DIRECTIVES else False
        if c == "@":
            parts = s.split(None, 1)
            if len(parts) < 2 or GUARD.match(parts[0]) is None:
                return False
            if raw is not None:
                _learn(raw, None, "")
                raw = None
            s = parts[1]
        sp = s.find(" ")  # nvcc and Triton write "op \targs;": a known opcode before the space is it
        h = KINDS.get(s[:sp]) if sp > 0 else None
        if h is not None:
            op, args = s[:sp], s[sp + 1 : -1].lstrip()  # as s[:-1].split(None, 1) would give them
        else:
            parts = s[:-1].split(None, 1)
            if not parts:
                return False
            op = parts[0]
            h = KINDS.get(op)
            if h is None:
                if OPCODE.match(op) is None:
                    return False
                h = _kind(op)
            args = parts[1] if len(parts) > 1 else ""
        if raw is not None:
            _learn(raw, h, op)
        if h[0] == K_IGNORE:
            return None
        if self.rename:
            args = apply_renames(args, self.rename)
        return op + " " + args + ";", len(op), (*h, op), k

    def braces(self, s: str, k: int) -> bool | None:
        """Statements in braces on one line (inline asm): parse_body's statement splitter, lowered here."""
        lineno = self.first_line + k
        for open_, close, _label, stmt, bad in STMT.findall(s):
            if open_:
                self.n_scopes += 1
                self.scopes.append({})
            elif close:
                if not self.scopes:
                    return False
                self.scopes.pop()
                self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
            elif stmt:
                if stmt == s:
                    return False
                sub = parse_body(self.src, "{" + stmt + "}", 0, len(stmt) + 2, lineno)
                instrs: list[Instruction] = []
                merge_sub(sub, instrs, self.decls, self.scopes, self.rename)
                if self.scopes and sub[1]:
                    self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
                for op, args, _, line in instrs:
                    cat, parts = category_of(op)
                    if cat != C_IGNORE:
                        lower_instruction(self.b, op, args, line, cat, parts)
            elif bad:
                return False
        return None


def _learn(raw: str, h: tuple[int, object, int, list[str]] | None, op: str) -> None:
    sp = raw.find(" ")
    if len(PREFIX_TABLE) > 50_000:
        return
    if sp < 0:  # a whole statement without operands ("\tret;"), learnt as the line itself
        if h is not None and h[0] == K_IGNORE and raw.lstrip(" \t") == op + ";":
            PREFIX_TABLE[raw] = (*h, op)
        return
    if sp == 0:
        return
    pre = raw[:sp]
    if pre in PREFIX_TABLE:  # learnt already (lines in brace scopes come here every time): same prefix, same entry
        return
    word = pre.lstrip(" \t")
    if not word or pre[: len(pre) - len(word)].strip(" \t"):
        return
    if h is not None and word == op:
        PREFIX_TABLE[pre] = (*h, op)
    elif word[0] == "@" and GUARD.match(word) is not None:
        PREFIX_TABLE[pre] = (K_GUARD, None, 0, [], "")
    elif word == ".reg":
        PREFIX_TABLE[pre] = (K_REG, None, 0, [], "")
    elif word.split(None, 1)[0] in IGNORED_DIRECTIVES:
        PREFIX_TABLE[pre] = (K_SKIPDIR, None, 0, [], "")
