"""Kernel times from AIConfigurator's measured tables: interpolated on a GPU that has tables, carried over
(``transfer.Transfer``) to a GPU that has none.

The shipped tables (``tessera/cost/data/aic``, from aiconfigurator-core 0.12.0, Apache-2.0; see the NOTICE
there) are loaded per GPU on first use; the per-GPU fitted rooflines the transfer needs are shipped beside
them in ``rooflines.csv`` (``write_rooflines`` refits them; `tessera cost import aic` does so).
"""

from __future__ import annotations

import csv
from dataclasses import replace
from pathlib import Path

from tessera.cost.aic_import import TABLES
from tessera.cost.tables import SHIPPED_AIC, MeasuredTable, load_gpu_tables, query_of, read_table, table_dirs
from tessera.cost.transfer import DEFAULT_CONSTANTS, TABLE_CONSTANTS, Measured, Roofline, Transfer
from tessera.errors import UserError
from tessera.graph import Kernel
from tessera.hardware import GpuSpec, gpu

ROOFLINES = "rooflines.csv"
ROOFLINE_COLUMNS = ["gpu", "table", "compute_eff", "memory_eff", "launch_s"]


def write_rooflines(root: Path) -> Path:
    """Fit every (GPU, table) roofline under ``root`` and write ``root/rooflines.csv``."""
    path = root / ROOFLINES
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(ROOFLINE_COLUMNS)
        for name, d in table_dirs(root).items():
            for table, t in load_gpu_tables(d, gpu(name)).items():
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

    def __init__(self, root: Path = SHIPPED_AIC) -> None:
        self.root = Path(root)
        self.dirs = table_dirs(self.root)  # catalog GPU name -> table directory
        self._rooflines = read_rooflines(self.root / ROOFLINES)
        self._tables: dict[tuple[str, str], MeasuredTable | None] = {}
        self._transfers: dict[tuple[str, str], Transfer] = {}
        self._times: dict[tuple[str, str, tuple[int, ...], int | None], float] = {}

    def table(self, name: str, table: str) -> MeasuredTable | None:
        """``name``'s ``table`` (loaded on first use, with its shipped roofline fit), or None."""
        key = (name, table)
        if key not in self._tables:
            path = self.dirs[name] / f"{table}.csv" if name in self.dirs else None
            self._tables[key] = None if path is None or not path.exists() else replace(
                read_table(path, table, gpu(name)), basis=self._rooflines.get(key))
        return self._tables[key]

    def tables(self, name: str) -> dict[str, MeasuredTable]:
        return {t: m for t in TABLES if (m := self.table(name, t)) is not None}

    def measured(self, name: str, table: str) -> Measured:
        m = self.table(name, table)
        if m is None:
            raise ValueError(f"{name} has no {table} table")
        return Measured(table=m)

    def has(self, name: str, table: str) -> bool:
        return name in self.dirs and (self.dirs[name] / f"{table}.csv").exists()

    def transfer(self, target: GpuSpec, table: str) -> Transfer:
        """Carry ``table`` to ``target`` from every measured GPU except ``target``."""
        key = (target.name, table)
        if key not in self._transfers:
            sources = tuple(self.measured(n, table) for n in self.dirs if n != target.name and self.has(n, table))
            self._transfers[key] = Transfer(target=target, sources=sources,
                                            constants=TABLE_CONSTANTS.get(table, DEFAULT_CONSTANTS))
        return self._transfers[key]

    def source(self, g: GpuSpec) -> str:
        """Where ``g``'s kernel costs come from, in words (for `tessera gpus`)."""
        if g.vendor == "host":
            return ""
        own = [t for t in TABLES if self.has(g.name, t)]
        if own:
            missing = [t for t in TABLES if t not in own]
            return "measured tables" + (f" ({', '.join(missing)} transferred)" if missing else "")
        return f"transferred from {len(self.dirs)} measured GPUs"

    def time_s(self, kernel: Kernel, g: GpuSpec) -> float | None:
        """Seconds for ``kernel`` on ``g`` from tables or transfer; None where no table kind applies."""
        q = query_of(kernel)
        if q is None or g.vendor == "host":
            return None
        table, key, kv_len = q
        ck = (g.name, table, key, kv_len)
        if ck not in self._times:
            own = self.table(g.name, table)
            self._times[ck] = (own.time_at(key, kv_len=kv_len) if own is not None
                               else self.transfer(g, table).time_s(key, kv_len))
        return self._times[ck]
