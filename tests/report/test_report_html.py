"""The HTML report: self-contained, every given section present, omitted ones noted, text escaped; the CLI."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest
from report_inputs import compare_cells, of_plan, sim_result, toy_graph, toy_plan

from tessera.cli import main
from tessera.report import plots
from tessera.report.data import ReportData, evaluation_maps, load_evaluation, parse_cell, parse_sim
from tessera.report.html import build_report

SECTIONS = ("compare", "placement", "gantt", "frontier", "latency", "memory", "deploy", "evaluation",
            "method")
STUDY = Path(__file__).parent.parent.parent / "bench" / "results" / "eval.quick.json"  # `tessera evaluate --quick`


@pytest.fixture(scope="module")
def full_page(tmp_path_factory) -> str:
    """One report with every section, built once for the tests that read it."""
    tmp = tmp_path_factory.mktemp("full")
    return build_report(_full_data(tmp), tmp / "out").read_text()


def _full_data(tmp_path) -> ReportData:
    gantt = plots.plot_frontier(plots.frontier_from_cells([parse_cell(c, "t") for c in compare_cells()],
                                                          "llama-3-70b"), tmp_path / "gantt.png")
    return ReportData(
        compare=tuple(parse_cell(c, "t") for c in compare_cells()), plan=toy_plan(), graphs=(toy_graph(),),
        sims=(parse_sim(sim_result(1.0), "tessera", "t"), parse_sim(sim_result(2.0), "homo<geneous>", "t")),
        gantt_png=gantt, commands=("tessera compare --json > compare.json",),
        evaluation=load_evaluation(STUDY), evaluation_maps=evaluation_maps(STUDY))


def _assert_self_contained(page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "<script" not in page.lower() and "<link" not in page.lower() and "@import" not in page
    srcs = re.findall(r'<img [^>]*src="([^"]*)"', page)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    for s in srcs:  # each embeds a real PNG
        assert base64.b64decode(s.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"


def test_full_report_is_self_contained_with_every_section(full_page: str) -> None:
    page = full_page
    _assert_self_contained(page)
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in page
    assert "omitted" not in page
    # compare, placement, gantt, one frontier (llama: two GPU sets; the others have one price), latency, memory,
    # and the study's best and worst placement maps (one when the best and the worst cell are one)
    maps = len(load_evaluation(STUDY).summary.extremes)
    assert maps in (1, 2) and page.count("<img ") == 6 + maps
    # escaped names: the plan's model and a sim label; never the raw '<'
    assert "toy&lt;2L&gt;" in page and "toy<2L>" not in page
    assert "homo&lt;geneous&gt;" in page and "mamba-2&lt;x&gt;" in page and "mamba-2<x>" not in page


def test_first_screen_and_placement_numbers_by_hand(full_page: str) -> None:
    page = full_page
    # a plan is given: the first screen is about its pool (H100-SXM + L40S), whatever the matrix holds
    assert "Rent <b>1× H100-SXM + 1× L40S</b> ($4.09/h) and serve <b>toy&lt;2L&gt;</b>" in page
    # these sims record no rate: the first screen says so rather than invent one
    # (sim_result: 2,500 tok/s, 90% of requests within the SLO: 2,250 tok/s of goodput)
    assert ("<th>Checked by simulation</th><td>at a rate the runs do not record: 2,250 tok/s (one seed: no "
            "spread) met the SLO") in page
    # toy assignment: 6 of 15 kernels on d0
    assert "decode: 40% on d0 H100-SXM, 60% on d1 L40S (of 15 kernels, 2 micro-batches" in page


def test_headline_without_a_plan_leads_with_the_largest_gain(tmp_path) -> None:
    cells = tuple(parse_cell(c, "t") for c in compare_cells())
    sims = (parse_sim(sim_result(1.0), "tessera", "t"),)
    page = build_report(ReportData(compare=cells, sims=sims), tmp_path).read_text()
    assert "<b>llama-3-70b</b> on <b>H100-SXM+L40S</b>" in page and "<b>1.20×</b> the goodput" in page
    # sim_result(1.0): p99 TPOT 4 × 0.01 s
    assert "lowest p99 time per output token is 40.00 ms (tessera)" in page


def test_missing_sections_are_noted_not_dropped(tmp_path) -> None:
    data = ReportData(compare=tuple(parse_cell(c, "t") for c in compare_cells()), title="T <&> x")
    page = build_report(data, tmp_path).read_text()
    _assert_self_contained(page)
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in page
    # placement, gantt, latency, memory, deploy, evaluation, and mamba/flux's one-price frontier
    assert page.count('class="note"') == 7
    assert "Placement map omitted" in page and "Latency percentiles omitted" in page
    assert "Evaluation study omitted" in page
    assert "<title>T &lt;&amp;&gt; x</title>" in page


def test_cli_builds_report_and_bad_files_exit_2(tmp_path, capsys) -> None:
    (tmp_path / "compare.json").write_text(json.dumps(compare_cells()))
    toy_plan().save(tmp_path / "plan.json")
    toy_graph().save(tmp_path / "graph.json")
    (tmp_path / "sim_tessera.json").write_text(json.dumps(of_plan(sim_result(1.0), toy_plan())))
    with pytest.raises(SystemExit) as ok:  # click's standalone mode exits 0 on success
        main(["report", "-q", "--plan", str(tmp_path / "plan.json"), "--graph", str(tmp_path / "graph.json"),
              "--sim", str(tmp_path / "sim_tessera.json"), "--out-dir", str(tmp_path / "out")])
    assert ok.value.code == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert 'alt="placement map, decode"' in page and 'alt="latency percentiles"' in page
    assert 'alt="pipeline gantt"' in page  # drawn from the plan by the simulator's Gantt
    capsys.readouterr()
    for args, msg in ((["--compare", str(tmp_path / "nope.json")], "cannot read compare file"),
                      (["--plan", str(tmp_path / "compare.json")], "holds a JSON list, not an object"),
                      (["--plan", str(tmp_path / "graph.json")], "neither a plan (no \"phases\") nor a pool plan"),
                      (["--sim", str(tmp_path / "plan.json")], "field 'requests' must be a number"),
                      ([], "nothing to report")):
        with pytest.raises(SystemExit) as e:
            main(["report", "-q", *args, "--out-dir", str(tmp_path / "bad")])
        assert e.value.code == 2
        err = capsys.readouterr().err.strip()
        assert msg in err and len(err.splitlines()) == 1, err


def test_study_markdown_becomes_html_tables() -> None:
    from tessera.report.html import markdown_html

    md = "# Title\n\n| a | b |\n|---|---|\n| **x** | `y` |\n\n- one\n  - two\ntext <b>\n"
    assert markdown_html(md) == ("<h3>Title</h3><table><tr><th>a</th><th>b</th></tr><tr><td><b>x</b></td>"
                                 "<td><code>y</code></td></tr></table><ul><li>one</li><li>two</li></ul>"
                                 "<p>text &lt;b&gt;</p>")
