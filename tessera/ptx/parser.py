"""PTX parser: module directives, .entry/.func headers with parameters, bodies as statements.

Built for PTX as nvcc 12-13 and Triton emit it. The parser is regex-driven (one master pattern per
level, run by the C regex engine over whole function bodies) because the analysis must sustain tens
of MB/s; operands stay raw text until the analysis asks for them (``split_operands``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

from tessera.errors import UserError


class PtxSyntaxError(UserError):
    """Malformed PTX: one line naming the source, the line number and the offending text."""


# Comments go first; strings are kept so that "//" inside a .file path survives. Block comments are
# replaced by their newlines so line numbers stay those of the original text.
_COMMENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|//[^\n]*|/\*[\s\S]*?\*/')
_UNTERMINATED = re.compile(r"/\*")
_LINE_COMMENT = re.compile(r"//[^\n]*+")
_SLASHED_STRING = re.compile(r'"[^"\n]*/[/*]')

_TOP = re.compile(
    r"""\s*(?:
      (?P<line>\.(?:version|target|address_size|file|loc)\b[^\n]*)
    | (?P<section>\.section\b[^{;\n]*)
    | (?P<func>(?:\.(?:visible|extern|weak|weak_odr|common)\s+)*\.(?:entry|func)\b)
    | (?P<decl>\.[a-z][^;{}]*(?:\{[^{}]*\}[^;{}]*)?;)
    | (?P<bad>\S[^\n]*)
    )""",
    re.X,
)
_HEADER = re.compile(
    r"""\s*(?:\((?P<ret>[^()]*)\)\s*)?(?P<name>[A-Za-z_$%][\w$]*)\s*
        (?:\((?P<params>[^()]*)\))?(?P<attrs>[^{;()]*)(?P<end>[{;])""",
    re.X,
)
_PARAM = re.compile(
    r"""\s*\.(?P<kind>param|reg)\s+(?P<mods>(?:\.[\w:]+(?:\s+\d+)?\s+)*?)
        (?P<type>\.[a-z]\w*)\s+(?:(?P<mods2>(?:\.[\w:]+(?:\s+\d+)?\s+)*))?(?P<name>[A-Za-z_$%][\w$]*)
        \s*(?:\[\s*(?P<count>\d*)\s*\])?\s*$""",
    re.X,
)
# A body statement the fast path does not cover (several on one line, a brace scope opened on the
# line of a statement): split by this pattern, a call's operand lists may span lines.
_STMT = re.compile(
    r"""\s*(?:(?P<open>\{)|(?P<close>\})|(?P<label>[A-Za-z_$%][\w$]*):(?!:)
    |(?P<stmt>[^;{}]*+(?:\{[^{}]*+\}[^;{}]*+)*+;)|(?P<bad>\S[^\n]*))""",
    re.X,
)
_RENAME_TOKEN = re.compile(r"(?<![\w$.%])[A-Za-z_$%][\w$]*")
_VALID_OPS: set[str] = set()  # opcodes already checked against _OPCODE
_OPCODE = re.compile(r"[a-z_][\w.:]*\Z")
_GUARD = re.compile(r"@!?[%$A-Za-z_][\w$]*\Z")
_SCALAR_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}
_DECL_NAME = re.compile(r"([A-Za-z_$%][\w$]*)\s*(?:<\s*(\d+)\s*>|\[\s*(\d*)\s*\])?\s*(?:=|;|,|$)")
_SPACES = (".global", ".const", ".shared", ".local", ".param", ".reg", ".tex")


class Instruction(NamedTuple):
    """One statement of a function body."""

    op: str  # full opcode with modifiers, e.g. "ld.global.nc.v4.f32"
    args: str  # raw operand text, without the ";" (spans lines only for `call`)
    guard: str  # "" or the predicate, "!%p1" for a negated guard
    line: int  # 1-based line number in the source


_new_instruction = tuple.__new__  # tuple.__new__(Instruction, (...)) skips NamedTuple's Python __new__


@dataclass(frozen=True, kw_only=True)
class Param:
    """One .param (or old-style .reg) parameter of an .entry or .func."""

    name: str
    type: str  # ".u64", ".b8", ".f32", ...
    count: int | None = None  # element count for arrays (`.b8 p[16]`), None for scalars
    align: int | None = None
    ptr_space: str | None = None  # ".ptr .global" -> "global" (Triton, newer nvcc)

    @property
    def size_bytes(self) -> int:
        elem = _SCALAR_BYTES.get(self.type.lstrip(".")[1:].removesuffix("x2"), 4)
        if self.type == ".pred":
            elem = 1
        return elem * (self.count if self.count is not None else 1)

    @property
    def may_hold_pointer(self) -> bool:
        """64-bit scalars, .ptr-marked values and aggregates of 8 bytes or more (structs by value)."""
        return self.ptr_space is not None or self.size_bytes >= 8


@dataclass(frozen=True, kw_only=True)
class Function:
    name: str
    is_entry: bool
    params: tuple[Param, ...]
    returns: tuple[Param, ...] = ()
    body: tuple[Instruction, ...] | None = None  # None: declaration only (.extern .func)
    # declarations inside the body: name -> state space (".shared", ".local", ".param", ".reg")
    locals: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    line: int = 0  # line of the .entry/.func keyword
    body_offset: int = 0  # character offset of the body's "{" in the comment-stripped text


@dataclass(frozen=True, kw_only=True)
class Module:
    source: str  # file name or "<string>", used in error messages
    version: str
    target: str
    address_size: int
    functions: dict[str, Function]
    globals: dict[str, tuple[str, int]]  # module-scope variable -> (state space, bytes)
    text: str = field(repr=False, compare=False)  # comment-stripped text, for locating errors

    @property
    def entries(self) -> list[Function]:
        return [f for f in self.functions.values() if f.is_entry]

    def error(self, line: int, what: str) -> PtxSyntaxError:
        """An error at ``line`` (1-based) naming the offending text."""
        lines = self.text.split("\n")
        snippet = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        return _error_line(self.source, line, snippet, what)


def _line_of(text: str, pos: int) -> tuple[int, str]:
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return line, text[start : end if end >= 0 else len(text)].strip()


def _error(source: str, text: str, pos: int, what: str) -> PtxSyntaxError:
    line, snippet = _line_of(text, pos)
    return _error_line(source, line, snippet, what)


def _error_line(source: str, line: int, snippet: str, what: str) -> PtxSyntaxError:
    if len(snippet) > 80:
        snippet = snippet[:77] + "..."
    return PtxSyntaxError(f"{source}:{line}: {what}: {snippet!r}")


def strip_comments(text: str, source: str = "<string>") -> str:
    if "/*" not in text and _SLASHED_STRING.search(text) is None:  # fast path: only // comments
        return _LINE_COMMENT.sub("", text)
    def keep(m: re.Match[str]) -> str:
        s = m.group(0)
        if m.group(1) is not None:
            return s
        return "\n" * s.count("\n") if s.startswith("/*") else ""

    out = _COMMENT.sub(keep, text)
    m = _UNTERMINATED.search(out)
    if m:
        raise _error(source, out, m.start(), "unterminated /* comment")
    return out


def _body_end(text: str, open_pos: int) -> int:
    """Offset just past the "}" matching the "{" at ``open_pos``, or -1 when it never closes."""
    depth = 0
    pos = open_pos
    find_open, find_close = text.find, text.find
    while True:
        o = find_open("{", pos)
        c = find_close("}", pos)
        if c < 0:
            return -1
        if 0 <= o < c:
            depth += 1
            pos = o + 1
        else:
            depth -= 1
            pos = c + 1
            if depth == 0:
                return pos


def _parse_params(src: str, text: str, pos: int, plist: str | None) -> tuple[Param, ...]:
    if plist is None or not plist.strip():
        return ()
    out = []
    for raw in plist.split(","):
        m = _PARAM.match(raw)
        if m is None:
            raise _error(src, text, pos, f"bad parameter declaration {raw.strip()!r}")
        mods = (m["mods"] or "") + " " + (m["mods2"] or "")
        align = re.search(r"\.align\s+(\d+)", mods)
        ptr = re.search(r"\.ptr\s+\.(\w+)", mods)
        count = m["count"]
        out.append(Param(
            name=m["name"], type=m["type"], count=int(count) if count else (0 if count == "" else None),
            align=int(align.group(1)) if align else None, ptr_space=ptr.group(1) if ptr else None,
        ))
    return tuple(out)


_IGNORED_DIRECTIVES = (".loc", ".file", ".pragma", ".maxntid", ".reqntid", ".minnctapersm", ".maxnreg")


def _parse_body(src: str, text: str, start: int, end: int, first_line: int
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
                if space in _SPACES:
                    n_scopes = _declare(s, space, scopes, decls, n_scopes)
                    if scopes:
                        rename = {a: b for sc in scopes for a, b in sc.items()}
                elif space not in _IGNORED_DIRECTIVES:
                    raise _error_line(src, lineno, s, "unknown directive in function body")
                continue
            guard = ""
            if c == "@":
                parts = s.split(None, 1)
                if len(parts) < 2 or _GUARD.match(parts[0]) is None:
                    raise _error_line(src, lineno, s, "malformed predicate guard")
                guard, s = parts[0][1:], parts[1]
            parts = s[:-1].split(None, 1)
            op = parts[0] if parts else ""
            if op not in _VALID_OPS:
                if _OPCODE.match(op) is None:
                    raise _error_line(src, lineno, s, "cannot parse statement")
                _VALID_OPS.add(op)
            args = parts[1] if len(parts) > 1 else ""
            if rename:
                args = _apply_renames(args, rename)
            body.append(new(cls, (op, args, guard, lineno)))
        elif c == "." and s.split(None, 1)[0] in _IGNORED_DIRECTIVES:
            continue  # .loc / .file / .maxntid lines carry no semicolon
        elif s.startswith(("call", "@")) and "{" not in s and "}" not in s and ";" not in s:
            pending, pending_line = s, lineno
        else:  # labels, braces, several statements on one line: the general statement splitter
            for open_, close, _label, stmt, bad in _STMT.findall(s):
                if open_:
                    n_scopes += 1
                    scopes.append({})
                elif close:
                    if not scopes:
                        raise _error_line(src, lineno, s, "unbalanced '}'")
                    scopes.pop()
                    rename = {a: b for sc in scopes for a, b in sc.items()}
                elif stmt:
                    sub = _parse_body(src, "{" + stmt + "}", 0, len(stmt) + 2, lineno)
                    _merge_sub(sub, body, decls, scopes, rename)
                    if scopes and sub[1]:
                        rename = {a: b for sc in scopes for a, b in sc.items()}
                elif bad:
                    raise _error_line(src, lineno, s, "cannot parse statement (missing ';'?)")
    if pending:
        raise _error_line(src, pending_line, pending.split("\n")[0], "call never ends with ';'")
    if scopes:
        raise _error_line(src, first_line, text[start:start + 40].strip(), "unclosed '{' in function body")
    return tuple(body), decls


def _apply_renames(args: str, rename: dict[str, str]) -> str:
    return _RENAME_TOKEN.sub(lambda m: rename.get(m.group(0), m.group(0)), args)


def _merge_sub(sub: tuple[tuple[Instruction, ...], dict[str, str]], body: list[Instruction],
               decls: dict[str, str], scopes: list[dict[str, str]], rename: dict[str, str]) -> None:
    """Adds one statement parsed on its own to the enclosing body, applying the current renames."""
    instrs, sub_decls = sub
    for ins in instrs:
        args = _apply_renames(ins.args, rename) if rename else ins.args
        body.append(ins._replace(args=args))
    for name, space in sub_decls.items():
        if scopes and space in (".param", ".reg", ".local", ".shared"):
            new = f"{name}@{id(scopes[-1])}"
            scopes[-1][name] = new
            name = new
        decls[name] = space


def _declare(s: str, space: str, scopes: list[dict[str, str]], decls: dict[str, str], n_scopes: int) -> int:
    rest = s.split(None, 1)[1] if " " in s or "\t" in s else ""
    for name, _, _ in _DECL_NAME.findall(rest.split("=", 1)[0] + ";"):
        if name.startswith("."):
            continue
        if scopes:
            new = f"{name}@{n_scopes}"
            scopes[-1][name] = new
            name = new
        decls[name] = space
    return n_scopes


def parse_ptx(text: str, source: str = "<string>") -> Module:
    """Parse a PTX module; raises PtxSyntaxError (a ValueError) with line number and text."""
    text = strip_comments(text, source)
    version = target = ""
    address_size = 64
    functions: dict[str, Function] = {}
    gvars: dict[str, tuple[str, int]] = {}
    pos, n = 0, len(text)
    while pos < n:
        m = _TOP.match(text, pos)
        if m is None:  # only trailing whitespace remains
            break
        kind = m.lastgroup
        pos = m.end()
        if kind == "line":
            words = m.group(kind).split()
            if words[0] == ".version":
                version = words[1] if len(words) > 1 else ""
            elif words[0] == ".target":
                target = " ".join(words[1:])
            elif words[0] == ".address_size":
                if len(words) != 2 or words[1] not in ("32", "64"):
                    raise _error(source, text, m.start(kind), "address size must be 32 or 64")
                address_size = int(words[1])
        elif kind == "section":  # DWARF sections (Triton -lineinfo): skip their braced data
            o = text.find("{", pos)
            if o < 0 or text[pos:o].strip():
                raise _error(source, text, m.start(kind), "section without a '{' block")
            close = _body_end(text, o)
            if close < 0:
                raise _error(source, text, m.start(kind), "unclosed section")
            pos = close
        elif kind == "func":
            fn, pos = _parse_function(source, text, m.start(kind), pos, m.group(kind))
            old = functions.get(fn.name)
            if old is not None and old.body is not None and fn.body is not None:
                raise _error(source, text, m.start(kind), f"function {fn.name} defined twice")
            if old is None or fn.body is not None:
                functions[fn.name] = fn
        elif kind == "decl":
            _module_decl(m.group(kind), gvars)
        else:
            raise _error(source, text, m.start(kind), "cannot parse top-level statement")
    if not version or not target:
        raise _error(source, text, 0, "missing .version or .target directive")
    return Module(source=source, version=version, target=target, address_size=address_size,
                  functions=functions, globals=gvars, text=text)


def _module_decl(decl: str, gvars: dict[str, tuple[str, int]]) -> None:
    words = decl.split("=", 1)[0].split()
    space = next((w for w in words if w in _SPACES), None)
    if space is None:
        return
    tail = words[-1].rstrip(";")
    name_m = _DECL_NAME.match(tail + ";")
    if name_m is None:
        return
    typ = next((w for w in words if w[:2] in (".b", ".u", ".s", ".f")), ".b8")
    elem = _SCALAR_BYTES.get(typ[2:], 1)
    count = name_m.group(3)
    gvars[name_m.group(1)] = (space, elem * (int(count) if count else 1))


def _parse_function(src: str, text: str, kw_pos: int, pos: int, keyword: str) -> tuple[Function, int]:
    is_entry = keyword.rstrip().endswith(".entry")
    h = _HEADER.match(text, pos)
    if h is None or (is_entry and h["ret"] is not None):
        raise _error(src, text, kw_pos, "malformed .entry/.func header")
    params = _parse_params(src, text, kw_pos, h["params"])
    rets = _parse_params(src, text, kw_pos, h["ret"])
    line = text.count("\n", 0, kw_pos) + 1
    if h["end"] == ";":
        return Function(name=h["name"], is_entry=is_entry, params=params, returns=rets, line=line), h.end()
    open_pos = h.end() - 1
    close = _body_end(text, open_pos)
    if close < 0:
        raise _error(src, text, kw_pos, f"body of {h['name']} never closes (truncated file?)")
    body_line = text.count("\n", 0, open_pos) + 1
    body, decls = _parse_body(src, text, open_pos, close, body_line)
    fn = Function(name=h["name"], is_entry=is_entry, params=params, returns=rets, body=body, locals=decls,
                  line=line, body_offset=open_pos)
    return fn, close


_SPLIT_DEPTH = re.compile(r"[\[\]{}(),]")


def split_operands(args: str) -> list[str] | None:
    """Top-level comma split of an operand list; None when brackets do not balance."""
    if "{" not in args and "(" not in args and "[" not in args:
        return [a.strip() for a in args.split(",")]
    out: list[str] = []
    depth = 0
    last = 0
    for m in _SPLIT_DEPTH.finditer(args):
        c = m.group(0)
        if c in "[{(":
            depth += 1
        elif c in "]})":
            depth -= 1
            if depth < 0:
                return None
        elif depth == 0:
            out.append(args[last : m.start()].strip())
            last = m.end()
    if depth != 0:
        return None
    out.append(args[last:].strip())
    return out
