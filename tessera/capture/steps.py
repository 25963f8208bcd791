"""Build a zoo model from its config and set up one step (inputs, caches, states) ready to record.

Called inside the capture's tensor mode (fake or real) with the default dtype already set.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tessera.capture import anymodel, quant
from tessera.capture.triton_launch import unrecorded
from tessera.capture.zoo import ModelSpec
from tessera.contracts.enums import Phase
from tessera.errors import UserError
from tessera.graph import Role


@dataclass
class Step:
    """A ready step: ``run()`` returns the step's output tensors; ``buffers`` are its non-weight inputs."""

    run: Callable[[], tuple[torch.Tensor, ...]]
    buffers: list[tuple[torch.Tensor, Role, str]] = field(default_factory=list)
    shape: dict[str, int] = field(default_factory=dict)


def build(spec: ModelSpec) -> nn.Module:
    """The model from its config through transformers' Auto classes (diffusers for ``_class_name``), with
    the hooks capture needs: balanced MoE routing, quantised storage as the checkpoint has it."""
    if spec.family == "dit":
        import diffusers

        cfg = {k: v for k, v in spec.config.items() if not k.startswith("_")}
        return getattr(diffusers, spec.config["_class_name"])(**cfg).eval()
    conf = anymodel.transformers_config(spec.config, spec.name)
    # Mamba has no attention to choose; MLA (value head dim ≠ key's) gets one attention kernel
    attn = anymodel.attention_implementation(conf, "eager" if spec.family == "ssm" else "sdpa")
    conf._attn_implementation = attn
    qcfg = spec.config.get("quantization_config")
    if qcfg is not None:
        quant.stored_format(qcfg)  # an unmodelled method is a one-line error before the build
        del conf.quantization_config  # transformers' own quantisers need the real checkpoint
    auto = anymodel.auto_class(conf.model_type)
    try:
        try:
            model = auto.from_config(conf, attn_implementation=attn)
        except ValueError as e:  # no sdpa path (gpt-oss: attention sinks): transformers' eager attention
            if "attention implementation" not in str(e):
                raise
            conf._attn_implementation = "eager"
            model = auto.from_config(conf, attn_implementation="eager")
    except Exception as e:  # transformers' own code refusing this config under fake tensors: one line
        raise _cannot(conf.model_type, "build a model", e) from None
    anymodel.route_dense_mixtures(model)
    anymodel.split_experts(model)
    if qcfg is not None:
        quant.quantise(model, qcfg)
    if model.config._attn_implementation == anymodel.MLA_ATTENTION:
        anymodel.absorb_mla(model)
    return model.eval()


# ---- steps -----------------------------------------------------------------------------------------------------


def _cannot(what: str, doing: str, e: Exception) -> UserError:
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return UserError(f"{what} (transformers) cannot {doing} from this config alone under fake tensors: "
                     f"{type(e).__name__}: {first}")


_CACHE_NAMES = {"keys": "k", "values": "v", "cumulative_length": "length", "conv_states": "conv",
                "recurrent_states": "ssm"}


def static_cache(model: nn.Module, step: Step, *, batch: int, past: int, length: int, real: bool) -> Any:
    """A static cache of past+length slots holding ``past`` tokens, for any mix of layers (full, sliding,
    MLA, Mamba/linear attention): transformers allocates every layer's tensors in a one-token warm-up run
    (before recording), then they are reset to hold ``past`` tokens (random contents in real mode). K/V
    tensors join ``step.buffers`` as kv, conv/recurrent states and length counters as state."""
    from transformers import StaticCache

    # one sequence in the warm-up: an MoE model then runs top_k experts, not all of them
    warm = torch.zeros(1, 1, dtype=torch.long)
    try:
        cache = StaticCache(config=model.config, max_cache_len=past + length)
        with unrecorded():  # custom Triton kernels (Liger) in the warm-up: not part of the step
            anymodel.text_entry(model)(input_ids=warm, cache=cache, use_cache=True, logits_to_keep=1,
                                       return_dict=False)
    except Exception as e:  # transformers' own code refusing this config or fake tensors: one line
        raise _cannot(type(model).__name__, "run a text step", e) from None
    for i, layer in enumerate(cache.layers):
        if hasattr(layer, "batch_size"):
            layer.batch_size = batch
        for attr, value in sorted(vars(layer).items()):
            slots = value if isinstance(value, dict) else {None: value}
            for j, t in slots.items():
                if not isinstance(t, torch.Tensor):
                    continue
                if t.dim():  # [1, ...] from the warm-up -> [batch, ...], zeros (random K/V and states in real mode)
                    t = torch.zeros((batch, *t.shape[1:]), dtype=t.dtype)
                    if real and past:
                        t.normal_()
                else:  # the cache length counter
                    t.fill_(past)
                if j is None:
                    setattr(layer, attr, t)
                else:
                    value[j] = t
                role = Role.KV if attr in ("keys", "values") else Role.STATE
                name = f"kv.{i}.{_CACHE_NAMES.get(attr, attr)}" + ("" if j is None else f".{j}")
                step.buffers.append((t, role, name))
        if isinstance(getattr(layer, "has_previous_state", None), dict):
            for j in layer.has_previous_state:
                layer.has_previous_state[j] = past > 0
    return cache


def llm_step(model: nn.Module, phase: str, batch: int, seq: int, context: int, real: bool) -> Step:
    """prefill: ``seq`` prompt tokens into a static cache of context+seq slots, after ``context`` cached
    tokens (0: an empty cache; more: a prompt chunk at an offset, as chunked prefill runs it); decode: one
    token against ``context`` cached tokens (cache of context+1 slots, so the new token's K/V is written).
    A Qwen2.5-VL decode token is text: its 2-D positions stand for all three mrope axes."""
    cfg = model.config.get_text_config(decoder=True)
    length, past = (seq if phase == Phase.PREFILL else 1), context
    step = Step(run=lambda: (), shape={"batch": batch, "seq": length, "context": past})
    cache = static_cache(model, step, batch=batch, past=past, length=length, real=real)
    ids = torch.randint(0, cfg.vocab_size, (batch, length))
    pos = torch.arange(past, past + length).expand(batch, length)
    step.buffers += [(ids, Role.INPUT, "input_ids"), (pos, Role.INPUT, "position_ids")]
    # return_dict=False: the logits come first in every model's tuple (Llama 4's output class misses a field)
    entry = anymodel.text_entry(model)
    step.run = lambda: (entry(input_ids=ids, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1,
                              return_dict=False)[0],)
    return step


def ssm_step(model: nn.Module, phase: str, batch: int, seq: int, context: int, real: bool) -> Step:
    """Mamba-2 with its conv and SSM states preallocated (prefill starts from zero state, or, with a
    ``context``, continues a prompt from the state after that many tokens; decode: one token from such a
    state; the state's size does not depend on ``context``)."""
    from transformers import DynamicCache

    cfg = model.config
    length = seq if phase == Phase.PREFILL else 1
    cache = DynamicCache(config=cfg)
    inner = cfg.expand * cfg.hidden_size
    conv_dim = inner + 2 * cfg.n_groups * cfg.state_size
    step = Step(run=lambda: (), shape={"batch": batch, "seq": length, "context": context})
    for i, layer in enumerate(cache.layers):
        layer.lazy_initialization(conv_states=torch.zeros(batch, conv_dim, cfg.conv_kernel),
                                  recurrent_states=torch.zeros(batch, cfg.num_heads, cfg.head_dim, cfg.state_size),
                                  conv_kernel_size=cfg.conv_kernel)
        if context:
            layer.has_previous_state[0] = True
            if real:
                layer.conv_states[0].normal_()
                layer.recurrent_states[0].normal_()
        step.buffers += [(layer.conv_states[0], Role.STATE, f"state.{i}.conv"),
                         (layer.recurrent_states[0], Role.STATE, f"state.{i}.ssm")]
    ids = torch.randint(0, cfg.vocab_size, (batch, length))
    step.buffers.append((ids, Role.INPUT, "input_ids"))
    step.run = lambda: (model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1).logits,)
    return step


def dit_step(model: nn.Module, batch: int, seq: int, context: int) -> Step:
    """One Flux denoising step: ``seq`` image tokens (a 1024² image is 4096), ``context`` text tokens."""
    cfg = model.config
    width = max(1, int(seq ** 0.5))
    img_ids = torch.stack([torch.zeros(seq), torch.arange(seq) // width, torch.arange(seq) % width], dim=-1)
    tensors = dict(
        hidden_states=torch.randn(batch, seq, cfg.in_channels),
        encoder_hidden_states=torch.randn(batch, context, cfg.joint_attention_dim),
        pooled_projections=torch.randn(batch, cfg.pooled_projection_dim),
        timestep=torch.full((batch,), 0.5),
        img_ids=img_ids,
        txt_ids=torch.zeros(context, 3),
    )
    if cfg.guidance_embeds:
        tensors["guidance"] = torch.full((batch,), 3.5)
    step = Step(run=lambda: (model(**tensors, return_dict=False)[0],),
                shape={"batch": batch, "seq": seq, "context": context})
    step.buffers = [(t, Role.INPUT, k) for k, t in tensors.items()]
    return step
