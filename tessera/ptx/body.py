"""Function bodies, statement by statement: the reading of a body behind `parse_ptx` (parse stage).

nvcc and Triton write one statement per line, so the common line costs a strip, two character tests
and a split; anything else (labels, braces, several statements on a line, calls spanning lines) goes
through a general statement splitter.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tessera.errors import UserError


class PtxSyntaxError(UserError):
    """Malformed PTX: one line naming the source, the line number and the offending text."""


# A line that is not one plain statement (several on one line, a brace scope opened on the
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


def error_line(source: str, line: int, snippet: str, what: str) -> PtxSyntaxError:
    if len(snippet) > 80:
        snippet = snippet[:77] + "..."
    return PtxSyntaxError(f"{source}:{line}: {what}: {snippet!r}")


IGNORED_DIRECTIVES = (".loc", ".file", ".pragma", ".maxntid", ".reqntid", ".minnctapersm", ".maxnreg")


def parse_body(src: str, text: str, start: int, end: int, first_line: int
               ) -> tuple[tuple[Instruction, ...], dict[str, str]]:
    """Statements between the braces at ``start`` and ``end - 1``, read line by line (BodyReader)."""
    reader = BodyReader(src, first_line)
    for k, raw in enumerate(text[start + 1 : end - 1].split("\n")):
        reader.line(raw, k)
    reader.finish(text[start:start + 40])
    return tuple(reader.body), reader.decls


class BodyReader:
    """Reads a body one line at a time into ``body`` (Instructions) and ``decls`` (name -> state space).

    nvcc and Triton write one statement per line, so the common line costs a strip, two character tests
    and a split. Names declared in nested scopes are renamed ``name@scope`` so the `.param` block nvcc
    opens for each call, and inline-asm temporaries, stay apart from their namesakes elsewhere. A call
    whose operand lists span lines is ``pending`` until its ";". The accelerated path (fast.py) hands
    this reader every line its C scanner does not settle, so both paths read lines the same way."""

    def __init__(self, src: str, first_line: int) -> None:
        self.src, self.first_line = src, first_line
        self.body: list[Instruction] = []
        self.decls: dict[str, str] = {}
        self.scopes: list[dict[str, str]] = []
        self.rename: dict[str, str] = {}
        self.n_scopes = 0
        self.pending = ""  # a call whose operand lists continue on the next lines
        self.pending_line = 0

    def line(self, raw: str, k: int) -> None:
        """Reads line ``k`` (0-based within the body); raises PtxSyntaxError on a malformed line."""
        s = raw.strip()
        if not s:
            return
        if self.pending:
            self.pending += "\n" + s
            if s[-1] != ";":
                return
            s, self.pending = self.pending, ""
            lineno = self.pending_line
        else:
            lineno = self.first_line + k
        c = s[0]
        if s[-1] == ";" and s.find(";") == len(s) - 1 and c != "{" and c != "}":
            self.statement(s, lineno)
        elif c == "." and ";" not in s and s.split(None, 1)[0] in IGNORED_DIRECTIVES:
            return  # .loc / .file / .maxntid lines carry no semicolon; one with a ";" inside is split
        elif s.startswith(("call", "@")) and "{" not in s and "}" not in s and ";" not in s:
            self.pending, self.pending_line = s, lineno
        else:  # labels, braces, several statements on one line: the general statement splitter
            self.split(s, lineno)

    def statement(self, s: str, lineno: int) -> None:
        """One statement ``s`` ending in its only ";"."""
        c = s[0]
        if c == ".":
            if s.startswith(".reg") and not self.scopes:
                return
            space = s.split(None, 1)[0]
            if space in SPACES:
                self.n_scopes = declare(s, space, self.scopes, self.decls, self.n_scopes)
                if self.scopes:
                    self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
            elif space not in IGNORED_DIRECTIVES:
                raise error_line(self.src, lineno, s, "unknown directive in function body")
            return
        guard = ""
        if c == "@":
            parts = s.split(None, 1)
            if len(parts) < 2 or GUARD.match(parts[0]) is None:
                raise error_line(self.src, lineno, s, "malformed predicate guard")
            guard, s = parts[0][1:], parts[1]
        parts = s[:-1].split(None, 1)
        op = parts[0] if parts else ""
        if op not in _VALID_OPS:
            if OPCODE.match(op) is None:
                raise error_line(self.src, lineno, s, "cannot parse statement")
            _VALID_OPS.add(op)
        args = parts[1] if len(parts) > 1 else ""
        if self.rename:
            args = apply_renames(args, self.rename)
        self.body.append(_new_instruction(Instruction, (op, args, guard, lineno)))

    def split(self, s: str, lineno: int) -> None:
        for open_, close, _label, stmt, bad in STMT.findall(s):
            if open_:
                self.n_scopes += 1
                self.scopes.append({})
            elif close:
                if not self.scopes:
                    raise error_line(self.src, lineno, s, "unbalanced '}'")
                self.scopes.pop()
                self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
            elif stmt:
                if stmt == s:  # would split to itself forever (a ";" inside braces, "{%f1;, %f2}")
                    raise error_line(self.src, lineno, s, "cannot parse statement (';' inside braces?)")
                sub = parse_body(self.src, "{" + stmt + "}", 0, len(stmt) + 2, lineno)
                merge_sub(sub, self.body, self.decls, self.scopes, self.rename)
                if self.scopes and sub[1]:
                    self.rename = {a: b for sc in self.scopes for a, b in sc.items()}
            elif bad:
                raise error_line(self.src, lineno, s, "cannot parse statement (missing ';'?)")

    def finish(self, head: str) -> None:
        """Checks the body ended cleanly; ``head`` is the body's first characters, for the message."""
        if self.pending:
            raise error_line(self.src, self.pending_line, self.pending.split("\n")[0], "call never ends with ';'")
        if self.scopes:
            raise error_line(self.src, self.first_line, head.strip(), "unclosed '{' in function body")


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


