"""Gantt chart (PNG) of a few pipelined iterations: one row per device and per link, one colour per
micro-batch. The report stage reuses ``plot_spans`` and ``plot_plan``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from tessera.contracts.enums import Phase
from tessera.contracts.plan import Plan, PoolPlan
from tessera.sim.model import PlanModel, SchedulerConfig  # noqa: E402
from tessera.sim.pool import Run  # noqa: E402
from tessera.sim.stages import run_groups  # noqa: E402
from tessera.sim.timing import StepTable  # noqa: E402
from tessera.sim.trace import Span, iteration_spans  # noqa: E402
from tessera.sim.workload import WorkloadSpec  # noqa: E402
from tessera.text import plural  # noqa: E402


def plot_spans(spans: Sequence[Span], path: str | Path, title: str = "") -> None:
    rows = list(dict.fromkeys(s.row for s in sorted(spans, key=lambda s: (s.kind != "compute", s.row))))
    fig, ax = plt.subplots(figsize=(10, 0.6 * len(rows) + 1.5))
    cmap = plt.get_cmap("tab10")
    for s in spans:
        y = rows.index(s.row)
        ax.barh(y, s.dur_s * 1e3, left=s.start_s * 1e3, height=0.6, color=cmap(s.microbatch % 10),
                edgecolor="black", linewidth=0.3, hatch="//" if s.kind == "link" else None)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or "pipelined iterations (colour = micro-batch, hatched = transfer)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def mixed_spans(plan: Plan, *, tokens: float | None = None, context: float | None = None,
                iterations: int = 3) -> list[Span]:
    """A mixed plan's m groups iterating back to back through the engine's stages (tessera.sim.stages), each
    iteration ``tokens`` tokens (default: the token budget), its group's sequences decoding first, at mean
    decode context ``context`` (default: prompt + half the output of the plan's traffic)."""
    pm = PlanModel.build(plan, SchedulerConfig())
    eng, route, times = pm.engine, pm.route, pm.stage_times
    assert eng is not None and route is not None and times is not None
    tok = float(eng.max_num_batched_tokens if tokens is None else tokens)
    dec = min(float(eng.group_seqs), tok)
    w = plan.workload
    ctx = float((w.prompt or 0) + (w.output or 0) // 2) if context is None else context
    shape = times.at(dec, tok - dec, ctx)
    raw: list[tuple[int, int, float, float]] = []
    run_groups(route, [shape] * eng.microbatches, iterations, spans=raw)
    rows = route.rows(plan)
    kinds = ["compute" if to is None else "link" for _, to in route.resources]
    return [Span(row=rows[r], start_s=s, dur_s=h, microbatch=g, kind=kinds[r], phase="mixed")
            for r, g, s, h in raw if h > 0]


def plot_plan(plan: Plan, path: str | Path, *, phase: str = "decode", tokens: float | None = None,
              context: float | None = None, iterations: int = 3) -> list[Span]:
    """Lay ``iterations`` steps of ``phase`` at (tokens, context) and plot them. A serving-model plan's
    ("mixed") groups run through the simulator's stages (``mixed_spans``: each group starts its next iteration
    when its previous one ends); other phases: the largest sampled shape at context 0, synchronously."""
    if phase == Phase.MIXED:
        spans = mixed_spans(plan, tokens=tokens, context=context, iterations=iterations)
        m = plan.engine.microbatches if plan.engine else plan.phases[phase].microbatches
        plot_spans(spans, path, f"{plan.model} {plan.strategy} mixed: {iterations} iterations of "
                                f"{plural(m, 'micro-batch', 'micro-batches')}")
        return spans
    table = StepTable.build(plan, phase)
    tok = float(table.max_tokens) if tokens is None else tokens
    ctx = 0.0 if context is None else context
    dur, w = table.time(tok, ctx)
    spans = [s for k in range(iterations) for s in iteration_spans(plan, phase, w, k * dur, dur)]
    mbs = plural(plan.phases[phase].microbatches, "micro-batch", "micro-batches")
    plot_spans(spans, path, f"{plan.model} {plan.strategy} {phase}: {iterations} iterations at tokens={tok:g}, "
                            f"context={ctx:g}, {mbs}")
    return spans


def plot_run(plan: Plan | PoolPlan, run: Run, workload: WorkloadSpec, path: str | Path) -> list[Span]:
    """A few pipelined iterations of a simulation's first cell: a mixed plan's at its token budget, another's
    at its largest batch, at prompt + half the output of context (the shortest lengths the workload asks)."""
    pm = run.models["throughput"]
    ctx = float(workload.prompt.lo or 0) + float(workload.output.lo or 0) / 2
    lead = plan.lead if isinstance(plan, PoolPlan) else plan
    tokens = None if pm.mixed else pm.max_batch * pm.iter.tokens_per_item
    return plot_plan(lead, path, phase=pm.iter.phase, tokens=tokens, context=0.0 if pm.image else ctx)
