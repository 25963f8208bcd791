"""Accuracy of the measured-table costs: leave-one-GPU-out transfer, and interpolation inside one GPU's grid.

Both score evenly spaced rows of each table (``rows`` per GPU and table) by |predicted / measured - 1|.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from tessera.cost.aic import AicCosts
from tessera.cost.aic_import import TABLES
from tessera.cost.calibrate import ErrorStats
from tessera.cost.tables import DEFAULT_CACHE, CacheModel, MeasuredTable
from tessera.cost.transfer import TABLE_CONSTANTS, Measured, Transfer, TransferConstants
from tessera.errors import UserError
from tessera.hardware import gpu, resolve_gpu

# the axis of each table a serving step varies (tokens / sequence): the one interpolation is checked along
TOKEN_AXIS = {"gemm": 0, "context_attention": 1, "generation_attention": 1, "moe": 0}


def _sample(n: int, rows: int) -> np.ndarray:
    return np.unique(np.linspace(0, n - 1, min(rows, n)).astype(int))


def _names(arg: str | None, available: list[str]) -> list[str]:
    names = [resolve_gpu(p.strip()) for p in (arg or "").split(",") if p.strip()]
    for n in names:
        if n not in available:
            raise UserError(f"GPU {n!r} has no measured tables; measured: {', '.join(available)}")
    return names


# the constants' candidates: GEMM cache model (fraction of L2 resident x L2 bytes per FP32 FLOP) and the
# transfer's (distance scale x ridge); each a few values around physically plausible ones
CACHES = tuple(CacheModel(resident_fraction=f, l2_bytes_per_fp32_flop=k) for f in (0.1, 0.15, 0.2)
               for k in (0.02, 0.03, 0.04))
CONSTANTS = tuple(TransferConstants(scale=s, ridge=r) for s in (0.25, 0.35, 0.5, 0.7, 1.0, 1.4)
                  for r in (0.03, 0.1, 0.3))


@dataclass(frozen=True, kw_only=True)
class Setting:
    cache: CacheModel
    constants: TransferConstants

    def to_dict(self) -> dict[str, float]:
        return asdict(self.cache) | asdict(self.constants)


def default_setting(table: str) -> Setting:
    """The shipped constants for ``table``."""
    return Setting(cache=DEFAULT_CACHE, constants=TABLE_CONSTANTS[table])


def settings(table: str) -> list[Setting]:
    """Candidate settings for ``table`` (the cache model matters to GEMMs only)."""
    caches = CACHES if table == "gemm" else (DEFAULT_CACHE,)
    return [Setting(cache=c, constants=k) for c in caches for k in CONSTANTS]


class Scorer:
    """One table's transfer errors under any setting: each GPU's table (refitted per cache model), its
    scored rows, and each source's log residual at another GPU's rows, computed once and reused."""

    def __init__(self, costs: AicCosts, table: str, rows: int) -> None:
        self.costs, self.table, self.rows = costs, table, rows
        self._tables: dict[tuple[CacheModel, str], MeasuredTable] = {}
        self._residuals: dict[tuple[CacheModel, str, str], np.ndarray] = {}

    def gpus(self) -> list[str]:
        return [n for n in sorted(self.costs.dirs) if self.costs.has(n, self.table)]

    def measured(self, cache: CacheModel, name: str) -> MeasuredTable:
        if (cache, name) not in self._tables:
            t = self.costs.table(name, self.table)
            self._tables[cache, name] = t if t.cache == cache else replace(t, cache=cache, basis=None)
        return self._tables[cache, name]

    def residuals(self, cache: CacheModel, source: str, held: str) -> np.ndarray:
        key = (cache, source, held)
        if key not in self._residuals:
            t, s = self.measured(cache, held), self.measured(cache, source)
            self._residuals[key] = np.array([s.log_ratio(tuple(int(v) for v in t.points[i]))
                                             for i in _sample(len(t.time_s), self.rows)])
        return self._residuals[key]

    def errors(self, held: str, sources: list[str], setting: Setting) -> np.ndarray:
        """|predicted / measured - 1| at ``held``'s scored rows, carried over from ``sources``."""
        return np.abs(self.ratios(held, sources, setting) - 1)

    def ratios(self, held: str, sources: list[str], setting: Setting) -> np.ndarray:
        """predicted / measured at ``held``'s scored rows, carried over from ``sources``."""
        t = self.measured(setting.cache, held)
        x = Transfer(target=gpu(held), constants=setting.constants,
                     sources=tuple(Measured(table=self.measured(setting.cache, s)) for s in sources))
        idx = _sample(len(t.time_s), self.rows)
        res = np.array([self.residuals(setting.cache, s, held) for s in sources])
        return x.times_s(t.points[idx], res) / t.time_s[idx]

    def select(self, fit: list[str]) -> tuple[Setting, float]:
        """The setting with the lowest mean |log(predicted / measured)| over leave-one-out folds within
        ``fit`` alone (the inner loop of nested cross-validation; the loss the rooflines are fitted with),
        and that loss; the defaults where ``fit`` has under 3 GPUs."""
        fit = [g for g in fit if self.costs.has(g, self.table)]
        if len(fit) < 3:
            return default_setting(self.table), float("nan")
        scored = [(float(np.abs(np.log(np.concatenate([self.ratios(h, [g for g in fit if g != h], s)
                                                        for h in fit]))).mean()), i, s)
                  for i, s in enumerate(settings(self.table))]
        loss, _, best = min(scored)
        return best, loss


@lru_cache(maxsize=2)
def scorers_of(costs: AicCosts, rows: int) -> dict[str, Scorer]:
    """One ``Scorer`` per table, shared by the validations of one ``costs`` (their residuals are reused)."""
    return {t: Scorer(costs, t, rows) for t in TABLES}


def _fold(scorers: dict[str, Scorer], held: str, fit: list[str], nested: bool
          ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, float]]]:
    errs, chosen = {}, {}
    for table, sc in scorers.items():
        sources = [n for n in fit if sc.costs.has(n, table)]
        if not sc.costs.has(held, table) or not sources:
            continue
        setting = sc.select(fit)[0] if nested else default_setting(table)
        errs[table] = sc.errors(held, sources, setting)
        chosen[table] = setting.to_dict()
    return errs, chosen


def validate_transfer(costs: AicCosts, *, fit_on: str | None = None, holdout: str | None = None,
                      rows: int = 300, nested: bool = False) -> dict[str, Any]:
    """Fit on some measured GPUs, predict the others' tables from their datasheets; errors per table.

    Neither given: leave-one-GPU-out over every GPU with tables (errors pooled over the folds). ``nested``:
    each fold chooses its constants (``settings``) by leave-one-out over its own fit GPUs only, so the
    held-out GPU plays no part in choosing them; otherwise the shipped defaults are used."""
    available = sorted(costs.dirs)
    fit, held = _names(fit_on, available), _names(holdout, available)
    if set(fit) & set(held):
        raise UserError(f"--fit-on and --holdout overlap: {', '.join(sorted(set(fit) & set(held)))}")
    held = held or ([g for g in available if g not in fit] if fit else available)
    folds = [(fit or [g for g in available if g != h], h) for h in held]
    if any(not f for f, _ in folds):
        raise UserError(f"validation needs at least two measured GPU types; measured: {', '.join(available)}")
    scorers = scorers_of(costs, rows)
    pooled: dict[str, list[float]] = defaultdict(list)
    fold_out = []
    for f, h in folds:
        errs, chosen = _fold(scorers, h, f, nested)
        for table, e in errs.items():
            pooled[table].extend(e.tolist())
        fold_out.append({"fit_on": f, "holdout": [h],
                         "overall": ErrorStats.of([x for e in errs.values() for x in e]).to_dict(),
                         "ops": {t: ErrorStats.of(e.tolist()).to_dict() for t, e in errs.items()},
                         **({"chosen": chosen} if nested else {})})
    return {
        "holdout": sorted({h for _, h in folds}),
        "fit_on": sorted({g for f, _ in folds for g in f}),
        "overall": ErrorStats.of([x for e in pooled.values() for x in e]).to_dict(),
        "ops": {t: ErrorStats.of(pooled[t]).to_dict() for t in TABLES if pooled.get(t)},
        "folds": fold_out,
    }


def select_all(costs: AicCosts, *, rows: int = 300) -> dict[str, dict[str, float]]:
    """Per table, the setting leave-one-GPU-out over every measured GPU chooses (what the shipped defaults
    should be), with its loss (mean |log(predicted / measured)|)."""
    out = {}
    for table, sc in scorers_of(costs, rows).items():
        best, loss = sc.select(sc.gpus())
        out[table] = best.to_dict() | {"mean_abs_log_error": loss}
    return out


def validate_interpolation(costs: AicCosts, *, rows: int = 300) -> dict[str, Any]:
    """Per GPU with tables: drop every other interior value of each table's token axis, rebuild the
    table from the rest and predict the dropped rows (grid points the table never saw)."""
    pooled: dict[str, list[float]] = defaultdict(list)
    per_gpu = {}
    for name in sorted(costs.dirs):
        errs: dict[str, list[float]] = defaultdict(list)
        for table, t in costs.tables(name).items():
            axis = np.unique(t.points[:, TOKEN_AXIS[table]])
            dropped = np.isin(t.points[:, TOKEN_AXIS[table]], axis[1:-1:2])
            kept = MeasuredTable(name=table, gpu=t.gpu, points=t.points[~dropped], time_s=t.time_s[~dropped])
            idx = np.flatnonzero(dropped)
            for i in idx[_sample(len(idx), rows)] if len(idx) else []:
                errs[table].append(abs(kept.time_at(tuple(int(v) for v in t.points[i])) / t.time_s[i] - 1))
        for table, e in errs.items():
            pooled[table].extend(e)
        per_gpu[name] = {t: ErrorStats.of(e).to_dict() for t, e in errs.items()}
    return {"overall": ErrorStats.of([x for e in pooled.values() for x in e]).to_dict(),
            "ops": {t: ErrorStats.of(pooled[t]).to_dict() for t in TABLES if pooled.get(t)},
            "gpus": per_gpu}
