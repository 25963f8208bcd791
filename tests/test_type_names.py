"""No type defined twice: two modules under tessera/ that define a class of the same name hold either one
concept twice (keep one definition, the other module imports it) or two concepts under one name (rename one
so that its name says the difference). Classes are read from the source with `ast` at any depth (a class
inside a function counts), nothing is imported."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import tessera

ROOT = Path(tessera.__file__).parent.parent  # the folder holding the tessera package

# Class names still defined in more than one module: name -> exactly the modules that define it, each with
# why it stays. The list only shrinks (test_every_allowed_name_still_collides fails on an entry that no
# longer collides, or no longer with exactly those modules).
ALLOWED: dict[str, frozenset[str]] = {}  # names allowed in two modules: none left (the list only shrinks)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES: dict[str, str] = {module_name(p): p.read_text() for p in sorted((ROOT / "tessera").rglob("*.py"))}


def class_names(source: str) -> set[str]:
    """Every class the source defines, at any depth."""
    return {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef)}


def collisions(sources: dict[str, str]) -> dict[str, frozenset[str]]:
    """Class name -> the modules defining it, for every name more than one module defines."""
    by_name: dict[str, set[str]] = defaultdict(set)
    for mod, source in sources.items():
        for name in class_names(source):
            by_name[name].add(mod)
    return {name: frozenset(mods) for name, mods in by_name.items() if len(mods) > 1}


FOUND = collisions(SOURCES)


def test_the_finder_reads_nested_classes_and_ignores_other_names() -> None:
    sources = {
        "a": "class X:\n    pass\n\n\nclass Y:\n    pass\n",
        "b": "def f():\n    class X:\n        pass\n    return X\n",
        "c": "Y = 1\n\n\ndef X():\n    pass\n",  # a variable and a function are not classes
    }
    assert collisions(sources) == {"X": frozenset({"a", "b"})}


def test_no_class_name_is_defined_in_two_modules() -> None:
    bad = {name: sorted(mods) for name, mods in FOUND.items() if ALLOWED.get(name) != mods}
    assert not bad, (f"class names defined in more than one module: {bad}; one concept: keep one definition "
                     "and import it; two concepts: rename one so that its name says the difference")


def test_every_allowed_name_still_collides() -> None:
    stale = {name: sorted(mods) for name, mods in ALLOWED.items() if FOUND.get(name) != mods}
    assert not stale, f"allowed collisions that no longer hold as listed (remove or correct them): {stale}"
