"""Imports flow one way: no cycle between packages or between modules, counting imports inside functions
(only `if TYPE_CHECKING:` blocks are left out: they never run), and no import of another package's private
module or private name. The imports are read from the source with `ast`, nothing is imported."""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import tessera

ROOT = Path(tessera.__file__).parent.parent  # the folder holding the tessera package

# Edges (importer module, imported module) that close a cycle and are still to be removed, each with why;
# the list only shrinks (test_every_allowed_edge_still_exists). Empty: every cycle found has been removed.
ALLOWED: frozenset[tuple[str, str]] = frozenset()


# Edges (importer module, tessera.plan submodule) from outside tessera.plan that still bypass the package's
# surface (tessera/plan/__init__.py), each with why; the list only shrinks (test_every_allowed_edge_still_exists).
PLAN_INSIDE_ALLOWED: frozenset[tuple[str, str]] = frozenset({
    # a named-model builder over HiGHS that fleet's GPU-mix MILP uses too; it belongs below both stages
    ("tessera.fleet.mix", "tessera.plan.solver.highs"),
})

# Command-line parsing (typer, and click under it) belongs to tessera/cli/ alone: a stage is a library.
CLI_LIBRARIES = ("typer", "click")
# Modules outside tessera.cli that still import one, each with why; the list only shrinks
# (test_every_allowed_edge_still_exists).
CLI_LIBRARY_ALLOWED: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Edge:
    importer: str  # module name, tessera.plan.cli
    imported: str  # the module the statement loads: a package's __init__ is the package's name
    name: str | None  # the name taken from it (`from m import name`); None for `import m`
    line: int


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted((ROOT / "tessera").rglob("*.py"))}


def is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def package_of(mod: str) -> str:
    """The package a module belongs to (a package's __init__ belongs to the package itself)."""
    return mod if is_package(mod) else mod.rsplit(".", 1)[0]


def stage_of(mod: str) -> str:
    """tessera.plan.baselines.common -> tessera.plan; top-level modules (tessera.cli) are their own."""
    return ".".join(mod.split(".")[:2])


def type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def statements(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, outside `if TYPE_CHECKING:` bodies."""
    out: list[ast.Import | ast.ImportFrom] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.append(node)
        children = node.orelse if type_checking_block(node) else list(ast.iter_child_nodes(node))
        todo.extend(children)
    return out


def absolute(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = package_of(mod).split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def existing(name: str) -> str:
    """The longest prefix of a dotted name that is one of our modules."""
    while name not in MODULES:
        name = name.rsplit(".", 1)[0]
    return name


def edges_of(mod: str) -> list[Edge]:
    out = []
    for node in statements(ast.parse(MODULES[mod].read_text(), filename=str(MODULES[mod]))):
        if isinstance(node, ast.Import):
            pairs = [(a.name, None) for a in node.names]
        else:
            base = absolute(mod, node)
            pairs = [(f"{base}.{a.name}", None) if f"{base}.{a.name}" in MODULES else (base, a.name)
                     for a in node.names]
        out += [Edge(mod, existing(target), name, node.lineno)
                for target, name in pairs if target == "tessera" or target.startswith("tessera.")]
    return out


EDGES: list[Edge] = [e for m in MODULES for e in edges_of(m)]


def cycles(adj: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(adj):
        if root in index:
            continue
        work = [(root, iter(sorted(adj[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(adj.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def live_edges() -> list[Edge]:
    return [e for e in EDGES if (e.importer, e.imported) not in ALLOWED and e.importer != e.imported]


def describe(comp: list[str], key) -> str:
    inside = sorted({f"  {e.importer}:{e.line} imports {e.imported}" for e in live_edges()
                     if key(e.importer) in comp and key(e.imported) in comp and key(e.importer) != key(e.imported)})
    return f"{' <-> '.join(comp)}:\n" + "\n".join(inside)


def test_the_cycle_finder_finds_a_loop_of_three_and_leaves_a_chain_alone() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_inside_functions_are_read_and_type_checking_ones_are_not() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x\nelse:\n    import y\n"
                     "def f():\n    import z\n")
    assert sorted(a.name for n in statements(tree) if isinstance(n, ast.Import) for a in n.names) == ["y", "z"]


def test_no_cycle_between_packages() -> None:
    adj: dict[str, set[str]] = defaultdict(set)
    for e in live_edges():
        adj[stage_of(e.importer)]
        if stage_of(e.importer) != stage_of(e.imported):
            adj[stage_of(e.importer)].add(stage_of(e.imported))
    found = cycles(adj)
    assert not found, "import cycles between packages:\n" + "\n".join(describe(c, stage_of) for c in found)


def test_no_cycle_between_modules() -> None:
    adj: dict[str, set[str]] = defaultdict(set)
    for e in live_edges():
        adj[e.importer].add(e.imported)
    found = cycles(adj)
    assert not found, "import cycles between modules:\n" + "\n".join(describe(c, lambda m: m) for c in found)


def private(part: str | None) -> bool:
    return part is not None and part.startswith("_") and not part.startswith("__")


def test_no_import_of_another_packages_private_module_or_name() -> None:
    bad = [e for e in EDGES if package_of(e.importer) != package_of(e.imported)
           and (private(e.name) or any(private(p) for p in e.imported.split(".")))]
    assert not bad, "private names imported across packages:\n" + "\n".join(
        f"  {e.importer}:{e.line} imports {e.imported}{'.' + e.name if e.name else ''}" for e in bad)


def test_other_packages_import_plan_only_through_its_package() -> None:
    """tessera/plan/__init__.py is the planner's one surface: outside tessera.plan, `from tessera.plan import
    X`, never a submodule (tessera.plan.model.serving, tessera.plan.search, ...)."""
    bad = sorted({f"  {e.importer}:{e.line} imports {e.imported}" for e in EDGES
                  if stage_of(e.importer) != "tessera.plan" and e.imported.startswith("tessera.plan.")
                  and (e.importer, e.imported) not in PLAN_INSIDE_ALLOWED})
    assert not bad, "tessera.plan submodules imported from outside; use `from tessera.plan import`:\n" + \
        "\n".join(bad)


def cli_library_importers(trees: dict[str, ast.AST]) -> dict[str, list[int]]:
    """Module -> the lines where it imports a CLI library (``typer``, ``typer.main``, ``click``...), for the
    modules outside tessera.cli."""
    found: dict[str, list[int]] = {}
    for mod, tree in trees.items():
        if mod == "tessera.cli" or mod.startswith("tessera.cli."):
            continue
        for node in statements(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if not node.level else []
            if any(n.split(".")[0] in CLI_LIBRARIES for n in names):
                found.setdefault(mod, []).append(node.lineno)
    return found


CLI_LIBRARY_IMPORTERS = cli_library_importers(
    {m: ast.parse(p.read_text(), filename=str(p)) for m, p in MODULES.items()})


def test_the_cli_library_finder_reads_every_form_of_import_and_spares_tessera_cli() -> None:
    trees = {m: ast.parse(src) for m, src in {
        "tessera.sim.a": "import typer\n", "tessera.sim.b": "def f():\n    from typer.main import get_command\n",
        "tessera.sim.c": "import click.testing as t\n", "tessera.sim.d": "from . import typer_free\nimport json\n",
        "tessera.cli.sim": "import typer\n", "tessera.cli": "import typer\n"}.items()}
    assert cli_library_importers(trees) == {"tessera.sim.a": [1], "tessera.sim.b": [2], "tessera.sim.c": [1]}


def test_only_tessera_cli_imports_typer() -> None:
    """Stages are libraries: parsing a command line (typer, click) is tessera/cli/'s, which calls them."""
    bad = {m: lines for m, lines in CLI_LIBRARY_IMPORTERS.items() if m not in CLI_LIBRARY_ALLOWED}
    assert not bad, "typer/click imported outside tessera/cli/; move the verb there:\n" + "\n".join(
        f"  {m}:{line}" for m, lines in sorted(bad.items()) for line in lines)


def test_every_allowed_edge_still_exists() -> None:
    """An edge removed from the code leaves the allow-list too, so that it cannot come back unnoticed."""
    present = {(e.importer, e.imported) for e in EDGES}
    assert ALLOWED <= present, f"no longer imported, drop from ALLOWED: {sorted(ALLOWED - present)}"
    gone = PLAN_INSIDE_ALLOWED - present
    assert not gone, f"no longer imported, drop from PLAN_INSIDE_ALLOWED: {sorted(gone)}"
    gone_cli = CLI_LIBRARY_ALLOWED - set(CLI_LIBRARY_IMPORTERS)
    assert not gone_cli, f"no longer import typer/click, drop from CLI_LIBRARY_ALLOWED: {sorted(gone_cli)}"


def test_bench_scripts_import_no_private_tessera_module_or_name() -> None:
    """bench/ stands outside the package: it uses the public surface only."""
    bad: set[str] = set()
    for path in sorted((ROOT / "bench").glob("*.py")):
        for node in statements(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            bad |= {f"  {path.name}:{node.lineno} imports {n}" for n in names
                    if n.startswith("tessera.") and any(private(p) for p in n.split("."))}
    assert not bad, "private tessera names imported by bench scripts:\n" + "\n".join(sorted(bad))


# What tessera.report may import: it renders the contracts and reads nothing of the stages (what only a stage
# knows, its caller looks up: tessera.study.report_facts); outside tessera, the standard library and the
# drawing and table libraries.
REPORT_MAY_IMPORT = ("tessera.contracts", "tessera.errors", "tessera.text", "tessera.report")
REPORT_MAY_IMPORT_OUTSIDE = frozenset({"matplotlib", "numpy", "rich"})


def outside_imports(mod: str) -> list[tuple[str, int]]:
    """(top-level name, line) of every import of something outside tessera, at any depth."""
    out = []
    for node in statements(ast.parse(MODULES[mod].read_text(), filename=str(MODULES[mod]))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            ([node.module or ""] if not node.level else [])
        out += [(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] != "tessera"]
    return out


def report_breaches(edges: list[Edge], outside: dict[str, list[tuple[str, int]]]) -> list[str]:
    """The imports of tessera.report modules that reach past what it may import."""
    bad = [f"  {e.importer}:{e.line} imports {e.imported}" for e in edges if stage_of(e.importer) == "tessera.report"
           and not any(e.imported == p or e.imported.startswith(p + ".") for p in REPORT_MAY_IMPORT)]
    allowed = sys.stdlib_module_names | REPORT_MAY_IMPORT_OUTSIDE | {"__future__"}
    bad += [f"  {m}:{line} imports {name}" for m, found in outside.items() for name, line in found
            if stage_of(m) == "tessera.report" and name not in allowed]
    return sorted(bad)


def test_report_imports_nothing_but_the_contracts() -> None:
    outside = {m: outside_imports(m) for m in MODULES if stage_of(m) == "tessera.report"}
    bad = report_breaches(EDGES, outside)
    assert not bad, "tessera.report renders contracts only; it imports:\n" + "\n".join(bad)


def test_the_report_rule_catches_a_stage_and_a_foreign_library() -> None:
    edges = [Edge("tessera.report.html", "tessera.hardware.catalog", None, 3),
             Edge("tessera.report.html", "tessera.contracts.plan", "Plan", 4)]
    outside = {"tessera.report.plots": [("matplotlib", 9), ("pandas", 10), ("json", 11)]}
    assert report_breaches(edges, outside) == ["  tessera.report.html:3 imports tessera.hardware.catalog",
                                               "  tessera.report.plots:10 imports pandas"]


# A command function (what typer registers: `@app.command(...)` on a def, or `app.command(...)(f)`) parses its
# flags, makes one library call and renders what comes back (docs/architecture.md, "The commands"). It holds
# no `for` or `while` loop (a loop is logic, or rendering that belongs in a helper beside it) and opens no
# file (reading or writing one is the stage's). Comprehensions that build a call's arguments are allowed.
FILE_CALLS = frozenset({"open", "read_text", "write_text", "read_bytes", "write_bytes"})

# (module, command function) that still loop or open a file, each with why; the list only shrinks
# (test_every_allowed_command_still_breaches).
COMMAND_LOGIC_ALLOWED: frozenset[tuple[str, str]] = frozenset()


def is_command_call(node: ast.AST) -> bool:
    """``x.command(...)`` or ``x.callback(...)``: typer's registration."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in ("command", "callback")


def command_functions(tree: ast.AST) -> list[ast.FunctionDef]:
    """The functions a module registers as commands, decorated or passed to ``x.command(...)``."""
    passed = {n.args[0].id for n in ast.walk(tree) if isinstance(n, ast.Call) and is_command_call(n.func)
              and n.args and isinstance(n.args[0], ast.Name)}
    return [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
            and (f.name in passed or any(is_command_call(d) for d in f.decorator_list))]


def command_logic(fn: ast.FunctionDef) -> list[str]:
    """``"for:LINE"``, ``"while:LINE"`` and ``"NAME():LINE"`` (a file call) inside a command function."""
    found = []
    for node in ast.walk(fn):
        if isinstance(node, ast.For | ast.AsyncFor | ast.While):
            found.append(f"{'while' if isinstance(node, ast.While) else 'for'}:{node.lineno}")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in FILE_CALLS:
                found.append(f"{name}():{node.lineno}")
    return sorted(found, key=lambda s: int(s.rsplit(":", 1)[1]))


COMMAND_LOGIC = {(m, f.name): command_logic(f) for m, p in MODULES.items() if stage_of(m) == "tessera.cli"
                 for f in command_functions(ast.parse(p.read_text(), filename=str(p)))}


def test_the_command_finder_reads_both_registrations_and_spares_helpers() -> None:
    tree = ast.parse(
        "def register(app):\n"
        "    @app.command('run')\n"
        "    def run_cmd(n):\n"
        "        rows = [i for i in range(n)]\n"  # a comprehension: allowed
        "        while n:\n"
        "            n -= 1\n"
        "        return rows\n"
        "def show(rows):\n"  # a render helper: not a command, free to loop
        "    for r in rows:\n"
        "        print(r)\n"
        "def load(path):\n"
        "    return Path(path).read_text() + open(path).read()\n"
        "app.command('load')(load)\n")
    found = {f.name: command_logic(f) for f in command_functions(tree)}
    assert found == {"run_cmd": ["while:5"], "load": ["read_text():12", "open():12"]}


def test_commands_hold_no_loop_and_open_no_file() -> None:
    bad = {k: v for k, v in COMMAND_LOGIC.items() if v and k not in COMMAND_LOGIC_ALLOWED}
    assert not bad, "command functions with a loop or a file opened; move it into the stage or a render " \
        "helper:\n" + "\n".join(f"  {m}.{f}: {', '.join(v)}" for (m, f), v in sorted(bad.items()))


def test_every_allowed_command_still_breaches() -> None:
    """A command made clean leaves the allow-list, so that its loop cannot come back unnoticed."""
    clean = sorted(k for k in COMMAND_LOGIC_ALLOWED if not COMMAND_LOGIC.get(k))
    assert not clean, f"no loop nor file left, drop from COMMAND_LOGIC_ALLOWED: {clean}"
