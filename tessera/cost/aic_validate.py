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
from tessera.cost.calibrate import ErrorStats, ValidationFold, ValidationReport
from tessera.cost.moe import TokenCurve, balanced_from_power_law
from tessera.cost.tables import (
    DEFAULT_CACHE,
    GEMM_TABLES,
    KERNEL_TABLES,
    MOE_TABLES,
    TABLE_CACHE,
    CacheModel,
    MeasuredTable,
    ideal_s,
    monotone_in_tokens,
    read_rows,
)
from tessera.cost.transfer import TABLE_CONSTANTS, Measured, TableTransfer, TransferConstants
from tessera.errors import UserError
from tessera.hardware import gpu, resolve_gpu

# the axis of each table a serving step varies (tokens / sequence): the one interpolation is checked along
TOKEN_AXIS = {"gemm": 0, "context_attention": 1, "generation_attention": 1, "moe": 0, "moe_power_law": 0,
              "gemm_fp8": 0, "moe_fp8_block": 0}


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
    return Setting(cache=TABLE_CACHE.get(table, DEFAULT_CACHE), constants=TABLE_CONSTANTS[table])


def settings(table: str) -> list[Setting]:
    """Candidate settings for ``table`` (the cache model matters to GEMMs only)."""
    caches = CACHES if table in GEMM_TABLES else (DEFAULT_CACHE,)
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
        x = TableTransfer(target=gpu(held), constants=setting.constants,
                     sources=tuple(Measured(table=self.measured(setting.cache, s)) for s in sources))
        idx = _sample(len(t.time_s), self.rows)
        res = np.array([self.residuals(setting.cache, s, held) for s in sources])
        return x.times_s(t.points[idx], res) / t.time_s[idx]

    def select(self, fit: list[str]) -> tuple[Setting, float]:
        """The setting with the lowest mean |log(predicted / measured)| over leave-one-out folds within
        ``fit`` alone (the inner loop of nested cross-validation; the loss the rooflines are fitted with),
        and that loss; the defaults where ``fit`` has under 3 GPUs (derived tables take no part: they are
        nobody's source)."""
        fit = [g for g in fit if self.costs.is_source(g, self.table)]
        if len(fit) < 3:
            return default_setting(self.table), float("nan")
        scored = [(float(np.abs(np.log(np.concatenate([self.ratios(h, [g for g in fit if g != h], s)
                                                        for h in fit]))).mean()), i, s)
                  for i, s in enumerate(settings(self.table))]
        loss, _, best = min(scored)
        return best, loss


@lru_cache(maxsize=4)
def scorers_of(costs: AicCosts, rows: int, tables: tuple[str, ...] = KERNEL_TABLES) -> dict[str, Scorer]:
    """One ``Scorer`` per table, shared by the validations of one ``costs`` (their residuals are reused)."""
    return {t: Scorer(costs, t, rows) for t in tables}


def _fold(scorers: dict[str, Scorer], held: str, fit: list[str], nested: bool
          ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, float]]]:
    errs, chosen = {}, {}
    for table, sc in scorers.items():
        sources = [n for n in fit if sc.costs.is_source(n, table)]
        if not sc.costs.has(held, table) or not sources:
            continue
        setting = sc.select(fit)[0] if nested else default_setting(table)
        errs[table] = sc.errors(held, sources, setting)
        chosen[table] = setting.to_dict()
    return errs, chosen


def validate_transfer(costs: AicCosts, *, fit_on: str | None = None, holdout: str | None = None,
                      rows: int = 300, nested: bool = False,
                      tables: tuple[str, ...] = KERNEL_TABLES) -> ValidationReport:
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
    scorers = scorers_of(costs, rows, tables)
    pooled: dict[str, list[float]] = defaultdict(list)
    fold_out = []
    for f, h in folds:
        errs, chosen = _fold(scorers, h, f, nested)
        for table, e in errs.items():
            pooled[table].extend(e.tolist())
        fold_out.append(ValidationFold(fit_on=tuple(f), holdout=(h,),
                                       overall=ErrorStats.of([x for e in errs.values() for x in e]),
                                       ops={t: ErrorStats.of(e.tolist()) for t, e in errs.items()},
                                       chosen=chosen if nested else None))
    return ValidationReport(holdout=tuple(sorted({h for _, h in folds})),
                            fit_on=tuple(sorted({g for f, _ in folds for g in f})),
                            overall=ErrorStats.of([x for e in pooled.values() for x in e]),
                            ops={t: ErrorStats.of(pooled[t]) for t in tables if pooled.get(t)},
                            folds=tuple(fold_out))


def select_all(costs: AicCosts, *, rows: int = 300) -> dict[str, dict[str, float]]:
    """Per table, the setting leave-one-GPU-out over every measured GPU chooses (what the shipped defaults
    should be), with its loss (mean |log(predicted / measured)|)."""
    out = {}
    for table, sc in scorers_of(costs, rows).items():
        best, loss = sc.select(sc.gpus())
        out[table] = best.to_dict() | {"mean_abs_log_error": loss}
    return out


def _predict(t: MeasuredTable, key: tuple[int, ...]) -> float:
    """``t``'s time at ``key`` as the cost model answers: MoE through its monotone token curve."""
    if t.name not in MOE_TABLES:
        return t.time_at(key)

    def raw(n: int) -> float:
        return t.time_at((n, *key[1:]))

    return TokenCurve.of(t.points[:, 0], raw).at(key[0], raw)


def validate_interpolation(costs: AicCosts, *, rows: int = 300) -> dict[str, Any]:
    """Per GPU with tables: drop every other interior value of each table's token axis, rebuild the
    table from the rest and predict the dropped rows (grid points the table never saw)."""
    pooled: dict[str, list[float]] = defaultdict(list)
    per_gpu = {}
    for name in sorted(costs.dirs):
        errs: dict[str, list[float]] = defaultdict(list)
        for table, t in costs.tables(name).items():
            if table not in KERNEL_TABLES:
                continue
            axis = np.unique(t.points[:, TOKEN_AXIS[table]])
            dropped = np.isin(t.points[:, TOKEN_AXIS[table]], axis[1:-1:2])
            kept = MeasuredTable(name=table, gpu=t.gpu, points=t.points[~dropped], time_s=t.time_s[~dropped],
                                 cache=t.cache)
            idx = np.flatnonzero(dropped)
            for i in idx[_sample(len(idx), rows)] if len(idx) else []:
                errs[table].append(abs(_predict(kept, tuple(int(v) for v in t.points[i])) / t.time_s[i] - 1))
        for table, e in errs.items():
            pooled[table].extend(e)
        per_gpu[name] = {t: ErrorStats.of(e).to_dict() for t, e in errs.items()}
    return {"overall": ErrorStats.of([x for e in pooled.values() for x in e]).to_dict(),
            "ops": {t: ErrorStats.of(pooled[t]).to_dict() for t in KERNEL_TABLES if pooled.get(t)},
            "gpus": per_gpu}


def moe_repairs(costs: AicCosts) -> list[dict[str, Any]]:
    """Every MoE grid point ``tables.monotone_in_tokens`` lowered, per GPU and table: shape, measured and
    repaired milliseconds (what docs/cost.md lists)."""
    out = []
    for name, d in sorted(costs.dirs.items()):
        for table in MOE_TABLES:
            if not (d / f"{table}.csv").exists():
                continue
            points, measured = read_rows(d / f"{table}.csv", table)
            repaired = monotone_in_tokens(points, measured)
            for i in np.flatnonzero(repaired < measured):
                out.append({"gpu": name, "table": table, "shape": [int(v) for v in points[i]],
                            "measured_ms": round(float(measured[i]) * 1e3, 5),
                            "repaired_ms": round(float(repaired[i]) * 1e3, 5)})
    return out


def validate_routing(costs: AicCosts) -> dict[str, Any]:
    """Leave-one-GPU-out check of the routing rule (tessera.cost.moe): each GPU measured both balanced and
    power-law gets its balanced table derived from its own power-law rows and the other GPUs' ratios, scored
    against its measured balanced rows; beside it, the power-law rows taken as they are."""
    per_gpu, pooled, as_is = {}, [], []
    for held in costs.both_routings():
        power_law = costs.table(held, "moe_power_law")
        derived = balanced_from_power_law(power_law, costs.routing_ratios(exclude=held))
        measured, plain = _by_shape(costs.table(held, "moe")), _by_shape(power_law)
        keys = list(_by_shape(derived).items())
        e = [abs(t / measured[k] - 1) for k, t in keys if k in measured]
        e0 = [abs(plain[k] / measured[k] - 1) for k, _ in keys if k in measured]
        per_gpu[held] = {"derived": ErrorStats.of(e).to_dict(),
                         "power_law_as_is": ErrorStats.of(e0).to_dict()}
        pooled += e
        as_is += e0
    return {"overall": ErrorStats.of(pooled).to_dict(), "power_law_as_is": ErrorStats.of(as_is).to_dict(),
            "gpus": per_gpu}


def _by_shape(t: MeasuredTable | None) -> dict[tuple[int, ...], float]:
    """A table's seconds by shape."""
    assert t is not None
    return {tuple(int(v) for v in p): float(x) for p, x in zip(t.points, t.time_s, strict=True)}


SIBLINGS = ("H100-SXM", "H200")  # the H20's measured Hopper siblings


def check_unmeasured_moe(costs: AicCosts, target: str = "H20", siblings: tuple[str, ...] = SIBLINGS,
                         dominant: str = "H200") -> dict[str, Any]:
    """MoE costs on a GPU no database measured (the H20), checked at every shape its measured siblings (GPUs
    of the same architecture) share, against what the datasheets and those measurements bound:

      dominated   the prediction is no faster than ``dominant``'s measurement (H200 has more of every figure
                  the model uses than H20: bf16 peak, bandwidth, SMs);
      roofline    how often the prediction beats the target's datasheet roofline at efficiency 1, beside how
                  often the siblings' measurements beat theirs (experts resident in L2 do);
      siblings    the prediction against the time at which the target reaches the same fraction of its
                  roofline as the siblings reach of theirs (geometric mean) at that shape: |ratio - 1|."""
    g = gpu(target)
    tabs = {n: costs.table(n, "moe") for n in siblings}
    rows = [_by_shape(tabs[n]) for n in siblings]
    keys = sorted(set.intersection(*(set(r) for r in rows)))
    p = np.array(keys)
    pred = np.array([costs.moe_s(g, "moe", k) for k in keys])
    ideal = ideal_s("moe", p, g)
    sib_eff = {n: ideal_s("moe", p, gpu(n)) / np.array([r[k] for k in keys]) for n, r in zip(siblings, rows,
                                                                                             strict=True)}
    ref = ideal / np.exp(np.mean([np.log(e) for e in sib_eff.values()], axis=0))
    dom = np.array([rows[siblings.index(dominant)][k] for k in keys])
    err = np.abs(pred / ref - 1)
    return {"target": target, "siblings": list(siblings), "shapes": len(keys),
            "no_faster_than_" + dominant: float((pred >= dom * (1 - 1e-9)).mean()),
            "beats_own_roofline": float((ideal / pred > 1).mean()),
            "siblings_beat_their_roofline": {n: float((e > 1).mean()) for n, e in sib_eff.items()},
            "vs_sibling_efficiency": {"median_ape": float(np.median(err)),
                                      "p90_ape": float(np.percentile(err, 90)), "points": len(keys)},
            "median_roofline_fraction": {target: float(np.median(ideal / pred)),
                                         **{n: float(np.median(e)) for n, e in sib_eff.items()}}}
