"""The evaluation's conclusions, computed from its cells alone (no planning): gains, ties, the paper's
headline checks, price and link sensitivity, the markdown of bench/results/eval.md and an HTML section.

Definitions (one cell = model × shape × pool × link):
  goodput gain      Tessera's goodput / the best baseline's goodput on the same pool (cells where no
                    baseline meets the SLO are counted apart: the ratio is unbounded);
  tokens/$ gain     Tessera's tokens per dollar / the best homogeneous deployment of as many GPUs of one
                    type (each type of the pool, H100, H200), by tokens per dollar at the same prices;
  kernel-level win  Tessera chose the MILP placement (or a fleet holding MILP cells) and gains > 0.5%;
                    otherwise a tie, named by the baseline Tessera became.
Prices enter only tokens per dollar: every plan maximises goodput, so a price change re-weights the
same plans (``per_usd`` with factors) and never re-plans.
"""

from __future__ import annotations

import html
import statistics
from collections import Counter
from dataclasses import replace
from pathlib import Path

from tessera.contracts.study import (
    EvalCell,
    EvalStudy,
    Extreme,
    FamilyShapeAnswer,
    GainSummary,
    HeadlineCheck,
    KneeCheck,
    LinkPoint,
    LinkSensitivity,
    PriceScenario,
    Stats,
    StudyAgreement,
    StudySummary,
    TesseraAnswer,
)
from tessera.report import agreement as check
from tessera.report.data import placement_map_path

BASE_LINK = "auto"  # each pool at the best link it can have (tessera.hardware.links)
BASELINES = ("homogeneous", "prefill_decode", "attention_ffn", "layer_pipeline")
PAPER = {"throughput": 2.3, "cost_efficiency": 1.6}
REFERENCES = ("H100-SXM", "H200")
WIN_MARGIN = 1.005
PRICE_STEP = 0.3


def ok(c: EvalCell) -> bool:
    return c.error is None


def best_baseline(c: EvalCell) -> tuple[str | None, float]:
    """The baseline with the most goodput on the cell's pool (name, goodput); (None, 0) if none serves. A
    fleet answer made only of baseline cells (e.g. four prefill/decode pairs) is a baseline too."""
    s = c.strategies or {}
    best: tuple[str | None, float] = (None, 0.0)
    for n in BASELINES:
        g = s[n].goodput_per_s if s[n].feasible else 0.0
        if g > best[1]:
            best = (n, g)
    f = c.fleet
    if f is None:
        return best
    # replicated baseline cells only (a fleet that found nothing has no cells to name)
    if f.reason is None and f.milp_cells == 0 and f.goodput_per_s > best[1]:
        best = (f"replicated {f.cells}", f.goodput_per_s)
    if f.baseline_goodput_per_s > best[1]:  # the pair's best baseline, replicated like the pair
        best = (f"replicated {f.baseline}", f.baseline_goodput_per_s)
    return best


def answer(c: EvalCell) -> TesseraAnswer:
    """The planned cell's Tessera answer (a cell that failed to plan has none: filter with ``ok``)."""
    assert c.tessera is not None, f"{_name(c)}: {c.error}"
    return c.tessera


def goodput_gain(c: EvalCell) -> float | None:
    _, base = best_baseline(c)
    return answer(c).goodput_per_s / base if base > 0 else None


def usd_per_hour(counts: dict[str, int], prices: dict[str, float], factors: dict[str, float] | None = None) -> float:
    f = factors or {}
    return sum(n * prices[g] * f.get(g, 1.0) for g, n in counts.items())


def per_usd(goodput_per_s: float, usd: float) -> float:
    """Output tokens (images) per dollar at ``usd`` per hour."""
    return goodput_per_s * 3600 / usd if usd > 0 else 0.0


def tessera_per_usd(c: EvalCell, factors: dict[str, float] | None = None) -> float:
    t = answer(c)
    return per_usd(t.goodput_per_s, usd_per_hour(t.used, c.prices, factors))


def same_size_best(c: EvalCell, factors: dict[str, float] | None = None) -> tuple[str, float]:
    """The same-size homogeneous deployment with the most tokens per $ ("NxGPU", tokens per $)."""
    best = ("none", 0.0)
    for h in c.same_size:
        v = per_usd(h.goodput_per_s, usd_per_hour({h.gpu: h.count}, c.prices, factors))
        if v > best[1]:
            best = (f"{h.count}x{h.gpu}", v)
    return best


def per_usd_gain(c: EvalCell, factors: dict[str, float] | None = None) -> float | None:
    _, ref = same_size_best(c, factors)
    return tessera_per_usd(c, factors) / ref if ref > 0 else None


def milp_cells(c: EvalCell) -> int:
    """The MILP cells of the cell's fleet answer (0 without one)."""
    return c.fleet.milp_cells if c.fleet is not None else 0


def kernel_level(c: EvalCell) -> bool:
    t = answer(c)
    milp = t.chosen == "milp" or (t.source == "fleet" and milp_cells(c) > 0)
    g = goodput_gain(c)
    return milp and (g is None or g > WIN_MARGIN)


def became(c: EvalCell) -> str:
    """What Tessera's answer is, in a word: "milp", a baseline's name, or "fleet"; a MILP placement within
    0.5% of a baseline is that tie ("milp ≈ layer_pipeline")."""
    t = answer(c)
    if t.source == "fleet":
        return "fleet" if milp_cells(c) else "fleet of baseline cells"
    if t.chosen == "milp" and not kernel_level(c):
        return f"milp ≈ {best_baseline(c)[0]}"
    return str(t.chosen)


def stats(values: list[float]) -> Stats | None:
    """best, median, worst of positive ratios (None when there are none)."""
    v = sorted(values)
    if not v:
        return None
    return Stats(best=v[-1], median=statistics.median(v), worst=v[0], n=len(v))


def base_cells(cells: list[EvalCell]) -> list[EvalCell]:
    return [c for c in cells if ok(c) and c.link == BASE_LINK]


def gain_summary(cells: list[EvalCell]) -> GainSummary:
    cs = base_cells(cells)
    g = [(goodput_gain(c), c) for c in cs]
    u = [(per_usd_gain(c), c) for c in cs]
    gv = [(x, c) for x, c in g if x is not None]
    uv = [(x, c) for x, c in u if x is not None]
    return GainSummary(goodput=stats([x for x, _ in gv]), per_usd=stats([x for x, _ in uv]),
                       only_tessera_serves=sum(1 for x, c in g if x is None and answer(c).goodput_per_s > 0),
                       kernel_level_wins=sum(1 for c in cs if kernel_level(c)), cells=len(cs),
                       chosen=dict(Counter(became(c) for c in cs).most_common()),
                       goodput_best_cell=_name(max(gv, key=lambda x: x[0])[1]) if gv else None,
                       per_usd_best_cell=_name(max(uv, key=lambda x: x[0])[1]) if uv else None)


def _name(c: EvalCell) -> str:
    return f"{c.model}, {c.shape}, {c.pool}" + (f" ({c.link})" if c.link != BASE_LINK else "")


def family_shape_answers(cells: list[EvalCell]) -> list[FamilyShapeAnswer]:
    """Per (model, shape): where Tessera wins at kernel level and by how much, where it ties and as what."""
    out = []
    for m, s in dict.fromkeys((c.model, c.shape) for c in base_cells(cells)):
        cs = [c for c in base_cells(cells) if c.model == m and c.shape == s]
        wins = [(goodput_gain(c), c.pool) for c in cs if kernel_level(c)]
        ties = Counter(became(c) for c in cs if not kernel_level(c))
        gains = [x for x in (goodput_gain(c) for c in cs) if x is not None]
        best = max(wins, key=lambda x: x[0] or float("inf")) if wins else None
        out.append(FamilyShapeAnswer(model=m, family=cs[0].family, shape=s, pools=len(cs), wins=len(wins),
                                     best_win=best, ties=dict(ties), gain=stats(gains)))
    return out


def reference_pair(cells: list[EvalCell], model: str, shape: str, gpu: str) -> tuple[float, float] | None:
    """(goodput, $/h) of 2×gpu for (model, shape): Tessera's answer on that pool when it was run (it is at
    least the homogeneous one), else the same-size homogeneous deployment computed beside a pair cell."""
    for c in base_cells(cells):
        if c.model == model and c.shape == shape and c.gpus == ((gpu, 2),):
            return answer(c).goodput_per_s, usd_per_hour(answer(c).used, c.prices)
    for c in base_cells(cells):
        if c.model == model and c.shape == shape and c.n_gpus == 2:
            for h in c.same_size:
                if h.gpu == gpu:
                    return h.goodput_per_s, h.count * c.prices[gpu]
    return None


def headline(cells: list[EvalCell], factors: dict[str, float] | None = None) -> list[HeadlineCheck]:
    """Per (model, shape) and reference GPU: does a heterogeneous pair beat 2×reference in goodput, and in
    tokens per $? The best pair by goodput and the best by tokens per $ are named."""
    out = []
    for m, s in dict.fromkeys((c.model, c.shape) for c in base_cells(cells)):
        pairs = [c for c in base_cells(cells) if c.model == m and c.shape == s and c.n_gpus == 2
                 and len(c.gpus) == 2]
        if not pairs:
            continue
        for ref in REFERENCES:
            r = reference_pair(cells, m, s, ref)
            if r is None:
                continue
            rg, rusd = r
            rusd *= (factors or {}).get(ref, 1.0)
            fast = max(pairs, key=lambda c: answer(c).goodput_per_s)
            cheap = max(pairs, key=lambda c: tessera_per_usd(c, factors))
            ref_per = per_usd(rg, rusd)
            out.append(HeadlineCheck(
                model=m, shape=s, reference=f"2x{ref}", ref_goodput=rg, ref_per_usd=ref_per,
                fastest_pair=fast.pool, fastest_goodput=answer(fast).goodput_per_s,
                beats_throughput=answer(fast).goodput_per_s > rg,
                cheapest_pair=cheap.pool, cheapest_per_usd=tessera_per_usd(cheap, factors),
                beats_per_usd=tessera_per_usd(cheap, factors) > ref_per,
                both=any(answer(c).goodput_per_s > rg and tessera_per_usd(c, factors) > ref_per for c in pairs)))
    return out


def price_scenarios(cells: list[EvalCell]) -> list[tuple[str, dict[str, float]]]:
    """List prices, then each GPU type of the study at −30% and +30% alone."""
    types = sorted({g for c in base_cells(cells) for g in c.prices})
    out: list[tuple[str, dict[str, float]]] = [("list prices", {})]
    for g in types:
        out += [(f"{g} −30%", {g: 1 - PRICE_STEP}), (f"{g} +30%", {g: 1 + PRICE_STEP})]
    return out


def price_sensitivity(cells: list[EvalCell]) -> list[PriceScenario]:
    out = []
    for label, f in price_scenarios(cells):
        gains = [x for x in (per_usd_gain(c, f) for c in base_cells(cells)) if x is not None]
        hl = headline(cells, f)
        out.append(PriceScenario(scenario=label, per_usd=stats(gains), beats_same_size=sum(1 for x in gains if x > 1),
                                 cells=len(gains), pair_beats_ref_per_usd=sum(1 for h in hl if h.beats_per_usd),
                                 pair_beats_ref_both=sum(1 for h in hl if h.both), checks=len(hl)))
    return out


def link_sensitivity(cells: list[EvalCell]) -> list[LinkSensitivity]:
    """Per (model, shape, pair) run at more than one link: Tessera's gain and choice at each link."""
    groups: dict[tuple[str, str, str], dict[str, EvalCell]] = {}
    for c in cells:
        if ok(c) and c.n_gpus == 2:
            groups.setdefault((c.model, c.shape, c.pool), {})[c.link] = c
    out = []
    for (m, s, p), by in groups.items():
        if len(by) < 2:
            continue
        out.append(LinkSensitivity(
            model=m, shape=s, pool=p,
            links={link_label(c): LinkPoint(gain=goodput_gain(c), chosen=became(c),
                                            goodput_per_s=answer(c).goodput_per_s)
                   for c in sorted(by.values(), key=lambda c: c.link != BASE_LINK)}))
    return out


def _ratio(r: float | None) -> str:
    return "–" if r is None else f"{r:.2f}"


def link_label(c: EvalCell) -> str:
    """The link a cell ran at: 'pcie4 (best)' for the base link, else its name."""
    return f"{c.link_used} (best)" if c.link == BASE_LINK else c.link_used


def sim_of(c: EvalCell, cells: list[EvalCell]) -> KneeCheck | None:
    """The cell's planner-vs-simulator check; a replicated pair (k identical pair cells behind a router,
    each serving a Poisson stream of 1/k the rate) carries its pair cell's."""
    if c.sim is not None or c.fleet is None or not c.fleet.replicated:
        return c.sim
    pair = "+".join(g for g, _ in c.gpus)
    p = next((x for x in cells if x.model == c.model and x.shape == c.shape and x.link == c.link
              and x.pool == pair), None)
    return replace(p.sim, from_pair=pair) if p is not None and p.sim is not None else None


def agreement(cells: list[EvalCell]) -> StudyAgreement:
    """Planner goodput against the simulator's SLO knee: every strategy of every cell (tessera.report.agreement),
    and Tessera's answer (a pool of cells included) apart."""
    every: list[KneeCheck | None] = [st.knee for c in cells if ok(c) for n, st in (c.strategies or {}).items()
                                     if n != "tessera" and st.knee is not None]
    sims = [(c, sm) for c in cells if ok(c) and (sm := sim_of(c, cells)) is not None and sm.ratio is not None]
    worst = max(sims, key=lambda x: abs(_ratio_of(x[1]) - 1)) if sims else None
    return StudyAgreement(strategies=check.summary(every), answers=check.summary([sm for _, sm in sims]),
                          worst_cell=_name(worst[0]) if worst else None,
                          worst_ratio=worst[1].ratio if worst else None,
                          not_simulated=sum(1 for c in cells if ok(c) and not _ratio_of(sim_of(c, cells))),
                          from_pair=sum(1 for c, sm in sims if sm.from_pair))


def _ratio_of(k: KneeCheck | None) -> float:
    """knee / planner, 0 where there is none."""
    return k.ratio if k is not None and k.ratio is not None else 0.0


def extremes(cells: list[EvalCell]) -> list[tuple[str, EvalCell]]:
    """("best", cell) and ("worst", cell) by goodput gain among cells with a single-cell placement."""
    cs = [(goodput_gain(c), c) for c in base_cells(cells) if c.placement is not None]
    cs = [(g, c) for g, c in cs if g is not None]
    if not cs:
        return []
    hi, lo = max(cs, key=lambda x: x[0]), min(cs, key=lambda x: x[0])
    return [("best", hi[1]), ("worst", lo[1])] if hi[1] is not lo[1] else [("best", hi[1])]


def summary(cells: list[EvalCell]) -> StudySummary:
    return StudySummary(gains=gain_summary(cells), answers=tuple(family_shape_answers(cells)),
                        headline=tuple(headline(cells)), price_sensitivity=tuple(price_sensitivity(cells)),
                        link_sensitivity=tuple(link_sensitivity(cells)), agreement=agreement(cells),
                        extremes=tuple(Extreme(label=lb, cell=_name(c), gain=goodput_gain(c), chosen=answer(c).chosen,
                                               placement=c.placement.summary if c.placement else {})
                                       for lb, c in extremes(cells)))


# ---- markdown ---------------------------------------------------------------------------------------------------


def _x(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}×"


def _n(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.3g}"


def _stats_row(label: str, st: Stats | None, best_cell: str | None, paper: float) -> str:
    if st is None:
        return f"| {label} | – | – | – | up to {paper}× |"
    return (f"| {label} | {st.best:.2f}× ({best_cell}) | {st.median:.2f}× | {st.worst:.2f}× | "
            f"up to {paper}× |")


def cell_table(cells: list[EvalCell]) -> list[str]:
    # goodput columns: output tokens/s, images/s for a diffusion model (one unit per row, named once here)
    lines = ["| model | shape | pool | link | Tessera chose | Tessera tok/s (img/s) | best baseline tok/s (img/s) "
             "| gain | per $ vs "
             "same-size homogeneous | sim knee / planner |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        if not ok(c):
            lines.append(f"| {c.model} | {c.shape} | {c.pool} | {c.link} | error: {c.error} "
                         "| | | | | |")
            continue
        name, base = best_baseline(c)
        ref, _ = same_size_best(c)
        sim = sim_of(c, cells)
        simtxt = f"{sim.ratio:.2f}" if sim is not None and sim.ratio is not None else \
            ("error" if sim is not None and sim.error else "–")
        lines.append(f"| {c.model} | {c.shape} | {c.pool} | {c.link} | {answer(c).chosen} | "
                     f"{_n(answer(c).goodput_per_s)} | {_n(base)} ({name}) | {_x(goodput_gain(c))} | "
                     f"{_x(per_usd_gain(c))} (vs {ref}) | {simtxt} |")
    return lines


def markdown(data: EvalStudy, stem: str = "eval") -> str:
    """The study as markdown; ``stem``: the files' stem (eval, eval.quick), which names its placement maps."""
    cells, s = list(data.cells), data.summary
    g = s.gains
    state = "complete" if data.complete else f"PARTIAL: {len(cells)} of {data.planned_cells} cells"
    lines = [f"# Evaluation: {len({c.model for c in cells})} model families × workload shapes × GPU pools "
             f"({state})", "",
             f"{len(cells)} cells; planning time summed over cells {data.cells_wall_s:.0f} s "
             f"(this invocation {data.run_wall_s:.0f} s; machine load {data.load_1min:.1f}, "
             "2 shared cores). Goodput: output tokens/s (flux-dev: images/s) of requests meeting TTFT ≤ 2 s and "
             "TPOT ≤ 100 ms (images ≤ 60 s). Command: `tessera evaluate` (or `bench/bench_eval.py`).", "",
             "## Shapes", "", "| shape | prompt | of which image tokens | output | steps | source |",
             "|---|---|---|---|---|---|"]
    for n, sh in data.shapes.items():
        lines.append(f"| {n} | {sh.prompt} | {sh.image_tokens} | {sh.output} | {sh.steps} | {sh.source} |")
    lines += ["", "## Gains (each pool at the best link it can have)", "",
              "| | best | median | worst | paper |", "|---|---|---|---|---|",
              _stats_row("goodput vs best baseline, same pool", g.goodput, g.goodput_best_cell,
                         PAPER["throughput"]),
              _stats_row("tokens/$ vs best same-size homogeneous", g.per_usd, g.per_usd_best_cell,
                         PAPER["cost_efficiency"]), "",
              f"Kernel-level wins (MILP placement, > 0.5% over every baseline): {g.kernel_level_wins} of "
              f"{g.cells} cells; cells where only Tessera meets the SLO: {g.only_tessera_serves}. "
              "Tessera's answer: " + ", ".join(f"{k} in {v}" for k, v in g.chosen.items()) + ".", "",
              "## Per family and shape", "",
              "| model (family) | shape | pools | kernel-level wins | best win | ties (Tessera became) | gain "
              "best / median / worst |", "|---|---|---|---|---|---|---|"]
    for a in s.answers:
        bw = "–"
        if a.best_win:
            gain = a.best_win[0]
            bw = f"{_x(gain) if gain is not None else 'only Tessera meets the SLO'} on {a.best_win[1]}"
        ties = ", ".join(f"{k} ×{v}" for k, v in a.ties.items()) or "–"
        gs = a.gain
        gt = f"{gs.best:.2f} / {gs.median:.2f} / {gs.worst:.2f}" if gs else "–"
        lines.append(f"| {a.model} ({a.family}) | {a.shape} | {a.pools} | {a.wins} | {bw} | {ties} "
                     f"| {gt} |")
    lines += ["", "## Does a heterogeneous pair beat 2×H100 or 2×H200?", "",
              "| model | shape | reference | ref tok/s (img/s) | fastest pair tok/s (img/s) | faster? | best pair per $ "
              "vs ref | cheaper "
              "per token? | one pair both? |", "|---|---|---|---|---|---|---|---|---|"]
    for h in s.headline:
        lines.append(f"| {h.model} | {h.shape} | {h.reference} | {_n(h.ref_goodput)} | "
                     f"{_n(h.fastest_goodput)} ({h.fastest_pair}) | {'yes' if h.beats_throughput else 'no'} "
                     f"| {_x(h.cheapest_per_usd / h.ref_per_usd if h.ref_per_usd else None)} "
                     f"({h.cheapest_pair}) | {'yes' if h.beats_per_usd else 'no'} | "
                     f"{'yes' if h.both else 'no'} |")
    lines += ["", "## Sensitivity: GPU prices ±30% (one type at a time; plans unchanged, tokens/$ re-weighted)", "",
              "| scenario | tokens/$ gain best / median / worst | cells beating same-size homogeneous per $ | "
              "pair beats 2×ref per $ | pair beats 2×ref in both |", "|---|---|---|---|---|"]
    for p in s.price_sensitivity:
        st = p.per_usd
        gt = f"{st.best:.2f} / {st.median:.2f} / {st.worst:.2f}" if st else "–"
        lines.append(f"| {p.scenario} | {gt} | {p.beats_same_size} / {p.cells} | "
                     f"{p.pair_beats_ref_per_usd} / {p.checks} | {p.pair_beats_ref_both} / {p.checks} |")
    lines += ["", "## Sensitivity: the link inside a pair (only links the pair can be built with)", "",
              "| model | shape | pair | link | Tessera goodput tok/s (img/s) | gain (Tessera chose) |",
              "|---|---|---|---|---|---|"]
    for lk in s.link_sensitivity:
        for name, v in lk.links.items():
            lines.append(f"| {lk.model} | {lk.shape} | {lk.pool} | {name} | "
                         f"{_n(v.goodput_per_s)} | {_x(v.gain)} ({v.chosen}) |")
    a = s.agreement
    lines += ["", "## Planner vs simulator (SLO knee)", ""]
    if a is None:  # a study run before the knee check: its 95%-load figures are not the check
        lines.append("Not checked against the simulator's SLO knee (results written by an earlier Tessera).")
    else:
        lines += ["Every strategy of every cell: " + check.summary_line(a.strategies),
                  "Tessera's answers (one cell's plan, a prefill/decode pair, a pool of cells): "
                  + check.summary_line(a.answers) + f" Worst: {a.worst_cell} ({_ratio(a.worst_ratio)}); "
                  f"{a.from_pair} replicated pairs carry their pair cell's check; not simulated: "
                  f"{a.not_simulated} cells (no plan serves)."]
    maps = ", ".join(placement_map_path(Path("."), stem, e.label).name for e in s.extremes)
    lines += ["", f"## Best and worst cells (placement maps: {maps or 'none'})", ""]
    for e in s.extremes:
        lines.append(f"- **{e.label}**: {e.cell}, {_x(e.gain)} the best baseline, Tessera chose {e.chosen}")
        for dev, v in e.placement.items():
            share = ", ".join(f"{k} {x:.0%}" for k, x in list(v.share_by_kind.items())[:4])
            lines.append(f"  - {dev}: {v.kernels} kernels; time by kind: {share}")
    lines += ["", "## Every cell", "", *cell_table(cells)]
    return "\n".join(lines) + "\n"




def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:.1%}"


def html_section(data: EvalStudy, figures: list[tuple[str, str]] | None = None) -> str:
    """The evaluation as an HTML section for the report: the markdown's tables as preformatted text plus
    the placement-map figures (``(label, relative path)``); self-contained but for those images."""
    body = html.escape(markdown(data))
    figs = "".join(f'<figure><img src="{html.escape(p)}" alt="{html.escape(lb)} placement map">'
                   f"<figcaption>{html.escape(lb)} cell</figcaption></figure>" for lb, p in figures or [])
    return f'<section id="evaluation"><h2>Evaluation study</h2><pre>{body}</pre>{figs}</section>'
