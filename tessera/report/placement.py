"""Placement map: layers × kernel kinds, each cell striped by the devices its kernels run on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.collections import PatchCollection  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from tessera.contracts.ir import KernelGraph, KernelKind  # noqa: E402
from tessera.errors import UserError  # noqa: E402

DPI = 150
PROLOGUE, EPILOGUE = "pro", "epi"


def device_colours(n: int) -> list[tuple[float, float, float, float]]:
    """One colour per device index, stable across every plot of a report (tab10, then tab20)."""
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


@dataclass(frozen=True, kw_only=True)
class PlacementGrid:
    """The data the map draws. ``cells[r][c]``: device index of every kernel of kind ``kinds[r]`` in
    column ``columns[c]``, in program order (empty: no such kernel there)."""

    columns: tuple[str, ...]  # "pro", "0", "1", …, "epi" (pro/epi only when present)
    kinds: tuple[KernelKind, ...]  # rows, in KernelKind declaration order
    cells: tuple[tuple[tuple[int, ...], ...], ...]

    def majority(self) -> list[list[int]]:
        """Per cell the device holding most of its kernels (lowest index on ties); -1 when empty."""
        return [[max(sorted(set(c)), key=c.count) if c else -1 for c in row] for row in self.cells]

    def kernels_per_device(self, n_devices: int) -> list[int]:
        out = [0] * n_devices
        for row in self.cells:
            for c in row:
                for d in c:
                    out[d] += 1
        return out


def placement_grid(graph: KernelGraph, assignment: tuple[int, ...] | list[int]) -> PlacementGrid:
    """Group kernels by (kind, layer). Unlayered kernels before the first layered one are the
    prologue (embedding, rotary tables); all later unlayered ones the epilogue (final norm, lm head)."""
    if len(assignment) != len(graph.kernels):
        raise UserError(f"plan phase {graph.phase!r} assigns {len(assignment)} kernels but the {graph.model} "
                        f"{graph.phase} graph has {len(graph.kernels)}: pass the graph the plan was made from")
    layered = [k.id for k in graph.kernels if k.layer is not None]
    first = layered[0] if layered else len(graph.kernels)
    layers = sorted({k.layer for k in graph.kernels if k.layer is not None})

    def column(kid: int, layer: int | None) -> str:
        if layer is not None:
            return str(layer)
        return PROLOGUE if kid < first else EPILOGUE

    cols_used = {column(k.id, k.layer) for k in graph.kernels}
    columns = tuple(c for c in (PROLOGUE, *map(str, layers), EPILOGUE) if c in cols_used)
    kinds = tuple(k for k in KernelKind if any(x.kind == k for x in graph.kernels))
    ci, ri = {c: i for i, c in enumerate(columns)}, {k: i for i, k in enumerate(kinds)}
    cells: list[list[list[int]]] = [[[] for _ in columns] for _ in kinds]
    for k in graph.kernels:
        cells[ri[k.kind]][ci[column(k.id, k.layer)]].append(int(assignment[k.id]))
    return PlacementGrid(columns=columns, kinds=kinds,
                         cells=tuple(tuple(tuple(c) for c in row) for row in cells))


def _runs(devs: tuple[int, ...]) -> list[tuple[int, int]]:
    """Run-length encoding: [(device, count)] in program order."""
    out: list[tuple[int, int]] = []
    for d in devs:
        if out and out[-1][0] == d:
            out[-1] = (d, out[-1][1] + 1)
        else:
            out.append((d, 1))
    return out


PANEL_COLUMNS = 42  # columns per panel: more layers wrap onto further panels so labels stay legible


def _panels(grid: PlacementGrid) -> list[range]:
    n = len(grid.columns)
    k = max(1, -(-n // PANEL_COLUMNS))
    per = -(-n // k)  # balanced: 82 columns -> two panels of 41
    return [range(i, min(n, i + per)) for i in range(0, n, per)]


def placement_figsize(grid: PlacementGrid) -> tuple[float, float]:
    """Inches: 0.22 in per column of the widest panel, 1.2 + 0.42 in per kernel kind per panel, 1.2 in of
    title and legend."""
    panels = _panels(grid)
    width = max(8.0, 3.0 + 0.22 * max(len(p) for p in panels))
    return (width, 1.2 + len(panels) * (1.2 + 0.42 * len(grid.kinds)))


def _draw_panel(ax: plt.Axes, grid: PlacementGrid, cols: range, colours: list) -> None:
    patches, faces = [], []
    outlines = []
    for r, row in enumerate(grid.cells):
        for x, c in enumerate(cols):
            devs = row[c]
            y = r - 0.45  # the y axis points down (ylim inverted): the first stripe is the cell's top
            for d, count in _runs(devs):
                h = 0.9 * count / len(devs)
                patches.append(Rectangle((x - 0.45, y), 0.9, h))
                faces.append(colours[d])
                y += h
            if len(set(devs)) > 1:  # an outline marks cells whose kernels are split over devices
                outlines.append(Rectangle((x - 0.45, r - 0.45), 0.9, 0.9))
    ax.add_collection(PatchCollection(patches, facecolors=faces, edgecolors="none"))
    ax.add_collection(PatchCollection(outlines, facecolors="none", edgecolors="black", linewidths=0.5))
    ax.set_xlim(-0.6, PANEL_COLUMNS - 0.4 if len(cols) < len(grid.columns) else len(cols) - 0.4)
    ax.set_ylim(len(grid.kinds) - 0.4, -0.6)
    ax.set_xticks(range(len(cols)), [grid.columns[c] for c in cols], fontsize=7)
    ax.set_yticks(range(len(grid.kinds)), [k.value for k in grid.kinds], fontsize=8)
    ax.tick_params(length=0)
    for s in ax.spines.values():
        s.set_visible(False)


def placement_figure(graph: KernelGraph, assignment: tuple[int, ...] | list[int], device_names: list[str], *,
                     title: str | None = None) -> plt.Figure:
    """Each cell is one (kernel kind, layer); it is cut top-to-bottom into stripes in program order, a
    stripe's height the share of that cell's kernels on one device, coloured by device. Models with more
    than PANEL_COLUMNS layers wrap onto stacked panels."""
    grid = placement_grid(graph, assignment)
    n_dev = len(device_names)
    if max(assignment, default=0) >= n_dev:
        raise UserError(f"placement uses device {max(assignment)} but only {n_dev} device names were given")
    colours = device_colours(n_dev)
    panels = _panels(grid)
    fig, axes = plt.subplots(len(panels), 1, figsize=placement_figsize(grid), dpi=DPI, squeeze=False)
    for ax, cols in zip(axes[:, 0], panels, strict=True):
        _draw_panel(ax, grid, cols, colours)
        ax.set_ylabel("kernel kind", fontsize=8)
    axes[-1, 0].set_xlabel("layer (pro = before the first layer, epi = after the last)", fontsize=9)
    counts = grid.kernels_per_device(n_dev)
    handles = [Patch(color=colours[i], label=f"d{i} {name} ({counts[i]} kernels)")
               for i, name in enumerate(device_names)]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, n_dev), fontsize=8, frameon=False)
    fig.suptitle(title or f"Placement of {graph.model} {graph.phase}: device of each kernel "
                          f"({len(graph.kernels)} kernels; cells split by share of kernels)", fontsize=10)
    fig.tight_layout(rect=(0, 0.45 / placement_figsize(grid)[1], 1, 1))
    return fig


def plot_placement_map(graph: KernelGraph, assignment: tuple[int, ...] | list[int], device_names: list[str],
                       path: Path, *, title: str | None = None) -> Path:
    """The placement map as a PNG at DPI (size: placement_figsize); returns the path written."""
    fig = placement_figure(graph, assignment, device_names, title=title)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)
