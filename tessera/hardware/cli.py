"""CLI verbs of the hardware stage: `tessera gpus`."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from tessera.hardware import catalog
from tessera.text import stdout_console


def gpus(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the GPU catalog: peak bf16 FLOP/s, memory, bandwidth, price."""
    specs = [catalog.gpu(n) for n in catalog.gpu_names()]
    if as_json:
        print(json.dumps([{"name": g.name, "bf16_tflops": g.peak("bf16") / 1e12, "mem_gb": g.mem_bytes / 1e9,
                           "mem_bw_gb_per_s": g.mem_bw_bytes_per_s / 1e9, "usd_per_hour": g.usd_per_hour}
                          for g in specs]))
        return
    t = Table(title="GPU catalog")
    for c in ("GPU", "bf16 TFLOP/s", "memory GB", "HBM GB/s", "USD/h"):
        t.add_column(c, justify="right" if c != "GPU" else "left")
    for g in specs:
        t.add_row(g.name, f"{g.peak('bf16') / 1e12:.0f}", f"{g.mem_bytes / 1e9:.0f}",
                  f"{g.mem_bw_bytes_per_s / 1e9:.0f}", f"{g.usd_per_hour:.2f}")
    stdout_console().print(t)


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
