"""Gantt chart (PNG) of a few pipelined iterations: one row per device and per link, one colour per
micro-batch. The report stage reuses ``plot_spans`` and ``plot_plan``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend must be chosen first)

from tessera.plan.types import Plan  # noqa: E402
from tessera.sim.timing import StepTable, mixed_table  # noqa: E402
from tessera.sim.trace import Span, iteration_spans  # noqa: E402
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


def plot_plan(plan: Plan, path: str | Path, *, phase: str = "decode", tokens: float | None = None,
              context: float | None = None, iterations: int = 3) -> list[Span]:
    """Lay ``iterations`` steps of ``phase`` at (tokens, context) and plot them. Defaults: a serving-model
    plan's ("mixed") operating point, drawn asynchronously (each micro-batch starts its next iteration as
    soon as it can, the period apart); else the largest sampled shape at context 0, synchronously."""
    mixed = phase == "mixed" and plan.batch > 0
    table = mixed_table(plan, phase) if phase == "mixed" else StepTable.build(plan, phase)
    w0 = plan.workload
    if tokens is None:
        tokens = float(plan.batch + -(-plan.batch * w0.get("prompt", 1) // max(1, w0.get("output", 1)))) if mixed \
            else float(table.max_tokens)
    if context is None:
        context = float(w0.get("prompt", 0) + w0.get("output", 0) // 2) if mixed else 0.0
    tok = tokens
    dur, w = table.time(tok, context)
    spans = [s for k in range(iterations) for s in iteration_spans(plan, phase, w, k * dur, dur, overlap=mixed)]
    plot_spans(spans, path, f"{plan.model} {plan.strategy} {phase}: {iterations} iterations at tokens={tok:g}, "
                            f"context={context:g}, {plural(plan.phases[phase].microbatches, 'micro-batch', 'micro-batches')}")
    return spans
