"""CLI verbs of the hardware stage: `tessera gpus`."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from tessera.hardware import catalog
from tessera.text import stdout_console


def _cost_sources(specs: list[catalog.GpuSpec]) -> dict[str, str]:
    """Where each GPU's kernel costs come from. The CLI is where stages meet: the catalog itself stays
    free of the cost stage, which reads it."""
    from tessera.cost.aic import AicCosts

    costs = AicCosts()
    return {g.name: costs.source(g) or ("measured on this machine" if g.measured else "roofline") for g in specs}


def gpus(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the GPU catalog: peak bf16 FLOP/s, memory, bandwidth, price, and where kernel costs come from."""
    specs = [catalog.gpu(n) for n in catalog.gpu_names()]
    sources = _cost_sources(specs)
    if as_json:
        print(json.dumps([{"name": g.name, "bf16_tflops": g.peak("bf16") / 1e12, "mem_gb": g.mem_bytes / 1e9,
                           "mem_bw_gb_per_s": g.mem_bw_bytes_per_s / 1e9, "usd_per_hour": g.usd_per_hour,
                           "costs": sources[g.name]} for g in specs]))
        return
    t = Table(title="GPU catalog")
    for c in ("GPU", "bf16 TFLOP/s", "memory GB", "mem GB/s", "USD/h", "kernel costs from"):
        t.add_column(c, justify="left" if c in ("GPU", "kernel costs from") else "right")
    for g in specs:
        t.add_row(g.name, f"{g.peak('bf16') / 1e12:.0f}", f"{g.mem_bytes / 1e9:.0f}",
                  f"{g.mem_bw_bytes_per_s / 1e9:.0f}", f"{g.usd_per_hour:.2f}", sources[g.name])
    stdout_console().print(t)


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
