"""How a ServingResult is shown on a terminal: the `tessera plan` table (its JSON is ServingResult.to_json)."""

from __future__ import annotations

from rich.table import Table


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('h') else 's'}"


def label(r, name: str) -> str:
    """`tessera (= prefill_decode)` when Tessera adopted a baseline's plan."""
    s = r.strategies[name]
    if name == "tessera" and s.chosen and s.chosen != "milp":
        return f"tessera (= {s.chosen})"
    return name


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
        rate = f"{s.goodput:,.1f}" if s.goodput >= 1 else f"{s.goodput:.3g}"  # 0.397 images/s, not 0.4
        t.add_row(label(r, name), rate, f"{s.usd_per_hour:.2f}", f"{s.tokens_per_usd:,.0f}",
                  f"{p.batch} × {p.microbatches}" + (f", {p.engine.max_num_batched_tokens}"
                                                      if p.engine and not r.images else ""),
                  "/".join(str(x) for x in s.tp),
                  lat, f"{p.ttft_s:.2f}" if p.ttft_s is not None and not r.images else "", busy, mem, note)
    return t
