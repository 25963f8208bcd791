"""One self-contained report.html: figures as base64 PNG data URIs, inline CSS, no scripts, all text escaped."""

from __future__ import annotations

import base64
import statistics
from collections.abc import Callable
from html import escape
from pathlib import Path

from tessera.errors import UserError
from tessera.hardware import catalog
from tessera.report import plots
from tessera.report.data import CompareCell, ReportData, strategy_order
from tessera.report.tables import (
    PLAN_HEADER,
    SIM_HEADER,
    fmt_rate,
    gain_text,
    plan_rows,
    sim_rows,
    strategy_text,
)
from tessera.text import plural

REFERENCE_CLAIM = "up to 2.3× serving throughput and 1.6× cost efficiency over disaggregation baselines"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1.2em;color:#222;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
.lead{font-size:1.08em;background:#f6f8fa;border-left:4px solid #d62728;padding:.8em 1em}
table{border-collapse:collapse;font-size:.86em;margin:.8em 0}th,td{border:1px solid #ccc;padding:.3em .55em;
vertical-align:top}th{background:#f0f0f0}td.num{text-align:right;white-space:nowrap}td.na{color:#888;
font-style:italic;max-width:14em}td.best{background:#fdecea;font-weight:600}
img{max-width:100%;height:auto;border:1px solid #eee;margin:.5em 0}.note{color:#777;font-style:italic}
code,pre{background:#f4f4f4;border-radius:3px}pre{padding:.6em;overflow-x:auto}
"""


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{data}">'


def _table(header: list[str], rows: list[list[str]], num_cols: set[int] | None = None) -> str:
    """num_cols: right-aligned, unwrapped columns (default: all but the first)."""
    num = set(range(1, len(header))) if num_cols is None else num_cols
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{escape(c)}</td>'
                                    for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _omitted(what: str, how: str) -> str:
    return f'<p class="note">{escape(what)} omitted: {escape(how)}</p>'


def _headline_cell(data: ReportData) -> CompareCell | None:
    """The cell the plan was made for if it is in the matrix, else the one with Tessera's largest gain."""
    cells = data.compare or ()
    if data.plan is not None:
        gpus = sorted(d.gpu for d in data.plan.devices)
        for c in cells:
            if c.model == data.plan.model and sorted(c.gpus) == gpus:
                return c
    scored = [c for c in cells if c.speedup() is not None]
    return max(scored, key=lambda c: c.speedup() or 0.0, default=cells[0] if cells else None)


def _placement_sentence(data: ReportData) -> str:
    """Where the plan's kernels go, per phase: shares of kernels per device."""
    assert data.plan is not None
    plan, per_phase = data.plan, []
    for name, ph in plan.phases.items():
        n = max(1, len(ph.assignment))
        shares = ", ".join(f"{100 * ph.assignment.count(d.index) / n:.0f}% on d{d.index} {escape(d.gpu)}"
                           for d in plan.devices)
        per_phase.append(f"{escape(name)}: {shares} (of {len(ph.assignment)} kernels, {ph.microbatches} "
                         "micro-batches in flight)")
    return f"The {escape(plan.strategy)} plan places " + "; ".join(per_phase) + "."


def headline(data: ReportData) -> str:
    """The question and its answer in one paragraph, with the numbers."""
    parts = ["The question: <em>for this model, these GPUs and this traffic, which placement of the model's "
             "kernels, and how much faster and cheaper is it than the alternatives?</em>"]
    cell = _headline_cell(data)
    if cell is not None:
        t, b = cell.strategies.get("tessera"), cell.best_baseline()
        if t is not None and t.scored:
            parts.append(f"For <b>{escape(cell.model)}</b> on <b>{escape(cell.pool)}</b>, Tessera's kernel "
                         f"placement predicts <b>{escape(fmt_rate(t.throughput_per_s, cell.unit))}</b> at "
                         f"${t.usd_per_hour:.2f}/h")
            s, g = cell.speedup(), cell.cost_gain()
            if b is not None and s is not None:
                parts[-1] += (f": <b>{s:.2f}×</b> the throughput of the best baseline ({escape(b.name)}, "
                              f"{escape(fmt_rate(b.throughput_per_s, cell.unit))} at ${b.usd_per_hour:.2f}/h)")
                parts[-1] += f" and <b>{g:.2f}×</b> its throughput per dollar." if g is not None else "."
            else:
                parts[-1] += "; no baseline applies to this model on these GPUs."
        elif t is not None:
            parts.append(f"Tessera found no placement of <b>{escape(cell.model)}</b> on <b>{escape(cell.pool)}</b>: "
                         f"{escape(t.reason or 'infeasible')}.")
        gains = [g for g in (c.speedup() for c in data.compare or ()) if g is not None]
        if len(gains) > 1:
            parts.append(f"Across {len(gains)} model × GPU cells, Tessera's throughput over the best baseline "
                         f"ranges from {min(gains):.2f}× to {max(gains):.2f}× (median "
                         f"{statistics.median(gains):.2f}×); the reference system reports {REFERENCE_CLAIM}.")
    if data.plan is not None:
        parts.append(_placement_sentence(data))
    if data.sims:
        best = min(data.sims, key=lambda s: s.tpot_s.p99)
        parts.append(f"Simulated under one workload, the lowest p99 time per output token is "
                     f"{best.tpot_s.p99 * 1e3:.2f} ms ({escape(best.label)}).")
    return '<p class="lead">' + " ".join(parts) + "</p>"


def _compare_html(data: ReportData, fig_dir: Path) -> str:
    if not data.compare:
        return _omitted("Compare matrix", "no compare results given (tessera compare --json).")
    cells = data.compare
    names = strategy_order({n for c in cells for n in c.strategies})
    head = "".join(f"<th>{escape(h)}</th>" for h in ("model", "GPUs", *names, "Tessera gain"))
    rows = []
    for c in cells:
        best = max((n for n in names if n in c.strategies and c.strategies[n].scored),
                   key=lambda n: c.strategies[n].throughput_per_s or 0.0, default=None)
        tds = []
        for n in names:
            r = c.strategies.get(n)
            cls = "best" if n == best else ("na" if r is None or not r.scored else "num")
            tds.append(f'<td class="{cls}">' + "<br>".join(escape(x) for x in strategy_text(c, n)) + "</td>")
        rows.append(f"<tr><td>{escape(c.model)}</td><td>{escape(c.pool)}</td>{''.join(tds)}"
                    f'<td class="num">' + "<br>".join(escape(x) for x in gain_text(c)) + "</td></tr>")
    png = plots.plot_compare_matrix(cells, fig_dir / "compare.png")
    return (f"<table><tr>{head}</tr>{''.join(rows)}</table><p>Shaded: the highest throughput in the row. "
            "n/a: the strategy does not apply to the architecture (not a zero).</p>"
            + _img(png, "throughput per strategy per GPU set"))


def _placement_html(data: ReportData, fig_dir: Path) -> str:
    if data.plan is None or not data.graphs:
        return _omitted("Placement map", "needs a plan and the kernel graphs it was made from (--plan, --graph).")
    out = []
    names = [d.gpu for d in data.plan.devices]
    for g in data.graphs:
        ph = data.plan.phases.get(g.phase)
        if ph is None:
            raise UserError(f"graph phase {g.phase!r} is not in the plan; plan phases: "
                            f"{', '.join(sorted(data.plan.phases))}")
        png = plots.plot_placement_map(g, ph.assignment, names, fig_dir / f"placement_{g.phase}.png")
        out.append(_img(png, f"placement map, {g.phase}"))
    return ("<p>Rows are kernel kinds, columns layers; each cell is split top to bottom in program order by "
            "the device its kernels run on. Outlined cells mix devices.</p>" + "".join(out))


def _frontier_html(data: ReportData, fig_dir: Path) -> str:
    if data.frontier:
        png = plots.plot_frontier(data.frontier, fig_dir / "frontier_advisor.png",
                                  title=data.frontier_title)
        return _img(png, "advisor frontier")
    if not data.compare:
        return _omitted("Throughput–cost frontier", "no advisor mixes and no compare results given.")
    out, skipped = [], []
    for i, model in enumerate(dict.fromkeys(c.model for c in data.compare)):
        pts = plots.frontier_from_cells(data.compare, model)
        if len({p.usd_per_hour for p in pts}) < 2:  # one price: the compare matrix already says it all
            skipped.append(model)
        else:
            unit = next(c.unit for c in data.compare if c.model == model)
            png = plots.plot_frontier(pts, fig_dir / f"frontier_{i}.png", unit=unit,
                                      title=f"{model}: every strategy on every GPU set, cost vs throughput")
            out.append(_img(png, f"frontier {model}"))
    note = (f'<p class="note">Not drawn for {escape(", ".join(skipped))}: every option there costs the same '
            "per hour (one GPU set), so the compare matrix shows the whole trade-off.</p>" if skipped else "")
    return ("<p>Options on the dashed staircase are not beaten on both cost and throughput by any other; "
            "the advisor's GPU mixes replace these points when given.</p>" + "".join(out) + note)


def _latency_html(data: ReportData, fig_dir: Path) -> str:
    if not data.sims:
        return _omitted("Latency percentiles", "no simulator results given (tessera simulate --json).")
    png = plots.plot_latency_percentiles(data.sims, fig_dir / "latency.png")
    return _table(SIM_HEADER, sim_rows(data.sims)) + _img(png, "latency percentiles")


def _memory_html(data: ReportData, fig_dir: Path) -> str:
    if data.plan is None:
        return _omitted("Memory per device", "no plan given (--plan).")
    p = data.plan
    tp = (fmt_rate(p.throughput_images_per_s, "images/s") if p.throughput_images_per_s is not None
          else fmt_rate(p.throughput_tokens_per_s, "tokens/s"))
    facts = [f"{p.model}: {p.strategy} plan, {p.mode} mode", f"{plural(len(p.devices), 'device')} over {p.link}",
             plural(len(p.members) or p.replicas, "replica"), f"{tp} at ${p.usd_per_hour:.2f}/h", f"solved in {p.solve_s:.2f} s"]
    if p.bound_ratio is not None:
        facts.append(f"plan/bound {p.bound_ratio:.3f}")
    if p.kv_capacity_tokens:
        facts.append(f"KV capacity {p.kv_capacity_tokens:,} tokens")
    png = plots.plot_memory(p, fig_dir / "memory.png")
    return f"<p>{escape('; '.join(facts))}.</p>" + _table(PLAN_HEADER, plan_rows(data.plan), num_cols=set(range(2, len(PLAN_HEADER) - 1))) + _img(png, "memory per device")


def _gantt_html(data: ReportData, fig_dir: Path) -> str:
    png = data.gantt_png
    if png is None and data.plan is not None:
        png = plots.plot_gantt(data.plan, fig_dir / "gantt.png")
    if png is None:
        return _omitted("Pipeline Gantt", "no plan and no Gantt image given (--plan, or --gantt from "
                                          "tessera simulate --gantt).")
    return ("<p>A few pipelined iterations of the plan: each device's kernels (colour = micro-batch) and "
            "each link's transfers (hatched); gaps are pipeline bubbles.</p>" + _img(png, "pipeline gantt"))


def _provenance_html(data: ReportData) -> str:
    gpus = sorted({g for c in data.compare or () for g in c.gpus} | {d.gpu for d in (data.plan.devices
                                                                                      if data.plan else ())})
    rows = []
    for name in gpus:
        try:
            s = catalog.gpu(name)
            rows.append([name, f"{s.usd_per_hour:.2f}", f"{s.price_date}: {s.price_source}", s.source])
        except ValueError:
            rows.append([name, "—", "not in the catalog", "—"])
    cmds = "".join(escape(c) + "\n" for c in data.commands)
    return ("<ul><li><b>Kernel times</b>: tessera/cost, a roofline per kernel kind (dense peak FLOP/s and memory "
            "bandwidth from the GPU datasheets, efficiencies per kind, launch overhead), overridden by measured "
            "profile tables where present.</li><li><b>Throughput and cost</b>: tessera/plan, the steady-state "
            "pipeline of the placement with micro-batches in flight; every baseline is built as a plan and "
            "scored by the same cost model. Cost per hour is the sum of the catalog's per-GPU prices.</li>"
            "<li><b>Latency percentiles</b>: tessera/sim, a discrete-event serving simulator (continuous "
            "batching, KV capacity from the plan's memory placement) running each plan on the same workload."
            "</li></ul>" + (_table(["GPU", "USD/h", "price source", "spec source"], rows, num_cols={1}) if rows else "")
            + (f"<p>Reproduce with:</p><pre>{cmds}</pre>" if cmds else ""))


def build_report(data: ReportData, out_dir: Path, *, on_section: Callable[[str], None] | None = None) -> Path:
    """Write out_dir/report.html (and the figures it embeds, under out_dir/figures) and return its path.
    ``on_section(title)`` is called before each section is built (a progress bar's hook)."""
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    fig_dir.mkdir(parents=True, exist_ok=True)
    builders: list[tuple[str, str, Callable[[], str]]] = [
        ("compare", "Compare matrix", lambda: _compare_html(data, fig_dir)),
        ("placement", "Placement map", lambda: _placement_html(data, fig_dir)),
        ("gantt", "Pipeline Gantt", lambda: _gantt_html(data, fig_dir)),
        ("frontier", "Throughput–cost frontier", lambda: _frontier_html(data, fig_dir)),
        ("latency", "Latency percentiles", lambda: _latency_html(data, fig_dir)),
        ("memory", "Memory per device", lambda: _memory_html(data, fig_dir)),
        ("method", "How these numbers were made", lambda: _provenance_html(data)),
    ]
    body = []
    for sid, title, build in builders:
        if on_section is not None:
            on_section(title)
        body.append(f'<section id="{sid}"><h2>{escape(title)}</h2>{build()}</section>')
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(data.title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{escape(data.title)}</h1>{headline(data)}{''.join(body)}"
            "</body></html>")
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
