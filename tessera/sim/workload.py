"""Request workloads: arrival processes and prompt/output lengths (deterministic for a seed).

Lengths are fixed (``"128"``), uniform over an inclusive integer range (``"64-512"``), or drawn from a
shipped trace sample (``"azure_conv_2023"``, ``"azure_code_2023"``: rows of the public Azure LLM
inference trace, see data/*.json for source and licence). When prompt and output name the same trace,
rows are drawn jointly so the prompt/output correlation of the trace is kept. For an image (diffusion)
plan the output length is the number of denoising steps.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from tessera.errors import UserError, choices_error

DATA = Path(__file__).parent / "data"
KINDS = ("offline", "poisson", "bursty")
BURSTS = ("gamma", "onoff")


@cache
def traces() -> dict[str, np.ndarray]:
    """Trace name -> int array [rows, 2] of (prompt_tokens, output_tokens)."""
    out = {}
    for f in sorted(DATA.glob("*.json")):
        d = json.loads(f.read_text())
        out[d["name"]] = np.array(d["rows"], dtype=np.int64)
    return out


@dataclass(frozen=True, kw_only=True)
class LengthSpec:
    """``lo == hi``: fixed; ``lo < hi``: uniform integer in [lo, hi]; ``trace``: sampled from a trace."""

    lo: int = 0
    hi: int = 0
    trace: str = ""

    def __post_init__(self) -> None:
        if self.trace:
            if self.trace not in traces():
                raise choices_error("length trace", self.trace, list(traces()))
        elif not 1 <= self.lo <= self.hi:
            raise UserError(f"length range {self.lo}-{self.hi} must satisfy 1 <= lo <= hi")

    @classmethod
    def parse(cls, text: str) -> LengthSpec:
        """``"128"``, ``"64-512"`` or a trace name; a well-formed number out of range says so by value."""
        t = text.strip()
        if t in traces():
            return cls(trace=t)
        lo_s, sep, hi_s = t.partition("-") if not t.startswith("-") else (t, "", "")
        try:
            lo, hi = int(lo_s), int(hi_s if sep else lo_s)
        except ValueError:
            raise UserError(f"length {text!r} is not N, LO-HI or a trace name; traces: "
                            f"{', '.join(sorted(traces()))}") from None
        if lo < 1:
            raise UserError(f"length {text!r}: {lo} tokens; a length must be >= 1")
        if lo > hi:
            raise UserError(f"length range {text!r} is inverted: LO {lo} > HI {hi}; write {hi}-{lo}")
        return cls(lo=lo, hi=hi)

    def __str__(self) -> str:
        return self.trace or (str(self.lo) if self.lo == self.hi else f"{self.lo}-{self.hi}")


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    kind: str = "offline"  # offline | poisson | bursty
    requests: int = 1000
    rate_per_s: float = 0.0  # mean arrival rate (poisson, bursty)
    prompt: LengthSpec = LengthSpec(lo=512, hi=512)
    output: LengthSpec = LengthSpec(lo=128, hi=128)
    burst: str = "gamma"  # gamma: gamma inter-arrivals with burst_cv; onoff: all arrivals in on-periods
    burst_cv: float = 3.0  # coefficient of variation of gamma inter-arrival times (1 = poisson)
    on_s: float = 10.0  # onoff: length of an on-period (arrivals at rate·(on+off)/on)
    off_s: float = 20.0  # onoff: length of an off-period (no arrivals)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise choices_error("workload", self.kind, KINDS)
        if self.burst not in BURSTS:
            raise choices_error("burst shape", self.burst, BURSTS)
        if self.requests < 1:
            raise UserError(f"requests={self.requests} must be >= 1")
        if self.kind != "offline" and not (self.rate_per_s > 0 and math.isfinite(self.rate_per_s)):
            raise UserError(f"workload {self.kind} needs a finite --rate > 0 (got {self.rate_per_s})")
        if self.burst_cv <= 0 or self.on_s <= 0 or self.off_s < 0:
            raise UserError(f"burst_cv={self.burst_cv}, on_s={self.on_s}, off_s={self.off_s} must be positive")


@dataclass(frozen=True)
class Requests:
    arrival_s: np.ndarray  # [N] float, sorted
    prompt: np.ndarray  # [N] int
    output: np.ndarray  # [N] int


def _arrivals(w: WorkloadSpec, rng: np.random.Generator) -> np.ndarray:
    n = w.requests
    if w.kind == "offline":
        return np.zeros(n)
    if w.kind == "poisson":
        return np.cumsum(rng.exponential(1.0 / w.rate_per_s, n))
    if w.burst == "gamma":
        shape = 1.0 / w.burst_cv**2  # mean 1/rate, cv = 1/sqrt(shape)
        return np.cumsum(rng.gamma(shape, 1.0 / (w.rate_per_s * shape), n))
    # onoff: a poisson process at the on-rate running on "on" time only, then mapped to wall time
    on_rate = w.rate_per_s * (w.on_s + w.off_s) / w.on_s
    on_time = np.cumsum(rng.exponential(1.0 / on_rate, n))
    period = np.floor(on_time / w.on_s)
    return on_time + period * w.off_s


def _lengths(spec: LengthSpec, rows: np.ndarray | None, col: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if spec.trace:
        assert rows is not None
        return rows[:, col].copy()
    if spec.lo == spec.hi:
        return np.full(n, spec.lo, dtype=np.int64)
    return rng.integers(spec.lo, spec.hi + 1, n)


def generate(w: WorkloadSpec, seed: int = 0) -> Requests:
    rng = np.random.default_rng(seed)
    arrival = _arrivals(w, rng)
    n = w.requests

    def rows_for(spec: LengthSpec) -> np.ndarray | None:
        if not spec.trace:
            return None
        t = traces()[spec.trace]
        return t[rng.integers(0, len(t), n)]

    if w.prompt.trace and w.prompt.trace == w.output.trace:
        rp = ro = rows_for(w.prompt)
    else:
        rp, ro = rows_for(w.prompt), rows_for(w.output)
    prompt = np.maximum(_lengths(w.prompt, rp, 0, n, rng), 1)
    output = np.maximum(_lengths(w.output, ro, 1, n, rng), 1)
    return Requests(arrival_s=arrival, prompt=prompt, output=output)
