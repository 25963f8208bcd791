"""PTX parser: module directives, .entry/.func headers with parameters, bodies as statements.

Built for PTX as nvcc 12-13 and Triton emit it. The parser is regex-driven (one master pattern per
level, run by the C regex engine over whole function bodies) because the analysis must sustain tens
of MB/s; operands stay raw text until the analysis asks for them (``split_operands``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, TypeVar

from tessera.ptx.body import (  # noqa: F401  (PtxSyntaxError, Instruction: public API)
    DECL_NAME,
    SPACES,
    Instruction,
    PtxSyntaxError,
    error_line,
    parse_body,
)

# Comments go first; strings are kept so that "//" inside a .file path survives. Block comments are
# replaced by their newlines so line numbers stay those of the original text.
_COMMENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|//[^\n]*|/\*[\s\S]*?\*/')
_UNTERMINATED = re.compile(r"/\*")
_LINE_COMMENT = re.compile(r"//[^\n]*+")
SLASHED_STRING = re.compile(r'"[^"\n]*/[/*]')

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
_SCALAR_BYTES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}
_T = TypeVar("_T")
_raw_new = object.__new__
_raw_setattr = object.__setattr__


def make(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of the frozen dataclass ``cls`` given *every* field: the generated __init__ sets each
    field through object.__setattr__, which cost ~1 us per object, a visible share of the analysis for
    parameters and results. tests/ptx/test_ptx_parser.py checks the result equals normal construction."""
    obj = _raw_new(cls)
    _raw_setattr(obj, "__dict__", fields)
    return obj


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
    # the body's statements; None for a declaration, or when parse_ptx was told not to read bodies
    body: tuple[Instruction, ...] | None = None
    # declarations inside the body: name -> state space (".shared", ".local", ".param", ".reg")
    locals: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    line: int = 0  # line of the .entry/.func keyword
    # the body in Module.text: (offset of its "{", offset past its "}", line of the "{"); None: declaration
    span: tuple[int, int, int] | None = None

    @property
    def defined(self) -> bool:
        """Has a body; False for a declaration (.extern .func)."""
        return self.span is not None


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
        return error_line(self.source, line, snippet, what)


def _line_of(text: str, pos: int) -> tuple[int, str]:
    line = text.count("\n", 0, pos) + 1
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    return line, text[start : end if end >= 0 else len(text)].strip()


def _error(source: str, text: str, pos: int, what: str) -> PtxSyntaxError:
    line, snippet = _line_of(text, pos)
    return error_line(source, line, snippet, what)


def strip_comments(text: str, source: str = "<string>") -> str:
    # fast path: only // comments. "*" not in text is one memchr; "/*" not in text alone is a slower
    # two-character search ('/' is frequent: every comment), so it only runs when a "*" exists
    if ("*" not in text or "/*" not in text) and not slashed_string(text):
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


def slashed_string(text: str) -> bool:
    """SLASHED_STRING.search(text) is not None, without running sre over the whole text: from every '"'
    (a closing one included, as the regex search tries them all) to the next '"' or newline, is there a
    "//" or "/*"? PTX has a handful of quotes (.file paths), found by memchr-speed str.find."""
    i = text.find('"')
    n = len(text)
    while i >= 0:
        q = text.find('"', i + 1)
        nl = text.find("\n", i + 1, q if q >= 0 else n)
        stop = nl if nl >= 0 else (q if q >= 0 else n)
        run = text[i + 1 : stop]
        if "//" in run or "/*" in run:
            return True
        i = q
    return False


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


# the common parameter ".param .u64 name" (a type without modifiers, a plain name): no regex needed
_PLAIN_TYPES = frozenset({".u8", ".u16", ".u32", ".u64", ".s8", ".s16", ".s32", ".s64", ".b8", ".b16", ".b32",
                          ".b64", ".f16", ".f32", ".f64", ".pred"})
_ALIGN = re.compile(r"\.align\s+(\d+)")
_PTR = re.compile(r"\.ptr\s+\.(\w+)")


def _parse_params(src: str, text: str, pos: int, plist: str | None) -> tuple[Param, ...]:
    if plist is None or not plist.strip():
        return ()
    out = []
    for raw in plist.split(","):
        w = raw.split()
        if len(w) == 3 and w[0] == ".param" and w[1] in _PLAIN_TYPES and w[2].isascii() and w[2].isidentifier():
            out.append(make(Param, {"name": w[2], "type": w[1], "count": None, "align": None, "ptr_space": None}))
            continue
        m = _PARAM.match(raw)
        if m is None:
            raise _error(src, text, pos, f"bad parameter declaration {raw.strip()!r}")
        mods = (m["mods"] or "") + " " + (m["mods2"] or "")
        align = _ALIGN.search(mods)
        ptr = _PTR.search(mods)
        count = m["count"]
        out.append(Param(
            name=m["name"], type=m["type"], count=int(count) if count else (0 if count == "" else None),
            align=int(align.group(1)) if align else None, ptr_space=ptr.group(1) if ptr else None,
        ))
    return tuple(out)


def parse_ptx(text: str, source: str = "<string>", read_bodies: bool = True) -> Module:
    """Parse a PTX module; raises PtxSyntaxError (a ValueError) with line number and text.

    With ``read_bodies=False`` each function keeps only its body's ``span``, for the lowering stage to
    read (the analysis does this: its accelerated path reads a body straight from the text), and errors
    inside bodies are raised there."""
    text = strip_comments(text, source)
    version = target = ""
    address_size = 64
    functions: dict[str, Function] = {}
    gvars: dict[str, tuple[str, int]] = {}
    pos, n = 0, len(text)
    lines_at = [0, 1]  # (offset, its 1-based line): line numbers are counted incrementally
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
            fn, pos = _parse_function(source, text, m.start(kind), pos, m.group(kind), read_bodies, lines_at)
            old = functions.get(fn.name)
            if old is not None and old.defined and fn.defined:
                raise _error(source, text, m.start(kind), f"function {fn.name} defined twice")
            if old is None or fn.defined:
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
    space = next((w for w in words if w in SPACES), None)
    if space is None:
        return
    tail = words[-1].rstrip(";")
    name_m = DECL_NAME.match(tail + ";")
    if name_m is None:
        return
    typ = next((w for w in words if w[:2] in (".b", ".u", ".s", ".f")), ".b8")
    elem = _SCALAR_BYTES.get(typ[2:], 1)
    count = name_m.group(3)
    gvars[name_m.group(1)] = (space, elem * (int(count) if count else 1))


def _line_at(text: str, pos: int, lines_at: list[int]) -> int:
    """1-based line of ``pos``, counting on from the last position asked (positions only grow)."""
    line = lines_at[1] + text.count("\n", lines_at[0], pos)
    lines_at[0], lines_at[1] = pos, line
    return line


def _parse_function(src: str, text: str, kw_pos: int, pos: int, keyword: str, read_bodies: bool,
                    lines_at: list[int]) -> tuple[Function, int]:
    is_entry = keyword.rstrip().endswith(".entry")
    h = _HEADER.match(text, pos)
    if h is None or (is_entry and h["ret"] is not None):
        raise _error(src, text, kw_pos, "malformed .entry/.func header")
    params = _parse_params(src, text, kw_pos, h["params"])
    rets = _parse_params(src, text, kw_pos, h["ret"])
    line = _line_at(text, kw_pos, lines_at)
    if h["end"] == ";":
        return _function(h["name"], is_entry, params, rets, None, {}, line, None), h.end()
    open_pos = h.end() - 1
    close = _body_end(text, open_pos)
    if close < 0:
        raise _error(src, text, kw_pos, f"body of {h['name']} never closes (truncated file?)")
    body_line = _line_at(text, open_pos, lines_at)
    span = (open_pos, close, body_line)
    if not read_bodies:
        return _function(h["name"], is_entry, params, rets, None, {}, line, span), close
    body, decls = parse_body(src, text, open_pos, close, body_line)
    return _function(h["name"], is_entry, params, rets, body, decls, line, span), close


def _function(name: str, is_entry: bool, params: tuple[Param, ...], returns: tuple[Param, ...],
              body: tuple[Instruction, ...] | None, locals_: dict[str, str], line: int,
              span: tuple[int, int, int] | None) -> Function:
    return make(Function, {"name": name, "is_entry": is_entry, "params": params, "returns": returns, "body": body,
                           "locals": locals_, "line": line, "span": span})


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
