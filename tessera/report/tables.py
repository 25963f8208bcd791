"""Terminal tables (rich) and the cell texts the HTML report shares with them."""

from __future__ import annotations

from rich.table import Table

from tessera.contracts.ir import KernelGraph
from tessera.contracts.plan import Plan
from tessera.contracts.results import SimResult
from tessera.report.data import CompareCell, SimRun, strategy_order
from tessera.text import plural

MEMORY_ROLES = ("weight", "kv", "state", "activation")


def fmt_rate(v: float | None, unit: str) -> str:
    """12345.6, "tokens/s" -> "12.3k tok/s"; images stay in plain digits."""
    if v is None:
        return "—"
    short = {"tokens/s": "tok/s", "images/s": "img/s"}.get(unit, unit)
    if v >= 1e6:
        return f"{v / 1e6:.2f}M {short}"
    if v >= 1e4:
        return f"{v / 1e3:.1f}k {short}"
    return f"{v:,.0f} {short}" if v >= 100 else f"{v:.3g} {short}"


def fmt_gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f}"


def strategy_text(cell: CompareCell, name: str) -> list[str]:
    """Lines shown for one strategy in one cell: throughput, cost, or why there is no number."""
    r = cell.strategies.get(name)
    if r is None:
        return ["not run"]
    if not r.applicable:
        return [f"n/a: {r.reason or 'not applicable'}"]
    if not r.feasible:
        return [f"infeasible: {r.reason or 'does not fit'}"]
    lines = [fmt_rate(r.throughput_per_s, cell.unit), f"${r.usd_per_hour:.2f}/h"]
    if r.usd_per_million_tokens is not None and cell.unit == "tokens/s":
        v = r.usd_per_million_tokens
        lines.append(f"${v:,.0f}/Mtok" if v >= 100 else f"${v:.3g}/Mtok")
    return lines


def gain_text(cell: CompareCell) -> list[str]:
    """Tessera against the best scored baseline: throughput ratio and throughput-per-dollar ratio."""
    b = cell.best_baseline()
    s, g = cell.speedup(), cell.cost_gain()
    if b is None or s is None:
        return ["no baseline applies" if b is None else "tessera not scored"]
    out = [f"{s:.2f}× vs {b.name}"]
    if g is not None:
        out.append(f"{g:.2f}× {cell.unit.split('/')[0]} per $")
    return out


SHORT_NAMES = {"homogeneous": "homog.", "prefill_decode": "prefill/decode", "attention_ffn": "attn/FFN",
               "layer_pipeline": "layer pipe"}


def compare_table(cells: tuple[CompareCell, ...] | list[CompareCell]) -> Table:
    """Cells × strategies: throughput and $/Mtok; why a strategy has no number goes to numbered notes."""
    names = strategy_order({n for c in cells for n in c.strategies})
    notes: dict[str, int] = {}
    t = Table(title="Predicted throughput per strategy (cost model, steady state)", show_lines=True)
    t.add_column("model", overflow="fold")
    t.add_column("GPUs", overflow="fold")
    t.add_column("$/h", justify="right")
    for n in names:
        t.add_column(SHORT_NAMES.get(n, n), justify="right", style="bold" if n == "tessera" else None)
    t.add_column("Tessera gain", justify="right")
    for c in cells:
        texts = []
        for n in names:
            r = c.strategies.get(n)
            if r is not None and not r.scored:
                why = strategy_text(c, n)[0]
                texts.append(f"{why.split(':')[0]} [{notes.setdefault(why, len(notes) + 1)}]")
            else:
                texts.append("\n".join(x for x in strategy_text(c, n) if not x.endswith("/h")))
        t_usd = c.strategies["tessera"].usd_per_hour if "tessera" in c.strategies else 0.0
        t.add_row(c.model, c.pool.replace("+", "+\n"), f"{t_usd:.2f}", *texts, "\n".join(gain_text(c)))
    if notes:
        t.caption = "  ".join(f"[{i}] {why}" for why, i in notes.items())
    return t


def kernels_per_device(plan: Plan) -> list[dict[str, int]]:
    """Per device, per phase: how many kernels the plan assigns to it."""
    out: list[dict[str, int]] = [{} for _ in plan.devices]
    for name, ph in plan.phases.items():
        for d in ph.assignment:
            out[d][name] = out[d].get(name, 0) + 1
    return out


def plan_rows(plan: Plan) -> list[list[str]]:
    """Device, GPU, GB per role, total / capacity, kernels per phase: shared by terminal and HTML."""
    kpd = kernels_per_device(plan)
    rows = []
    for d, mem, k in zip(plan.devices, plan.memory_bytes, kpd, strict=True):
        total = sum(mem.values())
        rows.append([f"d{d.index}", d.gpu, *(fmt_gb(mem.get(r, 0)) for r in MEMORY_ROLES),
                     f"{fmt_gb(total)} / {fmt_gb(d.mem_bytes)} ({100 * total / d.mem_bytes:.0f}%)",
                     ", ".join(f"{p} {n}" for p, n in k.items()) or "0"])
    return rows


PLAN_HEADER = ["device", "GPU", *(f"{r} GB" for r in MEMORY_ROLES), "used / capacity GB", "kernels"]


def plan_summary_table(plan: Plan, graphs: tuple[KernelGraph, ...] | None = None) -> Table:
    tp = fmt_rate(plan.throughput_images_per_s, "images/s") if plan.throughput_images_per_s is not None \
        else fmt_rate(plan.throughput_tokens_per_s, "tokens/s")
    caption = [f"{tp}, ${plan.usd_per_hour:.2f}/h"]
    if plan.bound_ratio is not None:
        caption.append(f"plan/bound {plan.bound_ratio:.3f}")
    caption.append(f"solved in {plan.solve_s:.2f} s, link {plan.link}, {plural(plan.replicas, 'replica')}")
    if graphs:
        caption.append("graphs: " + ", ".join(f"{g.phase} {len(g.kernels)} kernels" for g in graphs))
    t = Table(title=f"{plan.model}: {plan.strategy} plan ({plan.mode} mode)", caption="; ".join(caption))
    for h in PLAN_HEADER:
        t.add_column(h, justify="left" if h in ("device", "GPU", "kernels") else "right")
    for row in plan_rows(plan):
        t.add_row(*row)
    return t


SIM_HEADER = ["plan", "completed / requests", "lost", "tok/s", "TTFT p50/p99 ms", "TPOT p50/p99 ms",
              "E2E p50/p99 s", "SLO met", "$/Mtok"]


def _ms(v_s: float) -> str:
    """Seconds shown in ms with the digits that matter: 0.01234 -> 12.34, 10.93 -> 10,930."""
    ms = v_s * 1e3
    return f"{ms:,.0f}" if ms >= 1000 else (f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}")


def sim_rows(sims: tuple[SimRun, ...] | list[SimRun]) -> list[list[str]]:
    return [_sim_row(s.label, s.result) for s in sims]


def _sim_row(label: str, r: SimResult) -> list[str]:
    ttft, tpot, e2e = r.ttft_s, r.tpot_s, r.e2e_s  # {p50, p90, p99} s, numbers in a run the report reads
    return [label, f"{r.completed} / {r.requests}", str(r.lost), f"{r.throughput_tokens_per_s:,.0f}",
            f"{_ms(ttft['p50'])} / {_ms(ttft['p99'])}", f"{_ms(tpot['p50'])} / {_ms(tpot['p99'])}",
            f"{e2e['p50']:.2f} / {e2e['p99']:.2f}",
            "—" if r.slo_attainment is None else f"{100 * r.slo_attainment:.1f}%",
            "—" if r.usd_per_million_tokens is None else f"{r.usd_per_million_tokens:.3g}"]


def sim_table(sims: tuple[SimRun, ...] | list[SimRun]) -> Table:
    t = Table(title="Simulated serving (same workload for every plan)")
    for h in SIM_HEADER:
        t.add_column(h, justify="left" if h == "plan" else "right")
    for row in sim_rows(sims):
        t.add_row(*row)
    return t
