"""`tessera compare`: Tessera against every baseline, one model per family on GPU pairs, at equal SLO.

Per cell (model × pool), from `tessera.plan.plan_serving`: every strategy's goodput at the SLO, $/h and
tokens per dollar, the placement Tessera chose, and the best homogeneous deployment *of the same size*
(as many GPUs of one type as the pool has, for each type of the pool and for the H100) by tokens per
dollar — so "does a heterogeneous pair beat two H100s at lower cost" is answered per model with numbers.
Writes compare.json and compare.md; prints progress lines while it works.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from tessera.capture.context import check_context
from tessera.contracts.study import CompareRow, CompareStrategy, DevicePlacement, KneeCheck, SameBudget
from tessera.errors import UserError
from tessera.hardware import AUTO, best_link, cell_link
from tessera.plan import (
    STRATEGIES,
    PlannerConfig,
    Shapes,
    StrategyResult,
    UnitCost,
    capture_source,
    default_cost,
    engine_gpu,
    homogeneous,
    model_kind,
    plan_serving,
    planner_provenance,
    resolve_gpu,
)
from tessera.report.agreement import summary, summary_line
from tessera.study.agreement import knee_check

MODELS = ("llama-3-8b", "mixtral-8x7b", "mamba2-2.7b", "qwen2.5-vl-7b", "flux-dev")  # llm moe ssm vlm dit
PAIRS = ("H100,H20", "H100,L40S", "A100,L40S", "H20,L40S", "H100,A100", "H100,H100")
QUICK_PAIRS = ("H100,L40S", "H100,H20", "A100,L40S")
REFERENCE = "H100-SXM"  # the high-end GPU the paper's headline compares against
PAPER = {"throughput": 2.3, "cost_efficiency": 1.6}


def check_matrix_context(prompt: int | None, output: int | None) -> None:
    """Every model of the comparison matrix must take a request of ``prompt`` + ``output`` tokens: refused
    in one UserError line before hours of planning (None: not a fixed length, not checked)."""
    for model in MODELS:
        check_context(model, prompt, output)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def same_size_homogeneous(model: str, gpus: tuple[str, ...], cfg: PlannerConfig,
                          cache: dict[tuple[str, str, int], SameBudget]) -> SameBudget:
    """The best homogeneous deployment of len(gpus) GPUs of one type (each type of the pool, and H100)."""
    best: SameBudget | None = None
    for name in dict.fromkeys((*gpus, REFERENCE)):
        key = (model, name, len(gpus))
        if key not in cache:
            specs = (engine_gpu(resolve_gpu(name), cfg.gpu_memory_utilization),) * len(gpus)
            shapes = Shapes(model, capture_source(model), cfg, images=_images(model))
            r = homogeneous(shapes, specs, best_link(specs), default_cost(), cfg)  # n GPUs as they come
            cache[key] = SameBudget(gpus=(name,) * len(gpus), goodput=r.goodput, usd_per_hour=r.usd_per_hour,
                                    tokens_per_usd=r.tokens_per_usd, tp=tuple(r.tp))
        c = cache[key]
        if best is None or c.tokens_per_usd > best.tokens_per_usd:
            best = c
    assert best is not None
    return best


def _images(model: str) -> bool:
    return model_kind(model)[0]


def _strategy(s: StrategyResult, images: bool, knee: KneeCheck | None) -> CompareStrategy:
    return CompareStrategy(
        images=images, goodput_per_s=s.goodput, usd_per_hour=s.usd_per_hour, per_usd=s.tokens_per_usd,
        applicable=s.applicable, feasible=s.feasible, reason=None if s.feasible else s.reason,
        batch=s.plan.batch if s.plan else None, microbatches=s.plan.microbatches if s.plan else None,
        max_num_batched_tokens=s.plan.engine.max_num_batched_tokens if s.plan and s.plan.engine else None,
        slo_binding=s.point.knee.binding if s.point and s.point.knee else s.detail.get("binding"), knee=knee)


def _knees(r, knee: bool) -> dict[str, KneeCheck | None]:
    """Each feasible strategy's knee check (none with ``knee`` off); Tessera's deployment is the MILP's or
    an adopted baseline's, whose check is then reused."""
    out: dict[str, KneeCheck | None] = {
        n: knee_check(s.deployment, s.goodput) if knee and s.feasible and n != "tessera" else None
        for n, s in r.strategies.items()}
    t = r.tessera
    if knee and t.feasible:
        out["tessera"] = out[t.chosen] if t.chosen in STRATEGIES else knee_check(t.deployment, t.goodput)
    return out


def run_cell(model: str, pool: str, cfg: PlannerConfig, cache: dict[tuple[str, str, int], SameBudget],
             knee: bool = True) -> CompareRow:
    t0 = time.perf_counter()
    try:
        r = plan_serving(model, pool, cfg, progress=lambda desc: _progress(f"    {desc}"))
    except UserError as e:
        return CompareRow(model=model, gpus=tuple(pool.split(",")), error=str(e).splitlines()[0],
                          wall_s=time.perf_counter() - t0)
    knees = _knees(r, knee)
    strategies = {n: _strategy(s, r.images, knees[n]) for n, s in r.strategies.items()}
    same = same_size_homogeneous(model, r.gpus, cfg, cache)
    placement = {dev: DevicePlacement.from_dict(p) for dev, p in placement_summary(r).items()}
    return CompareRow(
        model=model, gpus=tuple(r.gpus), link=r.link, chosen=r.tessera.chosen, images=r.images,
        strategies=strategies,
        bound_ratio=r.tessera.plan.bound_ratio if r.tessera.plan and r.tessera.chosen == "milp" else None,
        solve_s=r.solve_s, best_homogeneous_same_budget=same,
        reference=cache[(model, REFERENCE, 2)] if len(r.gpus) == 2 else None, placement=placement,
        provenance=planner_provenance(model, cfg, r.tessera.deployment, images=r.images),
        wall_s=time.perf_counter() - t0)


def placement_summary(r) -> dict[str, Any]:
    """Which kernels Tessera's plan put where: per device, kernel count and time share by kind."""
    s = r.tessera
    if s.point is None or s.plan is None or s.chosen != "milp":
        return {}

    shapes = Shapes(r.model, capture_source(r.model), r.config, r.images)
    g = shapes.graph(s.point.batch, s.point.microbatches)
    cost = UnitCost(cost=default_cost())
    gpus = tuple(resolve_gpu(d.gpu) for d in s.plan.devices)
    out: dict[str, Any] = {}
    for d, gp in enumerate(gpus):
        ks = [k for k in g.kernels if s.point.assignment[k.id] == d]
        times = Counter()
        for k in ks:
            times[str(k.kind)] += cost.kernel_time_s(k, gp)
        tot = sum(times.values()) or 1.0
        out[f"{d}:{gp.name}"] = {"kernels": len(ks), "share_by_kind": {k: v / tot for k, v in times.most_common()}}
    return out


def run_compare(*, out_dir: Path, cfg: PlannerConfig, quick: bool = False, knee: bool = True,
                models: tuple[str, ...] = MODELS, pools: tuple[str, ...] | None = None,
                jobs: int = 1) -> tuple[list[CompareRow], str]:
    """Every cell of the matrix (``pools``: the pairs, by default the quick or the full set); ``jobs``
    processes side by side, each planning whole models (a model is captured once per process), in the
    order given; the rows come back in matrix order."""
    if jobs < 1:
        raise UserError(f"--jobs {jobs} must be >= 1 (processes planning models side by side)")
    pools = pools or (QUICK_PAIRS if quick else PAIRS)
    for p in pools:  # a named link every pair must be able to have: refused before any planning
        cell_link(tuple(resolve_gpu(g) for g in p.split(",")), cfg.link)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "compare.quick" if quick else "compare"  # a quick run never overwrites the full one
    t0, c0 = time.perf_counter(), time.process_time() + children_cpu_s()
    by_model: dict[str, list[CompareRow]] = {}
    if jobs == 1:
        for m in models:
            by_model[m] = model_rows(m, pools, cfg, knee)
            partial = [r.to_dict() for mm in models if mm in by_model for r in by_model[mm]]
            (out_dir / f"{stem}.json").write_text(json.dumps({"cells": partial}, indent=1))  # partial results
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(models)), mp_context=get_context("spawn")) as ex:
            futures = {m: ex.submit(model_rows, m, pools, cfg, knee) for m in models}
            by_model = {m: f.result() for m, f in futures.items()}
    rows = [r for m in models for r in by_model[m]]
    cells = [r.to_dict() for r in rows]  # the rows as written: what the markdown reads
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0 + children_cpu_s()
    md = markdown(cells, cfg, wall, cpu, jobs)
    (out_dir / f"{stem}.json").write_text(json.dumps({"cells": cells, "wall_s": wall, "cpu_s": cpu, "jobs": jobs,
                                                      "load_1min": os.getloadavg()[0]}, indent=1))
    (out_dir / f"{stem}.md").write_text(md)
    return rows, md


def model_rows(model: str, pools: tuple[str, ...], cfg: PlannerConfig, knee: bool) -> list[CompareRow]:
    """One model's cells, in pool order (run in a worker process when --jobs > 1)."""
    cache: dict[tuple[str, str, int], SameBudget] = {}
    out = []
    for p in pools:
        _progress(f"[{time.strftime('%H:%M:%S')}] {model} on {p}")
        out.append(run_cell(model, p, cfg, cache, knee))
    return out


def children_cpu_s() -> float:
    """CPU seconds of this process's finished child processes so far (cumulative: the --jobs workers are
    counted by the difference over a run)."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _good(e: dict[str, Any]) -> float:
    return e.get("goodput_tokens_per_s", e.get("goodput_images_per_s")) or 0.0


def _per_usd(e: dict[str, Any]) -> float:
    return e.get("tokens_per_usd", e.get("images_per_usd")) or 0.0


def _fmt(v: float) -> str:
    return f"{v:,.1f}" if v >= 10 else f"{v:.3g}"


def _per_usd_text(v: float, images: bool) -> str:
    return f"{v:,.0f} images" if images else f"{v / 1e6:.3f} Mtok"


def gains(cells: list[dict[str, Any]]) -> list[tuple[float, float, str]]:
    """(goodput vs best baseline, tokens/$ vs best same-size homogeneous, cell) per cell."""
    out = []
    for c in cells:
        if "error" in c:
            continue
        s = c["strategies"]
        base = max((_good(s[n]) for n in STRATEGIES[1:] if s[n]["feasible"]), default=0.0)
        ref = c["best_homogeneous_same_budget"]["tokens_per_usd"]
        t = s["tessera"]
        if base > 0 and ref > 0:
            out.append((_good(t) / base, _per_usd(t) / ref, f"{c['model']} on {'+'.join(c['gpus'])}"))
    return out


def markdown(cells: list[dict[str, Any]], cfg: PlannerConfig, wall: float, cpu: float | None = None,
             jobs: int = 1) -> str:
    t, slo = cfg.traffic, cfg.slo
    links = "each pair's best link" if cfg.link == AUTO else cfg.link
    lines = [f"# tessera compare: goodput at equal SLO ({links}; prompt {t.prompt}, output {t.output}; "
             f"TTFT ≤ {slo.ttft_s:g} s, TPOT ≤ {slo.tpot_s * 1e3:g} ms; images ≤ {slo.image_s:g} s); "
             f"{len(cells)} cells in {wall:.0f} s"
             + (f" ({cpu:.0f} s CPU, {jobs} process{'es' if jobs > 1 else ''})" if cpu is not None else ""), "",
             "Goodput: output tokens/s (flux-dev: images/s) of requests meeting the SLO, each strategy at its own "
             "best batch and micro-batch count. Same-size homogeneous: as many GPUs of one type as the pool, "
             "the best type by tokens per $.", "",
             "| model | pool | chosen | " + " | ".join(STRATEGIES) + " | $/h | per $ (Tessera) | "
             "best same-size homogeneous, per $ |", "|---|---|---|" + "---|" * len(STRATEGIES) + "---|---|---|"]
    for c in cells:
        pool = "+".join(c["gpus"])
        if "error" in c:
            lines.append(f"| {c['model']} | {pool} | error: {c['error']} |" + " |" * (len(STRATEGIES) + 3))
            continue
        s = c["strategies"]
        vals = ["n/a" if not s[n]["applicable"] else ("infeasible" if not s[n]["feasible"] else _fmt(_good(s[n])))
                for n in STRATEGIES]
        ref = c["best_homogeneous_same_budget"]
        lines.append(f"| {c['model']} | {pool} | {c['chosen']} | " + " | ".join(vals) +
                     f" | {s['tessera']['usd_per_hour']:.2f} | {_per_usd_text(_per_usd(s['tessera']), c['images'])} | "
                     f"{len(ref['gpus'])}×{ref['gpus'][0]}: {_per_usd_text(ref['tokens_per_usd'], c['images'])} |")
    g = gains(cells)
    lines += ["", "## Gains (Tessera vs the best baseline in the same pool; goodput per $ vs the best "
              "same-size homogeneous deployment)", ""]
    if g:
        thr = sorted(x[0] for x in g)
        usd = sorted(x[1] for x in g)
        best_t, best_u = max(g), max(g, key=lambda x: x[1])
        lines += ["| | best | median | worst | paper |", "|---|---|---|---|---|",
                  f"| goodput vs best baseline | {thr[-1]:.2f}× ({best_t[2]}) | {statistics.median(thr):.2f}× | "
                  f"{thr[0]:.2f}× | up to {PAPER['throughput']}× |",
                  f"| per $ vs same-size homogeneous | {usd[-1]:.2f}× ({best_u[2]}) | "
                  f"{statistics.median(usd):.2f}× | {usd[0]:.2f}× | up to {PAPER['cost_efficiency']}× |"]
        chosen = Counter(c["chosen"] for c in cells if "error" not in c)
        lines += ["", "Tessera's choice: " + ", ".join(f"{k} in {v} cell{'s' if v > 1 else ''}"
                                                       for k, v in chosen.most_common()) + "."]
    lines += ["", _headline(cells), "", _best_cell(cells), "", _agreement(cells)]
    return "\n".join(lines) + "\n"


def _agreement(cells: list[dict[str, Any]]) -> str:
    """Every strategy's goodput beside the simulator's SLO knee of the same deployment."""
    rows = [(c, n, s) for c in cells if "error" not in c for n, s in c["strategies"].items()
            if n != "tessera" and s.get("knee")]
    if not rows:
        return "## Planner vs simulator\n\nNot checked (--no-knee)."
    lines = ["## Planner vs simulator (SLO knee)", "", summary_line(summary([KneeCheck.from_dict(s["knee"]) for _, _, s in rows])), "",
             "| model | pool | strategy | batch × m, tokens/iter | binding | planner | simulator knee | knee / planner |",
             "|---|---|---|---|---|---|---|---|"]
    for c, n, s in rows:
        k = s["knee"]
        shape = f"{s['batch']} × {s['microbatches']}" + (f", {s['max_num_batched_tokens']}"
                                                        if s.get("max_num_batched_tokens") and not c["images"] else "")
        knee_txt = _fmt(k["knee_per_s"]) if "knee_per_s" in k else f"error: {k['error']}"
        ratio = f"{k['ratio']:.2f}" if k.get("ratio") is not None else ""
        lines.append(f"| {c['model']} | {'+'.join(c['gpus'])} | {n} | {shape} | {s.get('slo_binding') or ''} | "
                     f"{_fmt(k['planner_per_s'])} | {knee_txt} | {ratio} |")
    return "\n".join(lines)


def _headline(cells: list[dict[str, Any]]) -> str:
    """The paper's claim per model: a heterogeneous pair out-runs 2×H100 at lower cost."""
    out = ["## Does a heterogeneous pair beat 2×H100?", ""]
    for model in dict.fromkeys(c["model"] for c in cells):
        ref = [c for c in cells if c["model"] == model and "error" not in c and c["gpus"] == [REFERENCE] * 2]
        het = [c for c in cells if c["model"] == model and "error" not in c and len(set(c["gpus"])) > 1]
        if not het:
            continue
        if ref:  # the 2×H100 cell itself: its best strategy
            r = ref[0]["strategies"]
            ref_g, ref_usd = max(_good(r[n]) for n in STRATEGIES), r["tessera"]["usd_per_hour"]
        else:  # its homogeneous deployment (TP or replicas), computed beside every cell
            ref_g, ref_usd = het[0]["reference"]["goodput"], het[0]["reference"]["usd_per_hour"]
        if not ref_g:
            out.append(f"- **{model}**: 2×H100 meets no SLO point")
            continue
        rows = []
        for c in het:
            t = c["strategies"]["tessera"]
            faster = _good(t) > ref_g
            cheaper = t["usd_per_hour"] < ref_usd
            per = (_good(t) / t["usd_per_hour"]) / (ref_g / ref_usd) if ref_g and t["usd_per_hour"] else 0.0
            rows.append(f"{'+'.join(c['gpus'])}: {_fmt(_good(t))} vs {_fmt(ref_g)} ({'faster' if faster else 'slower'}), "
                        f"${t['usd_per_hour']:.2f}/h vs ${ref_usd:.2f}/h ({'cheaper' if cheaper else 'dearer'}), "
                        f"{per:.2f}× {'images' if c['images'] else 'tokens'} per $")
        wins = [r for r in rows if "faster" in r and "cheaper" in r]
        out.append(f"- **{model}**: {'yes' if wins else 'no'}. " + "; ".join(rows))
    return "\n".join(out)


def _best_cell(cells: list[dict[str, Any]]) -> str:
    """The cell where the MILP placement gains most over the best baseline, and where its kernels went."""
    best = None
    for c in cells:
        if "error" in c or c["chosen"] != "milp" or not c.get("placement"):
            continue
        s = c["strategies"]
        base = max((_good(s[n]) for n in STRATEGIES[1:] if s[n]["feasible"]), default=0.0)
        if base > 0 and (best is None or _good(s["tessera"]) / base > best[0]):
            best = (_good(s["tessera"]) / base, c)
    if best is None:
        return "## Best kernel-level cell\n\nNo cell where the MILP placement beats every baseline."
    g, c = best
    lines = [f"## Best kernel-level cell: {c['model']} on {'+'.join(c['gpus'])}, {g:.2f}× the best baseline", ""]
    for dev, v in c["placement"].items():
        share = ", ".join(f"{k} {x:.0%}" for k, x in list(v["share_by_kind"].items())[:5])
        lines.append(f"- {dev}: {v['kernels']} kernels; time by kind: {share}")
    return "\n".join(lines)
