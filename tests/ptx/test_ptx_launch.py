"""Launch log + allocation table -> KernelGraph: edges of the shipped three-kernel pipeline, by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tessera.cli import _register_all, app
from tessera.graph.ir import EdgeKind, KernelGraph, Role
from tessera.ptx.launch import build_from_log

EXAMPLE = Path(__file__).parents[2] / "examples" / "ptx"
CORPUS = Path(__file__).parent / "corpus"


def test_pipeline_edges_exact() -> None:
    # buffers sorted by base: 0 x (input), 1 w (weight), 2 a (activation), 3 scratch (never touched)
    # produce(x, w, a): R{x, w} W{a}; update_inplace(a + 32 KiB, x + 32 KiB): R{a, x} W{a};
    # consume(a, x): R{a} W{x}.  RAW: 0->1 a, 1->2 a.  WAW: 0->1 a.  WAR: 0->2 x, 1->2 x (both read x).
    g = build_from_log(EXAMPLE / "launches.jsonl", EXAMPLE / "allocations.json")
    assert [b.name for b in g.buffers] == ["x", "w", "a", "scratch"]
    assert [(k.reads, k.writes) for k in g.kernels] == [((0, 1), (2,)), ((2, 0), (2,)), ((2,), (0,))]
    got = {(e.src, e.dst, e.kind, e.buffer) for e in g.edges}
    assert got == {(0, 1, EdgeKind.RAW, 2), (0, 1, EdgeKind.WAW, 2), (1, 2, EdgeKind.RAW, 2),
                   (0, 2, EdgeKind.WAR, 0), (1, 2, EdgeKind.WAR, 0)}
    assert len(g.edges) == 5
    assert g.buffers[1].role is Role.WEIGHT and g.kernels[2].bytes_written == 65536
    g.check_invariants()
    assert KernelGraph.from_json(g.to_json()).edges == g.edges


def _write(tmp: Path, allocs: list[dict[str, object]], launches: list[dict[str, object]]) -> tuple[Path, Path]:
    (tmp / "a.json").write_text(json.dumps({"allocations": allocs}))
    (tmp / "l.jsonl").write_text("".join(json.dumps(r) + "\n" for r in launches))
    return tmp / "l.jsonl", tmp / "a.json"


ALLOCS = [{"name": "ptrs", "base": 4096, "bytes": 64, "role": "input"},
          {"name": "out", "base": 8192, "bytes": 4096, "role": "output"},
          {"name": "kv", "base": 65536, "bytes": 4096, "role": "kv"}]


def test_indirect_kernel_widens_to_its_pointer_params_or_everything(tmp_path: Path) -> None:
    shutil.copy(CORPUS / "sm_90" / "indirect.ptx", tmp_path / "m.ptx")
    launch = {"kernel": "ptr_array_gather", "module": "m.ptx", "args": [4096, 8192 + 16, 64]}
    log, alloc = _write(tmp_path, ALLOCS, [launch])
    k = build_from_log(log, alloc).kernels[0]
    assert k.indirect and set(k.reads) == set(k.writes) == {0, 1}
    k_all = build_from_log(log, alloc, indirect_scope="all").kernels[0]
    assert set(k_all.reads) == set(k_all.writes) == {0, 1, 2}


def test_struct_words_resolve_each_pointer(tmp_path: Path) -> None:
    shutil.copy(CORPUS / "sm_90" / "indirect.ptx", tmp_path / "m.ptx")
    # struct Args {const float* in; float* out; int n;}: read-write through the aggregate covers both pointers
    launch = {"kernel": "struct_args", "module": "m.ptx", "args": [[65536 + 8, 8192, 100]]}
    log, alloc = _write(tmp_path, ALLOCS, [launch])
    k = build_from_log(log, alloc).kernels[0]
    assert set(k.reads) == set(k.writes) == {1, 2} and not k.indirect


@pytest.mark.parametrize(("allocs", "launch", "needle"), [
    (ALLOCS[:1] + [{"name": "b", "base": 4100, "bytes": 8, "role": "input"}], {}, "overlap"),
    ([{"name": "b", "base": 4096, "bytes": 8, "role": "cache"}], {}, "valid: activation"),
    (ALLOCS, {"kernel": "nope", "module": "m.ptx", "args": []}, "valid: "),
    (ALLOCS, {"kernel": "fill", "module": "m.ptx", "args": [1]}, "takes 3 arguments"),
    (ALLOCS, {"kernel": "fill", "module": "m.ptx", "args": ["zz", 1.0, 3]}, "integer"),
])
def test_bad_inputs_are_one_line_errors(tmp_path: Path, allocs: list[dict[str, object]],
                                        launch: dict[str, object], needle: str) -> None:
    shutil.copy(CORPUS / "sm_90" / "elementwise.ptx", tmp_path / "m.ptx")
    log, alloc = _write(tmp_path, allocs, [launch] if launch else [])
    with pytest.raises(ValueError, match=needle) as ei:
        build_from_log(log, alloc)
    assert "\n" not in str(ei.value)


def test_cli_analyze_json_and_graph(tmp_path: Path) -> None:
    _register_all()
    r = CliRunner().invoke(app, ["ptx", "analyze", str(CORPUS / "sm_80" / "funcs.ptx"), "--json"])
    assert r.exit_code == 0, r.output
    doc = {e["name"]: e for e in json.loads(r.output)}
    assert [p["access"] for p in doc["call_twice"]["params"]] == ["read-write", "read", "read-write", "untouched"]
    out = tmp_path / "g.json"
    r = CliRunner().invoke(app, ["ptx", "graph", str(EXAMPLE / "launches.jsonl"), "--alloc",
                                 str(EXAMPLE / "allocations.json"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "5 edges" in r.output and len(KernelGraph.load(out).edges) == 5
