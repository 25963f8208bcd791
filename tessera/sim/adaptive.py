"""Online switching between a latency-mode and a throughput-mode plan, by load with hysteresis.

Load signal: a replica's outstanding requests (waiting + prefilling + decoding). It goes to throughput
mode when that reaches ``high_load`` and back to latency mode when it falls to ``low_load``. Defaults
come from the latency plan: ``high_load`` = its engine's ``max_num_seqs`` (a plan without engine settings:
its largest sampled batch; beyond it the latency schedule would queue or run outside the shapes it was
planned for), ``low_load`` = half of that. Without a latency plan (the engine's switch between two
micro-batch counts on one placement) ``high_load`` must be given.

Residency rule (a switch must not move weights): the two plans must be for the same model on the same
devices (same GPU and capacity, in order) with the same KV bytes per token, and then either
  (a) their memory placements agree on every device for the roles ``weight``, ``kv`` and ``state``
      (the same buffers already sit on the same devices; the plans differ only in how activations
      flow, micro-batching and batch size), or
  (b) they are serving-model plans of one placement (the same kernel assignment) at two batch sizes,
      as its latency and throughput schedules are: weights stay, one paged KV pool sized by the
      larger plan serves both, so each device needs the larger of the two plans' bytes, or
  (c) both placements fit at once: on every device the sum of both plans' ``memory_bytes`` over all
      roles is at most the device's ``mem_bytes``.
Otherwise the switch is refused with the first device that does not fit.

Switch cost: the in-flight iteration(s) drain (simulated), then ``switch_s`` passes with no
iteration. Default: the largest one-micro-batch ``latency_s`` of the iterative phase in either plan,
i.e. one pipeline fill of the slower schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.contracts.enums import Objective, Phase
from tessera.contracts.plan import Plan
from tessera.errors import UserError
from tessera.sim.model import ITER_PHASES

RESIDENT_ROLES = ("weight", "kv", "state")


@dataclass(frozen=True, kw_only=True)
class AdaptivePolicy:
    latency_plan: Plan | None = None  # None: thresholds given (the engine's switch between micro-batch counts)
    high_load: int | None = None  # outstanding requests at which a replica goes to throughput mode
    low_load: int | None = None  # outstanding requests at or below which it returns to latency mode
    switch_s: float | None = None  # None: default above

    def __post_init__(self) -> None:
        if self.high_load is None:
            lat = self.latency_plan
            if lat is None:
                raise UserError("adaptive switching without a latency plan needs high_load (--high-load)")
            object.__setattr__(self, "high_load", lat.engine.max_num_seqs if lat.engine is not None else max(
                (s.batch for n in ITER_PHASES if n in lat.phases for s in lat.phases[n].points), default=1))
        if self.low_load is None:
            object.__setattr__(self, "low_load", self.high_load // 2)
        if not 0 <= self.low_load < self.high_load:
            raise UserError(f"adaptive thresholds low={self.low_load}, high={self.high_load} "
                            "must satisfy 0 <= low < high")
        if self.switch_s is not None and self.switch_s < 0:
            raise UserError(f"switch cost {self.switch_s} s must be >= 0")

    def target(self, mode: Objective, load: int) -> Objective:
        if mode == Objective.LATENCY and load >= self.high_load:
            return Objective.THROUGHPUT
        if mode == Objective.THROUGHPUT and load <= self.low_load:
            return Objective.LATENCY
        return mode

    def switch_cost_s(self, throughput_plan: Plan) -> float:
        if self.switch_s is not None:
            return self.switch_s
        plans = [p for p in (throughput_plan, self.latency_plan) if p is not None]
        lat = [s.latency_s for p in plans for n in ITER_PHASES
               if n in p.phases for s in p.phases[n].points]
        return max(lat, default=0.0)


def check_switchable(a: Plan, b: Plan) -> str:
    """Raise UserError unless a switch between ``a`` and ``b`` keeps both placements resident;
    return which clause of the rule allowed it ("identical" or "both-resident")."""
    if a.model != b.model:
        raise UserError(f"adaptive plans are for different models: {a.model!r} vs {b.model!r}")
    da = [(d.gpu, d.mem_bytes) for d in a.devices]
    db = [(d.gpu, d.mem_bytes) for d in b.devices]
    if da != db:
        raise UserError(f"adaptive plans must run on the same devices: {da} vs {db}")
    if a.kv_bytes_per_token != b.kv_bytes_per_token:
        raise UserError(f"adaptive plans disagree on KV bytes per token: {a.kv_bytes_per_token} "
                        f"vs {b.kv_bytes_per_token}")
    ma, mb = list(a.memory_bytes), list(b.memory_bytes)
    if len(ma) != len(da) or len(mb) != len(db):
        raise UserError(f"adaptive plans need memory_bytes for each of the {len(da)} devices")
    if all(x.get(r, 0) == y.get(r, 0) for x, y in zip(ma, mb, strict=True) for r in RESIDENT_ROLES):
        return "identical"
    if Phase.MIXED in a.phases and a.phases.keys() == b.phases.keys() and all(
            a.phases[n].assignment == b.phases[n].assignment for n in a.phases):
        # one placement at two batch sizes: the weights stay where they are and one paged KV pool, sized by
        # the larger batch, serves both schedules
        for dev, x, y in zip(a.devices, ma, mb, strict=True):
            need = max(sum(x.values()), sum(y.values()))
            if need > dev.mem_bytes:
                raise UserError(f"adaptive switch refused: device {dev.index} ({dev.gpu}) needs "
                                f"{need / 1e9:.2f} GB, has {dev.mem_bytes / 1e9:.2f} GB")
        return "same-placement"
    for dev, x, y in zip(a.devices, ma, mb, strict=True):
        need = sum(x.values()) + sum(y.values())
        if need > dev.mem_bytes:
            raise UserError(
                f"adaptive switch refused: device {dev.index} ({dev.gpu}) would hold both plans' buffers, "
                f"{need / 1e9:.2f} GB, but has {dev.mem_bytes / 1e9:.2f} GB; give plans whose weight/kv/state "
                "placement is identical, or that fit together")
    return "both-resident"
