"""Function bodies, statement by statement: the reference scanner behind `parse_ptx`.

nvcc and Triton write one statement per line, so the common line costs a strip, two character tests
and a split; anything else (labels, braces, several statements on a line, calls spanning lines) goes
through a general statement splitter. lower.py scans well-formed bodies faster and falls back here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tessera.errors import UserError


class PtxSyntaxError(UserError):
    """Malformed PTX: one line naming the source, the line number and the offending text."""


# A body statement the fast path does not cover (several on one line, a brace scope opened on the
# line of a statement): split by this pattern, a call's operand lists may span lines.
STMT = re.compile(
    r"""\s*(?:(?P<open>\{)|(?P<close>\})|(?P<label>[A-Za-z_$%][\w$]*):(?!:)
    |(?P<stmt>[^;{}]*+(?:\{[^{}]*+\}[^;{}]*+)*+;)|(?P<bad>\S[^\n]*))""",
    re.X,
)
RENAME_TOKEN = re.compile(r"(?<![\w$.%])[A-Za-z_$%][\w$]*")
_VALID_OPS: set[str] = set()  # opcodes already checked against OPCODE
OPCODE = re.compile(r"[a-z_][\w.:]*\Z")
GUARD = re.compile(r"@!?[%$A-Za-z_][\w$]*\Z")
DECL_NAME = re.compile(r"([A-Za-z_$%][\w$]*+)\s*(?:<\s*(\d+)\s*>|\[\s*(\d*)\s*\])?\s*(?:=|;|,|$)")


SPACES = (".global", ".const", ".shared", ".local", ".param", ".reg", ".tex")


class Instruction(NamedTuple):
    """One statement of a function body."""

    op: str  # full opcode with modifiers, e.g. "ld.global.nc.v4.f32"
    args: str  # raw operand text, without the ";" (spans lines only for `call`)
    guard: str  # "" or the predicate, "!%p1" for a negated guard
    line: int  # 1-based line number in the source


_new_instruction = tuple.__new__  # tuple.__new__(Instruction, (...)) skips NamedTuple's Python __new__


def _error_line(source: str, line: int, snippet: str, what: str) -> PtxSyntaxError:
    if len(snippet) > 80:
        snippet = snippet[:77] + "..."
    return PtxSyntaxError(f"{source}:{line}: {what}: {snippet!r}")


IGNORED_DIRECTIVES = (".loc", ".file", ".pragma", ".maxntid", ".reqntid", ".minnctapersm", ".maxnreg")


def parse_body(src: str, text: str, start: int, end: int, first_line: int
                ) -> tuple[tuple[Instruction, ...], dict[str, str]]:
    """Statements between the braces at ``start`` and ``end - 1``, one line at a time: nvcc and Triton
    write one statement per line, so the common line costs a strip, two character tests and a split.
    Names declared in nested scopes are renamed ``name@scope`` so the `.param` block nvcc opens for
    each call, and inline-asm temporaries, stay apart from their namesakes elsewhere."""
    body: list[Instruction] = []
    decls: dict[str, str] = {}
    scopes: list[dict[str, str]] = []
    rename: dict[str, str] = {}
    n_scopes = 0
    new, cls = _new_instruction, Instruction
    lines = text[start + 1 : end - 1].split("\n")
    pending = ""  # a call whose operand lists continue on the next lines
    pending_line = 0
    for k, raw in enumerate(lines):
        s = raw.strip()
        if not s:
            continue
        if pending:
            pending += "\n" + s
            if s[-1] != ";":
                continue
            s, pending = pending, ""
            lineno = pending_line
        else:
            lineno = first_line + k
        c = s[0]
        if s[-1] == ";" and s.find(";") == len(s) - 1 and c != "{" and c != "}":
            if c == ".":
                if s.startswith(".reg") and not scopes:
                    continue
                space = s.split(None, 1)[0]
                if space in SPACES:
                    n_scopes = declare(s, space, scopes, decls, n_scopes)
                    if scopes:
                        rename = {a: b for sc in scopes for a, b in sc.items()}
                elif space not in IGNORED_DIRECTIVES:
                    raise _error_line(src, lineno, s, "unknown directive in function body")
                continue
            guard = ""
            if c == "@":
                parts = s.split(None, 1)
                if len(parts) < 2 or GUARD.match(parts[0]) is None:
                    raise _error_line(src, lineno, s, "malformed predicate guard")
                guard, s = parts[0][1:], parts[1]
            parts = s[:-1].split(None, 1)
            op = parts[0] if parts else ""
            if op not in _VALID_OPS:
                if OPCODE.match(op) is None:
                    raise _error_line(src, lineno, s, "cannot parse statement")
                _VALID_OPS.add(op)
            args = parts[1] if len(parts) > 1 else ""
            if rename:
                args = apply_renames(args, rename)
            body.append(new(cls, (op, args, guard, lineno)))
        elif c == "." and ";" not in s and s.split(None, 1)[0] in IGNORED_DIRECTIVES:
            continue  # .loc / .file / .maxntid lines carry no semicolon; one with a ";" inside is split
        elif s.startswith(("call", "@")) and "{" not in s and "}" not in s and ";" not in s:
            pending, pending_line = s, lineno
        else:  # labels, braces, several statements on one line: the general statement splitter
            for open_, close, _label, stmt, bad in STMT.findall(s):
                if open_:
                    n_scopes += 1
                    scopes.append({})
                elif close:
                    if not scopes:
                        raise _error_line(src, lineno, s, "unbalanced '}'")
                    scopes.pop()
                    rename = {a: b for sc in scopes for a, b in sc.items()}
                elif stmt:
                    if stmt == s:  # would split to itself forever (a ";" inside braces, "{%f1;, %f2}")
                        raise _error_line(src, lineno, s, "cannot parse statement (';' inside braces?)")
                    sub = parse_body(src, "{" + stmt + "}", 0, len(stmt) + 2, lineno)
                    merge_sub(sub, body, decls, scopes, rename)
                    if scopes and sub[1]:
                        rename = {a: b for sc in scopes for a, b in sc.items()}
                elif bad:
                    raise _error_line(src, lineno, s, "cannot parse statement (missing ';'?)")
    if pending:
        raise _error_line(src, pending_line, pending.split("\n")[0], "call never ends with ';'")
    if scopes:
        raise _error_line(src, first_line, text[start:start + 40].strip(), "unclosed '{' in function body")
    return tuple(body), decls


_RENAME_SPLIT = re.compile("(" + RENAME_TOKEN.pattern + ")")


def apply_renames(args: str, rename: dict[str, str]) -> str:
    """RENAME_TOKEN.sub(rename each token) without a Python callback per token: split keeps the tokens
    at the odd indices (the pattern never matches empty), map(rename.get) swaps them in C."""
    parts = _RENAME_SPLIT.split(args)
    if len(parts) > 1:
        toks = parts[1::2]
        parts[1::2] = map(rename.get, toks, toks)
    return "".join(parts)


def merge_sub(sub: tuple[tuple[Instruction, ...], dict[str, str]], body: list[Instruction],
               decls: dict[str, str], scopes: list[dict[str, str]], rename: dict[str, str]) -> None:
    """Adds one statement parsed on its own to the enclosing body, applying the current renames."""
    instrs, sub_decls = sub
    for ins in instrs:
        args = apply_renames(ins.args, rename) if rename else ins.args
        body.append(ins._replace(args=args))
    for name, space in sub_decls.items():
        if scopes and space in (".param", ".reg", ".local", ".shared"):
            new = f"{name}@{id(scopes[-1])}"
            scopes[-1][name] = new
            name = new
        decls[name] = space


def declare(s: str, space: str, scopes: list[dict[str, str]], decls: dict[str, str], n_scopes: int) -> int:
    rest = s.split(None, 1)[1] if " " in s or "\t" in s else ""
    for name, _, _ in DECL_NAME.findall(rest.split("=", 1)[0] + ";"):
        if name.startswith("."):
            continue
        if scopes:
            new = f"{name}@{n_scopes}"
            scopes[-1][name] = new
            name = new
        decls[name] = space
    return n_scopes


