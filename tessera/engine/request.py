"""A request's state while it is served, and the completion handed back (the engine's output contract)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tessera.engine.config import SamplingParams

FINISH_REASONS = ("stop", "length")  # OpenAI's names: an EOS token or stop string; max_tokens or the context
# a request may also end as "abort" (Engine.abort: its client went away); it has no Completion


@dataclass(eq=False)
class Request:
    """``computed`` tokens of ``tokens`` (prompt + output so far) have their KV / state in cache; the
    scheduler computes the rest, a chunk per iteration; the last computed token's logits give the next."""

    id: int
    prompt_ids: list[int]
    params: SamplingParams
    output_ids: list[int] = field(default_factory=list)
    computed: int = 0
    pages: list[int] = field(default_factory=list)
    slot: int | None = None
    group: int | None = None
    finish_reason: str | None = None
    text: str = ""
    preemptions: int = 0
    generator: torch.Generator | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.id}: empty prompt")
        if self.params.seed is not None:
            self.generator = torch.Generator().manual_seed(self.params.seed)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def remaining(self) -> int:
        """Tokens not yet computed."""
        return len(self.prompt_ids) + len(self.output_ids) - self.computed

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, kw_only=True)
class Completion:
    """One prompt's result: its text (stop string and EOS excluded), the generated token ids (an EOS token
    included, as vLLM reports it), why it ended, and where it ran."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    devices: tuple[str, ...]
    placement: str

    def __post_init__(self) -> None:
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Completion:
        return cls(text=d["text"], token_ids=tuple(d["token_ids"]), finish_reason=d["finish_reason"],
                   devices=tuple(d["devices"]), placement=d["placement"])
