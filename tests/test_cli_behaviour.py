"""Issue 17's CLI defects where the right behaviour is to work: options, JSON, help text, piped output."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tessera.capture.zoo import SPECS

ROOT = Path(__file__).parents[1]
EXAMPLE_PTX = ROOT / "examples" / "ptx"
TESSERA = [sys.executable, "-m", "tessera"]


# defect 10: --version, -h
def test_version_is_the_package_version(run_cli) -> None:
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    code, out, _ = run_cli(["--version"])
    assert code == 0 and out == f"tessera {want}\n"


@pytest.mark.parametrize("argv", [["-h"], ["trace", "-h"], ["ptx", "graph", "-h"], ["fleet", "plan", "-h"]])
def test_short_help_everywhere(run_cli, argv: list[str]) -> None:
    code, out, _ = run_cli(argv)
    assert code == 0 and out.startswith("Usage: tessera") and "-h, --help" in out


# defect 6: help text is shown as written, not eaten as rich markup
def test_fleet_plan_help_keeps_toml_brackets(run_cli) -> None:
    code, out, _ = run_cli(["fleet", "plan", "-h"])
    assert code == 0 and "[[gpu]] type + count" in out


# defect 10: trace --help states what --seq and --context default to, per phase (capture's defaults:
# a 512-token prompt, one decode token against 2048 cached ones)
def test_trace_help_shows_seq_and_context_defaults(run_cli) -> None:
    code, out, _ = run_cli(["trace", "-h"])
    flat = " ".join(out.split())
    assert code == 0 and "prefill 512" in flat and "decode 1" in flat and "decode 2048" in flat


# defect 3: trace writes its graph with -o/--out, as plan does; --output stays "output tokens" elsewhere
def test_trace_out_option_writes_the_graph(tmp_path: Path, run_cli) -> None:
    from tessera.graph.ir import KernelGraph

    path = tmp_path / "g.json"
    code, out, err = run_cli(["trace", "llama-tiny", "--phase", "prefill", "--seq", "8", "--json", "--out", str(path)])
    assert code == 0, err
    g = KernelGraph.load(path)
    assert g.model == "llama-tiny" and len(g.kernels) == json.loads(out)["kernels"] > 0
    code, _, _ = run_cli(["trace", "llama-tiny", "--phase", "prefill", "--output", str(path)])
    assert code == 2  # no such option on trace any more
    for verb in (["plan"], ["advise"], ["fleet", "plan"]):
        _, help_text, _ = run_cli([*verb, "-h"])
        assert "--output <int>" in help_text and "output tokens" in help_text, verb


def test_model_directory_traces_like_its_config(tmp_path: Path, run_cli) -> None:
    folder = tmp_path / "my-llama"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SPECS["llama-tiny"].config))
    code, out, err = run_cli(["trace", str(folder), "--phase", "prefill", "--seq", "8", "--json"])
    code_f, out_f, _ = run_cli(["trace", str(folder / "config.json"), "--phase", "prefill", "--seq", "8", "--json"])
    assert code == code_f == 0, err
    a, b = json.loads(out), json.loads(out_f)
    assert a["model"] == b["model"] == "my-llama"
    assert (a["kernels"], a["weight_bytes"]) == (b["kernels"], b["weight_bytes"])


# defect 10: --json on models, profile, report, ptx graph; models is not cut when piped
def test_models_json_lists_the_zoo(run_cli) -> None:
    code, out, _ = run_cli(["models", "--json"])
    rows = json.loads(out)
    assert code == 0 and [r["model"] for r in rows] == list(SPECS)
    assert {r["model"]: r["family"] for r in rows}["llama-3-8b"] == "llm"


def test_models_piped_is_not_truncated() -> None:
    r = subprocess.run([*TESSERA, "models"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "…" not in r.stdout
    for s in SPECS.values():  # every source in full, on one line
        assert s.source in r.stdout, s.source


def test_ptx_graph_json_edges_by_hand(run_cli) -> None:
    # the shipped three-kernel pipeline (see tests/ptx/test_ptx_launch.py): RAW 0->1 a, 1->2 a; WAW 0->1 a;
    # WAR 0->2 x, 1->2 x
    code, out, err = run_cli(["ptx", "graph", str(EXAMPLE_PTX / "launches.jsonl"), "--alloc",
                              str(EXAMPLE_PTX / "allocations.json"), "--json"])
    assert code == 0, err
    j = json.loads(out)
    assert (j["kernels"], j["buffers"], j["edges"]) == (3, 4, 5)
    got = {(e["src"], e["dst"], e["kind"], e["buffer"]) for e in j["edge_list"]}
    assert got == {(0, 1, "raw", "a"), (0, 1, "waw", "a"), (1, 2, "raw", "a"), (0, 2, "war", "x"),
                   (1, 2, "war", "x")}


@pytest.mark.slow
def test_profile_json_names_what_it_wrote(tmp_path: Path, run_cli) -> None:
    code, out, err = run_cli(["profile", "llama-tiny", "--batches", "1,2", "--repeats", "1", "--out",
                              str(tmp_path), "--json"])
    assert code == 0, err
    j = json.loads(out)
    assert j["batches"] == [1, 2] and j["files"] == ["kernels.csv", "mlp.csv"] and j["kernel_timings"] > 0
    assert Path(j["folder"]) == tmp_path / "cpu" / "llama-tiny"


# defect 5: report reads the list of labelled results make demo writes to sims.json; defect 10: --json
def _sim(label: str, tokens_per_s: float) -> dict[str, object]:
    pct = {"p50": 0.1, "p90": 0.2, "p99": 0.4}
    return {"label": label, "requests": 100, "completed": 100, "lost": 0, "sim_wall_s": 2.0,
            "throughput_tokens_per_s": tokens_per_s, "ttft_s": pct, "tpot_s": pct, "e2e_s": pct,
            "slo_attainment": 0.5, "usd_per_million_tokens": 1.0}


def test_report_reads_demo_sims_list(tmp_path: Path, run_cli) -> None:
    sims = tmp_path / "sims.json"
    sims.write_text(json.dumps([_sim("tessera", 2000.0), _sim("homogeneous", 1500.0)]))
    single = tmp_path / "sim_pd.json"
    single.write_text(json.dumps(_sim("ignored", 1000.0)))
    code, out, err = run_cli(["report", "--sim", str(sims), "--sim", str(single), "--out-dir", str(tmp_path / "r"),
                              "--json"])
    assert code == 0, err
    j = json.loads(out)
    assert j["sims"] == ["tessera", "homogeneous", "pd"]  # list entries keep their labels; a file its stem
    assert Path(j["report"]).is_file() and "Latency percentiles" in j["sections"]


def test_report_empty_sims_list_is_one_line(tmp_path: Path, run_cli) -> None:
    sims = tmp_path / "sims.json"
    sims.write_text("[]")
    code, _, err = run_cli(["report", "--sim", str(sims), "--out-dir", str(tmp_path / "r")])
    assert code == 2 and "holds an empty list" in err and len(err.splitlines()) == 1


def test_help_does_not_import_torch() -> None:
    # `tessera --help` lists every verb; only capturing needs torch and Triton (~3 s to import).
    code = ("import sys; import tessera.cli as c; c._register_all(); "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_report_shows_the_evaluation_study(tmp_path: Path, run_cli) -> None:
    study = Path(__file__).parent.parent / "bench" / "results" / "eval.quick.json"
    code, out, err = run_cli(["report", "--evaluation", str(study), "--out-dir", str(tmp_path / "r"), "--json"])
    assert code == 0, err
    page = Path(json.loads(out)["report"]).read_text()
    section = page.split('<section id="evaluation">')[1].split("</section>")[0]
    data = json.loads(study.read_text())
    assert all(c["model"] in section for c in data["cells"])  # every studied model is in the section
    # the placement maps written beside the JSON: the best and the worst cell's, one when they are one cell
    maps = len(data["summary"]["extremes"])
    assert maps in (1, 2) and section.count("data:image/png") == maps
    bad = tmp_path / "bad.json"
    bad.write_text('{"cells": 3}')
    code, _, err = run_cli(["report", "--evaluation", str(bad), "--out-dir", str(tmp_path / "r2")])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "cells" in err
