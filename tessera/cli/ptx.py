"""CLI verbs of the PTX stage: `tessera ptx analyze`, `tessera ptx graph`."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from tessera.contracts.ir import KernelGraph
from tessera.ptx.analysis import EntryAccess, analyze_ptx_file
from tessera.ptx.launch import INDIRECT_SCOPES, build_from_log
from tessera.text import stdout_console

ptx_app = typer.Typer(add_completion=False, no_args_is_help=True,
                      help="PTX dependency analysis: parameter access classes, launch logs -> kernel graphs.")


@ptx_app.command("analyze")
def analyze(
    file: Path = typer.Argument(..., help="A .ptx module."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Per entry: each parameter's access class, whether the kernel is indirect, and the counts behind it."""
    result = analyze_ptx_file(file)
    if as_json:
        print(json.dumps([e.to_dict() for e in result.values()], indent=1))
        return
    show_entries(list(result.values()))


def show_entries(entries: list[EntryAccess]) -> None:
    """`tessera ptx analyze`: per entry, a table of its parameters' access classes, its module variables
    and the first five reasons it is indirect."""
    con = stdout_console()
    for e in entries:
        t = Table(title=f"{e.name}{'  [indirect]' if e.indirect else ''}", title_justify="left")
        for c in ("parameter", "type", "access", "reads", "writes", "atomics", "widened", "data-dep"):
            t.add_column(c, justify="left" if c in ("parameter", "type", "access") else "right")
        for p in e.params:
            t.add_row(p.name, p.type, str(p.access), str(p.reads), str(p.writes), str(p.atomics),
                      str(p.conservative), "yes" if p.data_dependent else "")
        con.print(t)
        for g, acc in e.globals.items():
            con.print(f"  module variable {g}: {acc}")
        for r in e.reasons[:5]:
            con.print(f"  indirect: {r}", highlight=False)


@ptx_app.command("graph")
def graph(
    log: Path = typer.Argument(..., help="JSON-lines launch log (docs/ptx.md)."),
    alloc: Path = typer.Option(..., "--alloc", help="Allocation table JSON (docs/ptx.md)."),
    out: Path | None = typer.Option(None, "-o", "--out", help="Write the KernelGraph JSON here."),
    indirect_scope: str = typer.Option("params", help=f"Indirect kernels touch: {', '.join(INDIRECT_SCOPES)}."),
    as_json: bool = typer.Option(False, "--json", help="Print the counts and edges as one JSON object."),
) -> None:
    """Turn a launch log and an allocation table into a KernelGraph with RAW/WAR/WAW edges."""
    g = build_from_log(log, alloc, indirect_scope=indirect_scope)
    if out is not None:
        g.save(out)
    if as_json:
        print(json.dumps({
            "kernels": len(g.kernels), "buffers": len(g.buffers), "edges": len(g.edges),
            "indirect": sum(k.indirect for k in g.kernels),
            "edge_list": [{"src": e.src, "src_kernel": g.kernels[e.src].name, "dst": e.dst,
                           "dst_kernel": g.kernels[e.dst].name, "kind": e.kind.value,
                           "buffer": g.buffers[e.buffer].name} for e in g.edges]}))
        return
    show_edges(g)


def show_edges(g: KernelGraph) -> None:
    """`tessera ptx graph`: the counts, then one line per dependency edge (kernel#id -> kernel#id KIND)."""
    con = stdout_console()
    con.print(f"{len(g.kernels)} kernels, {len(g.buffers)} buffers, {len(g.edges)} edges, "
              f"{sum(k.indirect for k in g.kernels)} indirect", highlight=False)
    for e in g.edges:
        con.print(f"  {g.kernels[e.src].name}#{e.src} -> {g.kernels[e.dst].name}#{e.dst}  "
                  f"{e.kind.value.upper()} {g.buffers[e.buffer].name}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(ptx_app, name="ptx")
