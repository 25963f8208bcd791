"""No untyped field crosses a stage boundary: a dataclass in tessera/contracts/ has no field annotated with
`Any` (a `dict[str, Any]` bag, or `Any` itself) but those listed in UNTYPED below, each with why. The list only
shrinks: a field typed since must leave it. Read from the source with `ast`, nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import tessera

CONTRACTS = Path(tessera.__file__).parent / "contracts"

# (module file, class, field) still annotated with Any, each with why; type one and drop it from here.
UNTYPED: frozenset[tuple[str, str, str]] = frozenset({
    # the capturing front end's free-form notes about the model (its config's figures); no stage reads them
    ("ir.py", "KernelGraph", "meta"),
})


def is_dataclass(node: ast.ClassDef) -> bool:
    def name(d: ast.expr) -> str:
        d = d.func if isinstance(d, ast.Call) else d
        return d.id if isinstance(d, ast.Name) else d.attr if isinstance(d, ast.Attribute) else ""
    return any(name(d) == "dataclass" for d in node.decorator_list)


def untyped_fields(source: str, file: str) -> set[tuple[str, str, str]]:
    """(file, class, field) of every dataclass field whose annotation names Any."""
    out = set()
    for cls in ast.walk(ast.parse(source)):
        if not (isinstance(cls, ast.ClassDef) and is_dataclass(cls)):
            continue
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                ann = stmt.annotation
                text = ann.value if isinstance(ann, ast.Constant) and isinstance(ann.value, str) else ast.unparse(ann)
                names = {n.id for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Name)}
                names |= {n.attr for n in ast.walk(ast.parse(text, mode="eval")) if isinstance(n, ast.Attribute)}
                if "Any" in names:
                    out.add((file, cls.name, stmt.target.id))
    return out


def every_untyped_field() -> set[tuple[str, str, str]]:
    return {f for p in sorted(CONTRACTS.glob("*.py")) for f in untyped_fields(p.read_text(), p.name)}


def test_the_finder_reads_dict_of_any_and_bare_any_and_leaves_typed_fields_alone() -> None:
    src = ("from dataclasses import dataclass\nimport typing\n@dataclass(frozen=True)\nclass A:\n"
           "    a: dict[str, Any]\n    b: 'Any | None'\n    c: dict[str, int]\n    d: typing.Any\n"
           "class NotAContract:\n    e: Any\n")
    assert untyped_fields(src, "x.py") == {("x.py", "A", "a"), ("x.py", "A", "b"), ("x.py", "A", "d")}


def test_no_contract_field_is_untyped_but_the_listed_ones() -> None:
    new = every_untyped_field() - UNTYPED
    assert not new, "contract fields annotated with Any (type them, or list them in UNTYPED with why):\n" + \
        "\n".join(f"  tessera/contracts/{f}: {c}.{n}" for f, c, n in sorted(new))


def test_the_untyped_list_only_shrinks() -> None:
    gone = UNTYPED - every_untyped_field()
    assert not gone, f"typed since (or moved): drop from UNTYPED: {sorted(gone)}"
