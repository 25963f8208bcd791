"""Kernel times from AIConfigurator's measured tables: interpolated on a GPU that has tables, carried over
(``transfer.TableTransfer``) to a GPU that has none. A GPU whose MoE rows use power-law routing only gets a
balanced-routing MoE table derived from them (``moe.balanced_from_power_law``).

The shipped tables (``tessera/cost/data/aic``, from aiconfigurator-core 0.12.0, Apache-2.0; see the NOTICE
there) are loaded per GPU on first use; the per-GPU fitted rooflines the transfer needs are shipped beside
them in ``rooflines.csv`` (``write_rooflines`` refits them; `tessera cost import aic` does so).
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

import numpy as np

from tessera.cost.aic_import import TABLES
from tessera.cost.moe import TokenCurve, balanced_from_power_law, routing_log_ratios
from tessera.cost.tables import (
    KERNEL_TABLES,
    MOE_TABLES,
    SHIPPED_AIC,
    MeasuredTable,
    query_of,
    read_table,
    table_dirs,
)
from tessera.cost.transfer import DEFAULT_CONSTANTS, TABLE_CONSTANTS, Measured, Roofline, TableTransfer
from tessera.errors import UserError
from tessera.graph import Kernel
from tessera.hardware import GpuSpec, gpu

ROOFLINES = "rooflines.csv"
ROOFLINE_COLUMNS = ["gpu", "table", "compute_eff", "memory_eff", "launch_s"]


def write_rooflines(root: Path) -> Path:
    """Fit every (GPU, table) roofline under ``root`` (derived MoE tables included) and write
    ``root/rooflines.csv``."""
    path = root / ROOFLINES
    costs = AicCosts(root, fitted=False)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(ROOFLINE_COLUMNS)
        for name in costs.dirs:
            for table, t in costs.tables(name).items():
                r = t.roofline
                w.writerow([name, table, f"{r.compute_eff:.5g}", f"{r.memory_eff:.5g}", f"{r.launch_s:.5g}"])
    return path


def read_rooflines(path: Path) -> dict[tuple[str, str], Roofline]:
    if not path.exists():
        return {}
    out = {}
    with path.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f), start=1):
            try:
                out[(r["gpu"], r["table"])] = Roofline(compute_eff=float(r["compute_eff"]),
                                                       memory_eff=float(r["memory_eff"]),
                                                       launch_s=float(r["launch_s"]))
            except (KeyError, TypeError, ValueError) as e:
                raise UserError(f"{path}: row {i}: malformed ({e})") from None
    return out


class AicCosts:
    """Measured-table costs for every GPU (tables where it has them, transfer where not), cached."""

    def __init__(self, root: Path = SHIPPED_AIC, *, fitted: bool = True) -> None:
        """``fitted``: take each table's roofline from ``root/rooflines.csv`` (else fit it on first use)."""
        self.root = Path(root)
        self.dirs = table_dirs(self.root)  # catalog GPU name -> table directory
        self._rooflines = read_rooflines(self.root / ROOFLINES) if fitted else {}
        self._tables: dict[tuple[str, str], MeasuredTable | None] = {}
        self._transfers: dict[tuple[str, str], TableTransfer] = {}
        self._times: dict[tuple[str, str, tuple[int, ...], int | None], float] = {}
        self._curves: dict[tuple[str, str, tuple[int, ...]], TokenCurve] = {}

    def table(self, name: str, table: str) -> MeasuredTable | None:
        """``name``'s ``table`` (loaded on first use, with its shipped roofline fit), or None; a MoE table
        derived from power-law rows where the GPU has only those (``derived``)."""
        key = (name, table)
        if key not in self._tables:
            t = None
            if self._file(name, table):
                t = read_table(self.dirs[name] / f"{table}.csv", table, gpu(name))
            elif self.derived(name, table):
                ratios = self.routing_ratios(exclude=name)
                t = balanced_from_power_law(self._own(name, "moe_power_law"), ratios)
            self._tables[key] = None if t is None else replace(t, basis=self._rooflines.get(key))
        return self._tables[key]

    def _file(self, name: str, table: str) -> bool:
        return name in self.dirs and (self.dirs[name] / f"{table}.csv").exists()

    def _own(self, name: str, table: str) -> MeasuredTable:
        t = self.table(name, table)
        assert t is not None, (name, table)
        return t

    def both_routings(self, exclude: str | None = None) -> list[str]:
        """GPUs (other than ``exclude``) with MoE tables measured both balanced and power-law."""
        return [n for n in self.dirs
                if n != exclude and self._file(n, "moe") and self._file(n, "moe_power_law")]

    def routing_ratios(self, exclude: str | None = None) -> dict[tuple[int, ...], float]:
        """``moe.routing_log_ratios`` over ``both_routings(exclude)``."""
        return routing_log_ratios([(self._own(n, "moe"), self._own(n, "moe_power_law"))
                                   for n in self.both_routings(exclude)])

    def derived(self, name: str, table: str) -> bool:
        """Whether ``name``'s ``table`` is derived: a MoE table from its power-law rows (module doc)."""
        return (table == "moe" and not self._file(name, "moe") and self._file(name, "moe_power_law")
                and bool(self.both_routings(exclude=name)))

    def tables(self, name: str) -> dict[str, MeasuredTable]:
        return {t: m for t in TABLES if (m := self.table(name, t)) is not None}

    def measured(self, name: str, table: str) -> Measured:
        m = self.table(name, table)
        if m is None:
            raise ValueError(f"{name} has no {table} table")
        return Measured(table=m)

    def has(self, name: str, table: str) -> bool:
        return self._file(name, table) or self.derived(name, table)

    def is_source(self, name: str, table: str) -> bool:
        """Whether ``name``'s ``table`` is measured as it is used, so that other GPUs are carried over from
        it: a derived table serves its own GPU only (its routing correction and, on A100, an older vLLM are
        errors the measured GPUs do not share; as a source it made their leave-one-out errors worse)."""
        return self._file(name, table)

    def transfer(self, target: GpuSpec, table: str) -> TableTransfer:
        """Carry ``table`` to ``target`` from every measured GPU except ``target``."""
        key = (target.name, table)
        if key not in self._transfers:
            sources = tuple(self.measured(n, table) for n in self.dirs
                            if n != target.name and self.is_source(n, table))
            self._transfers[key] = TableTransfer(target=target, sources=sources,
                                            constants=TABLE_CONSTANTS.get(table, DEFAULT_CONSTANTS))
        return self._transfers[key]

    def source(self, g: GpuSpec) -> str:
        """Where ``g``'s kernel costs come from, in words (for `tessera gpus`)."""
        if g.vendor == "host":
            return ""
        own = [t for t in KERNEL_TABLES if self.has(g.name, t)]
        if own:
            missing = [t for t in KERNEL_TABLES if t not in own]
            notes = [f"{', '.join(missing)} transferred"] if missing else []
            notes += [f"{t} from power-law routing rows" for t in own if self.derived(g.name, t)]
            return "measured tables" + (f" ({'; '.join(notes)})" if notes else "")
        return f"transferred from {len(self.dirs)} measured GPUs"

    def time_s(self, kernel: Kernel, g: GpuSpec) -> float | None:
        """Seconds for ``kernel`` on ``g`` from tables or transfer; None where no table kind applies."""
        q = query_of(kernel)
        if q is None or g.vendor == "host":
            return None
        table, key, kv_len = q
        ck = (g.name, table, key, kv_len)
        if ck not in self._times:
            self._times[ck] = (self.moe_s(g, table, key) if table in MOE_TABLES
                               else self.raw_s(g, table, key, kv_len))
        return self._times[ck]

    def moe_s(self, g: GpuSpec, table: str, key: tuple[int, ...]) -> float:
        """Seconds of a MoE kernel (tokens, hidden, inter, topk, experts) on ``g``: non-decreasing in tokens
        (``moe.TokenCurve``)."""
        shape = key[1:]
        return self.curve(g, table, shape).at(key[0], lambda t: self.raw_s(g, table, (t, *shape)))

    def raw_s(self, g: GpuSpec, table: str, key: tuple[int, ...], kv_len: int | None = None) -> float:
        """Seconds at ``key``: ``g``'s own table interpolated, or the transfer to ``g``."""
        own = self.table(g.name, table)
        if own is not None:
            return own.time_at(key, kv_len=kv_len)
        return self.transfer(g, table).time_s(key, kv_len)

    def curve(self, g: GpuSpec, table: str, shape: tuple[int, ...]) -> TokenCurve:
        """``g``'s MoE time against tokens at model ``shape`` (hidden, inter, topk, experts), monotone; its
        grid the table's token values (a transfer: its sources')."""
        ck = (g.name, table, shape)
        if ck not in self._curves:
            own = self.table(g.name, table)
            tables = [own] if own is not None else [s.table for s in self.transfer(g, table).sources]
            grid = np.unique(np.concatenate([t.points[:, 0] for t in tables]))
            self._curves[ck] = TokenCurve.of(grid, lambda t: self.raw_s(g, table, (t, *shape)))
        return self._curves[ck]


def cost_sources(specs: list[GpuSpec]) -> dict[str, str]:
    """GPU name -> where its kernel costs come from, in words (`tessera gpus`): AIConfigurator's tables
    (measured or transferred), this machine (a measured host), or the roofline."""
    costs = AicCosts()
    return {g.name: costs.source(g) or ("measured on this machine" if g.measured else "roofline") for g in specs}
