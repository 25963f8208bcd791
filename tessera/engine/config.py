"""Engine settings and per-request sampling settings (the names vLLM and OpenAI's API use)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tessera.engine.arch import ModelArch
from tessera.errors import UserError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """Continuous batching as vLLM sets it up.

    ``max_num_seqs`` requests run at once (over all groups); an iteration computes at most
    ``max_num_batched_tokens`` tokens: every running decode first, then prompt chunks up to the budget.
    The running requests form ``microbatches`` groups (at most ``group_seqs`` each, as the plan's
    EngineSettings has it); an iteration is one group's batch, the groups taking turns. KV lives in
    pages of ``page_size`` tokens; ``num_pages`` of them per layer (None: enough for ``max_num_seqs``
    sequences of ``max_model_len`` tokens). ``max_model_len`` bounds prompt +
    output (None: the model's context window)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 256
    page_size: int = 16
    num_pages: int | None = None
    max_model_len: int | None = None
    microbatches: int = 1

    def __post_init__(self) -> None:
        for k in ("max_num_seqs", "max_num_batched_tokens", "page_size", "microbatches"):
            if not isinstance(getattr(self, k), int) or getattr(self, k) < 1:
                raise UserError(f"{k.replace('_', '-')}={getattr(self, k)!r} must be a positive integer")
        for k in ("num_pages", "max_model_len"):
            v = getattr(self, k)
            if v is not None and (not isinstance(v, int) or v < 1):
                raise UserError(f"{k.replace('_', '-')}={v!r} must be a positive integer")
        if self.microbatches > self.max_num_seqs:
            raise UserError(f"microbatches={self.microbatches} must be <= max-num-seqs={self.max_num_seqs} "
                            f"(each group runs at least one request)")

    def model_len(self, arch: ModelArch) -> int | None:
        """The longest prompt + output a request may have: the setting, capped by the context window."""
        limits = [v for v in (self.max_model_len, arch.context_window) if v is not None]
        return min(limits) if limits else None

    def pages(self, arch: ModelArch) -> int:
        """KV pages per layer (0 for a model without attention)."""
        if arch.family != "decoder":
            return 0
        if self.num_pages is not None:
            return self.num_pages
        length = self.model_len(arch)
        assert length is not None, "a decoder has a context window"
        return self.max_num_seqs * math.ceil(length / self.page_size)

    @property
    def group_seqs(self) -> int:
        return math.ceil(self.max_num_seqs / self.microbatches)


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """OpenAI's names: greedy when temperature is 0; top_k 0 and top_p 1 filter nothing; ``seed`` makes a
    request's samples reproducible whatever it is batched with; generation ends at an EOS token (unless
    ``ignore_eos``), at a stop string (cut from the text) or after ``max_tokens``."""

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise UserError(f"max-tokens={self.max_tokens!r} must be a positive integer")
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise UserError(f"temperature={self.temperature!r} must be a finite number >= 0")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise UserError(f"top-k={self.top_k!r} must be an integer >= 0 (0: no limit)")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise UserError(f"top-p={self.top_p!r} must be in (0, 1]")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise UserError(f"stop strings {list(self.stop)!r} must be non-empty strings")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise UserError(f"seed={self.seed!r} must be an integer")
        if not isinstance(self.ignore_eos, bool):
            raise UserError(f"ignore_eos={self.ignore_eos!r} must be true or false")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
