"""Iteration time from a Plan: interpolation of ``PhasePlan.points`` over (tokens, context).

Rule (also in docs/sim.md): points are grouped by ``context``; inside one context slice the step time
is piecewise linear in ``tokens``; between slices it is linear in ``context``. Below the smallest
sampled value (of either axis) the nearest sample is held (clamp: fixed costs dominate small shapes);
above the largest it is extrapolated linearly from the last two samples, never with a negative slope
(a falling extrapolation is clamped to the last sample). Linear, not log, space: an affine cost
(weights read once + per-token work) is then reproduced exactly between samples.

An evaluation returns the sample weights, not just the time, so per-device busy time can be
accumulated per iteration as a few floats and expanded into device seconds once at the end.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.contracts.plan import PhasePlan, Plan
from tessera.errors import UserError

Weights = tuple[tuple[int, float], ...]  # (point index, weight); weights sum to 1


def _axis_weights(xs: Sequence[float], x: float) -> tuple[tuple[int, float], ...]:
    """Weights over positions of sorted ``xs`` for value ``x`` (clamp below, extrapolate above)."""
    n = len(xs)
    if n == 1 or x <= xs[0]:
        return ((0, 1.0),)
    if x >= xs[-1]:
        w = (x - xs[-2]) / (xs[-1] - xs[-2])
        return ((n - 2, 1.0 - w), (n - 1, w))
    j = bisect_left(xs, x)
    if xs[j] == x:
        return ((j, 1.0),)
    w = (x - xs[j - 1]) / (xs[j] - xs[j - 1])
    return ((j - 1, 1.0 - w), (j, w))


@dataclass(frozen=True)
class StepTable:
    """Step-time lookup for one phase of one plan."""

    phase: str
    step_s: np.ndarray  # [P] per point
    busy_s: np.ndarray  # [P, D] device seconds per whole step (micro-batch busy × microbatches)
    contexts: tuple[float, ...]  # sorted distinct contexts
    slices: tuple[tuple[tuple[float, ...], tuple[int, ...]], ...]  # per context: sorted tokens, point ids
    tokens_per_item: float  # tokens one sequence/image adds to `tokens` (denoise: batch -> tokens)
    max_batch: int
    max_tokens: int

    @classmethod
    def build(cls, plan: Plan, name: str) -> StepTable:
        p: PhasePlan = plan.phases[name]
        if not p.points:
            raise UserError(f"plan phase {name!r} has no step points; the simulator needs at least one")
        ndev = len(plan.devices)
        for s in p.points:
            if s.step_s <= 0 or len(s.device_busy_s) != ndev:
                raise UserError(f"plan phase {name!r}: point (tokens={s.tokens}, context={s.context}) has "
                                f"step_s={s.step_s} or {len(s.device_busy_s)} device times for {ndev} devices")
        by_ctx: dict[float, list[tuple[float, int]]] = {}
        for i, s in enumerate(p.points):
            by_ctx.setdefault(float(s.context), []).append((float(s.tokens), i))
        contexts = tuple(sorted(by_ctx))
        slices = []
        for c in contexts:
            rows = sorted(set(by_ctx[c]))
            toks = [t for t, _ in rows]
            if len(set(toks)) != len(toks):
                raise UserError(f"plan phase {name!r}: two points share tokens and context={c}")
            slices.append((tuple(toks), tuple(i for _, i in rows)))
        step = np.array([s.step_s for s in p.points])
        busy = np.array([[b * s.microbatches for b in s.device_busy_s] for s in p.points])
        tpi = float(np.median([s.tokens / s.batch for s in p.points if s.batch > 0] or [1.0]))
        return cls(phase=name, step_s=step, busy_s=busy, contexts=contexts, slices=tuple(slices),
                   tokens_per_item=tpi, max_batch=max(s.batch for s in p.points),
                   max_tokens=max(s.tokens for s in p.points))

    def weights(self, tokens: float, context: float) -> Weights:
        out: dict[int, float] = {}
        for ci, wc in _axis_weights(self.contexts, context):
            toks, ids = self.slices[ci]
            for ti, wt in _axis_weights(toks, tokens):
                out[ids[ti]] = out.get(ids[ti], 0.0) + wc * wt
        w = tuple(out.items())
        if sum(wi * self.step_s[i] for i, wi in w) < min(self.step_s[i] for i, _ in w):
            # falling extrapolation: hold the largest-shape sample instead
            return ((max(out, key=lambda i: (self._pos(i))), 1.0),)
        return w

    def _pos(self, i: int) -> tuple[float, float]:
        for c, (toks, ids) in zip(self.contexts, self.slices, strict=True):
            if i in ids:
                return (c, toks[ids.index(i)])
        raise AssertionError(f"point {i} not in any slice")

    def time(self, tokens: float, context: float) -> tuple[float, Weights]:
        w = self.weights(tokens, context)
        step = self.step_s
        return sum(wi * float(step[i]) for i, wi in w), w


def phase_devices(plan: Plan, name: str) -> frozenset[int]:
    """Devices a phase occupies: any nonzero busy time at any point, or any kernel assigned."""
    p = plan.phases[name]
    devs = set(p.assignment)
    for s in p.points:
        devs.update(d for d, b in enumerate(s.device_busy_s) if b > 0)
    return frozenset(devs)


def lanes(plan: Plan, names: list[str]) -> list[list[str]]:
    """Group phases into lanes: phases whose device sets overlap (transitively) serialise on one lane;
    disjoint lanes run concurrently (e.g. prefill on device A while decode runs on device B)."""
    groups: list[tuple[set[int], list[str]]] = []
    for n in names:
        devs = set(phase_devices(plan, n))
        hit = [g for g in groups if g[0] & devs or not devs or not g[0]]
        merged_devs, merged_names = devs, [n]
        for g in hit:
            merged_devs |= g[0]
            merged_names = g[1] + merged_names
            groups.remove(g)
        groups.append((merged_devs, merged_names))
    return [g[1] for g in groups]


@dataclass(frozen=True)
class MixedTable:
    """The serving model's step table (a plan's "mixed" phase): points of *one micro-batch's* iteration on a
    full grid over its decode sequences (``batch``), chunk tokens (``tokens − batch``) and mean decode
    ``context``, interpolated multilinearly along each axis with the rules of StepTable (clamp below, linear
    above). A decode-only iteration and one that is mostly prefill price differently even at the same token
    count. The mixed engine (tessera.sim.mixed) prices each stage of an iteration from these weights
    (tessera.sim.stages); ``busy_s`` is per iteration of one micro-batch."""

    phase: str
    busy_s: np.ndarray  # [P, D] device seconds of one micro-batch's iteration
    batches: tuple[float, ...]
    chunks: tuple[float, ...]
    contexts: tuple[float, ...]
    index: dict[tuple[int, int, int], int]  # (batch i, chunk i, context i) -> point
    max_batch: int  # largest sampled decode sequences of one micro-batch
    max_tokens: int  # largest sampled tokens of one micro-batch's iteration

    @classmethod
    def build(cls, plan: Plan, name: str = "mixed") -> MixedTable:
        p: PhasePlan = plan.phases[name]
        if not p.points:
            raise UserError(f"plan phase {name!r} has no step points; the simulator needs at least one")
        ndev = len(plan.devices)
        for s in p.points:
            if s.latency_s <= 0 or len(s.device_busy_s) != ndev or s.tokens < s.batch or s.batch < 0:
                raise UserError(f"plan phase {name!r}: point (batch={s.batch}, tokens={s.tokens}, context="
                                f"{s.context}) has latency_s={s.latency_s} and {len(s.device_busy_s)} device "
                                f"times for {ndev} devices; a mixed point needs latency_s > 0 and "
                                "tokens >= batch")
        axes = [sorted({float(v) for v in vals}) for vals in (
            [s.batch for s in p.points], [s.tokens - s.batch for s in p.points], [s.context for s in p.points])]
        index = {(axes[0].index(s.batch), axes[1].index(s.tokens - s.batch), axes[2].index(s.context)): i
                 for i, s in enumerate(p.points)}
        if len(index) != len(p.points) or len(index) != len(axes[0]) * len(axes[1]) * len(axes[2]):
            shape = " x ".join(str(len(a)) for a in axes)
            raise UserError(f"plan phase {name!r}: its {len(p.points)} points do not form a full grid over "
                            f"(batch, chunk, context) ({shape} values)")
        return cls(phase=name, busy_s=np.array([s.device_busy_s for s in p.points], dtype=float),
                   batches=tuple(axes[0]), chunks=tuple(axes[1]), contexts=tuple(axes[2]), index=index,
                   max_batch=max(s.batch for s in p.points), max_tokens=max(s.tokens for s in p.points))

    def weights2(self, decode: float, chunk: float, context_i: int) -> Weights:
        """Weights over the points of context slice ``context_i`` for (decode sequences, chunk tokens)."""
        return tuple((self.index[bi, ci, context_i], wb * wc)
                     for bi, wb in _axis_weights(self.batches, decode)
                     for ci, wc in _axis_weights(self.chunks, chunk))

    def context_weights(self, context: float) -> tuple[tuple[int, float], ...]:
        return _axis_weights(self.contexts, context)
