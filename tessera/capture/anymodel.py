"""Any architecture transformers (or diffusers) builds from a config: which family, which Auto class, and
the few per-family hooks capture needs.

No list of supported model types: a config is built with ``AutoConfig.for_model`` and the model with
``AutoModelForImageTextToText`` / ``AutoModelForCausalLM.from_config``. Hooks apply by what a model has,
not by its name: every experts module (3-D expert weights) gets balanced routing; a mixture block whose
experts run densely over all tokens (Llama 4) gets a top-k router first; Qwen2.5-VL's vision tower its
real metadata (``vlm.py``). Static KV caches of any layer mix are allocated by transformers itself
(``steps.static_cache``).
"""

from __future__ import annotations

import inspect
import json
import types
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor

from tessera.capture import ops
from tessera.capture.recorder import Recorder
from tessera.errors import UserError, read_text

# Families whose steps differ: a Mamba-only model keeps SSM states, not a KV cache; a VL model with a
# vision-metadata hook (vlm.py) also runs its vision tower; a diffusion transformer denoises.
VISION_HOOKS = frozenset({"qwen2_5_vl"})
# Text-only steps enter through this submodule where the whole model's forward cannot take text alone:
# transformers 5.24's Llama4ForConditionalGeneration reads ``image_outputs`` off its text model's output.
TEXT_ENTRY = {"llama4": "language_model"}
# Fields that give a mixture-of-experts model its expert count.
_EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# What the Flux-style denoise step hands a diffusers transformer.
DIT_INPUTS = ("hidden_states", "encoder_hidden_states", "pooled_projections", "timestep", "img_ids", "txt_ids")


def load_config(name: str) -> tuple[dict[str, Any], Path]:
    """The JSON object in ``name``: a config.json, or a model directory holding one."""
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise UserError(f"model directory {name} holds no config.json")
    try:
        cfg = json.loads(read_text(path, "model config"))
    except json.JSONDecodeError as e:
        raise UserError(f"cannot read model config {path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(cfg, dict):
        raise UserError(f"model config {name} is not a JSON object")
    return cfg, path


def _diffusers_class(cfg: dict[str, Any], where: str) -> type:
    import diffusers

    cls = getattr(diffusers, str(cfg["_class_name"]), None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise UserError(f"model config {where}: diffusers {diffusers.__version__} has no model class "
                        f"{cfg['_class_name']!r}")
    missing = [a for a in DIT_INPUTS if a not in inspect.signature(cls.forward).parameters]
    if missing:
        raise UserError(f"model config {where}: {cls.__name__}.forward takes no {', '.join(missing)}; the denoise "
                        f"step feeds a Flux-style transformer ({', '.join(DIT_INPUTS)})")
    return cls


def transformers_config(cfg: dict[str, Any], where: str) -> Any:
    """The transformers config object, or a one-line error saying what is missing."""
    import transformers
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    kwargs = {k: v for k, v in cfg.items() if not k.startswith("_")}
    model_type = kwargs.pop("model_type", None)
    if not model_type:
        raise UserError(f"model config {where} has no model_type (nor a diffusers _class_name)")
    if model_type not in CONFIG_MAPPING:
        remote = cfg.get("auto_map") or {}
        how = (f"its checkpoint ships its own modelling code ({', '.join(sorted(set(remote.values())))}), which "
               "tessera does not download or run" if remote else "it is not a transformers architecture")
        raise UserError(f"model config {where}: transformers {transformers.__version__} has no model_type "
                        f"{model_type!r} (architectures {cfg.get('architectures')}): {how}")
    try:
        return AutoConfig.for_model(model_type, **kwargs)
    except (ValueError, TypeError, KeyError) as e:
        raise UserError(f"model config {where}: transformers cannot build a {model_type} config from it: "
                        f"{str(e).splitlines()[0]}") from None


def auto_class(model_type: str) -> Any:
    """The Auto class that builds a whole generative model of this type (vision tower included)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return AutoModelForImageTextToText
    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return AutoModelForCausalLM
    raise UserError(f"model_type {model_type!r} has no causal-LM or image-text-to-text model in transformers: "
                    "capture needs a generative model (prefill/decode steps)")


def family_of(cfg: dict[str, Any], where: str) -> str:
    """llm | moe | ssm | vlm | dit for a config.json object (building the config checks it)."""
    if "_class_name" in cfg:
        _diffusers_class(cfg, where)
        return "dit"
    conf = transformers_config(cfg, where)
    auto_class(conf.model_type)
    if conf.model_type in VISION_HOOKS:
        return "vlm"
    text = conf.get_text_config(decoder=True)
    if getattr(text, "num_attention_heads", None) is None:  # Mamba: no attention, no KV cache
        return "ssm"
    return "moe" if has_experts(conf) else "llm"


def has_experts(conf: Any) -> bool:
    """Whether the model holds an experts module: built on the meta device (no memory, ~0.2 s), since
    an expert count in a config can be a default the layer pattern never uses (Nemotron-H 56B)."""
    if not any((getattr(conf.get_text_config(decoder=True), f, 0) or 0) > 1 for f in _EXPERT_FIELDS):
        return False
    with torch.device("meta"):
        model = auto_class(conf.model_type).from_config(conf)
    return any(_expert_weight(m, "down_proj") is not None for m in model.modules())


# ---- MoE: per-expert weights and balanced routing ---------------------------------------------------------------


# The recording that experts of a layer are copied into instead of traced (fake mode only).
_EXPERT_RECORDER: ContextVar[Recorder | None] = ContextVar("tessera_expert_recorder", default=None)


def _expert_weight(mod: nn.Module, name: str) -> torch.Tensor | None:
    w = getattr(mod, name, None)
    return w if isinstance(w, nn.Parameter) and w.dim() == 3 else None


def set_resident(module: nn.Module, name: str, t: torch.Tensor | None) -> None:
    """``module.<name> = t`` as a weight: an nn.Parameter for real tensors, a registered buffer for fake ones.
    Both are recorded as weights; the buffer skips Parameter's detach, a fake-tensor dispatch (0.25 ms:
    a minute over DeepSeek-V3's 44,544 expert matrices and 30,000 fp8 Linears)."""
    if t is None or isinstance(t, FakeTensor):
        module.register_buffer(name, t)
    else:
        setattr(module, name, nn.Parameter(t, requires_grad=False))


def _linears(weights: torch.Tensor, bias: torch.Tensor | None, transposed: bool) -> nn.ModuleList:
    """One nn.Linear (weight [out, in]) per expert from a stacked [E, out, in] (or [E, in, out]) tensor."""
    fake = isinstance(weights, FakeTensor)  # fake: fresh tensors of the shape; real: the values
    n_experts, a, b = (int(x) for x in weights.shape)
    shape = (b, a) if transposed else (a, b)
    out = nn.ModuleList()
    for e in range(n_experts):
        lin = nn.Linear.__new__(nn.Linear)  # no init: the weights are set below
        nn.Module.__init__(lin)
        lin.out_features, lin.in_features = shape
        if fake:
            w = torch.empty(shape)
            b_e = None if bias is None else torch.empty(bias.shape[1:])
        else:
            w = (weights[e].transpose(0, 1) if transposed else weights[e]).contiguous().clone()
            b_e = None if bias is None else bias[e].clone()
        set_resident(lin, "weight", w)
        set_resident(lin, "bias", b_e)
        out.append(lin)
    return out


def split_experts(model: nn.Module) -> int:
    """Every experts module (3-D gate_up_proj or up_proj, and down_proj): one Linear per expert and
    projection, each its own weight buffer, and the balanced-routing forward. Returns how many modules."""
    count = 0
    for mod in list(model.modules()):
        up_name = "gate_up_proj" if _expert_weight(mod, "gate_up_proj") is not None else "up_proj"
        up, down = _expert_weight(mod, up_name), _expert_weight(mod, "down_proj")
        if up is None or down is None:
            continue
        # [E, in, out] layouts: transformers marks them is_transposed; Llama 4 stores [E, hidden, 2·ffn]
        transposed = getattr(mod, "is_transposed", type(mod).__name__ == "Llama4TextExperts")
        mod.gate = up_name == "gate_up_proj"
        mod.up_list = _linears(up, getattr(mod, up_name + "_bias", None), transposed)
        mod.down_list = _linears(down, getattr(mod, "down_proj_bias", None), transposed)
        for n in (up_name, "down_proj", up_name + "_bias", "down_proj_bias"):
            if hasattr(mod, n):
                delattr(mod, n)
        mod.forward = types.MethodType(balanced_experts_forward, mod)
        count += 1
    return count


def _gated(mod: Any, gate_up: torch.Tensor) -> torch.Tensor:
    if not mod.gate:  # up_proj only (Nemotron-H: relu²)
        return mod.act_fn(gate_up)
    apply_gate = getattr(mod, "_apply_gate", None)  # transformers' own (gpt-oss: interleaved, clamped)
    if apply_gate is not None:
        return apply_gate(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return mod.act_fn(gate) * up


def balanced_experts_forward(self: Any, hidden: torch.Tensor, top_k_index: torch.Tensor,
                             top_k_weights: torch.Tensor) -> torch.Tensor:
    """Experts under the capture's routing assumption: balanced top-k routing.

    The router's choice is data: fake tensors cannot say which tokens go where. Every expert receives
    tokens·top_k/E of the token-slots (slot s = token s // top_k, in order; the first (tokens·top_k) mod E
    experts take one more), so each expert is one dispatch, its GEMMs and one weighted combine, with the
    active-parameter FLOPs of the real model. The router's weights are used, its indices are not.

    Under a recording in fake mode (``replicating_experts``) an expert whose slot count was already
    traced in this layer is not traced again: the traced expert's kernels are copied with this expert's
    weights (``Recorder.replicate``), the same kernels a trace would record, at a fraction of the cost
    (DeepSeek-V3: 14,848 experts).
    """
    tokens, top_k = top_k_index.shape
    slots = tokens * top_k
    n_experts = len(self.down_list)
    flat_w = top_k_weights.reshape(-1)
    token_of_slot = torch.arange(slots, device=hidden.device) // top_k
    out = torch.zeros_like(hidden)
    rec = _EXPERT_RECORDER.get()
    traced: dict[int, tuple[int, range, int]] = {}  # slots -> (expert, its kernels, its first new buffer)
    start = 0
    for e in range(n_experts):
        n = slots // n_experts + (1 if e < slots % n_experts else 0)
        if n == 0:
            continue
        if rec is not None and n in traced:
            t, kernels, first_buffer = traced[n]
            rec.replicate(kernels, first_buffer, _expert_buffers(rec, self, t, e), (f"_list.{t}", f"_list.{e}"))
            start += n
            continue
        k0, b0 = (len(rec.kernels), len(rec.buffers)) if rec is not None else (0, 0)
        tok = token_of_slot[start:start + n]
        x = ops.moe_dispatch(hidden, tok)
        y = self.down_list[e](_gated(self, self.up_list[e](x)))
        ops.moe_combine_(out, tok, y, flat_w[start:start + n])
        if rec is not None:
            traced[n] = (e, range(k0, len(rec.kernels)), b0)
        start += n
    return out


def _expert_buffers(rec: Recorder, mod: Any, t: int, e: int) -> dict[int, int]:
    """Buffer ids of expert ``t``'s weights -> expert ``e``'s (weight, bias, scale of up and down)."""
    src = [p for lst in (mod.up_list, mod.down_list) for p in (*lst[t].parameters(), *lst[t].buffers())]
    dst = [p for lst in (mod.up_list, mod.down_list) for p in (*lst[e].parameters(), *lst[e].buffers())]
    return {rec.buffer_of(a): rec.buffer_of(b) for a, b in zip(src, dst, strict=True)}


@contextmanager
def replicating_experts(rec: Recorder) -> Iterator[None]:
    """While recording in fake mode: trace one expert per slot count per layer, copy the rest."""
    token = _EXPERT_RECORDER.set(rec)
    try:
        yield
    finally:
        _EXPERT_RECORDER.reset(token)


def _topk_moe_forward(self: Any, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Llama 4's mixture block with its router's top-k kept (its own forward runs every expert on every
    token, scaled by a score that is zero off the top-k): shared expert + balanced routed experts."""
    hidden = hidden.reshape(-1, self.hidden_dim)
    scores, logits = self.router(hidden)  # [tokens, E]: sigmoid of the top-k logits, 0 elsewhere
    top_w, top_i = torch.topk(scores, self.top_k, dim=1)
    out = self.shared_expert(hidden)
    out.add_(self.experts(hidden, top_i, top_w))
    return out, logits


def route_dense_mixtures(model: nn.Module) -> None:
    """Mixture blocks whose experts take one argument (every token to every expert): top-k first."""
    for mod in model.modules():
        experts = getattr(mod, "experts", None)
        if isinstance(experts, nn.Module) and hasattr(mod, "router") and hasattr(mod, "shared_expert") \
                and len(inspect.signature(type(experts).forward).parameters) == 2:
            mod.forward = types.MethodType(_topk_moe_forward, mod)


def text_entry(model: nn.Module) -> nn.Module:
    """The module a text-only step (prefill/decode) calls: the model, or its ``TEXT_ENTRY`` submodule."""
    sub = TEXT_ENTRY.get(getattr(model.config, "model_type", ""))
    return model.get_submodule(sub) if sub else model


# ---- attention whose value head dim differs from the key's (MLA) ------------------------------------------------

MLA_ATTENTION = "tessera_sdpa"


def _mla_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa, except where v's head dim differs from q's: there torch's sdpa falls back to its
    math path on CPU (bmm, softmax, bmm as separate kernels), so the attention is one ``tessera::attention``
    kernel instead, as FlashAttention/FlashMLA run it on a GPU. An MLA module whose latents reach here
    unexpanded (``absorb_mla``) attends as a serving engine does: a decode step absorbed over the
    compressed cache, a prefill over keys and values expanded from it."""
    from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward

    if getattr(module, "tessera_latent", False):
        if query.shape[2] == 1:
            return _absorbed_mla(module, query, key, value, attention_mask, scaling)
        key, value = type(module).expand_kv(module, key, value)
    if query.shape[-1] == value.shape[-1]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    causal = query.shape[2] > 1 and attention_mask is None and (is_causal is not False)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    mask = attention_mask[..., : key.shape[2]] if attention_mask is not None else None
    out = ops.attention(query, key, value, mask, scale, causal)
    return out.transpose(1, 2).contiguous(), None


def _latents(self: Any, kv_nope: torch.Tensor, k_rot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """An MLA module's ``expand_kv`` under capture: the cached latents go to the attention function as they
    are ([B, 1, S, kv_lora_rank], [B, 1, S, qk_rope_head_dim]); it expands them only for a prefill."""
    return kv_nope, k_rot


def absorb_mla(model: nn.Module) -> int:
    """MLA modules (DeepSeek V2/V3 and their kin: a ``kv_b_proj`` and an ``expand_kv``): decode attends over
    the compressed latent with absorbed weights. transformers expands the whole cache through kv_b_proj at
    every step (a GEMM over every cached token), which no serving engine does. Quantised kv_b_proj weights
    get the bf16 W_UK / W_UV copies an engine derives from them at load (resident). Returns how many."""
    count = 0
    for mod in model.modules():
        if not (hasattr(mod, "kv_b_proj") and hasattr(mod, "expand_kv") and hasattr(mod, "kv_lora_rank")):
            continue
        mod.expand_kv = types.MethodType(_latents, mod)
        mod.tessera_latent = True
        w = getattr(mod.kv_b_proj, "weight", None)
        if not (isinstance(w, torch.Tensor) and w.is_floating_point() and w.element_size() > 1):
            heads, nope, v = mod.num_heads, mod.qk_nope_head_dim, mod.v_head_dim
            set_resident(mod, "w_uk", torch.empty(heads, nope, mod.kv_lora_rank))
            set_resident(mod, "w_uv", torch.empty(heads, v, mod.kv_lora_rank))
        count += 1
    return count


def _absorbed_weights(mod: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UK [H, nope, r] and W_UV [H, v, r]: views of kv_b_proj's weight [H·(nope + v), r], or the resident
    bf16 copies of a quantised one."""
    if hasattr(mod, "w_uk"):
        return mod.w_uk, mod.w_uv
    w = mod.kv_b_proj.weight.view(mod.num_heads, mod.qk_nope_head_dim + mod.v_head_dim, mod.kv_lora_rank)
    return w[:, : mod.qk_nope_head_dim], w[:, mod.qk_nope_head_dim:]


def _absorbed_mla(mod: Any, query: torch.Tensor, kv_nope: torch.Tensor, k_rot: torch.Tensor,
                  attention_mask: torch.Tensor | None, scaling: float | None) -> tuple[torch.Tensor, None]:
    """One decode token per sequence (query [B, H, 1, nope + rope]) attending over the latent cache:
    q_latent = q_nope · W_UK per head (a bmm over heads, [H, B, nope] × [H, nope, r]); one
    ``tessera::mla_attention`` kernel over the cache; its [B, H, 1, r] output · W_UVᵀ per head (bmm)."""
    b, h, _, _ = query.shape
    w_uk, w_uv = _absorbed_weights(mod)
    q_nope, q_rot = torch.split(query, [mod.qk_nope_head_dim, mod.qk_rope_head_dim], dim=-1)
    q_latent = torch.bmm(q_nope.reshape(b, h, -1).transpose(0, 1), w_uk.to(query.dtype))  # [H, B, r]
    q_latent = q_latent.transpose(0, 1).unsqueeze(2)  # [B, H, 1, r]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    mask = attention_mask[..., : kv_nope.shape[2]] if attention_mask is not None else None
    out = ops.mla_attention(q_latent, q_rot, kv_nope, k_rot, mask, scale)  # [B, H, 1, r]
    out = torch.bmm(out.squeeze(2).transpose(0, 1), w_uv.to(query.dtype).transpose(1, 2))  # [H, B, v]
    return out.transpose(0, 1).unsqueeze(1).contiguous(), None  # [B, 1, H, v]


def attention_implementation(conf: Any, default: str) -> str:
    """``default``, or the MLA-aware sdpa where the text model's value head dim differs from its key's."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    text = conf.get_text_config(decoder=True)
    v_dim = getattr(text, "v_head_dim", None)
    qk_dim = getattr(text, "qk_head_dim", None) or (getattr(text, "qk_nope_head_dim", 0) or 0) + \
        (getattr(text, "qk_rope_head_dim", 0) or 0)
    if default != "sdpa" or not v_dim or not qk_dim or v_dim == qk_dim:
        return default
    AttentionInterface.register(MLA_ATTENTION, _mla_sdpa)
    AttentionMaskInterface.register(MLA_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return MLA_ATTENTION
