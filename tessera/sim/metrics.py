"""Serving metrics from the per-request timestamps of a run; the JSON contract of `tessera simulate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tessera.errors import UserError

CONTRACT_KEYS = ("requests", "completed", "lost", "sim_wall_s", "throughput_tokens_per_s", "ttft_s", "tpot_s",
                 "e2e_s", "slo_attainment", "usd_per_million_tokens")


@dataclass(frozen=True, kw_only=True)
class SLO:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None  # arrival to completion: an image plan's latency per image

    def __post_init__(self) -> None:
        for k in ("ttft_s", "tpot_s", "e2e_s"):
            v = getattr(self, k)
            if v is not None and not v > 0:
                raise UserError(f"SLO {k}={v} must be > 0")

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_s, self.tpot_s, self.e2e_s))


def meets_slo(slo: SLO, arrival: np.ndarray, first_s: np.ndarray, done_s: np.ndarray,
              output: np.ndarray) -> np.ndarray:
    """Per request, whether it completed within every target ``slo`` gives (a request never completed
    misses; TPOT = (E2E − TTFT)/(output − 1) is judged only where output > 1)."""
    ok = ~np.isnan(done_s)
    good = ok.copy()
    if slo.ttft_s is not None:
        good &= first_s - arrival <= slo.ttft_s
    if slo.tpot_s is not None:
        multi = ok & (output > 1)
        tpot = np.where(multi, (done_s - first_s) / np.maximum(output - 1, 1), 0.0)
        good &= ~multi | (tpot <= slo.tpot_s)
    if slo.e2e_s is not None:
        good &= done_s - arrival <= slo.e2e_s
    return good


def percentiles(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return {"p50": None, "p90": None, "p99": None}
    p = np.percentile(x, [50, 90, 99])
    return {"p50": float(p[0]), "p90": float(p[1]), "p99": float(p[2])}


@dataclass(frozen=True, kw_only=True)
class SimResult:
    requests: int
    completed: int
    lost: int  # requests that can never fit (prompt + output beyond the KV capacity)
    sim_wall_s: float  # simulated seconds from the first arrival to the last completion
    throughput_tokens_per_s: float  # generated (output) tokens / sim_wall_s; 0 for image plans
    ttft_s: dict[str, float | None] = field(hash=False)
    tpot_s: dict[str, float | None] = field(hash=False)
    e2e_s: dict[str, float | None] = field(hash=False)
    slo_attainment: float | None  # fraction of all requests meeting every given SLO; None without SLO
    usd_per_million_tokens: float | None  # None when no tokens were produced (image plans)
    requests_per_s: float = 0.0
    images_per_s: float = 0.0
    device_utilisation: tuple[float, ...] = ()  # per device of the cell, averaged over replicas (pools:
    # per device of each cell entry, then of each replacement entry, each averaged over its replicas)
    preemptions: int = 0
    switches: int = 0
    replicas: int = 1  # replicas at the start (pools: all cells' replicas; replacements not counted)
    runtime_s: float = 0.0  # real seconds the simulation took (not deterministic; not in the contract)
    replica_completed: tuple[int, ...] = ()  # requests completed per replica (replacements last)
    series_start_s: float = 0.0  # throughput series: windows of series_window_s from here (first arrival)
    series_window_s: float = 0.0
    series_per_s: tuple[float, ...] = ()  # output tokens/s (images/s for image plans) per window
    failures: tuple[dict[str, Any], ...] = field(default=(), hash=False)  # one report per Failure

    def steady_per_s(self, start_s: float, end_s: float, default: float = float("nan")) -> float:
        """Mean of the throughput series over the whole windows between ``start_s`` and ``end_s`` (seconds
        from the first arrival): the steady rate once ramp-up is past and before the drain (at least one
        window; ``default`` when the series ends before ``start_s``)."""
        w = self.series_window_s
        i0 = int(start_s / w) + 1
        if len(self.series_per_s) <= i0:
            return default
        return float(np.mean(self.series_per_s[i0:max(int(end_s / w), i0 + 1)]))

    def to_json(self) -> dict[str, Any]:
        """Exactly the contract of `tessera simulate --json`."""
        return {k: getattr(self, k) for k in CONTRACT_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """The contract plus a ``detail`` object with the remaining figures."""
        detail = {k: getattr(self, k) for k in ("requests_per_s", "images_per_s", "device_utilisation",
                                                 "preemptions", "switches", "replicas", "runtime_s")}
        series = {"start_s": self.series_start_s, "window_s": self.series_window_s, "unit": "images/s" if self.images_per_s else "tokens/s",
                  "per_s": list(self.series_per_s)}
        return {**self.to_json(), "detail": {
            **detail, "device_utilisation": list(self.device_utilisation),
            "replica_completed": list(self.replica_completed), "throughput_series": series,
            "failures": [dict(f) for f in self.failures]}}


def summarise(*, arrival: np.ndarray, first_s: np.ndarray, done_s: np.ndarray, output: np.ndarray,
              lost: int, image: bool, slo: SLO | None, usd_per_hour: float,
              busy_s: list[tuple[np.ndarray, int]], preemptions: int, switches: int, replicas: int,
              runtime_s: float, **extra: Any) -> SimResult:
    """``busy_s``: per cell entry, (device-seconds per device summed over its replicas, replica count)."""
    ok = ~np.isnan(done_s)
    n_ok = int(ok.sum())
    span = float(done_s[ok].max() - arrival.min()) if n_ok else 0.0
    tokens = float(output[ok].sum()) if not image else 0.0
    tput = tokens / span if span > 0 else 0.0
    ttft = first_s - arrival
    e2e = done_s - arrival
    multi = ok & (output > 1)
    tpot = np.full(len(arrival), np.nan)
    tpot[multi] = (done_s[multi] - first_s[multi]) / (output[multi] - 1)
    att = None
    if slo is not None and slo.given:
        att = float(meets_slo(slo, arrival, first_s, done_s, output).sum()) / len(arrival)
    usd = usd_per_hour / 3600.0 / tput * 1e6 if tput > 0 else None
    util = tuple(float(b) / (span * n) if span > 0 else 0.0 for busy, n in busy_s for b in busy)
    return SimResult(
        requests=len(arrival), completed=n_ok, lost=lost, sim_wall_s=span, throughput_tokens_per_s=tput,
        ttft_s=percentiles(ttft[ok]), tpot_s=percentiles(tpot[multi]), e2e_s=percentiles(e2e[ok]),
        slo_attainment=att, usd_per_million_tokens=usd, requests_per_s=n_ok / span if span > 0 else 0.0,
        images_per_s=(n_ok / span if span > 0 else 0.0) if image else 0.0, device_utilisation=util,
        preemptions=preemptions, switches=switches, replicas=replicas, runtime_s=runtime_s, **extra)
