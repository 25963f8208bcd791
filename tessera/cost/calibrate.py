"""Fit roofline efficiencies to measured profiles, and measure how well a fit predicts an unseen GPU.

The fit, per kernel kind, picks (compute efficiency, memory efficiency, launch overhead) minimising
the mean |log(predicted / measured)| over the samples (a coarse grid refined twice around the best
point; three parameters, so exhaustive search is cheap and has no local-minimum surprises).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from tessera.cost.aic import AicCosts
from tessera.cost.model import DEFAULT_EFFICIENCY, CostModel, Efficiency, gemm_terms
from tessera.cost.profiles import OPS, SHIPPED, GemmTable, KernelTiming, Sample, load_profiles, read_kernels
from tessera.errors import UserError
from tessera.graph import KernelKind
from tessera.hardware import GpuSpec, gpu, resolve_gpu

_COMPUTE = (0.05, 1.2)  # search ranges: efficiencies as fractions of peak, launch in seconds
_MEMORY = (0.02, 1.2)
_LAUNCH_S = (0.0, 40e-6)


def _unit_terms(s: Sample, spec: GpuSpec) -> tuple[float, float]:
    """(compute_s, memory_s) of a sample at efficiency 1 and no launch overhead, as
    ``CostModel.roofline_time_s`` counts them."""
    k, peak = s.kernel, spec.peak(s.kernel.dtype)
    d = k.dims
    extra_bytes = 0
    if k.kind is KernelKind.GEMM and spec.vendor != "host" and {"m", "n", "k"} <= d.keys():
        compute_s, extra_bytes = gemm_terms(d, spec.sms, peak)
    else:
        compute_s = k.flops / peak
    return compute_s, (k.bytes_read + k.bytes_written + extra_bytes) / spec.mem_bw_bytes_per_s


def fit_kind(samples: list[Sample]) -> Efficiency:
    """Efficiency of one kernel kind that best explains ``samples`` (from any mix of GPUs).

    A kind whose samples carry no FLOPs (elementwise, norm, gather) keeps its prior compute efficiency.
    """
    terms = np.array([_unit_terms(s, gpu(s.gpu)) for s in samples])  # [N, 2]
    meas = np.array([s.time_s for s in samples])
    lo = np.array([_COMPUTE[0], _MEMORY[0], _LAUNCH_S[0]])
    hi = np.array([_COMPUTE[1], _MEMORY[1], _LAUNCH_S[1]])
    best = (lo + hi) / 2
    for _ in range(3):
        c, m, launch = (np.linspace(lo[i], hi[i], 17) for i in range(3))
        # roofline without launch on a [17 c, 17 m, N] grid, then one pass per launch value
        base = np.maximum(terms[None, None, :, 0] / c[:, None, None], terms[None, None, :, 1] / m[None, :, None])
        loss = np.stack([np.abs(np.log((base + x) / meas)).mean(axis=-1) for x in launch], axis=-1)
        i, j, k = np.unravel_index(np.argmin(loss), loss.shape)
        best = np.array([c[i], m[j], launch[k]])
        step = (hi - lo) / 16
        lo, hi = np.maximum(best - 2 * step, [1e-3, 1e-3, 0.0]), best + 2 * step
    compute = float(min(best[0], 1.5)) if terms[:, 0].any() else DEFAULT_EFFICIENCY[samples[0].kernel.kind].compute
    return Efficiency(compute=compute, memory=float(min(best[1], 1.5)), launch_s=float(best[2]))


def fit_efficiencies(samples: list[Sample]) -> dict[KernelKind, Efficiency]:
    by_kind: dict[KernelKind, list[Sample]] = defaultdict(list)
    for s in samples:
        by_kind[s.kernel.kind].append(s)
    return {kind: fit_kind(ss) for kind, ss in sorted(by_kind.items())}


def fit_kernels(timings: list[KernelTiming], device: str = "cpu") -> dict[KernelKind, Efficiency]:
    """Per-kind efficiencies of ``device`` fitted on per-kernel timings."""
    return fit_efficiencies([Sample(gpu=device, model=t.model, op=t.kernel.name, tokens=t.tokens,
                                    time_s=t.time_s, kernel=t.kernel) for t in timings])


def calibrated_model(profiles: dict[str, list[Sample]], *, tables: bool = True) -> CostModel:
    """Efficiencies fitted jointly on all GPUs of ``profiles`` (the datasheet-only predictor for other
    GPUs), plus each profiled device's own fit and (with ``tables``) its measured GEMM table."""
    gpu_samples = [s for name, ss in profiles.items() if gpu(name).vendor != "host" for s in ss]
    joint = fit_efficiencies(gpu_samples) if gpu_samples else {}
    return CostModel(
        efficiency={**DEFAULT_EFFICIENCY, **joint},
        per_gpu={name: fit_efficiencies(ss) for name, ss in profiles.items()},
        gemm_tables={name: GemmTable.from_samples(ss) for name, ss in profiles.items()} if tables else {},
    )


CPU_KERNELS = SHIPPED.parent / "cpu" / "llama-tiny" / "kernels.csv"  # `tessera profile llama-tiny` output


@cache
def default_cost_model() -> CostModel:
    """The calibrated model (fitted once per process): AIConfigurator's measured tables (tessera/cost/data/aic)
    first; GPU efficiencies and GEMM tables from the Vidur profiles shipped in tessera/cost/data/vidur; the
    CPU's efficiencies from its shipped per-kernel profile."""
    model = replace(calibrated_model(load_profiles(SHIPPED)), aic=AicCosts())
    if CPU_KERNELS.exists():
        model.per_gpu["cpu"] = fit_kernels(read_kernels(CPU_KERNELS))
    return model


# ---- accuracy --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ErrorStats:
    median_ape: float  # fractions: 0.08 = 8 %
    p90_ape: float
    points: int

    @classmethod
    def of(cls, ape: list[float]) -> ErrorStats:
        a = np.array(ape)
        return cls(median_ape=float(np.median(a)), p90_ape=float(np.percentile(a, 90)), points=len(a))

    def to_dict(self) -> dict[str, float | int]:
        return {"median_ape": round(self.median_ape, 5), "p90_ape": round(self.p90_ape, 5), "points": self.points}


@dataclass(frozen=True, kw_only=True)
class ValidationFold:
    """One fold: the GPUs fitted on and held out, the held-out errors overall and (the AIC tables' folds)
    per table, and (nested AIC folds) the constants each table chose, as ``Setting.to_dict`` writes them."""

    fit_on: tuple[str, ...]
    holdout: tuple[str, ...]
    overall: ErrorStats
    ops: dict[str, ErrorStats] | None = None
    chosen: dict[str, dict[str, float]] | None = None

    def to_dict(self) -> dict[str, object]:
        return {"fit_on": list(self.fit_on), "holdout": list(self.holdout), "overall": self.overall.to_dict(),
                **({"ops": {t: e.to_dict() for t, e in self.ops.items()}} if self.ops is not None else {}),
                **({"chosen": self.chosen} if self.chosen is not None else {})}


@dataclass(frozen=True, kw_only=True)
class ValidationReport:
    """`tessera cost validate`'s report: every held-out GPU and every GPU fitted on (sorted), the errors
    pooled over the folds overall and per operator (or AIC table), and each fold's own."""

    holdout: tuple[str, ...]
    fit_on: tuple[str, ...]
    overall: ErrorStats
    ops: dict[str, ErrorStats]
    folds: tuple[ValidationFold, ...]

    def to_dict(self) -> dict[str, object]:
        """The `--json` report (errors as fractions)."""
        return {"holdout": list(self.holdout), "fit_on": list(self.fit_on), "overall": self.overall.to_dict(),
                "ops": {op: e.to_dict() for op, e in self.ops.items()},
                "folds": [f.to_dict() for f in self.folds]}


def _ape(model: CostModel, samples: list[Sample]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for s in samples:
        pred = model.roofline_time_s(s.kernel, gpu(s.gpu))
        out[s.op].append(abs(pred - s.time_s) / s.time_s)
    return out


def _names(arg: str | list[str] | None, available: list[str]) -> list[str]:
    if arg is None:
        return []
    parts = arg.split(",") if isinstance(arg, str) else arg
    names = [resolve_gpu(p.strip()) for p in parts if p.strip()]
    for n in names:
        if n not in available:
            raise UserError(f"GPU {n!r} has no profiles in this directory; profiled: {', '.join(available)}")
    return names


def validate(profiles: dict[str, list[Sample]], *, fit_on: str | list[str] | None = None,
             holdout: str | list[str] | None = None) -> ValidationReport:
    """Fit on some GPUs, predict the others from their datasheets alone; errors per operator.

    Neither given: leave-one-GPU-out over every profiled GPU (errors pooled over the folds).
    """
    available = sorted(profiles)
    fit, held = _names(fit_on, available), _names(holdout, available)
    if fit and not held:
        held = [g for g in available if g not in fit]
    if held and not fit:
        fit = [g for g in available if g not in held]
    if fit and set(fit) & set(held):
        raise UserError(f"--fit-on and --holdout overlap: {', '.join(sorted(set(fit) & set(held)))}")
    folds = [(fit, held)] if fit else [([g for g in available if g != h], [h]) for h in available]
    if any(not f or not h for f, h in folds):
        raise UserError(f"validation needs at least two profiled GPU types to fit on one and test another; "
                        f"profiled: {', '.join(available)}")
    pooled: dict[str, list[float]] = defaultdict(list)
    fold_out = []
    for f, h in folds:
        model = CostModel(efficiency={**DEFAULT_EFFICIENCY,
                                      **fit_efficiencies([s for g in f for s in profiles[g]])})
        errs = _ape(model, [s for g in h for s in profiles[g]])
        for op, e in errs.items():
            pooled[op].extend(e)
        fold_out.append(ValidationFold(fit_on=tuple(f), holdout=tuple(h),
                                       overall=ErrorStats.of([x for e in errs.values() for x in e])))
    ops = {op: ErrorStats.of(pooled[op]) for op in OPS if pooled.get(op)}
    ops.update({op: ErrorStats.of(e) for op, e in pooled.items() if op not in ops})
    return ValidationReport(holdout=tuple(sorted({g for _, h in folds for g in h})),
                            fit_on=tuple(sorted({g for f, _ in folds for g in f})),
                            overall=ErrorStats.of([x for e in pooled.values() for x in e]), ops=ops,
                            folds=tuple(fold_out))


def model_to_dict(model: CostModel) -> dict[str, Any]:
    def effs(d: dict[KernelKind, Efficiency]) -> dict[str, dict[str, float | None]]:
        return {k.value: {"compute": e.compute, "memory": e.memory, "launch_s": e.launch_s} for k, e in d.items()}

    return {"launch_s": model.launch_s, "efficiency": effs(model.efficiency),
            "per_gpu": {g: effs(d) for g, d in model.per_gpu.items()},
            "gemm_tables": {g: len(t.shapes) for g, t in model.gemm_tables.items()}}


ALL_GPUS = "all GPUs (datasheet predictor)"  # the scope of the efficiencies every GPU shares


def efficiency_rows(model: CostModel) -> list[tuple[str, str, Efficiency]]:
    """(scope, kernel kind, efficiency) of every fitted efficiency: those all GPUs share (``ALL_GPUS``),
    then each GPU's own (`tessera cost calibrate`'s table)."""
    scopes = {ALL_GPUS: model.efficiency, **model.per_gpu}
    return [(scope, kind.value, e) for scope, effs in scopes.items() for kind, e in effs.items()]


def write_calibration(model: CostModel, path: Path) -> None:
    path.write_text(json.dumps(model_to_dict(model), indent=1) + "\n")
