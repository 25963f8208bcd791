"""The engine: requests in, completions out, one scheduled iteration at a time.

``load_engine`` resolves a model (zoo name or directory), checks memory before allocating anything, builds
the program with real weights (loaded shard by shard, or random), allocates KV pages / state slots and
traces the program. ``Engine.step`` runs one iteration: the scheduler's batch for the next group, laid
out flat, through the executor (the traced program, or any callable taking ``IterationInputs``, e.g. a
split run), then sampling and stop checks. Its halves, ``schedule`` and ``complete``, let a driver keep
one iteration per group in flight on worker processes (``tessera.engine.serve``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from tessera.engine.cache import FreeList, pages_for
from tessera.engine.config import DTYPES, EngineConfig, SamplingParams
from tessera.engine.inputs import IterationInputs, SeqPiece, build_inputs
from tessera.engine.loader import ModelSource, dummy_weights, load_weights, open_model
from tessera.engine.memory import available_bytes, check_memory, memory_need
from tessera.engine.models import allocate_caches, build_model
from tessera.engine.program import Program
from tessera.engine.request import Completion, Request
from tessera.engine.sampling import sample
from tessera.engine.scheduler import Scheduled, Scheduler
from tessera.engine.tokenizer import Codec, tokenizer_for
from tessera.errors import UserError

Executor = Callable[[IterationInputs], Tensor]
LOAD_FORMATS = ("auto", "dummy")


@dataclass(frozen=True)
class Batch:
    """One scheduled iteration of a group: its requests with their token counts, their pieces and the
    flat inputs."""

    group: int
    scheduled: tuple[Scheduled, ...]
    pieces: tuple[SeqPiece, ...]
    inputs: IterationInputs


@dataclass(frozen=True)
class Iteration:
    """What one step ran: its group, the tokens of each scheduled request, and (if kept) the logits."""

    group: int
    tokens: tuple[tuple[int, int], ...]  # (request id, tokens computed)
    logits: Tensor | None


class Engine:
    def __init__(self, program: Program | None, source: ModelSource, config: EngineConfig, codec: Codec, *,
                 executor: Executor | None = None, devices: tuple[str, ...] = ("cpu",),
                 placement: str = "single", keep_logits: bool = False) -> None:
        """``program`` None: a driver whose iterations run elsewhere (``schedule``/``complete``; workers)."""
        self.program = program
        self.source = source
        self.config = config
        self.codec = codec
        self.executor: Executor | None = executor or program
        self.devices, self.placement = devices, placement
        arch = source.arch
        pages = FreeList(config.pages(arch)) if arch.family == "decoder" else None
        slots = FreeList(config.max_num_seqs) if arch.family == "mamba2" else None
        self.scheduler = Scheduler(config, pages, slots)
        self.keep_logits = keep_logits
        self.history: list[Iteration] = []
        self.requests: dict[int, Request] = {}  # every request added, by id
        self._next_id = 0
        self._turn = 0

    # ---- requests ----------------------------------------------------------------------------

    def add_request(self, prompt_ids: Sequence[int], params: SamplingParams) -> Request:
        """Queue a request; a prompt the model or the cache cannot hold is one UserError line."""
        arch = self.source.arch
        bad = [t for t in prompt_ids if not 0 <= t < arch.vocab_size]
        if not prompt_ids or bad:
            raise UserError(f"prompt token ids must be 0..{arch.vocab_size - 1} and at least one; got "
                            f"{list(prompt_ids)[:8]}")
        total = len(prompt_ids) + params.max_tokens
        limit = self.config.model_len(arch)
        if limit is not None and total > limit:
            raise UserError(f"prompt of {len(prompt_ids)} tokens + max-tokens {params.max_tokens} = {total} "
                            f"exceeds the model's {limit}-token context (max_model_len)")
        pool = self.scheduler.pages
        if pool is not None and pages_for(total, self.config.page_size) > pool.count:
            raise UserError(f"a request of {total} tokens needs {pages_for(total, self.config.page_size)} KV "
                            f"pages of {self.config.page_size} tokens; the cache has {pool.count}")
        r = Request(id=self._next_id, prompt_ids=list(prompt_ids), params=params)
        self._next_id += 1
        self.requests[r.id] = r
        self.scheduler.add(r)
        return r

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
                 ) -> list[Completion]:
        """Serve ``prompts`` together (continuous batching) until all finish; completions in prompt order."""
        plist = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} sampling params for {len(prompts)} prompts")
        requests = [self.add_request(p, sp) for p, sp in zip(prompts, plist, strict=True)]
        while self.scheduler.has_work():
            self.step()
        return [self.completion(r) for r in requests]

    def completion(self, r: Request) -> Completion:
        assert r.finish_reason is not None, f"request {r.id} has not finished"
        return Completion(text=r.text, token_ids=tuple(r.output_ids), finish_reason=r.finish_reason,
                          devices=self.devices, placement=self.placement)

    # ---- iterations --------------------------------------------------------------------------

    def step(self) -> list[Request]:
        """Run the next group that has work; returns the requests that finished."""
        batch = self.schedule()
        if batch is None:
            return []
        assert self.executor is not None, "an engine without a program runs its iterations elsewhere"
        with torch.no_grad():
            logits = self.executor(batch.inputs)
        return self.complete(batch, logits)

    def schedule(self, busy: frozenset[int] = frozenset()) -> Batch | None:
        """The next iteration: the first group from this turn on, not in ``busy`` (groups whose iteration is
        in flight), with something to compute; None when none has. Requests of busy groups are never
        preempted (their pages are being written)."""
        group, scheduled = self._next_batch(busy)
        if not scheduled:
            return None
        pieces = [SeqPiece(tokens=tuple(s.request.tokens[s.request.computed:s.request.computed + s.tokens]),
                           start=s.request.computed, pages=tuple(s.request.pages), slot=s.request.slot or 0,
                           sample=s.tokens == s.request.remaining) for s in scheduled]
        return Batch(group=group, scheduled=tuple(scheduled), pieces=tuple(pieces),
                     inputs=build_inputs(pieces, self.config.page_size))

    def complete(self, batch: Batch, logits: Tensor) -> list[Request]:
        """Take an iteration's logits: advance its requests, sample, check stops; the finished ones."""
        self.history.append(Iteration(group=batch.group, tokens=tuple((s.request.id, s.tokens)
                                                                      for s in batch.scheduled),
                                      logits=logits.clone() if self.keep_logits else None))
        rows = iter(logits.float())  # one row per sampled piece, in batch order
        done = []
        for s, piece in zip(batch.scheduled, batch.pieces, strict=True):
            s.request.computed += s.tokens
            if piece.sample:
                s.request.output_ids.append(sample(next(rows), s.request.params, s.request.generator))
                if self._finished(s.request):
                    self.scheduler.finish(s.request)
                    done.append(s.request)
        return done

    def restart(self) -> int:
        """Every running request back to the queue with nothing cached (their KV and states were lost with
        a worker), latest arrivals first so the oldest runs first again; returns how many."""
        running = sorted((r for g in self.scheduler.running for r in g), key=lambda r: r.id, reverse=True)
        for r in running:
            self.scheduler.preempt(r)
        return len(running)

    def reconfigure(self, config: EngineConfig) -> None:
        """Switch to ``config``'s micro-batch count between iterations (none in flight; the adaptive switch,
        ``tessera.engine.adaptive``); every other setting must stay, the KV pages and slots included."""
        if replace(config, microbatches=self.config.microbatches) != self.config:
            raise ValueError(f"only the micro-batch count may change: {self.config} -> {config}")
        self.config = config
        self.scheduler.regroup(config)
        self._turn = 0

    def abort(self, r: Request) -> None:
        """Drop ``r`` (a client went away): out of the queue or its group, its pages and slot freed, its
        finish reason ``abort``. The caller makes sure no iteration in flight holds it (its pages would be
        written after they were handed on)."""
        if not r.finished:
            self.scheduler.remove(r)
            r.finish_reason = "abort"

    def _next_batch(self, busy: frozenset[int] = frozenset()) -> tuple[int, list[Scheduled]]:
        """The first group, from this turn on and not busy, with something to compute, and its batch."""
        for _ in range(self.config.microbatches):
            group = self._turn
            self._turn = (self._turn + 1) % self.config.microbatches
            if group in busy:
                continue
            batch = self.scheduler.schedule(group, busy)
            if batch:
                return group, batch
        if self.scheduler.has_work() and not busy:
            raise RuntimeError("no group could schedule a token although requests wait: the KV cache is too "
                               "small for any of them")
        return -1, []

    def _finished(self, r: Request) -> bool:
        """Whether the request ends with its last token, and why (a stop string before length, as vLLM);
        its text is decoded only when needed: to look for stop strings, or at the end."""
        p = r.params
        limit = self.config.model_len(self.source.arch)
        if not p.ignore_eos and r.output_ids[-1] in self.codec.eos_token_ids:
            r.finish_reason = "stop"  # the EOS token stays in token_ids, not in the text
        elif len(r.output_ids) >= p.max_tokens or (limit is not None and len(r.tokens) >= limit):
            r.finish_reason = "length"
        if p.stop or r.finished:
            r.text = self.codec.decode(r.output_ids[:-1] if r.finish_reason == "stop" else r.output_ids)
            cut = min((i for i in (r.text.find(s) for s in p.stop) if i >= 0), default=-1)
            if cut >= 0:
                r.text, r.finish_reason = r.text[:cut], "stop"
        return r.finished


def resolve_dtype(name: str, source: ModelSource) -> torch.dtype:
    """``auto``: the checkpoint's own dtype (config ``dtype`` / ``torch_dtype``) where it names one of
    bf16/fp16/fp32, else bf16."""
    if name in DTYPES:
        return DTYPES[name]
    if name != "auto":
        raise UserError(f"unknown dtype {name!r}; valid: auto, {', '.join(DTYPES)}")
    by_torch = {str(v).removeprefix("torch."): v for v in DTYPES.values()}
    return by_torch.get(source.config_dtype or "", torch.bfloat16)


def load_engine(target: str | ModelSource, config: EngineConfig, *, dtype: str = "auto",
                load_format: str = "auto", seed: int = 0, keep_logits: bool = False,
                codec: Codec | None = None) -> Engine:
    """An engine for a zoo name or model directory: memory checked, weights in place, program traced."""
    if load_format not in LOAD_FORMATS:
        raise UserError(f"unknown load format {load_format!r}; valid: {', '.join(LOAD_FORMATS)}")
    source = open_model(target) if isinstance(target, str) else target
    if load_format == "auto" and not source.has_weights:
        raise UserError(f"{source.name} has no safetensors weights to load; use --load-format dummy for "
                        f"random weights")
    torch_dtype = resolve_dtype(dtype, source)
    check_memory(source.name, memory_need(source.arch, config, torch_dtype), available_bytes(),
                 str(torch_dtype).removeprefix("torch."))
    codec = codec or tokenizer_for(source)
    model = build_model(source.arch, torch_dtype, "cpu")
    if load_format == "dummy":
        dummy_weights(model, seed)
    else:
        assert source.directory is not None
        load_weights(model, source.directory)
    allocate_caches(model, pages=config.pages(source.arch), page_size=config.page_size,
                    slots=config.max_num_seqs, dtype=torch_dtype, device="cpu")
    return Engine(Program(model), source, config, codec, keep_logits=keep_logits)
