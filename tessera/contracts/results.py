"""Result types that cross stage boundaries."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class FrontierPoint:
    """One option on the throughput-cost plane (a strategy in a cell, or an advisor's GPU mix)."""

    label: str
    group: str  # legend entry: strategy name or "mix"
    usd_per_hour: float
    throughput_per_s: float

    def __post_init__(self) -> None:
        if not (self.usd_per_hour > 0 and self.throughput_per_s > 0):
            raise ValueError(f"frontier point {self.label!r}: usd_per_hour={self.usd_per_hour} and "
                             f"throughput_per_s={self.throughput_per_s} must be > 0")
