"""The steps of a run: which programs to capture, what each step is fed, and a single-process executor.

LLM / SSM: a prefill program, then one decode program per context length (the capture's static cache has
context+1 slots, so each decode position is its own program; KV and state carry between them by name).
DiT: one denoising program run ``denoise_steps`` times with an Euler flow-matching update in between.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import torch

from tessera.capture.core import capture_program, fused_view, record
from tessera.capture.program import Capture
from tessera.capture.zoo import resolve
from tessera.errors import UserError
from tessera.graph import Role
from tessera.runtime.compiled import bind_weights, call, compile_program
from tessera.runtime.device import HOST, fresh_storage, on_device, synchronize
from tessera.runtime.program import CapturedProgram, Storages, replay_step, view_of
from tessera.runtime.state import carry


@dataclass(frozen=True, kw_only=True)
class Job:
    model: str  # zoo name of a tiny model, or a path to a small config.json
    batch: int = 1  # sequences per micro-batch (the captured batch)
    seq: int = 8  # prompt tokens (llm, ssm) or image tokens (dit)
    new_tokens: int = 4  # greedy tokens generated per sequence (llm, ssm)
    context: int = 4  # text tokens (dit)
    denoise_steps: int = 3  # (dit)
    seed: int = 0

    def __post_init__(self) -> None:
        for what, v in (("batch", self.batch), ("seq", self.seq), ("new_tokens", self.new_tokens),
                        ("context", self.context), ("denoise_steps", self.denoise_steps)):
            if v < 1:
                raise UserError(f"{what}={v} must be >= 1")

    @property
    def family(self) -> str:
        return resolve(self.model).family


def capture(model: str, phase: str, *, batch: int, seq: int | None = None, context: int | None = None,
            seed: int = 0) -> Capture:
    """capture_program, also for a small local config.json (capture_program only takes zoo tiny names)."""
    if resolve(model).tiny:
        return capture_program(model, phase, batch=batch, seq=seq, context=context, seed=seed)
    graph, rec, outs = record(model, phase, batch=batch, seq=seq, context=context, real=True, seed=seed)
    return Capture(graph=graph, program=tuple(rec.program), initial=dict(rec.initial),
                   outputs=tuple(rec.ref(t) for t in outs), expected=tuple(t.detach().clone() for t in outs),
                   fused=fused_view(graph, rec))


def step_keys(job: Job) -> list[str]:
    if job.family == "dit":
        return ["denoise"]
    return ["prefill", *[f"decode@{c}" for c in range(job.seq, job.seq + job.new_tokens - 1)]]


def capture_steps(job: Job) -> dict[str, CapturedProgram]:
    if job.family not in ("llm", "moe", "ssm", "dit"):
        raise UserError(f"model {job.model}: family {job.family} cannot run yet; valid families: dit, llm, moe, ssm")
    out: dict[str, CapturedProgram] = {}
    for key in step_keys(job):
        if key == "denoise":
            cap = capture(job.model, "denoise", batch=job.batch, seq=job.seq, context=job.context, seed=job.seed)
        elif key == "prefill":
            cap = capture(job.model, "prefill", batch=job.batch, seq=job.seq, seed=job.seed)
        else:
            cap = capture(job.model, "decode", batch=job.batch, context=int(key.split("@")[1]), seed=job.seed)
        out[key] = CapturedProgram.from_capture(cap)
    first = out[step_keys(job)[-1]]
    for key, prog in out.items():  # every decode position must be the same kernel sequence
        if key.startswith("decode") and ([o.func for o in prog.ops] != [o.func for o in first.ops]
                                         or prog.placement_graph.meta.get("fused_from")
                                         != first.placement_graph.meta.get("fused_from")):
            raise AssertionError(f"{key} is not the same kernel sequence as the other decode steps")
    return out


def input_buffer(program: CapturedProgram, name: str) -> int:
    for b in program.graph.buffers:
        if b.name == name and b.role is Role.INPUT:
            return b.id
    raise AssertionError(f"program has no input buffer {name!r}")


def as_input(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, the form step inputs are handed over in."""
    return t.contiguous().reshape(-1).view(torch.uint8).clone()


class Executor(Protocol):
    def step(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool
             ) -> list[list[torch.Tensor]]: ...


class LocalExecutor:
    """Single-process execution of the same steps (the reference) on one device, timing every kernel
    (on CUDA the stream is synchronised around each kernel, so a time is the kernel's, not its launch's).
    Step outputs come back as host tensors, as the workers' do."""

    def __init__(self, programs: dict[str, CapturedProgram], device: torch.device = HOST) -> None:
        self.programs, self.device = programs, device
        self.weights = {k: {b: on_device(t, device).untyped_storage() for b, t in p.initial.items()
                            if p.role(b) is Role.WEIGHT} for k, p in programs.items()}
        self.state: dict[int, dict[str, tuple[torch.UntypedStorage, object]]] = {}
        self.kernel_s: dict[str, list[list[float]]] = {k: [[] for _ in p.ops] for k, p in programs.items()}
        # per step key: seconds of each op loop outside the ops themselves / number of ops (dispatch cost)
        self.dispatch_s: dict[str, list[float]] = {k: [] for k in programs}
        # per step key: seconds of one micro-batch's step outside the op loop (storage set-up, outputs)
        self.overhead_s: dict[str, list[float]] = {k: [] for k in programs}
        self.compiled = {k: bind_weights(compile_program(p, range(len(p.ops)), device), self.weights[k])
                         for k, p in programs.items()}

    def step(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool
             ) -> list[list[torch.Tensor]]:
        prog, dev, weights = self.programs[key], self.device, self.weights[key]
        sync = dev.type == "cuda"
        outs = []
        for mb, given in enumerate(inputs):
            step0 = time.perf_counter()
            st = self.state.setdefault(mb, {})
            store: Storages = {}
            for b, t in prog.initial.items():
                buf = prog.graph.buffers[b]
                if buf.role in (Role.KV, Role.STATE) and not reset and buf.name in st:
                    old, old_buf = st[buf.name]
                    store[b] = old if old_buf.shape == buf.shape else carry(old, old_buf, buf)  # type: ignore[arg-type]
                elif b in given:
                    store[b] = on_device(given[b], dev).untyped_storage()
                else:
                    store[b] = weights[b] if buf.role is Role.WEIGHT else fresh_storage(t, dev)
            times = self.kernel_s[key]
            clock = time.perf_counter
            loop0 = clock()
            for c in self.compiled[key]:  # the workers' dispatch path (zeroed buffers made on first use)
                if sync:
                    synchronize(dev)
                t0 = clock()
                call(store, c)
                if sync:
                    synchronize(dev)
                times[c.kernel].append(clock() - t0)
            loop_s = clock() - loop0
            self.dispatch_s[key].append((loop_s - sum(t[-1] for t in times)) / max(1, len(times)))
            for b in prog.initial:
                buf = prog.graph.buffers[b]
                if buf.role in (Role.KV, Role.STATE):
                    st[buf.name] = (store[b], buf)
            outs.append([view_of(store, r).to(HOST, copy=True) for r in prog.outputs])
            self.overhead_s[key].append(time.perf_counter() - step0 - loop_s)
        return outs


__all__ = ["Job", "LocalExecutor", "as_input", "capture_steps", "input_buffer", "replay_step", "step_keys"]
