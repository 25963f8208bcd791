"""CLI verbs of the cost stage: `tessera gpus` (the catalog with each GPU's cost source), `tessera cost
calibrate|validate` and `tessera profile`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from tessera.cli.hardware import show_catalog
from tessera.cost import calibrate as cal
from tessera.cost.aic import cost_sources
from tessera.cost.model import CostModel
from tessera.cost.profiles import SHIPPED, load_profiles
from tessera.errors import choices_error
from tessera.hardware import catalog as hw_catalog
from tessera.hardware import use_catalog
from tessera.text import stdout_console

cost_app = typer.Typer(no_args_is_help=True, help="Calibrate the cost model and measure its accuracy.")

PROFILES_HELP = "Directory laid out like <gpu>/<model>/mlp.csv (Vidur format); default: the shipped profiles."
CATALOG_HELP = "Extra catalog TOML (adds GPUs, overrides prices); same as the TESSERA_CATALOG env var."


def gpus(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the GPU catalog: peak bf16 FLOP/s, memory, bandwidth, price, and where kernel costs come from."""
    specs = [hw_catalog.gpu(n) for n in hw_catalog.gpu_names()]
    show_catalog(specs, cost_sources(specs), as_json)


def _setup(catalog: Path | None) -> None:
    if catalog is not None:
        use_catalog(catalog)


@cost_app.command("calibrate")
def calibrate_cmd(
    profiles: Path = typer.Option(SHIPPED, "--profiles", help=PROFILES_HELP),
    out: Path | None = typer.Option(None, "--out", help="Write the fitted efficiencies here as JSON."),
    catalog: Path | None = typer.Option(None, "--catalog", help=CATALOG_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Fit per-kernel-class efficiencies (compute, memory, launch) to measured profiles."""
    _setup(catalog)
    model = cal.calibrated_model(load_profiles(profiles))
    if out is not None:
        cal.write_calibration(model, out)
    if as_json:
        print(json.dumps(cal.model_to_dict(model)))
        return
    stdout_console().print(efficiency_table(model, profiles))


def efficiency_table(model: CostModel, profiles: Path) -> Table:
    """`tessera cost calibrate`: one row per fitted (scope, kernel kind); launch overhead in microseconds."""
    t = Table(title=f"fitted efficiencies ({profiles})")
    for c in ("scope", "kind", "compute", "memory", "launch us"):
        t.add_column(c)
    for scope, kind, e in cal.efficiency_rows(model):
        t.add_row(scope, kind, f"{e.compute:.3f}", f"{e.memory:.3f}",
                  "default" if e.launch_s is None else f"{e.launch_s * 1e6:.2f}")
    return t


SOURCES = ("vidur", "aic")


@cost_app.command("validate")
def validate_cmd(
    source: str = typer.Option("vidur", "--source", help="vidur (per-operator profiles) or aic "
                               "(AIConfigurator's measured kernel tables)."),
    profiles: Path | None = typer.Option(None, "--profiles", help=PROFILES_HELP + " With --source aic: "
                                         "a directory of <system>/<table>.csv (default: the shipped tables)."),
    fit_on: str | None = typer.Option(None, "--fit-on", help="Comma-separated GPUs to fit on."),
    holdout: str | None = typer.Option(None, "--holdout", help="GPU(s) to predict from specs alone."),
    rows: int = typer.Option(300, "--rows", help="With --source aic: rows scored per GPU and table."),
    catalog: Path | None = typer.Option(None, "--catalog", help=CATALOG_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the JSON report."),
) -> None:
    """Fit on some GPU types, predict the others from datasheets; default leave-one-GPU-out."""
    _setup(catalog)
    if source not in SOURCES:
        raise choices_error("cost source", source, list(SOURCES))
    if source == "aic":
        from tessera.cost.aic import AicCosts
        from tessera.cost.aic_validate import validate_transfer
        from tessera.cost.tables import SHIPPED_AIC

        report = validate_transfer(AicCosts(profiles or SHIPPED_AIC), fit_on=fit_on, holdout=holdout,
                                   rows=rows).to_dict()
    else:
        report = cal.validate(load_profiles(profiles or SHIPPED), fit_on=fit_on, holdout=holdout).to_dict()
    if as_json:
        print(json.dumps(report))
        return
    stdout_console().print(accuracy_table(report))


def accuracy_table(report: dict[str, Any]) -> Table:
    """`tessera cost validate`: absolute percentage errors per operator, then overall, of the held-out GPUs."""
    t = Table(title=f"holdout {', '.join(report['holdout'])} | fit on {', '.join(report['fit_on'])}")
    for c in ("operator", "median APE", "p90 APE", "points"):
        t.add_column(c, justify="left" if c == "operator" else "right")
    for op, s in [*report["ops"].items(), ("overall", report["overall"])]:
        t.add_row(op, f"{s['median_ape']:.1%}", f"{s['p90_ape']:.1%}", str(s["points"]))
    return t


@cost_app.command("import")
def import_cmd(
    source: str = typer.Argument(..., help="aic: the installed aiconfigurator-core's measured tables."),
    out: Path = typer.Option(None, "--out", help="Directory for <system>/<table>.csv; default: the shipped "
                             "tables' directory (tessera/cost/data/aic)."),
    systems: str | None = typer.Option(None, "--systems", help="Comma-separated systems (default: all "
                                       "with vLLM tables), e.g. h100_sxm,l40s."),
) -> None:
    """Convert a measured kernel database into the tables the cost model reads, and refit their rooflines."""
    from tessera.cost.aic import write_rooflines
    from tessera.cost.aic_import import import_aic
    from tessera.cost.tables import SHIPPED_AIC

    if source != "aic":
        raise choices_error("import source", source, ["aic"])
    target = out or SHIPPED_AIC
    report = import_aic(target, systems=[s for s in (systems or "").split(",") if s] or None)
    print(import_lines(report), end="")
    print(f"rooflines -> {write_rooflines(target)}")


def import_lines(report: dict[str, dict[str, str]]) -> str:
    """`tessera cost import`: one line per (system, table) imported and where it went, each line ended."""
    return "".join(f"{system:>20} {table:<21} {where}\n"
                   for system, tables in report.items() for table, where in tables.items())


def profile(
    model: str = typer.Argument(..., help="A tiny zoo model (real-mode capture), e.g. llama-tiny."),
    device: str = typer.Option("cpu", "--device", help="Device to time on (cpu)."),
    out: Path = typer.Option(Path("profiles"), "--out", help="Writes OUT/cpu/MODEL/{kernels,mlp}.csv."),
    batches: str = typer.Option("1,2,4,8", "--batches", help="Comma-separated decode batch sizes."),
    context: int = typer.Option(32, "--context", help="KV-cache length of the decode step."),
    repeats: int = typer.Option(20, "--repeats", help="Timed replays per batch size."),
    as_json: bool = typer.Option(False, "--json", help="Print what was written as one JSON object."),
) -> None:
    """Time every captured kernel of MODEL on the local device; write a profile (Vidur format + per kernel)."""
    from tessera.cost.profiler import profile_to

    if device != "cpu":
        raise choices_error("profiling device", device, ["cpu"])
    try:
        sizes = tuple(int(b) for b in batches.split(","))
    except ValueError:
        raise typer.BadParameter(f"--batches {batches!r} must be comma-separated integers") from None
    run = profile_to(model, out, batches=sizes, context=context, repeats=repeats)
    if as_json:
        print(json.dumps(run.to_dict()))
        return
    print(f"{run.kernel_timings} kernel timings -> {run.folder}")


def register(app: typer.Typer) -> None:
    app.command("gpus")(gpus)
    app.add_typer(cost_app, name="cost")
    app.command("profile")(profile)
