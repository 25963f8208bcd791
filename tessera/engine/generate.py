"""`tessera generate` as a function: prompts served together by continuous batching, in this process for a
lone ``cpu`` device or on worker processes split by a placement (tessera.engine.serve_run)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from tessera.engine.cluster import ClusterSettings
from tessera.engine.config import EngineConfig
from tessera.engine.devices import WorkerKind
from tessera.engine.engine import load_engine, resolve_dtype
from tessera.engine.loader import open_model
from tessera.engine.prompts import Prompt
from tessera.engine.request import Completion
from tessera.engine.serve_run import generate_on_workers
from tessera.engine.tokenizer import Codec, tokenizer_for
from tessera.errors import UserError


@dataclass(frozen=True, kw_only=True)
class GenerateSpec:
    model: str  # zoo name or model directory
    prompts: tuple[Prompt, ...]
    kinds: tuple[WorkerKind, ...]  # one ``cpu``: this process; else one worker process each
    placement: str = "layer_split"  # with workers: a rule, "plan", or a PLAN.json
    config: EngineConfig  # max_model_len None: the longest request given (longest_request)
    dtype: str = "auto"
    load_format: str = "auto"
    settings: ClusterSettings = ClusterSettings()


@dataclass(frozen=True, kw_only=True)
class GenerateResult:
    """The completions in prompt order, the engine's iterations, the seconds before the first iteration
    (loading; with workers: placing and starting them) and the seconds generating after it."""

    completions: tuple[Completion, ...]
    iterations: int
    load_s: float
    generate_s: float

    @property
    def tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.completions)


def prompt_ids(prompts: tuple[Prompt, ...], codec: Codec) -> list[list[int]]:
    """Each prompt's token ids: as given, or its text through ``codec``."""
    return [list(p.ids) if p.ids is not None else codec.encode(p.text or "") for p in prompts]


def longest_request(ids: list[list[int]], prompts: tuple[Prompt, ...]) -> int:
    """Tokens of the longest prompt + output among the requests (the default model length)."""
    return max(len(i) + p.params.max_tokens for i, p in zip(ids, prompts, strict=True))


def in_process(kinds: tuple[WorkerKind, ...]) -> bool:
    """A lone ``cpu`` runs the engine in this process; anything else starts workers."""
    return len(kinds) == 1 and kinds[0].name == "cpu"


def generate(spec: GenerateSpec) -> GenerateResult:
    source = open_model(spec.model)
    codec = tokenizer_for(source)
    ids = prompt_ids(spec.prompts, codec)
    config = spec.config if spec.config.max_model_len else replace(
        spec.config, max_model_len=longest_request(ids, spec.prompts))
    params = [p.params for p in spec.prompts]
    t0 = time.perf_counter()
    if in_process(spec.kinds):
        engine = load_engine(source, config, dtype=spec.dtype, load_format=spec.load_format, codec=codec)
        t1 = time.perf_counter()
        outs = engine.generate(ids, params)
    else:
        if spec.load_format == "auto" and not source.has_weights:
            raise UserError(f"{source.name} has no safetensors weights to load; use --load-format dummy")
        engine, outs, ready_s = generate_on_workers(
            source, resolve_dtype(spec.dtype, source), config, spec.kinds, spec.placement,
            list(zip(ids, params, strict=True)), load_format=spec.load_format, settings=spec.settings)
        t1 = t0 + ready_s
    t2 = time.perf_counter()
    return GenerateResult(completions=tuple(outs), iterations=len(engine.history), load_s=t1 - t0,
                          generate_s=t2 - t1)
