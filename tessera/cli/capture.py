"""CLI verbs of the capture stage: `tessera models`, `tessera trace`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from tessera.capture.defaults import DEFAULT_CONTEXT, DEFAULT_SEQ
from tessera.text import stdout_console

if TYPE_CHECKING:  # the zoo is imported inside `models` so that `tessera --help` does not load it
    from tessera.capture.zoo import ModelSpec

out = stdout_console()


def _per_phase(defaults: dict[str, int]) -> str:
    return ", ".join(f"{phase} {n}" for phase, n in defaults.items())


def _gb(n: int) -> str:
    return f"{n / 1e9:.3f}"


def models(
    as_json: Annotated[bool, typer.Option("--json", help="print a JSON list, one object per model")] = False,
) -> None:
    """List the model zoo (any local HF config.json path is accepted too)."""
    from tessera.capture.zoo import PHASES, SPECS

    if as_json:
        print(json.dumps([{"model": s.name, "family": s.family, "phases": list(PHASES[s.family]),
                           "source": s.source} for s in SPECS.values()]))
        return
    out.print(zoo_table(list(SPECS.values()), PHASES))


def trace(
    model: Annotated[str, typer.Argument(help="zoo name (see `tessera models`) or path to a config.json")],
    phase: Annotated[str, typer.Option(help="prefill | decode | encode | denoise")],
    batch: Annotated[int, typer.Option(help="sequences / images in the step")] = 1,
    seq: Annotated[int | None, typer.Option(help="prompt tokens, image tokens (denoise) or patches (encode)",
                                            show_default=_per_phase(DEFAULT_SEQ))] = None,
    context: Annotated[int | None, typer.Option(
        help="cached tokens (decode), text tokens (denoise) or image patches per prompt (VL prefill)",
        show_default=_per_phase(DEFAULT_CONTEXT))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
    # -o/--out as in `plan`; `--output` means output tokens in plan, advise and fleet plan
    output: Annotated[Path | None, typer.Option("-o", "--out", help="write the KernelGraph JSON here")] = None,
    eager: Annotated[bool, typer.Option("--eager", help="one kernel per ATen operator instead of the "
                                        "production-fused view (elementwise/norm/copy chains fused)")] = False,
) -> None:
    """Capture one step of MODEL and summarise its kernels (fused view unless --eager)."""
    from tessera.capture import capture_model, summarize

    graph = capture_model(model, phase, batch=batch, seq=seq, context=context, eager=eager)
    if output is not None:
        graph.save(output)
    s = summarize(graph)
    if as_json:
        print(json.dumps(s))
        return
    show_trace(s)


def zoo_table(specs: list[ModelSpec], phases: dict[str, tuple[str, ...]]) -> Table:
    """`tessera models`: one row per zoo model, with the phases its family captures."""
    table = Table(title="model zoo")
    for col in ("model", "family", "phases", "source"):
        table.add_column(col)
    for s in specs:
        table.add_row(s.name, s.family, ", ".join(phases[s.family]), s.source)
    return table


def show_trace(s: dict[str, Any]) -> None:
    """`tessera trace`: kernels by kind (titled with the step's totals), the heaviest kernels and the
    capture's warnings, from ``tessera.capture.summarize``'s summary."""
    head = (f"{s['model']} {s['phase']} {s['shape']}: {s['kernels']} kernels ({s['view']} view; "
            f"{s['eager_kernels']} eager), {s['layers']} layers, "
            f"{s['flops'] / 1e12:.3f} TFLOP, read {_gb(s['bytes_read'])} GB, written {_gb(s['bytes_written'])} GB, "
            f"weights {_gb(s['weight_bytes'])} GB, kv {_gb(s['kv_bytes'])} GB, state {_gb(s['state_bytes'])} GB, "
            f"deps from PTX {s['deps_from']['ptx']} / schema {s['deps_from']['schema']}, "
            f"captured in {s['capture_s']:.2f} s")
    kinds = Table(title=head)
    for col in ("kind", "kernels", "GFLOP", "GB moved"):
        kinds.add_column(col, justify="right" if col != "kind" else "left")
    for kind, row in s["by_kind"].items():
        kinds.add_row(kind, str(row["kernels"]), f"{row['flops'] / 1e9:.2f}", _gb(row["bytes"]))
    heavy = Table(title="heaviest kernels")
    for col in ("id", "op", "kind", "module", "GFLOP", "GB moved"):
        heavy.add_column(col)
    for k in s["heaviest"]:
        heavy.add_row(str(k["id"]), k["name"], k["kind"], k["module"], f"{k['flops'] / 1e9:.2f}", _gb(k["bytes"]))
    out.print(kinds)
    out.print(heavy)
    for finding in s["findings"]:
        out.print(f"warning: {finding}", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("models")(models)
    app.command("trace")(trace)
