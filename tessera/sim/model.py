"""What the engine needs from one Plan, derived once: step tables, lanes, KV capacity, batch limits."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tessera.errors import UserError
from tessera.plan.types import Plan
from tessera.sim.timing import MixedTable, StepTable, lanes, mixed_table

FIRST_PHASES = ("prefill", "encode")  # run once per request, before the iterative phase
ITER_PHASES = ("mixed", "decode", "denoise")  # run once per output token / denoising step
# "mixed": the serving model's iteration (decode tokens + a prefill chunk in one step, one step table over
# all its tokens); requests are prefilled in chunks inside it.


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """vLLM-style continuous batching knobs; None takes the default derived from the plan."""

    max_batch: int | None = None  # sequences in flight; default: largest sampled decode/denoise batch
    max_prefill_tokens: int | None = None  # tokens per prefill iteration; default: largest sampled prefill
    chunked_prefill: bool = False  # split prompts across iterations, mixed with decode on a shared lane
    router: str = "least_loaded"  # least_loaded | round_robin
    chunk_tokens: int | None = None  # prompt tokens one request prefills per iteration; default: the plan's
    # chunk over its micro-batches (a mixed plan), else up to the token budget

    def __post_init__(self) -> None:
        if self.router not in ("least_loaded", "round_robin"):
            raise UserError(f"unknown router {self.router!r}; valid: least_loaded, round_robin")
        for k in ("max_batch", "max_prefill_tokens", "chunk_tokens"):
            v = getattr(self, k)
            if v is not None and v < 1:
                raise UserError(f"{k}={v} must be >= 1")


@dataclass(frozen=True, kw_only=True)
class PlanModel:
    plan: Plan
    first: StepTable | MixedTable | None  # prefill (LLM) or encode (diffusion), None when the plan has neither
    iter: StepTable | MixedTable  # decode or denoise, or the serving model's mixed iteration
    shared: bool  # first and iterative phases share devices -> one lane, serialised
    emits_token: bool  # the first phase produces the first output token (prefill does, encode does not)
    image: bool  # requests are images (denoise), not token sequences
    kv_cap: float  # tokens of KV the cell holds; inf when the model keeps no per-token KV
    max_batch: int
    max_prefill_tokens: int
    chunked: bool
    names: tuple[str, ...] = field(default=())
    mixed: bool = False  # one table prices decode and chunk tokens together (a "mixed" phase)
    chunk_cap: int | None = None  # prompt tokens one request may prefill per iteration (its micro-batch's chunk)

    @classmethod
    def build(cls, plan: Plan, cfg: SchedulerConfig) -> PlanModel:
        it_name = next((p for p in ITER_PHASES if p in plan.phases), None)
        if it_name is None:
            raise UserError(f"plan {plan.model}/{plan.strategy} has no decode or denoise phase "
                            f"(phases: {', '.join(sorted(plan.phases)) or 'none'}); nothing to serve")
        image = it_name == "denoise"
        if it_name == "mixed":
            return cls._mixed(plan, cfg)
        first_name = "encode" if image else "prefill"
        if not image and first_name not in plan.phases:
            raise UserError(f"plan {plan.model}/{plan.strategy} has decode but no prefill phase")
        first = StepTable.build(plan, first_name) if first_name in plan.phases else None
        it = StepTable.build(plan, it_name)
        names = [n for n in (first_name, it_name) if n in plan.phases]
        shared = len(lanes(plan, names)) == 1
        if plan.kv_bytes_per_token > 0:
            if plan.kv_capacity_tokens <= 0:
                raise UserError(f"plan {plan.model}/{plan.strategy} has kv_bytes_per_token="
                                f"{plan.kv_bytes_per_token} but kv_capacity_tokens={plan.kv_capacity_tokens}")
            kv_cap = float(plan.kv_capacity_tokens)
        else:
            kv_cap = math.inf
        max_pf = cfg.max_prefill_tokens or (first.max_tokens if first else 1)
        return cls(plan=plan, first=first, iter=it, shared=shared, emits_token=first_name == "prefill",
                   image=image, kv_cap=kv_cap, max_batch=cfg.max_batch or it.max_batch,
                   max_prefill_tokens=max_pf, chunked=cfg.chunked_prefill, names=tuple(names))

    @classmethod
    def _mixed(cls, plan: Plan, cfg: SchedulerConfig) -> PlanModel:
        """A serving-model plan: every iteration is one lookup of the mixed table at (decode sequences,
        chunk tokens, mean context); the batch limit defaults to the planned B plus the prompts in prefill,
        the token budget to B + C, and a request prefills at most its micro-batch's chunk ⌈C/m⌉ per
        iteration."""
        it = mixed_table(plan, "mixed")
        w = plan.workload
        batch = plan.batch or it.max_batch
        m = max(1, plan.microbatches)
        prompt = max(1, w.get("prompt", 1))
        chunk = math.ceil(batch * prompt / max(1, w.get("output", 1)))
        # the planner's B decoding sequences plus the prompts its chunks are prefilling: one per micro-batch,
        # or ⌈c/P⌉ when a micro-batch's chunk c holds whole prompts
        prefilling = m * max(1, math.ceil(math.ceil(chunk / m) / prompt))
        kv_cap = float(plan.kv_capacity_tokens) if plan.kv_bytes_per_token > 0 else math.inf
        return cls(plan=plan, first=it, iter=it, shared=True, emits_token=True, image=False, kv_cap=kv_cap,
                   max_batch=cfg.max_batch or batch + prefilling,
                   max_prefill_tokens=cfg.max_prefill_tokens or batch + chunk,
                   chunked=True, names=("mixed",), mixed=True, chunk_cap=cfg.chunk_tokens or math.ceil(chunk / m))
