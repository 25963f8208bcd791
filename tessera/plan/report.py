"""How a ServingResult is shown: the `tessera plan --json` contract and the terminal table."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('h') else 's'}"


def label(r, name: str) -> str:
    """`tessera (= prefill_decode)` when Tessera adopted a baseline's plan."""
    s = r.strategies[name]
    if name == "tessera" and s.chosen and s.chosen != "milp":
        return f"tessera (= {s.chosen})"
    return name


def async_gain(p) -> float | None:
    """A Plan's output rate under asynchronous micro-batches over the same point re-synchronised every
    iteration (the synchronous period over the asynchronous one); None without a synchronous figure."""
    rate = p.throughput_images_per_s if p.throughput_images_per_s is not None else p.throughput_tokens_per_s
    return rate / p.sync_throughput if rate and p.sync_throughput else None


def strategy_json(r, name: str) -> dict[str, Any]:
    s = r.strategies[name]
    p = s.plan
    unit = "images_per_s" if r.images else "tokens_per_s"
    ent: dict[str, Any] = {
        "applicable": s.applicable, "feasible": s.feasible, "reason": None if s.feasible else s.reason,
        "chosen": s.chosen, "usd_per_hour": s.usd_per_hour,
        "usd_per_million_tokens": (s.usd_per_hour / 3600 / s.goodput * 1e6) if s.feasible and not r.images else None,
        "tokens_per_usd": s.tokens_per_usd if s.feasible else None,
        f"throughput_{unit}": s.goodput if s.feasible else None,
        f"goodput_{unit}": s.goodput,
        # the SLO knee's capacity (the engine saturating) beside the goodput, and what binds the knee
        f"capacity_{unit}": (s.pool.throughput_per_s if s.pool else _capacity(p)) if p else None,
        "slo_binding": s.point.knee.binding if s.point and s.point.knee else s.detail.get("binding"),
        "batch": p.batch if p else None, "microbatches": p.microbatches if p else None, "tp": list(s.tp),
        "max_num_batched_tokens": p.engine.max_num_batched_tokens if p and p.engine and not r.images else None,
        "ttft_s": p.ttft_s if p else None, "tpot_s": p.tpot_s if p else None,
        "latency_s": p.latency_s if p else None,
        # the operating point's own output rate (before the SLO) under either schedule: their ratio, not the
        # sync figure beside goodput, is the gain of asynchronous micro-batches
        f"sync_throughput_{unit}": p.sync_throughput if p and s.pool is None else None,
        "async_gain": async_gain(p) if p and s.pool is None else None,
        "device_busy": {f"{i}:{d.gpu}": b for i, (d, b) in enumerate(zip(p.devices, p.device_busy, strict=False))}
        if p else {},
        "idle_reason": s.detail.get("idle"),
        "memory_bytes": {f"{i}:{d.gpu}": sum(p.memory_bytes[i].values()) for i, d in enumerate(p.devices)} if p else {},
        "bound_ratio": p.bound_ratio if p else None,
        # a pool's notes are about the pool (its cells' own notes are in pool[i]'s plan)
        "notes": [f"independent replicas: {s.detail['replicas']}"] if s.pool else list(p.notes) if p else [],
        "detail": {k: v for k, v in s.detail.items() if k != "idle"},
        # several different cells (homogeneous on a mixed pool): each cell once, with its count; the
        # figures above that are per device (batch, busy, memory) are the lead cell's, pool[0]
        "pool": [_cell_json(c, unit) for c in s.pool.cells] if s.pool else None,
    }
    return ent


def _capacity(p) -> float | None:
    return p.throughput_images_per_s if p.throughput_images_per_s is not None else p.throughput_tokens_per_s


def _cell_json(c, unit: str) -> dict[str, Any]:
    p = c.plan
    return {"count": c.count, "replicas": p.replicas, "gpus": [d.gpu for d in p.devices],
            f"throughput_{unit}": p.throughput_images_per_s if unit == "images_per_s" else p.throughput_tokens_per_s,
            "usd_per_hour": p.usd_per_hour, "batch": p.batch, "microbatches": p.microbatches,
            "device_busy": list(p.device_busy), "memory_bytes": [sum(m.values()) for m in p.memory_bytes]}


def result_json(r) -> dict[str, Any]:
    c = r.config
    return {"model": r.model, "gpus": list(r.gpus), "link": r.link, "mode": "throughput",
            "slo": {"ttft_s": c.slo.ttft_s, "tpot_s": c.slo.tpot_s, "image_s": c.slo.image_s,
                    "target": c.slo.target},
            "traffic": {"prompt": c.traffic.prompt, "output": c.traffic.output, "steps": c.traffic.steps},
            "chosen": r.tessera.chosen, "solve_s": r.solve_s, "wall_s": r.wall_s,
            "bound_ratio": r.tessera.plan.bound_ratio if r.tessera.plan and r.tessera.chosen == "milp" else None,
            "strategies": {n: strategy_json(r, n) for n in r.strategies}}


def result_table(r) -> Table:
    c = r.config
    slo = (f"image ≤ {c.slo.image_s:g} s" if r.images else
           f"TTFT ≤ {c.slo.ttft_s:g} s, TPOT ≤ {c.slo.tpot_s * 1e3:g} ms")
    traffic = f"{c.traffic.steps} steps" if r.images else f"prompt {c.traffic.prompt}, output {c.traffic.output}"
    t = Table(title=f"{r.model} on {' + '.join(r.gpus)} ({r.link}); {traffic}; SLO {slo}; "
                    f"solve {r.solve_s:.1f} s of {r.wall_s:.1f} s")
    unit = "images/s" if r.images else "goodput tok/s"
    for col in ("strategy", unit, "$/h", "tok per $" if not r.images else "img per $",
                "batch × m" if r.images else "batch × m, tokens/iter", "TP",
                "TPOT ms" if not r.images else "image s", "TTFT s", "busy", "GB used of capacity", "note"):
        t.add_column(col, justify="left" if col in ("strategy", "note") else "right", no_wrap=col == "strategy")
    for name in r.strategies:
        s = r.strategies[name]
        p = s.plan
        if not s.applicable or not s.feasible or p is None:
            t.add_row(label(r, name), "n/a" if not s.applicable else "0", f"{s.usd_per_hour:.2f}", "", "", "", "",
                      "", "", "", s.reason or "")
            continue
        cells = [c.plan for c in s.pool.cells] if s.pool else [p]  # memory and busy: every different cell
        mem = " / ".join(f"{sum(m.values()) / 1e9:.0f} of {d.mem_bytes / 1e9:.0f}"
                         for c in cells for m, d in zip(c.memory_bytes, c.devices, strict=True))
        lat = (f"{p.tpot_s * 1e3:.1f}" if p.tpot_s is not None else "") if not r.images else f"{p.ttft_s:.1f}"
        busy = " / ".join(f"{b:.0%}" for c in cells for b in c.device_busy)
        note = s.detail.get("idle") or (s.detail.get("replicas") or s.detail.get("orientation") or "")
        t.add_row(label(r, name), f"{s.goodput:,.1f}", f"{s.usd_per_hour:.2f}", f"{s.tokens_per_usd:,.0f}",
                  f"{p.batch} × {p.microbatches}" + (f", {p.engine.max_num_batched_tokens}"
                                                      if p.engine and not r.images else ""),
                  "/".join(str(x) for x in s.tp),
                  lat, f"{p.ttft_s:.2f}" if p.ttft_s is not None and not r.images else "", busy, mem, note)
    return t
