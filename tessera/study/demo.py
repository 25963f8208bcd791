"""`make demo`: the main job on built-in defaults, ending in out/report.html.

1. capture one model of each family (kernel counts, FLOPs, resident bytes);
2. plan Llama-3-8B on an H100 + L40S pair under the serving model: Tessera against every baseline, each at
   its best batch and micro-batch count at the default SLO (TTFT 2 s, TPOT 100 ms);
3. simulate every feasible plan with Poisson arrivals at 90% of its own predicted goodput, three seeds, and
   at 50–125% of it (one seed) for goodput-vs-rate curves;
4. advise a GPU mix for llama-3-8b at three budgets (throughput–cost frontier, alternatives to rent);
5. build the self-contained HTML report, with the compare matrix `tessera compare` wrote to
   RESULTS/compare.json (that matrix takes ~10 min here, so the demo reads it rather than redo it).

Run as `python -m tessera.study.demo --results bench/results` (the Makefile's `make demo`): the folder of
results files is the caller's to name, not a path inside the package.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tessera.capture import capture_model, summarize
from tessera.contracts.plan import PoolPlan
from tessera.contracts.provenance import Provenance, fingerprint
from tessera.fleet.advise import advise
from tessera.plan import PlannerConfig, Shapes, capture_source, plan_serving, resolve_gpu, result_table
from tessera.progress import Steps
from tessera.report.answer import answer_of
from tessera.report.data import (
    RentOption,
    ReportData,
    evaluation_maps,
    load_compare,
    load_cost_accuracy,
    load_evaluation,
    parse_sim,
)
from tessera.report.html import build_report
from tessera.sim import LatencyTargets, LengthSpec, WorkloadSpec, simulate
from tessera.study.report_facts import with_facts

OUT = Path(os.environ.get("TESSERA_DEMO_OUT", "out"))
# Files read from the results folder (--results): the compare matrix, the evaluation study (`tessera
# evaluate`, about an hour here) and the cost model's measured error (bench_cost_aic.py).
COMPARE, EVALUATION, COST_ACCURACY = "compare.json", "eval.json", "cost_aic.json"
MODEL, GPUS, LINK = "llama-3-8b", ("H100", "L40S"), "auto"  # auto: the pair's best link (PCIe 4)
# Each plan is simulated at SIM_LOAD of its own predicted goodput (its capacity at the SLO), once per seed:
# the spread over seeds is the report's "how sure". The sweep runs each plan at SWEEP_LOADS of its capacity
# (one seed, fewer requests) for the goodput-vs-rate curves: where each saturates.
# Runs are long enough (arrivals over minutes of simulated time) that start-up and drain move goodput by ~1%.
SIM_LOAD, SIM_REQUESTS, SEEDS = 0.9, 20_000, (0, 1, 2)
SWEEP_LOADS, SWEEP_REQUESTS = (0.5, 0.8, 0.9, 1.0, 1.1, 1.25), 10_000
BUDGETS_USD_PER_HOUR = (10.0, 20.0, 40.0)
ADVISE_MODEL = MODEL  # the advisor answers for the same model the report is about
# One model per family at a modest step shape: (model, phase, shape kwargs).
FAMILIES: tuple[tuple[str, str, dict[str, int]], ...] = (
    ("llama-3-8b", "decode", {"batch": 32, "context": 2048}),
    ("qwen2.5-7b", "prefill", {"batch": 4, "seq": 512}),
    ("mixtral-8x7b", "decode", {"batch": 16, "context": 1024}),
    ("mamba2-2.7b", "prefill", {"batch": 4, "seq": 512}),
    ("qwen2.5-vl-7b", "encode", {"batch": 1}),
    ("flux-dev", "denoise", {"batch": 1}),
)
console = Console(width=None if Console().is_terminal else 150)


def _step(step: Steps, title: str, fn: Callable[[], Any]) -> Any:
    """One progress step: a spinner on a terminal, one line on stdout otherwise (so `make demo > log` shows it)."""
    step(title)
    return fn()


def capture_families(progress: Steps) -> Table:
    t = Table(title="1. Capture: one model of each family (fake tensors, bf16, no weights allocated)")
    for c in ("model", "phase", "shape", "kernels", "layers", "GFLOP", "weights GB", "KV+state GB", "capture s"):
        t.add_column(c, justify="left" if c in ("model", "phase", "shape") else "right")
    for model, phase, kw in FAMILIES:
        g = _step(progress, f"capture {model} {phase}", lambda m=model, p=phase, k=kw: capture_model(m, p, **k))
        s = summarize(g)
        t.add_row(model, phase, " ".join(f"{k}={v}" for k, v in s["shape"].items()), f"{s['kernels']:,}",
                  str(s["layers"]), f"{s['flops'] / 1e9:,.0f}", f"{s['weight_bytes'] / 1e9:.1f}",
                  f"{(s['kv_bytes'] + s['state_bytes']) / 1e9:.2f}", f"{s['capture_s']:.1f}")
    return t


def operating_rates(result: Any, load: float) -> dict[str, float]:
    """Requests/s at which each feasible plan runs at ``load`` of its own predicted goodput:
    rate = load × goodput (output tokens/s) / output tokens per request."""
    out = result.config.traffic.output
    return {name: load * o.goodput / out for name, o in result.strategies.items()
            if o.feasible and o.plan is not None and o.goodput > 0}


def simulate_at(result: Any, progress: Steps, load: float, seeds: tuple[int, ...], requests: int) -> list[dict[str, Any]]:
    """Every feasible plan at ``load`` of its own capacity (Poisson, the plan's SLO), per seed (a plan of
    independent replicas, the homogeneous baseline on a mixed pair, is served behind the simulator's router);
    each entry records its operating point beside the simulator's contract."""
    t, slo = result.config.traffic, result.config.slo
    sims = []
    for name, rate in operating_rates(result, load).items():
        o = result.strategies[name]
        wl = WorkloadSpec(kind="poisson", requests=requests, rate_per_s=rate,
                          prompt=LengthSpec(lo=t.prompt, hi=t.prompt), output=LengthSpec(lo=t.output, hi=t.output))
        for seed in seeds:
            r = _step(progress, f"simulate {name} at {rate:.1f} req/s ({load:.0%} of its capacity), seed {seed}",
                      lambda p=o.deployment, w=wl, s=seed: simulate(p, w, seed=s, slo=LatencyTargets.of(slo)))
            prov = Provenance(model=result.model, plan=fingerprint(o.deployment), prompt=str(t.prompt),
                              output=str(t.output), output_per_request=float(t.output), slo_ttft_s=slo.ttft_s,
                              slo_tpot_s=slo.tpot_s, workload="poisson", rate_per_s=rate, seed=seed)
            sims.append({"label": name, "capacity_tokens_per_s": o.goodput, **r.to_json(),
                         "provenance": prov.to_dict()})
    return sims


def sim_table(sims: list[dict[str, Any]]) -> Table:
    t = Table(title=f"3. Simulated serving: Poisson at {SIM_LOAD:.0%} of each plan's predicted goodput, "
                    f"{SIM_REQUESTS} requests, seeds {', '.join(map(str, SEEDS))} (SLO: TTFT 2 s, TPOT 100 ms)")
    for c in ("strategy", "seed", "req/s", "tokens/s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms", "SLO met", "$/1M tok"):
        t.add_column(c, justify="left" if c == "strategy" else "right")
    for s in sims:
        usd, prov = s["usd_per_million_tokens"], s["provenance"]  # seed and rate: where every JSON file has them
        t.add_row(s["label"], str(prov["seed"]), f"{prov['rate_per_s']:.1f}", f"{s['throughput_tokens_per_s']:,.0f}",
                  f"{s['ttft_s']['p99']:.2f}", f"{s['tpot_s']['p50'] * 1e3:.1f}", f"{s['tpot_s']['p99'] * 1e3:.1f}",
                  f"{(s['slo_attainment'] or 0) * 100:.0f}%", f"{usd:.3f}" if usd else "")
    return t


def advise_options(progress: Steps) -> list[Any]:
    """The advisor's choices (its mix, the best homogeneous and prefill/decode mixes) at each budget."""
    return [_step(progress, f"advise GPU mixes for {ADVISE_MODEL} at ${b:.0f}/h",
                  lambda b=b: advise(ADVISE_MODEL, None, b, simulate=False)) for b in BUDGETS_USD_PER_HOUR]


def rent_options(advice: list[Any], compare: Any) -> tuple[Any, ...]:
    """Alternatives to the demo's pair for the report's first screen: the best same-size homogeneous pool
    of the compare matrix's cell for this model and pair, and every advisor choice."""
    pair = sorted(resolve_gpu(g).name for g in GPUS)
    out = [c.reference for c in compare or () if c.model == MODEL and sorted(c.gpus) == pair and c.reference]
    for a in advice:
        for ch in (a.mix, a.homogeneous, a.prefill_decode):
            if ch is not None and ch.usd_per_hour > 0 and ch.throughput_per_s > 0:
                out.append(RentOption(label=f"{ch.group}: {ch.label}", gpus=tuple(g for c, n in ch.counts
                                                                                 for g in c * n),
                                      usd_per_hour=ch.usd_per_hour, goodput_tokens_per_s=ch.throughput_per_s,
                                      source=f"planner prediction, advisor at ${a.budget_usd_per_hour:.0f}/h"))
    return tuple(out)


def main(results: Path) -> None:
    """The demo, reading the compare matrix, the study and the cost accuracy from the folder ``results``."""
    OUT.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    with Steps("make demo", stream=sys.stdout) as progress:
        families = capture_families(progress)
        cfg = PlannerConfig(link=LINK)
        result = _step(progress, f"plan {MODEL} on {' + '.join(GPUS)} (Tessera MILP + 4 baselines)",
                       lambda: plan_serving(MODEL, list(GPUS), cfg))
        sims = simulate_at(result, progress, SIM_LOAD, SEEDS, SIM_REQUESTS)
        sweep = [s for load in SWEEP_LOADS for s in simulate_at(result, progress, load, (0,), SWEEP_REQUESTS)]
        advice = advise_options(progress)
    console.print(families)
    console.print(result_table(result))
    console.print(sim_table(sims))

    plan, deployment = result.tessera.plan, result.tessera.deployment
    if plan is None or deployment is None:  # the built-in defaults always fit; a changed default must say so
        raise SystemExit(f"no feasible Tessera plan for {MODEL} on {' + '.join(GPUS)}")
    deployment.save(OUT / "plan.json")  # a pool plan where Tessera's answer is several different cells
    (OUT / "plan_result.json").write_text(json.dumps(result.to_json(), indent=1))
    (OUT / "sims.json").write_text(json.dumps(sims, indent=1))
    (OUT / "sweep.json").write_text(json.dumps(sweep, indent=1))
    graphs = ()
    if "mixed" in plan.phases:  # the iteration graph at the plan's operating point (its assignment's kernels)
        graphs = (Shapes(MODEL, capture_source(MODEL), cfg, images=False).graph(plan.batch, plan.microbatches),)
    baselines = tuple(o.deployment for n, o in result.strategies.items() if n != "tessera" and o.feasible and o.plan is not None)
    data = with_facts(report_data(deployment, baselines, graphs, sims, sweep, advice, results), OUT)
    with Steps("report", stream=sys.stdout) as step:
        path = build_report(data, OUT, on_section=step)
    console.print(answer_text(data), highlight=False, soft_wrap=True)
    console.print(f"\n[bold green]report:[/] {path}  ({time.perf_counter() - t_start:.0f} s in all)")


def report_data(deployment: Any, baselines: tuple[Any, ...], graphs: tuple[Any, ...], sims: list[dict[str, Any]],
                sweep: list[dict[str, Any]], advice: list[Any], results: Path) -> Any:
    """What the report is built from: the demo's plan (or pool plan), its baselines' plans, the runs and the
    advisor's choices, with what the compare matrix, the study and the cost model's error in ``results``
    (compare.json, eval.json, cost_aic.json) hold."""
    compare_json, evaluation, cost_accuracy = results / COMPARE, results / EVALUATION, results / COST_ACCURACY
    compare = load_compare(compare_json) if compare_json.exists() else None
    budgets = ", ".join(f"${b:.0f}" for b in BUDGETS_USD_PER_HOUR)
    return ReportData(
        title=f"Tessera: {MODEL} on {' + '.join(GPUS)}", compare=compare,
        plan=deployment.lead if isinstance(deployment, PoolPlan) else deployment,
        pool=deployment if isinstance(deployment, PoolPlan) else None, graphs=graphs or None,
        cost_accuracy=load_cost_accuracy(cost_accuracy) if cost_accuracy.exists() else None,
        sims=tuple(parse_sim(s, s["label"], "demo") for s in sims),
        sweep=tuple(parse_sim(s, s["label"], "demo sweep") for s in sweep),
        frontier=tuple(p for a in advice for p in a.frontier_points()),
        frontier_title=f"Advisor: GPU mixes for {ADVISE_MODEL} at {budgets} per hour",
        options=rent_options(advice, compare), baseline_plans=baselines,
        evaluation=load_evaluation(evaluation) if evaluation.exists() else None,
        evaluation_maps=evaluation_maps(evaluation) if evaluation.exists() else (),
        commands=(f"tessera plan {MODEL} --gpus {','.join(GPUS)} --link {LINK} -o plan.json",
                  "tessera simulate plan.json --workload poisson --rate R --requests 20000 --prompt 1024 "
                  "--output 256 --slo-ttft-ms 2000 --slo-tpot-ms 100 --seed S",
                  f"tessera advise {ADVISE_MODEL} --budget-usd-per-hour 20",
                  "tessera compare   # the whole matrix: writes bench/results/compare.json",
                  "tessera evaluate  # the study: writes bench/results/eval.json",
                  "tessera report --plan out/plan.json --sim out/sims.json --sweep out/sweep.json "
                  "--compare bench/results/compare.json --evaluation bench/results/eval.json "
                  "--cost-accuracy bench/results/cost_aic.json --out-dir out", "make demo"),
    )


def answer_text(data: Any) -> str:
    """The report's first screen in a few plain lines for the terminal."""
    a = answer_of(data)
    own = a.predicted_usd_per_million_tokens if a is not None else None
    if a is None or a.capacity_tokens_per_s is None or own is None:
        return ""
    lines = [f"\nRent {' + '.join(a.gpus)} (${a.usd_per_hour:.2f}/h) and serve {a.model} with the {a.strategy} plan:",
             f"  {a.capacity_tokens_per_s:,.0f} tok/s at the SLO (TTFT {a.slo_ttft_s or 0:g} s, TPOT "
             f"{1e3 * (a.slo_tpot_s or 0):g} ms), ${own:.3f}/M tokens"]
    if a.goodput is not None:
        g = a.goodput
        lines.append(f"  simulated at {a.rate_per_s or 0:.2f} req/s = {100 * (a.load or 0):.0f}% of it: "
                     f"{g.mid:,.0f} tok/s met the SLO ({g.lo:,.0f}-{g.hi:,.0f} over {g.n} seeds)")
    best = a.cheaper or a.homogeneous
    if best is not None:
        lines.append(f"  {'cheaper' if best.usd_per_million_tokens < own else 'best of one GPU type'}: "
                     f"{best.label}, ${best.usd_per_million_tokens:.3f}/M tokens ({best.source})")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tessera.study.demo", description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, required=True,
                   help="folder of compare.json, eval.json and cost_aic.json (the repository's bench/results)")
    return p.parse_args(argv)


if __name__ == "__main__":
    main(parse_args().results)
