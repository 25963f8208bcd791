"""Serving metrics from the per-request timestamps of a run; the JSON contract of `tessera simulate`."""

from __future__ import annotations

from typing import Any

import numpy as np

from tessera.contracts.results import SimResult
from tessera.contracts.slo import LatencyTargets


def meets_slo(slo: LatencyTargets, arrival: np.ndarray, first_s: np.ndarray, done_s: np.ndarray,
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


def summarise(*, arrival: np.ndarray, first_s: np.ndarray, done_s: np.ndarray, output: np.ndarray,
              lost: int, image: bool, slo: LatencyTargets | None, usd_per_hour: float,
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
