"""How the GPU catalog is shown. The verb, `tessera gpus`, also names where each GPU's kernel costs come
from, which is the cost stage's knowledge: tessera/cli/cost.py registers it and calls ``show_catalog``,
so that the catalog stays free of the cost stage, which reads it."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from tessera.hardware import catalog
from tessera.text import stdout_console


def _bf16(g: catalog.GpuSpec) -> float | None:
    """Datasheet bf16 TFLOP/s; None for a GPU without bf16 (V100, T4: the cost model runs bf16 at fp16's rate)."""
    v = g.peak_flops_per_s.get("bf16")
    return None if v is None else v / 1e12


def show_catalog(specs: list[catalog.GpuSpec], sources: dict[str, str], as_json: bool) -> None:
    """Print ``specs`` as a table or JSON; ``sources``: GPU name -> where its kernel costs come from."""
    if as_json:
        print(json.dumps([{"name": g.name, "bf16_tflops": _bf16(g), "dtypes": sorted(g.peak_flops_per_s),
                           "mem_gb": g.mem_bytes / 1e9,
                           "mem_bw_gb_per_s": g.mem_bw_bytes_per_s / 1e9, "usd_per_hour": g.usd_per_hour,
                           "costs": sources[g.name]} for g in specs]))
        return
    t = Table(title="GPU catalog")
    for c in ("GPU", "bf16 TFLOP/s", "memory GB", "mem GB/s", "USD/h", "kernel costs from"):
        t.add_column(c, justify="left" if c in ("GPU", "kernel costs from") else "right")
    for g in specs:
        bf16 = _bf16(g)
        fp16 = g.peak_flops_per_s.get("fp16")
        t.add_row(g.name, f"{bf16:.0f}" if bf16 is not None else f"none (fp16 {fp16 / 1e12:.0f})" if fp16 else "none",
                  f"{g.mem_bytes / 1e9:.0f}",
                  f"{g.mem_bw_bytes_per_s / 1e9:.0f}", f"{g.usd_per_hour:.2f}", sources[g.name])
    stdout_console().print(t)


def register(app: typer.Typer) -> None:
    """Nothing: the catalog's verb, `tessera gpus`, is registered with the cost stage's (see above)."""
