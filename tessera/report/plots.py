"""Report figures (matplotlib, Agg): frontier, compare matrix, latency percentiles, memory per device.
Each function writes one PNG at DPI and returns its path; sizes are fixed per input shape (no tight bbox)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from tessera.contracts.plan import Plan
from tessera.report.data import (  # noqa: E402
    CompareCell,
    FrontierPoint,
    GanttFacts,
    GanttSpan,
    SimRun,
    strategy_order,
)
from tessera.report.placement import DPI, device_colours, plot_placement_map  # noqa: E402

__all__ = ["DPI", "plot_placement_map", "pareto_frontier", "plot_frontier", "plot_compare_matrix",
           "plot_latency_percentiles", "latency_figure", "plot_goodput_curves", "plot_memory", "plot_gantt",
           "gantt_figure", "frontier_order", "strategy_colour"]

_STRATEGY_COLOURS = {"tessera": "#d62728", "homogeneous": "#7f7f7f", "prefill_decode": "#1f77b4",
                     "attention_ffn": "#2ca02c", "layer_pipeline": "#9467bd", "mix": "#ff7f0e"}
_ROLE_COLOURS = {"weight": "#4c72b0", "kv": "#dd8452", "state": "#937860", "activation": "#55a868"}
WIDE_SPAN = 20.0  # max/min beyond which an axis goes logarithmic


def strategy_colour(name: str) -> str:
    return _STRATEGY_COLOURS.get(name, "#17becf")


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)


def _wide(values: list[float]) -> bool:
    pos = [v for v in values if v > 0]
    return len(pos) > 1 and max(pos) / min(pos) > WIDE_SPAN


def pareto_frontier(points: list[FrontierPoint] | tuple[FrontierPoint, ...]) -> list[FrontierPoint]:
    """Points no other point beats on both cost (lower) and throughput (higher), by rising cost."""
    best: list[FrontierPoint] = []
    for p in sorted(points, key=lambda p: (p.usd_per_hour, -p.throughput_per_s)):
        if not best or p.throughput_per_s > best[-1].throughput_per_s:
            best.append(p)
    return best


def frontier_order(points: list[FrontierPoint] | tuple[FrontierPoint, ...]) -> list[FrontierPoint]:
    """The order in which a frontier figure numbers its points: by cost, then by falling throughput."""
    return sorted(points, key=lambda p: (p.usd_per_hour, -p.throughput_per_s, p.label))


def plot_frontier(points: list[FrontierPoint] | tuple[FrontierPoint, ...], path: Path, *,
                  title: str = "Throughput vs cost", unit: str = "tokens/s") -> Path:
    """Scatter by group (strategy or mix) with the Pareto staircase: for a budget on the x axis, the
    best throughput any option within it reaches. Points are numbered in frontier_order."""
    return _save(frontier_figure(points, title=title, unit=unit), path)


def frontier_figure(points: list[FrontierPoint] | tuple[FrontierPoint, ...], *, title: str = "Throughput vs cost",
                    unit: str = "tokens/s") -> plt.Figure:
    """The figure plot_frontier saves."""
    fig, ax = plt.subplots(figsize=(9.5, 5), dpi=DPI)
    groups = strategy_order({p.group for p in points})
    markers = "o^sDvP*X"
    for i, g in enumerate(groups):
        ps = [p for p in points if p.group == g]
        ax.scatter([p.usd_per_hour for p in ps], [p.throughput_per_s for p in ps], s=46, zorder=3,
                   marker=markers[i % len(markers)], color=strategy_colour(g), label=g, edgecolors="black",
                   linewidths=0.4)
    front = pareto_frontier(points)
    xs = [p.usd_per_hour for p in front]
    ys = [p.throughput_per_s for p in front]
    if front:
        xmax = max(p.usd_per_hour for p in points) * 1.02
        ax.step([*xs, xmax], [*ys, ys[-1]], where="post", color="black", lw=1.2, ls="--", zorder=2,
                label="Pareto frontier")
        ax.margins(x=0.08)
    # Numbers, not names, beside the points (names overprint where options cost alike); points at one
    # position share one annotation. The numbering is frontier_order's, listed in a table by the caller.
    at: dict[tuple[float, float], list[int]] = {}
    for i, p in enumerate(frontier_order(points), start=1):
        at.setdefault((p.usd_per_hour, p.throughput_per_s), []).append(i)
    on_front = {(p.usd_per_hour, p.throughput_per_s) for p in front}
    for (x, y), nums in at.items():  # frontier labels above their point, the others below: a dominated option
        up = (x, y) in on_front          # sits under a frontier one of similar cost, so the two labels separate
        ax.annotate(",".join(map(str, nums)), (x, y), textcoords="offset points", xytext=(6, 4 if up else -6),
                    va="bottom" if up else "top", fontsize=8, fontweight="bold")
    if _wide([p.usd_per_hour for p in points]):
        ax.set_xscale("log")
    if _wide([p.throughput_per_s for p in points]):
        ax.set_yscale("log")
    else:
        ax.set_ylim(bottom=0, top=max((p.throughput_per_s for p in points), default=1.0) * 1.12)
    ax.set_xlabel("cost (USD per hour)")
    ax.set_ylabel(f"throughput ({unit})")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def compare_figsize(cells: tuple[CompareCell, ...] | list[CompareCell]) -> tuple[float, float]:
    models = list(dict.fromkeys(c.model for c in cells))
    pools = max(sum(c.model == m for c in cells) for m in models)
    return (max(8.0, 2.0 + 1.7 * pools), 1.0 + 2.5 * len(models))


def plot_compare_matrix(cells: tuple[CompareCell, ...] | list[CompareCell], path: Path) -> Path:
    """One panel per model; per GPU set grouped bars of every strategy's throughput. A strategy that
    does not apply is written 'n/a' (and 'infeasible' when it does not fit) instead of a zero bar."""
    models = list(dict.fromkeys(c.model for c in cells))
    names = strategy_order({n for c in cells for n in c.strategies})
    fig, axes = plt.subplots(len(models), 1, figsize=compare_figsize(cells), dpi=DPI, squeeze=False)
    width = 0.8 / len(names)
    for ax, model in zip(axes[:, 0], models, strict=True):
        mcells = [c for c in cells if c.model == model]
        top = max((r.throughput_per_s or 0.0 for c in mcells for r in c.strategies.values() if r.scored),
                  default=1.0)
        for j, name in enumerate(names):
            xs = np.arange(len(mcells)) + (j - (len(names) - 1) / 2) * width
            for x, cell in zip(xs, mcells, strict=True):
                r = cell.strategies.get(name)
                if r is not None and r.scored:
                    ax.bar(x, r.throughput_per_s, width, color=strategy_colour(name), edgecolor="black", lw=0.3)
                    continue
                mark = "n/a" if r is None or not r.applicable else "infeasible"
                ax.bar(x, top * 0.03, width, color="none", edgecolor="#999999", hatch="///", lw=0.5)
                ax.text(x, top * 0.05, mark, rotation=90, ha="center", va="bottom", fontsize=6.5, color="#555555")
            # speedup of tessera over the best baseline, written over its bar
        for x, cell in zip(np.arange(len(mcells)) - (len(names) - 1) / 2 * width, mcells, strict=True):
            s, t = cell.speedup(), cell.strategies.get("tessera")
            if s is not None and t is not None and "tessera" in names:
                ax.text(x + names.index("tessera") * width, t.throughput_per_s or 0.0, f"{s:.2f}×",
                        ha="center", va="bottom", fontsize=7, fontweight="bold")
        ax.set_xticks(range(len(mcells)), [c.pool for c in mcells], fontsize=8)
        ax.set_ylim(0, top * 1.18)
        ax.set_ylabel(f"throughput ({mcells[0].unit})", fontsize=8)
        ax.set_title(f"{model}: predicted throughput per GPU set (× = Tessera over best baseline)", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=strategy_colour(n)) for n in names]
    fig.legend(handles, names, loc="lower center", ncol=len(names), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.4 / compare_figsize(cells)[1], 1, 1))
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)


def by_label(sims: tuple[SimRun, ...] | list[SimRun]) -> dict[str, list[SimRun]]:
    """Runs grouped by plan label, in strategy order (one entry per seed)."""
    groups: dict[str, list[SimRun]] = {}
    for r in sims:
        groups.setdefault(r.label, []).append(r)
    return {k: groups[k] for k in strategy_order(list(groups))}


def operating_label(label: str, runs: list[SimRun]) -> str:
    """'tessera\n27.8 req/s, 90% of capacity': the rate each plan was run at, under its name."""
    rates = sorted({r.rate_per_s for r in runs if r.rate_per_s is not None})
    loads = [r.load for r in runs if r.load is not None]
    text = label
    if len(rates) == 1:
        text += f"\n{rates[0]:.3g} req/s"
        if loads:
            text += f", {100 * float(np.median(loads)):.0f}% of cap."
    return text


def plot_latency_percentiles(sims: tuple[SimRun, ...] | list[SimRun], path: Path, *,
                             slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> Path:
    """Three panels (TTFT, TPOT, end-to-end): per plan, bars of p50 / p90 / p99 in ms, the median over seeds
    with whiskers from the lowest to the highest seed; the SLO as a red line on the TTFT and TPOT panels
    (taken from the runs when not given)."""
    return _save(latency_figure(sims, slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s), path)


def latency_figure(sims: tuple[SimRun, ...] | list[SimRun], *, slo_ttft_s: float | None = None,
                   slo_tpot_s: float | None = None) -> plt.Figure:
    """The figure plot_latency_percentiles saves."""
    groups = by_label(sims)
    slo = {"ttft_s": slo_ttft_s or next((r.slo_ttft_s for r in sims if r.slo_ttft_s), None),
           "tpot_s": slo_tpot_s or next((r.slo_tpot_s for r in sims if r.slo_tpot_s), None)}
    fig, axes = plt.subplots(1, 3, figsize=(13, 4.8), dpi=DPI)
    shades = {"p50": 0.35, "p90": 0.65, "p99": 1.0}
    labels = list(groups)
    for ax, (metric, title) in zip(axes, (("ttft_s", "time to first token"), ("tpot_s", "time per output token"),
                                          ("e2e_s", "end-to-end latency")), strict=True):
        allv = []
        for j, (q, alpha) in enumerate(shades.items()):
            vals = [np.array([getattr(r.result, metric)[q] * 1e3 for r in groups[k]]) for k in labels]
            mid = np.array([np.median(v) for v in vals])
            err = np.array([mid - [v.min() for v in vals], [v.max() for v in vals] - mid])
            xs = np.arange(len(labels)) + (j - 1) * 0.27
            ax.bar(xs, mid, 0.27, color=[strategy_colour(k) for k in labels], alpha=alpha, edgecolor="black",
                   lw=0.3, yerr=err if max(len(v) for v in vals) > 1 else None, ecolor="black", capsize=2)
            allv += [x for v in vals for x in v]
        limit = slo.get(metric)
        if limit:
            ax.axhline(limit * 1e3, color="#d62728", ls="--", lw=1.3, zorder=4)
            ax.text(0.99, limit * 1e3, f"SLO {limit * 1e3:,.0f} ms", color="#d62728", ha="right", va="bottom",
                    fontsize=8, transform=ax.get_yaxis_transform())
            allv.append(limit * 1e3)
        if _wide(allv):
            ax.set_yscale("log")
        ax.set_xticks(range(len(labels)), [operating_label(k, groups[k]) for k in labels], rotation=30,
                      ha="right", fontsize=7.5)
        ax.set_ylabel(f"{metric.removesuffix('_s').upper()} (ms)")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", alpha=0.3, which="both")
    seeds = max(len(v) for v in groups.values())
    handles = [plt.Rectangle((0, 0), 1, 1, color="#444444", alpha=a) for a in shades.values()]
    handles.append(plt.Line2D([], [], color="#d62728", ls="--"))
    fig.legend(handles, [*(f"{q} (bar shade)" for q in shades), "SLO"], loc="upper right", ncol=4, fontsize=8,
               frameon=False)
    fig.suptitle("Simulated latency, each plan at its own rate" + (f" (median of {seeds} seeds; whiskers: lowest "
                 "to highest seed)" if seeds > 1 else ""), fontsize=10, x=0.01, ha="left")
    return fig


def plot_goodput_curves(sweep: tuple[SimRun, ...] | list[SimRun], path: Path) -> Path:
    """Goodput against offered rate per plan: where a curve leaves the 'all served in SLO' diagonal the plan
    saturates; each plan's predicted capacity is a dotted vertical line in its colour."""
    groups = by_label(sweep)
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=DPI)
    top = 0.0
    for label, runs in groups.items():
        pts = sorted((r.offered_tokens_per_s or 0.0, r.goodput_tokens_per_s or 0.0) for r in runs)
        xs, ys = [x for x, _ in pts], [y for _, y in pts]
        ax.plot(xs, ys, marker="o", ms=4, color=strategy_colour(label), label=label, lw=1.6)
        cap = next((r.capacity_tokens_per_s for r in runs if r.capacity_tokens_per_s), None)
        if cap:
            ax.axvline(cap, color=strategy_colour(label), ls=":", lw=1.1)
        top = max(top, *xs, *ys)
    ax.plot([0, top], [0, top], color="#999999", lw=0.8, ls="--", label="every request served within SLO")
    ax.set_xlim(0, top * 1.03)
    ax.set_ylim(0, top * 1.03)
    ax.set_xlabel("offered load (output tokens/s = requests/s × output tokens)")
    ax.set_ylabel("goodput (output tokens/s meeting the SLO)")
    ax.set_title("Goodput vs offered rate per plan (dotted: the plan's predicted capacity)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def plot_memory(plan: Plan, path: Path) -> Path:
    """Per device horizontal bars of resident bytes by role (GB), capacity as a black tick."""
    n = len(plan.devices)
    fig, ax = plt.subplots(figsize=(8, 1.8 + 0.55 * n), dpi=DPI)
    roles = [r for r in _ROLE_COLOURS if any(m.get(r, 0) for m in plan.memory_bytes)]
    roles += sorted({r for m in plan.memory_bytes for r in m} - set(roles))
    left = np.zeros(n)
    for role in roles:
        gb = np.array([m.get(role, 0) / 1e9 for m in plan.memory_bytes])
        ax.barh(range(n), gb, left=left, color=_ROLE_COLOURS.get(role, "#c44e52"), label=role, height=0.6)
        left += gb
    cap_gb = [d.mem_bytes / 1e9 for d in plan.devices]
    for i, cap in enumerate(cap_gb):
        ax.plot([cap, cap], [i - 0.4, i + 0.4], color="black", lw=2, label="capacity" if i == 0 else None)
    for i in range(n):
        ax.text(max(left[i], cap_gb[i]) * 1.01, i, f"{left[i]:.1f} / {cap_gb[i]:.0f} GB", va="center", fontsize=8)
    colours = device_colours(n)
    ax.set_yticks(range(n), [f"d{d.index} {d.gpu}" for d in plan.devices], fontsize=8)
    for t, c in zip(ax.get_yticklabels(), colours, strict=True):
        t.set_color(c)
    ax.invert_yaxis()
    ax.set_xlim(0, max([*cap_gb, *left]) * 1.25 if n else 1)
    ax.set_xlabel("resident memory (GB = 1e9 bytes)")
    ax.set_title(f"Memory per device: {plan.model}, {plan.strategy} plan", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=len(roles) + 1, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, path)


def frontier_from_cells(cells: tuple[CompareCell, ...] | list[CompareCell], model: str) -> list[FrontierPoint]:
    """Every scored strategy of every GPU set of one model, as points on the cost-throughput plane."""
    out = []
    for c in cells:
        if c.model != model:
            continue
        for r in c.strategies.values():
            if r.scored and r.usd_per_hour > 0 and not math.isnan(r.throughput_per_s or math.nan):
                out.append(FrontierPoint(label=f"{r.name} {c.pool}", group=r.name, usd_per_hour=r.usd_per_hour,
                                         throughput_per_s=r.throughput_per_s or 0.0))
    return out


def plot_gantt(gantt: GanttFacts, path: Path) -> Path:
    """The plan's iterations as the simulator laid them out (``gantt``, looked up before the report is
    built); this drawing adds the legend: one colour per micro-batch, transfers hatched."""
    return draw_gantt(gantt.spans, path, title=gantt.title)


GANTT_COLOURS = plt.get_cmap("tab10")


def draw_gantt(spans: Sequence[GanttSpan], path: Path, *, title: str) -> Path:
    """One row per device, then one per link; bar colour = micro-batch (legend), hatched = transfer."""
    return _save(gantt_figure(spans, title=title), path)


def gantt_figure(spans: Sequence[GanttSpan], *, title: str) -> plt.Figure:
    """The figure draw_gantt saves."""
    rows = list(dict.fromkeys(s.row for s in sorted(spans, key=lambda s: (s.kind != "compute", s.row))))
    mbs = sorted({s.microbatch for s in spans})
    fig, ax = plt.subplots(figsize=(11, 1.9 + 0.55 * len(rows)), dpi=DPI)
    for s in spans:
        ax.barh(rows.index(s.row), s.dur_s * 1e3, left=s.start_s * 1e3, height=0.6,
                color=GANTT_COLOURS(s.microbatch % 10), edgecolor="black", linewidth=0.3,
                hatch="////" if s.kind == "link" else None)
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title, fontsize=9.5)
    ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, facecolor=GANTT_COLOURS(m % 10), edgecolor="black", lw=0.3) for m in mbs]
    names = [f"micro-batch {m}" for m in mbs]
    if any(s.kind == "link" for s in spans):
        handles.append(plt.Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="black", hatch="////", lw=0.3))
        names.append("transfer on a link (hatched)")
    else:
        names[-1] += " (no transfers between devices)"
    ax.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, -0.22 - 0.1 / max(1, len(rows))),
              ncol=min(len(handles), 5), fontsize=8, frameon=False)
    return fig
