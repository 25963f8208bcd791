"""Service-level objectives, as two types because they answer two questions.

``Slo`` is what a deployment is planned for: every latency has a default (`tessera plan --help`) and
``target`` is the share of requests that must meet them for an arrival rate to count as goodput.
``LatencyTargets`` is what the simulator judges each request against: a latency not given is not judged
(a text run has no per-image latency; a run may judge TTFT alone) and there is no share, since the
simulator measures attainment rather than requiring one. ``LatencyTargets.of`` turns the first into the
second. A plan file records the first as ``tessera.contracts.plan.PlanSlo``, whose fields may be absent (a
hand-written plan names only some).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.errors import UserError

SLO_TARGET = 0.9  # share of requests that must meet the SLO for an arrival rate to count as goodput


@dataclass(frozen=True, kw_only=True)
class Slo:
    """Service-level objective; defaults as in `tessera plan --help`. ``target``: the share of requests that
    must meet it for an arrival rate to count as goodput."""

    ttft_s: float = 2.0  # time to first token
    tpot_s: float = 0.1  # time per output token
    image_s: float = 60.0  # latency of one image (diffusion)
    target: float = SLO_TARGET

    def __post_init__(self) -> None:
        for k in ("ttft_s", "tpot_s", "image_s"):
            v = getattr(self, k)
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise UserError(f"SLO {k.replace('_s', '')} of {v!r} s must be a positive number of seconds")
        if not (isinstance(self.target, int | float) and 0 < self.target < 1):
            raise UserError(f"SLO target {self.target!r} must be a share of requests between 0 and 1 "
                            "(e.g. 0.9)")


@dataclass(frozen=True, kw_only=True)
class LatencyTargets:
    """The latencies (seconds) a simulated request must meet; None: not judged."""

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

    @classmethod
    def of(cls, slo: Slo, *, images: bool = False) -> LatencyTargets:
        """What a plan made for ``slo`` is judged against: an image model's latency per image, else a text
        model's TTFT and TPOT."""
        return cls(e2e_s=slo.image_s) if images else cls(ttft_s=slo.ttft_s, tpot_s=slo.tpot_s)
