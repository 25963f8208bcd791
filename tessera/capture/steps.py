"""Build a zoo model from its config and set up one step (inputs, caches, states) ready to record.

Called inside the capture's tensor mode (fake or real) with the default dtype already set.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tessera.capture.zoo import ModelSpec
from tessera.graph import Role


@dataclass
class Step:
    """A ready step: ``run()`` returns the step's output tensors; ``buffers`` are its non-weight inputs."""

    run: Callable[[], tuple[torch.Tensor, ...]]
    buffers: list[tuple[torch.Tensor, Role, str]] = field(default_factory=list)
    shape: dict[str, int] = field(default_factory=dict)


def build(spec: ModelSpec) -> nn.Module:
    cfg = {k: v for k, v in spec.config.items() if not k.startswith("_")}
    if spec.family == "dit":
        from diffusers import FluxTransformer2DModel

        return FluxTransformer2DModel(**cfg).eval()
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    model_type = cfg.pop("model_type")
    conf = AutoConfig.for_model(model_type, **cfg)
    attn = "eager" if spec.family == "ssm" else "sdpa"  # Mamba has no attention to choose
    conf._attn_implementation = attn
    auto = AutoModelForImageTextToText if spec.family == "vlm" else AutoModelForCausalLM
    model = auto.from_config(conf, attn_implementation=attn)
    if spec.family == "moe":
        _split_experts(model)
    return model.eval()


# ---- MoE: per-expert weights and balanced routing --------------------------------------------------------------


def _split_experts(model: nn.Module) -> None:
    """Give every expert its own weight tensors (one buffer each) and the balanced-routing forward."""
    for mod in model.modules():
        if type(mod).__name__.endswith("Experts") and isinstance(getattr(mod, "gate_up_proj", None), nn.Parameter):
            mod.gate_up = nn.ParameterList([nn.Parameter(w.clone()) for w in mod.gate_up_proj.data])
            mod.down = nn.ParameterList([nn.Parameter(w.clone()) for w in mod.down_proj.data])
            del mod.gate_up_proj, mod.down_proj
            mod.forward = types.MethodType(_balanced_experts_forward, mod)


def _balanced_experts_forward(self: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                              top_k_weights: torch.Tensor) -> torch.Tensor:
    """Experts under the capture's routing assumption: balanced top-k routing.

    The router's choice is data: fake tensors cannot say which tokens go where. We assume every expert
    receives tokens·top_k/E of the token-slots (slot s = token s // top_k, in order; the first
    (tokens·top_k) mod E experts take one extra), so each expert is one gather + two GEMMs + one
    scatter-add with the active-parameter FLOPs of the real model. The router's weights are used as
    computed; its indices are ignored (so a real-mode MoE output is that of this routing, not the router's).
    """
    tokens, top_k = top_k_index.shape
    slots = tokens * top_k
    n_experts = len(self.gate_up)
    flat_w = top_k_weights.reshape(-1)
    out = torch.zeros_like(hidden)
    start = 0
    for e in range(n_experts):
        n = slots // n_experts + (1 if e < slots % n_experts else 0)
        if n == 0:
            continue
        tok = torch.arange(start, start + n, device=hidden.device) // top_k
        x = hidden.index_select(0, tok)
        gate, up = nn.functional.linear(x, self.gate_up[e]).chunk(2, dim=-1)
        y = nn.functional.linear(self.act_fn(gate) * up, self.down[e])
        out.index_add_(0, tok, y * flat_w[start:start + n, None].to(y.dtype))
        start += n
    return out


# ---- steps -----------------------------------------------------------------------------------------------------


def static_cache(model: nn.Module, step: Step, *, batch: int, past: int, length: int, real: bool) -> Any:
    """A static KV cache of past+length slots holding ``past`` tokens (random K/V in real mode); its
    K, V and length counters join ``step.buffers``."""
    from transformers import StaticCache

    cfg = model.config.get_text_config(decoder=True)
    cache = StaticCache(config=cfg, max_cache_len=past + length)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    cache.early_initialization(batch_size=batch, num_heads=cfg.num_key_value_heads, head_dim=head_dim,
                               dtype=torch.get_default_dtype(), device=torch.device("cpu"))
    for i, layer in enumerate(cache.layers):
        layer.cumulative_length.fill_(past)
        if real and past:
            layer.keys.normal_()
            layer.values.normal_()
        step.buffers += [(layer.keys, Role.KV, f"kv.{i}.k"), (layer.values, Role.KV, f"kv.{i}.v"),
                         (layer.cumulative_length, Role.STATE, f"kv.{i}.length")]
    return cache


def llm_step(model: nn.Module, phase: str, batch: int, seq: int, context: int, real: bool) -> Step:
    """prefill: ``seq`` prompt tokens into an empty static cache of ``seq`` slots; decode: one token
    against ``context`` cached tokens (cache of context+1 slots, so the new token's K/V is written).
    A Qwen2.5-VL decode token is text: its 2-D positions stand for all three mrope axes."""
    cfg = model.config.get_text_config(decoder=True)
    length, past = (seq, 0) if phase == "prefill" else (1, context)
    step = Step(run=lambda: (), shape={"batch": batch, "seq": length, "context": past})
    cache = static_cache(model, step, batch=batch, past=past, length=length, real=real)
    ids = torch.randint(0, cfg.vocab_size, (batch, length))
    pos = torch.arange(past, past + length).expand(batch, length)
    step.buffers += [(ids, Role.INPUT, "input_ids"), (pos, Role.INPUT, "position_ids")]
    step.run = lambda: (model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True,
                              logits_to_keep=1).logits,)
    return step


def ssm_step(model: nn.Module, phase: str, batch: int, seq: int, context: int, real: bool) -> Step:
    """Mamba-2 with its conv and SSM states preallocated (prefill starts from zero state, decode from a
    state after ``context`` tokens: the state's size does not depend on it)."""
    from transformers import DynamicCache

    cfg = model.config
    length = seq if phase == "prefill" else 1
    cache = DynamicCache(config=cfg)
    inner = cfg.expand * cfg.hidden_size
    conv_dim = inner + 2 * cfg.n_groups * cfg.state_size
    step = Step(run=lambda: (), shape={"batch": batch, "seq": length, "context": 0 if phase == "prefill" else context})
    for i, layer in enumerate(cache.layers):
        layer.lazy_initialization(conv_states=torch.zeros(batch, conv_dim, cfg.conv_kernel),
                                  recurrent_states=torch.zeros(batch, cfg.num_heads, cfg.head_dim, cfg.state_size),
                                  conv_kernel_size=cfg.conv_kernel)
        if phase == "decode":
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
