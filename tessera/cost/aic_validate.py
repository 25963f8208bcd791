"""Accuracy of the measured-table costs: leave-one-GPU-out transfer, and interpolation inside one GPU's grid.

Both score evenly spaced rows of each table (``rows`` per GPU and table) by |predicted / measured - 1|.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from tessera.cost.aic import AicCosts
from tessera.cost.aic_import import TABLES
from tessera.cost.calibrate import ErrorStats
from tessera.cost.tables import MeasuredTable
from tessera.cost.transfer import Transfer
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


def _fold(costs: AicCosts, held: str, fit: list[str], rows: int) -> dict[str, list[float]]:
    errs: dict[str, list[float]] = defaultdict(list)
    for table, t in costs.tables(held).items():
        sources = tuple(costs.measured(n, table) for n in fit if costs.has(n, table))
        if not sources:
            continue
        x = Transfer(target=gpu(held), sources=sources)
        for i in _sample(len(t.time_s), rows):
            pred = x.time_s(tuple(int(v) for v in t.points[i]))
            errs[table].append(abs(pred / t.time_s[i] - 1))
    return errs


def validate_transfer(costs: AicCosts, *, fit_on: str | None = None, holdout: str | None = None,
                      rows: int = 300) -> dict[str, Any]:
    """Fit on some measured GPUs, predict the others' tables from their datasheets; errors per table.

    Neither given: leave-one-GPU-out over every GPU with tables (errors pooled over the folds)."""
    available = sorted(costs.dirs)
    fit, held = _names(fit_on, available), _names(holdout, available)
    if set(fit) & set(held):
        raise UserError(f"--fit-on and --holdout overlap: {', '.join(sorted(set(fit) & set(held)))}")
    held = held or ([g for g in available if g not in fit] if fit else available)
    folds = [(fit or [g for g in available if g != h], h) for h in held]
    if any(not f for f, _ in folds):
        raise UserError(f"validation needs at least two measured GPU types; measured: {', '.join(available)}")
    pooled: dict[str, list[float]] = defaultdict(list)
    fold_out = []
    for f, h in folds:
        errs = _fold(costs, h, f, rows)
        for table, e in errs.items():
            pooled[table].extend(e)
        fold_out.append({"fit_on": f, "holdout": [h],
                         "overall": ErrorStats.of([x for e in errs.values() for x in e]).to_dict(),
                         "ops": {t: ErrorStats.of(e).to_dict() for t, e in errs.items()}})
    return {
        "holdout": sorted({h for _, h in folds}),
        "fit_on": sorted({g for f, _ in folds for g in f}),
        "overall": ErrorStats.of([x for e in pooled.values() for x in e]).to_dict(),
        "ops": {t: ErrorStats.of(pooled[t]).to_dict() for t in TABLES if pooled.get(t)},
        "folds": fold_out,
    }


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
