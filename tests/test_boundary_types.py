"""No untyped bag crosses a package boundary: a public function (or a public method of a public class) whose
parameters or return are annotated with `dict[str, Any]`, `Any` or a bare `dict`, or a dataclass field so
annotated, fails here when another tessera package imports it, unless BOUNDARY_UNTYPED lists it with why.
Read from the source with `ast` over the import graph tests/test_imports.py builds; nothing is imported.

A name crosses when a module of another package (`stage_of`: tessera.plan.model.x is tessera.plan's) takes it,
through re-exports (`from tessera.plan import Plan` is tessera.contracts.plan's Plan) or as an attribute of
an imported module (`catalog.load(...)`). A class's public methods and fields cross with the class.
Serializers' own `to_dict`/`from_dict`/`to_json`/`from_json` are exempt: they are where JSON is built."""

from __future__ import annotations

import ast
from dataclasses import dataclass

from tests.test_imports import EDGES, MODULES, Edge, absolute, stage_of, statements

SERIALIZERS = frozenset({"to_dict", "from_dict", "to_json", "from_json"})


@dataclass(frozen=True, order=True)
class Untyped:
    module: str  # where it is defined: tessera.runtime.api
    owner: str  # the function or class name: render, RunResult
    slot: str  # a parameter's name, "return", or (for a class) "Method.param", "Method.return", a field's name


def untyped(ann: ast.expr | None) -> bool:
    """An annotation that names Any anywhere, or holds a bare (unsubscripted) dict."""
    if ann is None:
        return False
    if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
        ann = ast.parse(ann.value, mode="eval").body
    subscripted = {id(n.value) for n in ast.walk(ann) if isinstance(n, ast.Subscript)}
    for n in ast.walk(ann):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name == "Any" or (name in ("dict", "Dict") and id(n) not in subscripted):
            return True
    return False


def public(name: str) -> bool:
    return not name.startswith("_")


def function_slots(fn: ast.FunctionDef | ast.AsyncFunctionDef, prefix: str = "") -> list[str]:
    """The untyped parameters (by name) and return ("return") of a function; serializers have none."""
    if fn.name in SERIALIZERS:
        return []
    a = fn.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *([a.vararg] if a.vararg else []),
              *([a.kwarg] if a.kwarg else [])]
    slots = [p.arg for p in params if untyped(p.annotation)] + (["return"] if untyped(fn.returns) else [])
    return [prefix + s for s in slots]


def class_slots(cls: ast.ClassDef) -> list[str]:
    """A class's untyped public fields and its public methods' untyped parameters and returns."""
    out = []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and public(stmt.target.id) \
                and untyped(stmt.annotation):
            out.append(stmt.target.id)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and public(stmt.name):
            out += function_slots(stmt, f"{stmt.name}.")
    return out


def untyped_in(tree: ast.Module, module: str) -> dict[str, list[Untyped]]:
    """Top-level public name -> its untyped slots."""
    out: dict[str, list[Untyped]] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and public(node.name):
            slots = class_slots(node) if isinstance(node, ast.ClassDef) else function_slots(node)
            out[node.name] = [Untyped(module, node.name, s) for s in slots]
    return out


def reexports(tree: ast.Module, module: str) -> dict[str, tuple[str, str]]:
    """Name -> (module, name) it was taken from, for the module's top-level `from X import name`."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            base = absolute(module, node)
            for a in node.names:
                if f"{base}.{a.name}" not in MODULES and base in MODULES:
                    out[a.asname or a.name] = (base, a.name)
    return out


def attribute_uses(tree: ast.Module, module: str) -> set[tuple[str, str]]:
    """(module, name) for `alias.name` where alias is a module of ours imported whole (`import m as alias`,
    `from package import module`)."""
    bound: dict[str, str] = {}
    for node in statements(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name: a.name for a in node.names if a.name in MODULES}
        else:
            base = absolute(module, node)
            bound |= {a.asname or a.name: f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
    return {(bound[ast.unparse(n.value)], n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and ast.unparse(n.value) in bound}


TREES: dict[str, ast.Module] = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in MODULES.items()}
REEXPORTS = {m: reexports(t, m) for m, t in TREES.items()}
DEFINED = {m: untyped_in(t, m) for m, t in TREES.items()}


def resolve(module: str, name: str) -> tuple[str, str]:
    """Follow re-exports to where the name is defined (tessera.plan, Plan -> tessera.contracts.plan, Plan)."""
    seen: set[tuple[str, str]] = set()
    while name not in DEFINED.get(module, {}) and name in REEXPORTS.get(module, {}) and (module, name) not in seen:
        seen.add((module, name))
        module, name = REEXPORTS[module][name]
    return module, name


def crossing_uses(edges, trees: dict[str, ast.Module]) -> set[tuple[str, str]]:
    """(defining module, name) of every public name another package takes from ours."""
    uses = {(e.importer, e.imported, e.name) for e in edges if e.name}
    uses |= {(m, target, name) for m, t in trees.items() for target, name in attribute_uses(t, m)}
    out = set()
    for importer, imported, name in uses:
        module, defined = resolve(imported, name)
        if stage_of(importer) != stage_of(module):
            out.add((module, defined))
    return out


def boundary_untyped() -> set[Untyped]:
    return {u for module, name in crossing_uses(EDGES, TREES) for u in DEFINED.get(module, {}).get(name, [])}


# Untyped slots that still cross a package, each with why; type one (a frozen kw_only dataclass with one
# serializer) and drop it from here. The list only shrinks (test_the_allowed_list_only_shrinks).
U = Untyped
BOUNDARY_UNTYPED: frozenset[Untyped] = frozenset({
    # a model's config.json / transformers config object, free-form by nature (any architecture's keys)
    U("tessera.capture.anymodel", "load_config", "return"),
    U("tessera.capture.anymodel", "transformers_config", "cfg"),
    U("tessera.capture.anymodel", "transformers_config", "return"),
    # a recorded operator's arguments and the torch callables that replay it: any Python value torch takes
    U("tessera.capture.program", "materialise", "return"), U("tessera.capture.program", "materialise", "tree"),
    U("tessera.capture.program", "resolve", "return"), U("tessera.capture.program", "run_op", "func"),
    U("tessera.capture.recorder", "OpRecord", "args"), U("tessera.capture.recorder", "OpRecord", "kwargs"),
    U("tessera.capture.recorder", "Recorder", "run_op"),
    # the capturing front end's free-form notes about the model; no stage reads them (test_contract_types)
    U("tessera.contracts.ir", "KernelGraph", "meta"), U("tessera.contracts.ir", "build_graph", "meta"),
    # readers of parsed JSON: they check the object they are given and build the contract from it
    U("tessera.contracts.plan", "PoolPlan", "from_members.d"), U("tessera.contracts.plan", "plan_from_dict", "d"),
    U("tessera.contracts.provenance", "of_file", "d"), U("tessera.report.data", "parse_sim", "d"),
    U("tessera.report.data", "read_json", "return"),
    # the cost model's saved file: the serializer `tessera cost calibrate` writes (it has no reader)
    U("tessera.cost.calibrate", "model_to_dict", "return"),
    # torchrun rendezvous entries and the worker target: (address, key) pairs and a picklable callable
    U("tessera.engine.remote", "RemoteLink", "accept.infos"), U("tessera.engine.remote", "RemoteLink", "spawn.processes"),
    U("tessera.engine.remote", "RemoteLink", "spawn.specs"), U("tessera.engine.remote", "bootstrap", "return"),
    U("tessera.engine.remote", "connect", "infos"), U("tessera.engine.remote", "worker_loop", "target"),
    # multiprocessing queues and what workers post on them (mp.Queue is not generic at run time)
    U("tessera.engine.worker", "worker_main", "commands"), U("tessera.engine.worker", "worker_main", "heartbeat"),
    U("tessera.engine.worker", "worker_main", "results"),
    U("tessera.runtime.cluster", "Processes", "poll.return"), U("tessera.runtime.cluster", "Processes", "ready.return"),
    U("tessera.runtime.cluster", "Processes", "spawn.specs"), U("tessera.runtime.cluster", "Processes", "spawn.target"),
    U("tessera.runtime.worker", "read_ahead", "commands"), U("tessera.runtime.worker", "worker_process", "body"),
    U("tessera.runtime.worker", "worker_process", "commands"),
    U("tessera.runtime.worker", "worker_process", "heartbeat"),
    U("tessera.runtime.worker", "worker_process", "results"),
    # a strategy's free-form solver notes (time, gap, pattern counts), shown in `tessera plan` tables
    U("tessera.plan.config", "StrategyResult", "detail"),
    # Triton's own objects: a kernel's JITFunction and its constexpr values
    U("tessera.ptx.triton_ptx", "Specialisation", "constexprs"), U("tessera.ptx.triton_ptx", "kernel_access", "fn"),
})


def test_the_annotation_reader_flags_any_and_bare_dict_and_leaves_typed_ones_alone() -> None:
    def ann(text: str) -> ast.expr:
        return ast.parse(text, mode="eval").body
    flagged = ["dict[str, Any]", "Any", "typing.Any", "dict", "'dict[str, Any] | None'", "list[dict]",
               "tuple[dict[str, Any], ...]", "Mapping[str, Any]"]
    clean = ["dict[str, float]", "RunFigures", "'Plan | None'", "list[dict[str, int]]", "object"]
    assert [t for t in flagged if not untyped(ann(t))] == []
    assert [t for t in clean if untyped(ann(t))] == []
    assert untyped(None) is False


def test_the_finder_reads_functions_methods_and_fields_and_spares_serializers_and_privates() -> None:
    tree = ast.parse(
        "@dataclass(frozen=True)\nclass R:\n    a: dict[str, Any]\n    b: int\n    _c: Any\n"
        "    def to_json(self) -> dict[str, Any]: ...\n    def rows(self, x: dict) -> list[str]: ...\n"
        "    def _hidden(self) -> Any: ...\n"
        "def f(a: int, *, b: dict[str, Any], **kw: Any) -> dict[str, Any]: ...\n"
        "def from_dict(d: Any) -> R: ...\ndef _g(x: Any) -> None: ...\n")
    found = {k: [u.slot for u in v] for k, v in untyped_in(tree, "tessera.x").items()}
    assert found == {"R": ["a", "rows.x"], "f": ["b", "kw", "return"], "from_dict": []}


def test_the_finder_follows_reexports_and_module_attributes_and_keeps_within_a_package() -> None:
    edges = [Edge("tessera.fleet.cells", "tessera.plan", "plan_serving", 1),  # re-exported by plan's front
             Edge("tessera.plan.search", "tessera.plan.model.serving", "serve_point", 2)]  # inside plan
    tree = ast.parse("from tessera.hardware import catalog\ncatalog.load_catalog()\n")
    uses = crossing_uses(edges, {"tessera.cli.hardware": tree})
    assert ("tessera.plan.search", "plan_serving") in uses
    assert ("tessera.hardware.catalog", "load_catalog") in uses
    assert not any(name == "serve_point" for _, name in uses)


def test_no_untyped_bag_crosses_a_package_but_the_listed_ones() -> None:
    new = sorted(boundary_untyped() - BOUNDARY_UNTYPED)
    assert not new, "dict[str, Any] / Any / bare dict across a package boundary (type it with a frozen " \
        "dataclass, or list it in BOUNDARY_UNTYPED with why):\n" + \
        "\n".join(f"  {u.module}: {u.owner} {u.slot}" for u in new)


def test_the_allowed_list_only_shrinks() -> None:
    gone = sorted(BOUNDARY_UNTYPED - boundary_untyped())
    assert not gone, "typed since, or no longer crossing a package: drop from BOUNDARY_UNTYPED:\n" + \
        "\n".join(f"  {u.module}: {u.owner} {u.slot}" for u in gone)
