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
        plots.plot_frontier(pts, tmp_path / "f.png"): (1200, 750),  # 8 × 5
        plots.plot_latency_percentiles(sims, tmp_path / "l.png"): (1800, 675),  # 12 × 4.5
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
