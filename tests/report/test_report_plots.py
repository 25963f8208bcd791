"""Figures: the placement grid worked by hand, the map's pixels match it, PNG sizes, the Pareto frontier."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pytest
from report_inputs import compare_cells, png_size, sim_result

from tessera.errors import UserError
from tessera.graph import KernelKind
from tessera.report import plots
from tessera.report.data import FrontierPoint, parse_cell, parse_sim
from tessera.report.placement import (
    PlacementGrid,
    _panels,
    device_colours,
    placement_figsize,
    placement_figure,
    placement_grid,
)


def test_placement_grid_worked_by_hand(graph) -> None:
    from report_inputs import TOY_ASSIGNMENT
    grid = placement_grid(graph, TOY_ASSIGNMENT)
    assert grid.columns == ("pro", "0", "1", "epi")
    assert grid.kinds == (KernelKind.GEMM, KernelKind.ATTENTION_DECODE, KernelKind.NORM, KernelKind.EMBEDDING)
    assert grid.cells == (
        ((), (0, 1, 1), (0, 1, 1), (0,)),  # gemm: q-proj on d0, o-proj and ffn on d1; lm head on d0
        ((), (1,), (1,), ()),  # attention on d1 in both layers
        ((), (0, 0), (1, 1), (1,)),  # norms: d0 in layer 0, d1 in layer 1 and the final norm
        ((0,), (), (), ()),  # embedding in the prologue on d0
    )
    assert grid.majority() == [[-1, 1, 1, 0], [-1, 1, 1, -1], [-1, 0, 1, 1], [0, -1, -1, -1]]
    assert grid.kernels_per_device(2) == [6, 9]


def test_placement_map_pixels_follow_the_grid(graph) -> None:
    from report_inputs import TOY_ASSIGNMENT
    grid = placement_grid(graph, TOY_ASSIGNMENT)
    fig = placement_figure(graph, TOY_ASSIGNMENT, ["H100-SXM", "L40S"])
    fig.canvas.draw()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    ax = fig.axes[0]
    colours = [np.round(np.array(c[:3]) * 255) for c in device_colours(2)]
    checked = 0
    for r, row in enumerate(grid.cells):
        for c, devs in enumerate(row):
            # sample the centre of each kernel's stripe (stripes run top to bottom in program order)
            for j, d in enumerate(devs or (None,)):
                y = r - 0.45 + 0.9 * (j + 0.5) / max(1, len(devs))
                px, py = ax.transData.transform((c, y))
                got = rgba[int(round(rgba.shape[0] - py)), int(round(px)), :3]
                want = np.array([255, 255, 255]) if d is None else colours[d]
                assert np.abs(got.astype(int) - want).max() <= 2, (r, c, j, got, want)
                checked += 1
    plt.close(fig)
    assert checked == 15 + 7  # every kernel's stripe, and the 7 empty cells stay white


def test_placement_rejects_a_graph_of_another_size(graph) -> None:
    with pytest.raises(UserError, match="assigns 3 kernels but the toy<2L> decode graph has 15"):
        placement_grid(graph, (0, 1, 0))


def test_pngs_have_the_stated_pixel_size(tmp_path, graph) -> None:
    from report_inputs import TOY_ASSIGNMENT, toy_plan
    cells = [parse_cell(c, "test") for c in compare_cells()]
    sims = [parse_sim(sim_result(s), lbl, "test") for s, lbl in ((1.0, "tessera"), (1.5, "prefill_decode"))]
    pts = plots.frontier_from_cells(cells, "llama-3-70b")
    written = {
        # inches × 150 dpi, worked from each function's figsize rule
        plots.plot_frontier(pts, tmp_path / "f.png"): (1425, 750),  # 9.5 × 5 (legend beside the axes)
        plots.plot_latency_percentiles(sims, tmp_path / "l.png"): (1950, 720),  # 13 × 4.8
        plots.plot_memory(toy_plan(), tmp_path / "m.png"): (1200, 435),  # 8 × (1.8 + 0.55·2)
        plots.plot_placement_map(graph, TOY_ASSIGNMENT, ["H100-SXM", "L40S"], tmp_path / "p.png"): (1200, 612),
        plots.plot_compare_matrix(cells, tmp_path / "c.png"): (1200, 1275),  # 8 × (1.0 + 2.5·3 models)
    }
    for path, size in written.items():
        assert path.stat().st_size > 10_000, path  # a blank canvas compresses to ~5 kB
        assert png_size(path) == size, path


def test_pareto_frontier_by_hand() -> None:
    def p(label: str, usd: float, tp: float) -> FrontierPoint:
        return FrontierPoint(label=label, group="mix", usd_per_hour=usd, throughput_per_s=tp)
    pts = [p("b", 2, 5), p("a", 1, 10), p("d", 3, 20), p("c", 2, 20), p("e", 4, 30)]
    # b: a is cheaper and faster; d: c is as fast and cheaper
    assert [x.label for x in plots.pareto_frontier(pts)] == ["a", "c", "e"]


def test_frontier_point_rejects_nonpositive() -> None:
    with pytest.raises(ValueError, match="usd_per_hour=0"):
        FrontierPoint(label="x", group="mix", usd_per_hour=0, throughput_per_s=1.0)


def test_frontier_from_cells_skips_unscored() -> None:
    cells = [parse_cell(c, "test") for c in compare_cells()]
    pts = plots.frontier_from_cells(cells, "llama-3-70b")
    # 5 strategies in the first cell, 4 in the second (prefill_decode is infeasible there)
    assert len(pts) == 9
    assert {x.label for x in pts if x.group == "prefill_decode"} == {"prefill_decode H100-SXM+L40S"}


def test_many_layers_wrap_onto_balanced_panels() -> None:
    def grid(n_cols: int) -> PlacementGrid:
        return PlacementGrid(columns=tuple(map(str, range(n_cols))), kinds=tuple(KernelKind)[:6],
                             cells=tuple(tuple(() for _ in range(n_cols)) for _ in range(6)))
    assert _panels(grid(42)) == [range(0, 42)]
    # 80 layers + prologue + epilogue = 82 columns: two panels of 41
    assert _panels(grid(82)) == [range(0, 41), range(41, 82)]
    # width 3 + 0.22·41 in, height 1.2 + 2·(1.2 + 0.42·6) in
    assert placement_figsize(grid(82)) == pytest.approx((12.02, 8.64))


def _run(label: str, seed: int, scale: float) -> dict:
    return {**sim_result(scale), "label": label, "seed": seed, "rate_per_s": 4.0, "output_tokens": 256,
            "capacity_tokens_per_s": 1200.0, "slo_ttft_s": 2.0, "slo_tpot_s": 0.1}


def test_latency_figure_draws_the_slo_and_the_seed_range() -> None:
    sims = [parse_sim(_run("tessera", s, x), "tessera", "t") for s, x in ((0, 1.0), (1, 1.5), (2, 2.0))]
    fig = plots.latency_figure(sims)
    ttft, tpot, e2e = fig.axes
    # red dashed SLO lines at 2000 ms (TTFT) and 100 ms (TPOT); none on end-to-end
    hlines = [[ln.get_ydata()[0] for ln in ax.get_lines() if ln.get_linestyle() == "--"] for ax in fig.axes]
    assert hlines == [[2000.0], [100.0], []]
    assert any("SLO 2,000 ms" == t.get_text() for t in ttft.texts) and any("SLO 100 ms" == t.get_text() for t in tpot.texts)
    # p99 TPOT over seeds: 40, 60, 80 ms -> bar at the median 60 ms, whisker 40 to 80
    p99_bar = [b for b in tpot.patches if b.get_alpha() == 1.0][0]
    assert p99_bar.get_height() == pytest.approx(60.0)
    # the tick names the plan's own rate and its share of capacity: 4 × 256 / 1200 = 85%
    assert tpot.get_xticklabels()[0].get_text() == "tessera\n4 req/s, 85% of cap."
    plt.close(fig)


def test_gantt_has_a_legend_per_micro_batch_and_hatched_transfers() -> None:
    from tessera.sim.trace import Span
    spans = [Span(row="dev0 H100-SXM", start_s=0.0, dur_s=1e-3, microbatch=0, kind="compute", phase="mixed"),
             Span(row="dev0 H100-SXM", start_s=1e-3, dur_s=1e-3, microbatch=1, kind="compute", phase="mixed"),
             Span(row="link 0->1", start_s=1e-3, dur_s=2e-4, microbatch=0, kind="link", phase="mixed"),
             Span(row="dev1 L40S", start_s=1.2e-3, dur_s=1e-3, microbatch=0, kind="compute", phase="mixed")]
    fig = plots.gantt_figure(spans, title="t")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "micro-batch 0", "micro-batch 1", "transfer on a link (hatched)"]
    # devices first, links after; the link's bar is hatched, compute bars are not
    assert [t.get_text() for t in ax.get_yticklabels()] == ["dev0 H100-SXM", "dev1 L40S", "link 0->1"]
    assert [bool(b.get_hatch()) for b in ax.patches] == [False, False, True, False]
    # micro-batches 0 and 1 in different colours, the same colour for one micro-batch on every row
    faces = [b.get_facecolor() for b in ax.patches]
    assert faces[0] != faces[1] and faces[0] == faces[2] == faces[3]
    plt.close(fig)


def test_frontier_numbers_points_once_and_shares_a_number_label_for_coincident_points() -> None:
    def p(label: str, usd: float, tp: float, group: str = "mix") -> FrontierPoint:
        return FrontierPoint(label=label, group=group, usd_per_hour=usd, throughput_per_s=tp)
    pts = [p("c", 20, 50), p("a", 10, 30), p("a2", 10, 30, "homogeneous"), p("b", 10, 20, "prefill_decode")]
    assert [x.label for x in plots.frontier_order(pts)] == ["a", "a2", "b", "c"]
    fig = plots.frontier_figure(pts)
    # a and a2 sit at one position: one annotation "1,2", never two labels printed over each other
    assert sorted(t.get_text() for t in fig.axes[0].texts) == ["1,2", "3", "4"]
    plt.close(fig)
    from tessera.report.html import frontier_key
    key = frontier_key(pts)
    # one row per point, numbered in frontier_order, the frontier marked (a at $10, then c at $20)
    assert "<td class=num>1</td><td>a</td><td>mix</td>" in key and "<td class=num>4</td><td>c</td>" in key
    assert key.count(">yes<") == 2
