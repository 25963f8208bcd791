"""What the engine needs from one Plan, derived once: step tables, lanes, KV capacity, engine limits."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.contracts.enums import Phase
from tessera.contracts.plan import EngineSettings, Plan
from tessera.errors import UserError
from tessera.sim.stages import Route, StageTimes, route_of
from tessera.sim.timing import MixedTable, StepTable, lanes

FIRST_PHASES = (Phase.PREFILL, Phase.ENCODE)  # run once per request, before the iterative phase
ITER_PHASES = (Phase.MIXED, Phase.DECODE, Phase.DENOISE)  # run once per output token / denoising step
# "mixed": the serving model's iteration (a micro-batch's decode tokens + prompt chunks in one step); a mixed
# plan is served by tessera.sim.mixed (groups, token budget, stages along the route), the others by
# tessera.sim.replica (lanes of whole steps).


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """The engine's knobs (vLLM's names); None takes the plan's engine settings (``Plan.engine``), or for a
    plan without them the default derived from its step points (docs/sim.md)."""

    max_num_seqs: int | None = None  # sequences running at once per replica (all micro-batches together)
    # token budget: of one micro-batch's iteration (mixed plans), of one prefill iteration (two-phase plans)
    max_num_batched_tokens: int | None = None
    microbatches: int | None = None  # mixed plans: groups advancing independently through the placement
    chunked_prefill: bool = False  # two-phase plans on a shared lane: prompt chunks beside decodes
    router: str = "least_loaded"  # least_loaded | round_robin
    chunk_tokens: int | None = None  # prompt tokens one request may prefill per iteration (vLLM's
    # long_prefill_token_threshold; the runtime's chunk); None: up to the token budget
    max_partial_prefills: int | None = None  # mixed plans: prompts one group prefills at once; None: no limit

    def __post_init__(self) -> None:
        if self.router not in ("least_loaded", "round_robin"):
            raise UserError(f"unknown router {self.router!r}; valid: least_loaded, round_robin")
        for k in ("max_num_seqs", "max_num_batched_tokens", "microbatches", "chunk_tokens",
                  "max_partial_prefills"):
            v = getattr(self, k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise UserError(f"{k}={v!r} must be an integer >= 1")


@dataclass(frozen=True, kw_only=True)
class PlanModel:
    plan: Plan
    first: StepTable | MixedTable | None  # prefill (LLM) or encode (diffusion), None when the plan has neither
    iter: StepTable | MixedTable  # decode or denoise, or the serving model's mixed iteration
    shared: bool  # first and iterative phases share devices -> one lane, serialised
    emits_token: bool  # the first phase produces the first output token (prefill does, encode does not)
    image: bool  # requests are images (denoise), not token sequences
    kv_cap: float  # tokens of KV the cell holds; inf when the model keeps no per-token KV
    max_batch: int  # sequences (images) running at once per replica
    max_prefill_tokens: int  # token budget: of a prefill iteration, or of one micro-batch's mixed iteration
    chunked: bool
    names: tuple[str, ...] = field(default=())
    mixed: bool = False  # a serving-model plan: served by tessera.sim.mixed
    engine: EngineSettings | None = None  # mixed plans: the settings it runs under (overrides applied)
    route: Route | None = None  # mixed plans: one micro-batch's stages along the placement
    stage_times: StageTimes | None = None  # mixed plans: each stage's hold and the latency at a shape
    chunk_cap: int | None = None  # prompt tokens one request may prefill per iteration (None: the budget's)
    partial_prefills: int | None = None  # mixed plans: prompts a group prefills at once (None: no limit)

    @classmethod
    def build(cls, plan: Plan, cfg: SchedulerConfig) -> PlanModel:
        it_name = next((p for p in ITER_PHASES if p in plan.phases), None)
        if it_name is None:
            raise UserError(f"plan {plan.model}/{plan.strategy} has no decode or denoise phase "
                            f"(phases: {', '.join(sorted(plan.phases)) or 'none'}); nothing to serve")
        image = it_name == Phase.DENOISE
        if it_name == Phase.MIXED:
            return cls._mixed(plan, cfg)
        first_name = "encode" if image else "prefill"
        if not image and first_name not in plan.phases:
            raise UserError(f"plan {plan.model}/{plan.strategy} has decode but no prefill phase")
        first = StepTable.build(plan, first_name) if first_name in plan.phases else None
        it = StepTable.build(plan, it_name)
        names = [n for n in (first_name, it_name) if n in plan.phases]
        shared = len(lanes(plan, names)) == 1
        eng = plan.engine
        # the decode (denoise) instance's sequences and the prefill instance's tokens per batch: the plan's
        # engine settings where it has them, else its largest sampled shapes
        max_batch = cfg.max_num_seqs or (eng.max_num_seqs if eng else it.max_batch)
        max_pf = cfg.max_num_batched_tokens or (eng.max_num_batched_tokens if eng else None) or \
            (first.max_tokens if first else 1)
        return cls(plan=plan, first=first, iter=it, shared=shared, emits_token=first_name == Phase.PREFILL,
                   image=image, kv_cap=kv_capacity(plan), max_batch=max_batch, max_prefill_tokens=max_pf,
                   chunked=cfg.chunked_prefill, names=tuple(names), chunk_cap=cfg.chunk_tokens)

    @classmethod
    def _mixed(cls, plan: Plan, cfg: SchedulerConfig) -> PlanModel:
        """A serving-model plan: the engine settings (the plan's, each overridable by ``cfg``), the step
        points of one micro-batch's iteration and the route. Nothing the planner derived from the settings
        (its batch, its chunk) is read."""
        table = MixedTable.build(plan, "mixed")
        eng = engine_settings(plan, table, cfg)
        route = route_of(plan, "mixed")
        return cls(plan=plan, first=table, iter=table, shared=True, emits_token=True, image=False,
                   kv_cap=kv_capacity(plan), max_batch=eng.max_num_seqs,
                   max_prefill_tokens=eng.max_num_batched_tokens, chunked=True, names=("mixed",), mixed=True,
                   engine=eng, route=route, stage_times=StageTimes.build(plan, "mixed", route, table),
                   chunk_cap=cfg.chunk_tokens, partial_prefills=cfg.max_partial_prefills)


def kv_capacity(plan: Plan) -> float:
    """Tokens of KV one replica of the cell holds; inf for a model without per-token KV."""
    if plan.kv_bytes_per_token <= 0:
        return math.inf
    if plan.kv_capacity_tokens <= 0:
        raise UserError(f"plan {plan.model}/{plan.strategy} has kv_bytes_per_token={plan.kv_bytes_per_token} "
                        f"but kv_capacity_tokens={plan.kv_capacity_tokens}")
    return float(plan.kv_capacity_tokens)


def engine_settings(plan: Plan, table: MixedTable, cfg: SchedulerConfig) -> EngineSettings:
    """``plan.engine`` with ``cfg``'s overrides. A mixed plan without engine settings (a hand-made one) runs
    its grid's largest shape: the phase's micro-batches, groups of the largest sampled batch, and a budget of
    the largest sampled tokens."""
    eng = plan.engine
    m = cfg.microbatches or (eng.microbatches if eng else max(1, plan.phases["mixed"].microbatches))
    seqs = cfg.max_num_seqs or (eng.max_num_seqs if eng else m * table.max_batch)
    budget = cfg.max_num_batched_tokens or (eng.max_num_batched_tokens if eng else table.max_tokens)
    try:
        return EngineSettings(max_num_seqs=seqs, max_num_batched_tokens=budget, microbatches=m)
    except ValueError as e:
        raise UserError(f"plan {plan.model}/{plan.strategy}: {e}") from None
