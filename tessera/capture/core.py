"""Capture a zoo model's step: fake tensors for a KernelGraph of any size, real tensors for a program."""

from __future__ import annotations

import time
from contextlib import ExitStack
from typing import Any
from unittest import mock

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten

from tessera.capture import anymodel, steps, vlm
from tessera.capture.defaults import DEFAULT_CONTEXT, DEFAULT_IMAGE_PATCHES, DEFAULT_SEQ
from tessera.capture.fuse import fuse
from tessera.capture.liger import kernels_applied
from tessera.capture.program import Capture
from tessera.capture.recorder import Recorder
from tessera.capture.triton_launch import capturing
from tessera.capture.zoo import PHASES, ModelSpec, resolve
from tessera.contracts.enums import Phase
from tessera.errors import UserError, choices_error
from tessera.graph import KernelGraph, Role, build_graph


def block_layers(model: nn.Module) -> dict[int, tuple[str, int | None]]:
    """id(module) -> (path, layer): blocks of every outermost ModuleList, numbered consecutively in
    registration order (diffusion: double- then single-stream blocks; VL: vision blocks then LM layers)."""
    lists: list[str] = []
    for path, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and path and not any(path.startswith(p + ".") for p in lists):
            lists.append(path)
    offset: dict[str, int] = {}
    total = 0
    for p in lists:
        offset[p] = total
        total += len(model.get_submodule(p))
    info: dict[int, tuple[str, int | None]] = {}
    for path, mod in model.named_modules():
        layer = None
        for p in lists:
            rest = path[len(p) + 1:].split(".")[0] if path.startswith(p + ".") else ""
            if rest.isdigit():
                layer = offset[p] + int(rest)
        info[id(mod)] = (path, layer)
    return info


def _check_shape(spec: ModelSpec, phase: str, batch: int, seq: int | None, context: int | None) -> None:
    if phase not in PHASES[spec.family]:
        raise choices_error(f"phase for {spec.name}", phase, PHASES[spec.family])
    for what, v in (("batch", batch), ("seq", seq), ("context", context)):
        if v is not None and (not isinstance(v, int) or v < 1):
            raise UserError(f"{what}={v!r} must be a positive integer")


def _make_step(spec: ModelSpec, model: nn.Module, phase: str, batch: int, seq: int | None,
               context: int | None, real: bool) -> steps.Step:
    seq = seq or DEFAULT_SEQ[phase]
    if spec.family == "vlm" and phase == Phase.ENCODE:
        return vlm.encode_step(model, batch, seq)
    if spec.family == "vlm" and phase == Phase.PREFILL:  # context: image patches per prompt
        return vlm.prefill_step(model, batch, seq, context or DEFAULT_IMAGE_PATCHES, real)
    context = context or DEFAULT_CONTEXT.get(phase, 0)
    if spec.family in ("llm", "moe", "vlm"):
        return steps.llm_step(model, phase, batch, seq, context, real)
    if spec.family == "ssm":
        return steps.ssm_step(model, phase, batch, seq, context, real)
    assert spec.family == "dit", f"no step for family {spec.family}"
    return steps.dit_step(model, batch, seq, context)


def record(name: str, phase: str, *, batch: int, seq: int | None, context: int | None, real: bool,
           seed: int = 0, dtype: torch.dtype | None = None) -> tuple[KernelGraph, Recorder, tuple[torch.Tensor, ...]]:
    """Build the model and record one step; shared by fake (graph) and real (program) capture."""
    spec = resolve(name)
    _check_shape(spec, phase, batch, seq, context)
    t0 = time.perf_counter()
    prev_dtype = torch.get_default_dtype()
    with ExitStack() as stack:
        if not real:
            # allow_non_fake_inputs: VL metadata (grid sizes) stays real while activations are fake
            stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))
        else:
            # Take the path fake tensors force on transformers' mask code (it cannot read their values),
            # so a real capture has the same kernels as the fake one: an explicit mask, never a skipped one.
            stack.enter_context(mock.patch("transformers.masking_utils.is_tracing", lambda tensor=None: True))
        stack.callback(torch.set_default_dtype, prev_dtype)
        torch.set_default_dtype(dtype or (torch.float32 if real else torch.bfloat16))
        torch.manual_seed(seed)
        stack.enter_context(kernels_applied(spec.config))  # Liger variants: Triton modules while traced
        model = steps.build(spec)
        step = _make_step(spec, model, phase, batch, seq, context, real)
        rec = Recorder(phase=phase, module_info=block_layers(model), keep_program=real)
        for n, p in model.named_parameters():
            rec.register(p, Role.WEIGHT, n)
        for n, b in model.named_buffers():
            rec.register(b, Role.WEIGHT, n)  # rotary tables and the like: resident constants
        for t, role, n in step.buffers:
            rec.register(t, role, n)
        hooks = [
            nn.modules.module.register_module_forward_pre_hook(lambda m, a: rec.push(m)),
            nn.modules.module.register_module_forward_hook(lambda m, a, o: rec.pop(m), always_call=True),
        ]
        stack.callback(lambda: [h.remove() for h in hooks])
        if not real:  # real mode keeps every expert's operators: the program replays them
            stack.enter_context(anymodel.replicating_experts(rec))
        with torch.no_grad(), rec, capturing(rec):
            outs = step.run()
        outs = tuple(t for t in tree_flatten(outs)[0] if isinstance(t, torch.Tensor))
        for t in outs:
            if rec.buffers[rec.buffer_of(t)].role is Role.ACTIVATION:
                rec.set_role(t, Role.OUTPUT)
    meta: dict[str, Any] = {"source": spec.source, "family": spec.family, "capture_s": time.perf_counter() - t0,
                            "mode": "real" if real else "fake", "view": "eager"}
    if rec.findings:
        meta["findings"] = list(rec.findings)
    graph = build_graph(model=spec.name, phase=phase, shape=step.shape, kernels=rec.kernels,
                        buffers=rec.graph_buffers(), meta=meta)
    return graph, rec, outs


def capture_model(name: str, phase: str, *, batch: int, seq: int | None = None, context: int | None = None,
                  dtype: torch.dtype = torch.bfloat16, eager: bool = False) -> KernelGraph:
    """KernelGraph of one step under fake tensors (no memory for weights; any size); bf16 unless told.

    The production-fused view (``tessera.capture.fuse``) unless ``eager``: one kernel per ATen operator."""
    graph, rec, _ = record(name, phase, batch=batch, seq=seq, context=context, real=False, dtype=dtype)
    return graph if eager else fused_view(graph, rec)


def fused_view(graph: KernelGraph, rec: Recorder) -> KernelGraph:
    """The fused view of a recording, its capture time included."""
    t0 = time.perf_counter()
    fused = fuse(graph, rec.access)
    fused.meta["capture_s"] = graph.meta["capture_s"] + time.perf_counter() - t0
    return fused


def capture_program(name: str, phase: str, *, batch: int, seq: int | None = None, context: int | None = None,
                    seed: int = 0) -> Capture:
    """Real fp32 CPU capture of a tiny model: the eager graph plus a replayable program (kernel i = op i), and
    the fused view (``Capture.fused``) whose kernels each run a consecutive group of those ops."""
    spec = resolve(name)
    if not spec.tiny:
        raise UserError(f"real-mode capture needs a tiny model, not {name!r}; valid: "
                        + ", ".join(n for n, s in _tiny_specs().items()))
    graph, rec, outs = record(name, phase, batch=batch, seq=seq, context=context, real=True, seed=seed)
    return Capture(graph=graph, program=tuple(rec.program), initial=dict(rec.initial),
                   outputs=tuple(rec.ref(t) for t in outs), expected=tuple(t.detach().clone() for t in outs),
                   fused=fused_view(graph, rec))


def _tiny_specs() -> dict[str, ModelSpec]:
    from tessera.capture.zoo import SPECS

    return {n: s for n, s in SPECS.items() if s.tiny}
