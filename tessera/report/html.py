"""One self-contained report.html: figures as base64 PNG data URIs, inline CSS, no scripts, all text escaped."""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Callable
from html import escape
from pathlib import Path

from tessera.contracts.plan import PoolPlan
from tessera.errors import UserError
from tessera.report import plots
from tessera.report.answer import (
    RUNTIME_VENDORS,
    Answer,
    Spread,
    answer_of,
    matrix_gains,
    runtime_covers,
    weight_copies,
)
from tessera.report.data import CompareCell, FrontierPoint, RentOption, ReportData, SimRun, strategy_order
from tessera.report.deploy import deploy_html
from tessera.report.tables import (
    PLAN_HEADER,
    SIM_HEADER,
    fmt_gb,
    fmt_rate,
    gain_text,
    plan_rows,
    sim_rows,
    strategy_text,
)
from tessera.text import plural

FIGURES, GANTT_PNG = "figures", "gantt.png"  # under the output folder: the figures the page embeds
REFERENCE_CLAIM = "up to 2.3× serving throughput and 1.6× cost efficiency over disaggregation baselines"

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1.2em;color:#222;line-height:1.45}
h1{font-size:1.7em;margin-bottom:.2em}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}
.lead{font-size:1.02em;background:#f6f8fa;border-left:4px solid #d62728;padding:.6em 1em}
.verdict{font-size:1.25em;margin:.2em 0 .5em}table.facts th{text-align:left;white-space:nowrap;width:15em}
table.facts{font-size:.95em;width:100%}ul.sure{margin:0;padding-left:1.1em}table.facts td,table.facts th{background:#fff}
table{border-collapse:collapse;font-size:.86em;margin:.8em 0}th,td{border:1px solid #ccc;padding:.3em .55em;
vertical-align:top}th{background:#f0f0f0}td.num{text-align:right;white-space:nowrap}td.na{color:#888;
font-style:italic;max-width:14em}td.best{background:#fdecea;font-weight:600;white-space:nowrap}
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


def _fmt_spread(sp: Spread | None, fmt: Callable[[float], str], short: Callable[[float], str] | None = None) -> str:
    """'6,595 tok/s (6,567 to 6,607 over 3 seeds)'; the range in ``short`` form when given."""
    if sp is None:
        return "not simulated"
    if sp.n == 1:
        return f"{fmt(sp.mid)} (one seed: no spread)"
    if sp.lo == sp.hi:
        return f"{fmt(sp.mid)} in each of {sp.n} seeds"
    rng = short or fmt
    return f"{fmt(sp.mid)} (median; {rng(sp.lo)} to {rng(sp.hi)} over {sp.n} seeds)"


def _tok(v: float) -> str:
    return fmt_rate(v, "tokens/s")


def _usd_mtok(v: float) -> str:
    return f"${v:.3f}/M tokens" if v < 10 else f"${v:,.1f}/M tokens"


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def slo_text(ttft_s: float | None, tpot_s: float | None) -> str:
    parts = ([f"TTFT ≤ {ttft_s * 1e3:,.0f} ms"] if ttft_s else []) + ([f"TPOT ≤ {tpot_s * 1e3:,.0f} ms"] if tpot_s else [])
    return ", ".join(parts) or "no SLO stated"


def _rent_text(gpus: tuple[str, ...]) -> str:
    return " + ".join(f"{n}× {g}" for g, n in Counter(gpus).items())


def _pm(v: float) -> str:
    return f"{100 * v:.1f}%" if v < 0.1 else f"{100 * v:.0f}%"


def _cost_text(a: Answer) -> str:
    """The cost model's error as it applies to these GPUs: measured tables or transferred costs."""
    srcs = {g: a.cost_source(g) for g in sorted(set(a.gpus))}
    measured = [g for g, src in srcs.items() if src.startswith("measured")]
    moved = [g for g in srcs if g not in measured]
    acc = a.cost_accuracy
    parts = []
    if measured:
        err = (f": {_pm(acc.measured_median)} median, {_pm(acc.measured_p90)} p90 error between measured points"
               if acc and acc.measured_median is not None and acc.measured_p90 is not None else "")
        parts.append(f"{', '.join(measured)} kernel times come from measured tables{err}")
    if moved:
        err = (f": {_pm(acc.unseen_median)} median, {_pm(acc.unseen_p90)} p90 error on a GPU left out of the fit"
               if acc else "")
        parts.append(f"{', '.join(moved)} kernel times are transferred from measured GPUs{err}")
    if acc is None:
        parts.append("the cost model's measured error was not given (--cost-accuracy "
                     "bench/results/cost_aic.json)")
    else:
        parts.append(f"on any GPU left out of the fit the error is {_pm(acc.unseen_median)} median, "
                     f"{_pm(acc.unseen_p90)} p90 ({acc.source})")
    return "cost model: " + "; ".join(parts)


def _knee_text(a: Answer) -> str:
    k = a.knee
    if k is None:
        return ("planner vs simulator: not checked (the compare matrix, `tessera compare`, runs the simulator's "
                "SLO knee against every strategy)")
    own = (f"the simulator's SLO knee of this model on these GPUs is {k.own:.2f}× the planner's goodput; "
           if k.own is not None else "")
    return (f"planner vs simulator: {own}over the compare matrix {k.within} of {k.checked} strategies within "
            f"{k.tolerance:.0%}, knee / planner {k.lo:.2f}–{k.hi:.2f} (median {k.median:.2f})")


def _sure_text(a: Answer) -> str:
    """How sure: the cost model's error, the planner–simulator gap, the spread over seeds, the latency margins,
    the headroom below saturation and where the rate sweep saw the plan saturate."""
    out = [_cost_text(a), _knee_text(a)]
    if a.goodput is not None and a.goodput.n > 1:
        out.append(f"simulated goodput varies ±{100 * a.goodput.rel_half_width:.1f}% over {a.goodput.n} seeds")
    if a.worst_tpot_p99_s is not None and a.worst_ttft_p99_s is not None:
        margin = [f"p99 TTFT {a.worst_ttft_p99_s:.2f} s" + (f" of {a.slo_ttft_s:g} s" if a.slo_ttft_s else ""),
                  f"p99 TPOT {a.worst_tpot_p99_s * 1e3:.0f} ms" + (f" of {a.slo_tpot_s * 1e3:.0f} ms" if a.slo_tpot_s else "")]
        out.append("worst seed: " + ", ".join(margin))
    if a.load is not None:
        head = (f"{100 * (1 - a.load):.0f}% headroom below saturation" if a.load < 1
                else f"{100 * (a.load - 1):.0f}% <b>above</b> saturation: queues grow without bound")
        out.append(f"the offered rate is {100 * a.load:.0f}% of the capacity ({head})")
    ok, bad = a.saturation()
    if bad is not None:
        att = dict(a.sweep)[bad]
        out.append(f"in the rate sweep ≥ 99% of requests meet the SLO up to {100 * (ok or 0):.0f}% of capacity and "
                   f"{100 * att:.0f}% at {100 * bad:.0f}%: past capacity queues build and goodput collapses, so "
                   "keep the headroom")
    return "<ul class=sure>" + "".join(f"<li>{x[0].upper() + x[1:]}.</li>" for x in out) + "</ul>"


def _traffic_text(a: Answer) -> str:
    """Prompt and output tokens per request, as the plan or its runs record them."""
    if a.prompt is None or a.output is None:
        return "not recorded in the plan"
    return f"prompt {_tokens(a.prompt)} and output {_tokens(a.output)} tokens per request"


def _tokens(text: str) -> str:
    return f"{int(text):,}" if text.isdigit() else text


def _checked_text(a: Answer) -> str:
    """The simulation at one offered rate: what it served and how many requests met the SLO."""
    if a.goodput is None:
        return "not simulated (tessera simulate PLAN --json, given with --sim)"
    rate = (f"at {a.rate_per_s:.2f} requests/s, Poisson" + (f" ({100 * a.load:.0f}% of the capacity)"
                                                              if a.load is not None else "")
            if a.rate_per_s is not None else "at a rate the runs do not record")
    return (f"{rate}: {_fmt_spread(a.goodput, _tok, lambda v: f'{v:,.0f}')} met the SLO; requests meeting it "
            + _fmt_spread(a.attainment, _pct))


def _option_text(a: Answer, o: RentOption, own: float | None) -> str:
    srcs = "; ".join(f"{g} kernel costs: {a.cost_source(g)}" for g in sorted(set(o.gpus)))
    vs = f", {own / o.usd_per_million_tokens:.2f}× cheaper per token" if own and o.usd_per_million_tokens < own \
        else (f", {o.usd_per_million_tokens / own:.2f}× dearer per token" if own else "")
    return (f"{_rent_text(o.gpus)}: {_tok(o.goodput_tokens_per_s)} for ${o.usd_per_hour:.2f}/h, "
            f"{_usd_mtok(o.usd_per_million_tokens)}{vs} ({o.source}; {srcs})")


def _alternative_rows(a: Answer) -> list[tuple[str, str]]:
    """The best baseline on the same GPUs, the best one-type option and a cheaper option to rent, among the
    GPUs the runtime runs."""
    rows = []
    own = a.predicted_usd_per_million_tokens
    if a.best_baseline is not None and a.edge is not None:
        name, good = a.best_baseline
        band = a.error_band
        tie = (f" — within the {band:.0%} the predictions can be off by: a tie, not a win"
               if band is not None and abs(a.edge - 1) <= band else "")
        rows.append(("Against the alternatives on these GPUs", f"{a.edge:.2f}× the predicted goodput of the best "
                     f"baseline ({name}, {_tok(good)}){tie}"))
    if a.homogeneous is not None:
        rows.append(("Best option of one GPU type", _option_text(a, a.homogeneous, own)))
    if a.cheaper is not None and a.cheaper != a.homogeneous:
        rows.append(("Cheaper per token if you can choose the GPUs", _option_text(a, a.cheaper, own)))
    runtime = f"the CPU and CUDA devices: the catalog's {', '.join(v.upper() for v in RUNTIME_VENDORS)} GPUs"
    if a.left_out:
        runtime += f"; options on {', '.join(a.left_out)} are left out: it cannot run them"
    rows.append(("GPUs Tessera's runtime runs", runtime))
    return rows


def _answer_html(data: ReportData) -> str:
    """The first screen: what to rent with one capacity and one price at the stated SLO, the simulation that
    checks it, how sure, and what else to rent."""
    a = answer_of(data)
    if a is None:
        return headline(data)
    own = a.predicted_usd_per_million_tokens
    cap = (f": <b>{escape(_tok(a.capacity_tokens_per_s))}</b> at the SLO, <b>{escape(_usd_mtok(own))}</b>"
           if a.capacity_tokens_per_s and own else ": no capacity at the SLO in the plan")
    verdict = (f"Rent <b>{escape(_rent_text(a.gpus))}</b> (${a.usd_per_hour:.2f}/h) and serve "
               f"<b>{escape(a.model)}</b> with {escape(a.how)}{cap}.")
    best = a.cheaper or a.homogeneous
    if best is not None and own is not None and best.usd_per_million_tokens < own:
        verdict += (f"<br>If you can rent other GPUs: <b>{escape(_rent_text(best.gpus))}</b> serves a token "
                    f"<b>{own / best.usd_per_million_tokens:.2f}× cheaper</b> (predicted; see below).")
    rows = [("SLO", slo_text(a.slo_ttft_s, a.slo_tpot_s)), ("Traffic", _traffic_text(a)),
            ("Checked by simulation", _checked_text(a))]
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    body += f"<tr><th>How sure</th><td>{_sure_text(a)}</td></tr>"
    body += "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in _alternative_rows(a))
    return (f'<div class="lead"><p class="verdict">{verdict}</p><table class="facts">{body}</table>'
            f"{_gains_html(data)}</div>")


def _gains_html(data: ReportData) -> str:
    """Gains over the whole compare matrix as best / median / worst, never the best cell alone."""
    gains = matrix_gains(data.compare)
    if not gains:
        return ""
    rows = "".join(f"<tr><td>{escape(name)}</td><td class=num>{g.best:.2f}× ({escape(g.best_cell)})</td>"
                   f"<td class=num>{g.median:.2f}×</td><td class=num>{g.worst:.2f}× ({escape(g.worst_cell)})</td>"
                   f"<td class=num>{g.cells}</td></tr>" for name, g in gains.items())
    return ("<p>Tessera's gains over the compare matrix (planner predictions at the matrix's SLO; the reference "
            f"paper reports {REFERENCE_CLAIM}):</p><table><tr><th>ratio</th><th>best</th><th>median</th>"
            f"<th>worst</th><th>cells</th></tr>{rows}</table>")


def _rent_sentence(data: ReportData, cell: CompareCell) -> str:
    """What to rent for the cell's model: the pair under Tessera or the same-size homogeneous pool, whichever
    serves a token for less (a pool the runtime cannot run is named as such), and how sure: planner
    predictions, with the simulator's knee check of Tessera's plan where the matrix has one."""
    t, ref = cell.strategies["tessera"], cell.reference
    own = t.usd_per_hour / (t.throughput_per_s * 3600) * 1e6 if t.throughput_per_s else None
    if own is None or cell.unit != "tokens/s":
        return ""
    if ref is not None and ref.usd_per_million_tokens < own:
        runs = all(runtime_covers(data, g) for g in ref.gpus)
        text = (f"Per token, rent <b>{escape(ref.label)}</b> rather than this pair: "
                f"{escape(fmt_rate(ref.goodput_tokens_per_s, cell.unit))} for ${ref.usd_per_hour:.2f}/h, "
                f"${ref.usd_per_million_tokens:.3f}/M tokens against ${own:.3f}/M, "
                f"{own / ref.usd_per_million_tokens:.2f}× cheaper"
                + ("." if runs else " (planned from transferred costs; Tessera's runtime does not run it)."))
    else:
        text = f"Per token this pair is the cheaper of the two: ${own:.3f}/M tokens."
    sure = ("These are the planner's predictions at the matrix's SLO"
            + (f"; the simulator's SLO knee of this plan is {t.knee_ratio:.2f}× the planner's goodput."
               if t.knee_ratio is not None else "; not simulated."))
    return text + " " + sure


def headline(data: ReportData) -> str:
    """Without a plan: the question and the compare matrix's answer in one paragraph, with the numbers."""
    parts = ["The question: <em>for this model, these GPUs and this traffic, which placement of the model's "
             "kernels, and how much faster and cheaper is it than the alternatives?</em>"]
    cell = _headline_cell(data)
    if cell is not None:
        t, b = cell.strategies.get("tessera"), cell.best_baseline()
        if t is not None and t.scored:
            parts.append(f"For <b>{escape(cell.model)}</b> on <b>{escape(cell.pool)}</b>, Tessera's kernel "
                         f"placement predicts <b>{escape(fmt_rate(t.throughput_per_s, cell.unit))}</b> at "
                         f"${t.usd_per_hour:.2f}/h")
            s, g = cell.speedup(), cell.per_dollar_gain()
            if b is not None and s is not None:
                parts[-1] += (f": <b>{s:.2f}×</b> the goodput of the best baseline on the same GPUs "
                              f"({escape(b.name)}, {escape(fmt_rate(b.throughput_per_s, cell.unit))} at "
                              f"${b.usd_per_hour:.2f}/h)")
            else:
                parts[-1] += "; no baseline applies to this model on these GPUs"
            ref = cell.reference
            parts[-1] += (f", and <b>{g:.2f}×</b> the goodput per dollar of the best same-size homogeneous "
                          f"deployment ({escape(ref.label)})." if g is not None and ref is not None else ".")
            parts.append(_rent_sentence(data, cell))
        elif t is not None:
            parts.append(f"Tessera found no placement of <b>{escape(cell.model)}</b> on <b>{escape(cell.pool)}</b>: "
                         f"{escape(t.reason or 'infeasible')}.")
    if data.sims:
        best = min(data.sims, key=lambda s: s.result.tpot_s["p99"])
        parts.append(f"Simulated, the lowest p99 time per output token is "
                     f"{best.result.tpot_s['p99'] * 1e3:.2f} ms ({escape(best.label)}).")
    return '<div class="lead"><p>' + " ".join(parts) + "</p>" + _gains_html(data) + "</div>"


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
    if data.plan is None:
        return _omitted("Placement map", "needs a plan and the kernel graphs it was made from (--plan, --graph).")
    if not data.graphs:
        return f"<p>{_placement_sentence(data)}</p>" + _omitted(
            "Placement map", "needs the kernel graphs the plan was made from (--graph).")
    out = []
    names = [d.gpu for d in data.plan.devices]
    for g in data.graphs:
        ph = data.plan.phases.get(g.phase)
        if ph is None:
            raise UserError(f"graph phase {g.phase!r} is not in the plan; plan phases: "
                            f"{', '.join(sorted(data.plan.phases))}")
        png = plots.plot_placement_map(g, ph.assignment, names, fig_dir / f"placement_{g.phase}.png")
        out.append(_img(png, f"placement map, {g.phase}"))
    return (f"<p>{_placement_sentence(data)}</p>"
            "<p>Rows are kernel kinds, columns layers; each cell is split top to bottom in program order by "
            "the device its kernels run on. Outlined cells mix devices.</p>" + "".join(out))


def frontier_key(points: tuple[FrontierPoint, ...] | list[FrontierPoint], unit: str = "tokens/s") -> str:
    """The table the frontier figure's numbers point into."""
    front = {id(p) for p in plots.pareto_frontier(points)}
    rows = [[str(i), p.label, p.group, f"{p.usd_per_hour:.2f}", fmt_rate(p.throughput_per_s, unit),
             f"{p.throughput_per_s / p.usd_per_hour:,.0f}", "yes" if id(p) in front else ""]
            for i, p in enumerate(plots.frontier_order(points), start=1)]
    return _table(["#", "option", "kind", "$/h", "goodput", f"{unit.split('/')[0]}/s per $/h", "on the frontier"],
                  rows, num_cols={0, 3, 4, 5})


def _frontier_html(data: ReportData, fig_dir: Path) -> str:
    if data.frontier:
        png = plots.plot_frontier(data.frontier, fig_dir / "frontier_advisor.png",
                                  title=data.frontier_title)
        return ("<p>For each budget, the advisor's GPU mix (Tessera's answer) beside the best homogeneous and the "
                "best prefill/decode mix for the same money, goodput at the SLO predicted by the planner. Options on "
                "the dashed staircase are not beaten on both cost and goodput; the numbers point into the table.</p>"
                + _img(png, "advisor frontier") + frontier_key(data.frontier))
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
            out.append(_img(png, f"frontier {model}") + frontier_key(pts, unit))
    note = (f'<p class="note">Not drawn for {escape(", ".join(skipped))}: every option there costs the same '
            "per hour (one GPU set), so the compare matrix shows the whole trade-off.</p>" if skipped else "")
    return ("<p>Options on the dashed staircase are not beaten on both cost and throughput by any other; "
            "the advisor's GPU mixes replace these points when given.</p>" + "".join(out) + note)


def _spread_cell(values: list[float], fmt: Callable[[float], str]) -> str:
    sp = Spread.of(values)
    if sp is None:
        return "—"
    return fmt(sp.mid) if sp.n == 1 or sp.lo == sp.hi else f"{fmt(sp.mid)} ({fmt(sp.lo)}–{fmt(sp.hi)})"


OPERATING_HEADER = ["plan", "offered req/s", "of its capacity", "seeds", "goodput tok/s", "SLO met",
                    "TTFT p99 ms", "TPOT p99 ms", "lost", "$/M tokens"]


def operating_rows(sims: tuple[SimRun, ...]) -> list[list[str]]:
    """One row per plan: median over seeds, the lowest and highest seed in brackets."""
    rows = []
    for label, runs in plots.by_label(sims).items():
        rates = sorted({r.rate_per_s for r in runs if r.rate_per_s is not None})
        rows.append([
            label, " / ".join(f"{r:.3g}" for r in rates) or "—",
            _spread_cell([r.load for r in runs if r.load is not None], lambda v: f"{100 * v:.0f}%"),
            str(len(runs)),
            _spread_cell([g for g in (r.goodput_tokens_per_s for r in runs) if g is not None], lambda v: f"{v:,.0f}"),
            _spread_cell([r.result.slo_attainment for r in runs if r.result.slo_attainment is not None], lambda v: f"{100 * v:.1f}%"),
            _spread_cell([r.result.ttft_s["p99"] * 1e3 for r in runs], lambda v: f"{v:,.0f}"),
            _spread_cell([r.result.tpot_s["p99"] * 1e3 for r in runs], lambda v: f"{v:,.1f}"),
            str(sum(r.result.lost for r in runs)),
            _spread_cell([r.result.usd_per_million_tokens for r in runs if r.result.usd_per_million_tokens], lambda v: f"{v:.3g}"),
        ])
    return rows


def _latency_html(data: ReportData, fig_dir: Path) -> str:
    if not data.sims:
        return _omitted("Latency percentiles", "no simulator results given (tessera simulate --json).")
    sims = data.sims
    ttft = next((r.slo_ttft_s for r in sims if r.slo_ttft_s), None) or (data.plan.slo.ttft_s if data.plan else None)
    tpot = next((r.slo_tpot_s for r in sims if r.slo_tpot_s), None) or (data.plan.slo.tpot_s if data.plan else None)
    rates = {r.rate_per_s for r in sims}
    loads = [r.load for r in sims if r.load is not None]
    if None in rates:
        how = "The runs do not record their offered rate (plain <code>tessera simulate --json</code> files)."
    elif len(rates) == 1 and len(plots.by_label(sims)) > 1:
        how = (f"<b>Every plan was run at one rate, {next(iter(rates)):.3g} requests/s</b>: a plan with less "
               "capacity is overloaded there, so compare them on the goodput curves instead.")
    else:
        how = "Each plan is run at its own rate"
        if loads:
            how += (f", {100 * min(loads):.0f}–{100 * max(loads):.0f}% of its own predicted capacity"
                    if max(loads) - min(loads) > 0.005 else f", {100 * loads[0]:.0f}% of its own predicted capacity")
        how += ", so none is overloaded and each shows the latency it gives when busy."
    png = plots.plot_latency_percentiles(sims, fig_dir / "latency.png", slo_ttft_s=ttft, slo_tpot_s=tpot)
    out = (f"<p>{how} SLO: {escape(slo_text(ttft, tpot))} (red dashed lines). Goodput counts the output tokens "
           "of requests that met it.</p>" + _table(OPERATING_HEADER, operating_rows(sims))
           + _img(png, "latency percentiles")
           + "<details><summary>every run</summary>" + _table(SIM_HEADER, sim_rows(sims)) + "</details>")
    if data.sweep:
        png = plots.plot_goodput_curves(data.sweep, fig_dir / "goodput_curves.png")
        out += ("<h3>Goodput vs offered rate</h3><p>Each plan at several offered rates (one seed each): a curve on "
                "the diagonal serves every request within the SLO; where it bends away the plan is saturated. The "
                "dotted lines are the planner's predicted capacities.</p>" + _img(png, "goodput vs rate"))
    return out


def _memory_html(data: ReportData, fig_dir: Path) -> str:
    if data.plan is None:
        return _omitted("Memory per device", "no plan given (--plan).")
    p = data.plan
    tp = (fmt_rate(p.throughput_images_per_s, "images/s") if p.throughput_images_per_s is not None
          else fmt_rate(p.throughput_tokens_per_s, "tokens/s"))
    facts = [f"{p.model}: {p.strategy} plan, {p.mode} mode", f"{plural(len(p.devices), 'device')} over {p.link}",
             plural(p.replicas, "replica"), f"{tp} at ${p.usd_per_hour:.2f}/h"]
    if p.solve_s > 0:
        facts.append(f"solved in {p.solve_s:.2f} s")
    if p.bound_ratio is not None:
        facts.append(f"plan/bound {p.bound_ratio:.3f}")
    if p.kv_capacity_tokens:
        facts.append(f"KV capacity {p.kv_capacity_tokens:,} tokens")
    png = plots.plot_memory(p, fig_dir / "memory.png")
    return f"<p>{escape('; '.join(facts))}.</p>" + _duplication_html(data) + _table(PLAN_HEADER, plan_rows(data.plan), num_cols=set(range(2, len(PLAN_HEADER) - 1))) + _img(png, "memory per device")


def _duplication_html(data: ReportData) -> str:
    """Why the weights summed over devices can exceed the model's: a weight is held by every device that runs
    a kernel touching it."""
    assert data.plan is not None
    p = data.plan
    held_gb = sum(m.get("weight", 0) for m in p.memory_bytes) / 1e9
    rule = ("A weight is resident on every device that runs a kernel reading it, so weights summed over the "
            "devices count a shared weight once per device holding it")
    graph = next((g for g in data.graphs or () if g.phase in p.phases), None)
    if graph is None:
        return f"<p>Weights over all devices: {held_gb:.1f} GB. {rule}.</p>"
    wc = weight_copies(graph, p.phases[graph.phase].assignment, len(p.devices))
    per_dev = ", ".join(f"d{d.index} {escape(d.gpu)} {b / 1e9:.1f} GB" for d, b in zip(p.devices, wc.held_bytes,
                                                                                        strict=True))
    copies = (f"{wc.shared_bytes / 1e9:.1f} GB of weights are used by kernels on more than one device, so "
              f"{wc.duplicated_bytes / 1e9:.1f} GB are copies" if wc.duplicated_bytes > 0 else
              "here no weight is used on two devices, so none is held twice")
    return (f"<p><b>Weights: {wc.unique_bytes / 1e9:.1f} GB in the model, {sum(wc.held_bytes) / 1e9:.1f} GB held "
            f"over the devices</b> ({per_dev}; the plan's memory table says {held_gb:.1f} GB). {rule}: {copies}. "
            "Prefill/decode holds every layer on both sides (the whole model twice); a layer pipeline holds each "
            "layer once.</p>" + _weights_by_strategy(data, wc.unique_bytes))


def _weights_by_strategy(data: ReportData, model_bytes: int) -> str:
    """Weights each strategy's plan holds on the same GPUs, against the model's own: the copies made visible."""
    assert data.plan is not None
    plans = [data.plan, *data.baseline_plans]
    rows = []
    for p in plans:
        # every independent replica holds its own copy: count × replicas of each different cell
        cells = [(c.plan, c.count) for c in p.cells] if isinstance(p, PoolPlan) else [(p, 1)]
        held = sum(n * c.replicas * m.get("weight", 0) for c, n in cells for m in c.memory_bytes)
        rows.append([p.strategy, fmt_gb(held), f"{held / model_bytes:.2f}×" if model_bytes else "—",
                     fmt_gb(max(0, held - model_bytes))])
    if len(rows) < 2:
        return ""
    return ("<p>Weights held by each strategy on these GPUs (GB; × the model's own weights):</p>"
            + _table(["plan", "weights held GB", "of the model", "copies GB"], rows))


def _gantt_html(data: ReportData, fig_dir: Path) -> str:
    png = data.gantt_png
    if png is None and data.gantt is not None:
        png = plots.plot_gantt(data.gantt, fig_dir / GANTT_PNG)
    if png is None:
        return _omitted("Pipeline Gantt", "no plan and no Gantt image given (--plan, or --gantt from "
                                          "tessera simulate --gantt).")
    return ("<p>Three pipelined iterations of the plan at its operating point: one row per device and per "
            "link, colour = micro-batch (legend under the chart), hatched = a transfer between devices; gaps "
            "are pipeline bubbles.</p>" + _img(png, "pipeline gantt"))


def _provenance_html(data: ReportData) -> str:
    gpus = sorted({g for c in data.compare or () for g in c.gpus} | {d.gpu for d in (data.plan.devices
                                                                                      if data.plan else ())}
                  | {g for o in data.options for g in o.gpus}
                  | {g for c in data.compare or () if c.reference for g in c.reference.gpus})
    rows = []
    for name in gpus:
        s = data.gpu(name)
        if s is not None:
            rows.append([name, f"{s.usd_per_hour:.2f}", f"{s.price_date}: {s.price_source}", ", ".join(s.dtypes),
                         s.cost_source, s.spec_source])
        else:
            rows.append([name, "—", "not in the catalog", "—", "—", "—"])
    cmds = "".join(escape(c) + "\n" for c in data.commands)
    return ("<ul><li><b>Kernel times</b>: tessera/cost, measured GPU tables (NVIDIA AIConfigurator's database) "
            "where the GPU has them, else a model fitted on the measured GPUs carried over by datasheet figures "
            "(peak FLOP/s per dtype, memory bandwidth); a dtype without a datasheet rate (bf16 on V100) runs at "
            "the nearest supported one.</li><li><b>Throughput and cost</b>: tessera/plan, the steady-state "
            "pipeline of the placement with micro-batches in flight; every baseline is built as a plan and "
            "scored by the same cost model. Cost per hour is the sum of the catalog's per-GPU prices.</li>"
            "<li><b>Latency percentiles</b>: tessera/sim, a discrete-event serving simulator (continuous "
            "batching, KV capacity from the plan's memory placement) running each plan on Poisson arrivals at "
            "its own offered rate, one run per seed."
            "</li></ul>" + (_table(["GPU", "USD/h", "price (dated) and its source", "dtypes with a datasheet rate",
                     "kernel costs from", "spec source"], rows, num_cols={1}) if rows else "")
            + (f"<p>Reproduce with:</p><pre>{cmds}</pre>" if cmds else ""))


def _evaluation_html(data: ReportData) -> str:
    if data.evaluation is None:
        return _omitted("Evaluation study", "no study given (--evaluation, `tessera evaluate --json` output).")
    from tessera.report.evalsummary import markdown

    figs = "".join(f"<figure>{_img(png, label + ' placement map')}<figcaption>{escape(label)} cell"
                   "</figcaption></figure>" for label, png in data.evaluation_maps)
    return markdown_html(markdown(data.evaluation)) + figs


def _inline(text: str) -> str:
    """Escaped text with the study's inline markdown: **bold** and `code`."""
    out = escape(text)
    out = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", out)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", out)


def markdown_html(md: str) -> str:
    """The study's markdown (evalsummary.markdown: headings, pipe tables, bullets, paragraphs) as HTML."""
    out: list[str] = []
    rows: list[list[str]] = []
    items: list[str] = []

    def flush() -> None:
        if rows:
            head, body = rows[0], rows[1:]
            out.append("<table><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in head) + "</tr>" +
                       "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body) +
                       "</table>")
            rows.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>")
            items.clear()

    for line in md.splitlines():
        text = line.strip()
        if text.startswith("|"):
            cells = [c.strip() for c in text.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):  # not the |---| separator
                rows.append(cells)
            continue
        if text.startswith("- "):
            if rows:
                flush()
            items.append(_inline(text[2:]))
            continue
        flush()
        if text.startswith("#"):
            out.append(f"<h3>{_inline(text.lstrip('#').strip())}</h3>")
        elif text:
            out.append(f"<p>{_inline(text)}</p>")
    flush()
    return "".join(out)


def build_report(data: ReportData, out_dir: Path, *, on_section: Callable[[str], None] | None = None) -> Path:
    """Write out_dir/report.html (and the figures it embeds, under out_dir/figures) and return its path.
    ``on_section(title)`` is called before each section is built (a progress bar's hook)."""
    out_dir = Path(out_dir)
    fig_dir = out_dir / FIGURES
    fig_dir.mkdir(parents=True, exist_ok=True)
    builders: list[tuple[str, str, Callable[[], str]]] = [
        ("compare", "Compare matrix", lambda: _compare_html(data, fig_dir)),
        ("placement", "Placement map", lambda: _placement_html(data, fig_dir)),
        ("gantt", "Pipeline Gantt", lambda: _gantt_html(data, fig_dir)),
        ("frontier", "Throughput–cost frontier", lambda: _frontier_html(data, fig_dir)),
        ("latency", "Latency percentiles", lambda: _latency_html(data, fig_dir)),
        ("memory", "Memory per device", lambda: _memory_html(data, fig_dir)),
        ("deploy", "Deploy it", lambda: deploy_html(data)),
        ("evaluation", "Evaluation study: families × shapes × pools", lambda: _evaluation_html(data)),
        ("method", "How these numbers were made", lambda: _provenance_html(data)),
    ]
    body = []
    for sid, title, build in builders:
        if on_section is not None:
            on_section(title)
        body.append(f'<section id="{sid}"><h2>{escape(title)}</h2>{build()}</section>')
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{escape(data.title)}</title>'
            f"<style>{CSS}</style></head><body><h1>{escape(data.title)}</h1>{_answer_html(data)}{''.join(body)}"
            "</body></html>")
    path = out_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path
