"""What the engine needs to know about a model, read once from its Hugging Face config.

``ModelArch`` is the one contract between a config.json and the model programs: dimensions, which
family's program to build, the rotary frequencies (computed from the config, never loaded), per-layer
sliding windows, the MoE routing rule and the Mamba-2 dimensions. Supported model types are listed in
``SUPPORTED``; anything else is one line naming them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from tessera.capture.anymodel import transformers_config
from tessera.errors import UserError

# model_type -> program family. "decoder": attention + MLP or MoE blocks; "mamba2": Mamba-2 mixers.
SUPPORTED = {"llama": "decoder", "mistral": "decoder", "qwen2": "decoder", "qwen3": "decoder",
             "mixtral": "decoder", "qwen3_moe": "decoder", "mamba2": "mamba2"}
# Rotary scalings whose frequencies do not depend on the sequence length (so one table serves every
# iteration); "dynamic" and "longrope" rescale with the length and are refused.
STATIC_ROPE = ("default", "linear", "llama3", "yarn")
SPECIAL_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


@dataclass(frozen=True, kw_only=True)
class MoeSpec:
    """Top-k softmax routing as transformers runs it. ``style`` names the checkpoint's expert tensors:
    "mixtral" (block_sparse_moe.experts.E.w1/w3/w2) or "qwen3_moe" (mlp.experts.E.gate/up/down_proj)."""

    experts: int
    top_k: int
    intermediate_size: int
    renormalize: bool  # top-k weights divided by their sum (Mixtral always; Qwen3-MoE: norm_topk_prob)
    weights_fp32: bool  # Mixtral multiplies expert outputs by fp32 weights; Qwen3-MoE casts them first
    style: str
    layers: tuple[bool, ...]  # which layers are sparse (Qwen3-MoE's mlp_only_layers are dense)

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= self.experts:
            raise UserError(f"MoE config: num_experts_per_tok={self.top_k} must be in 1..{self.experts}")
        if self.style not in ("mixtral", "qwen3_moe"):
            raise ValueError(f"MoeSpec style {self.style!r} not in ('mixtral', 'qwen3_moe')")


@dataclass(frozen=True, kw_only=True)
class MambaSpec:
    """Mamba-2 mixer dimensions (transformers' Mamba2Config names)."""

    heads: int
    head_dim: int
    groups: int
    state_size: int
    conv_kernel: int
    intermediate_size: int  # expand · hidden
    chunk_size: int
    dt_min: float  # time_step_limit: dt clamped to [dt_min, dt_max] in the chunked scan
    dt_max: float
    conv_bias: bool
    bias: bool  # in_proj / out_proj bias
    residual_fp32: bool

    def __post_init__(self) -> None:
        if self.heads * self.head_dim != self.intermediate_size or self.heads % self.groups:
            raise UserError(f"mamba2 config: num_heads={self.heads} x head_dim={self.head_dim} must equal "
                            f"expand x hidden_size={self.intermediate_size}, and n_groups={self.groups} "
                            f"divide num_heads")

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: x, B and C."""
        return self.intermediate_size + 2 * self.groups * self.state_size

    @property
    def proj_size(self) -> int:
        """in_proj's output: gate z, then x·B·C, then dt per head."""
        return self.intermediate_size + self.conv_dim + self.heads


@dataclass(frozen=True, kw_only=True)
class ModelArch:
    model_type: str
    family: str  # decoder | mamba2
    vocab_size: int
    hidden_size: int
    num_layers: int
    norm_eps: float
    tie_word_embeddings: bool
    context_window: int | None  # max_position_embeddings; None: no positional limit (Mamba-2)
    eos_token_ids: tuple[int, ...] = ()
    # decoder
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k before rotary
    windows: tuple[int, ...] = ()  # per layer: sliding window in tokens, 0 = full attention
    inv_freq: tuple[float, ...] = ()  # rotary inverse frequencies, head_dim / 2 of them
    rope_scaling: float = 1.0  # transformers' attention_scaling (cos and sin multiplied by it)
    moe: MoeSpec | None = None
    mamba: MambaSpec | None = None

    def __post_init__(self) -> None:
        if self.family not in ("decoder", "mamba2"):
            raise ValueError(f"ModelArch family {self.family!r} not in ('decoder', 'mamba2')")
        sizes = ("vocab_size", "hidden_size", "num_layers")
        bad = {k: getattr(self, k) for k in sizes if getattr(self, k) < 1}
        if bad:
            raise UserError(f"{self.model_type} config: {bad} must be positive")
        if self.family == "decoder":
            if self.num_heads < 1 or self.num_kv_heads < 1 or self.num_heads % self.num_kv_heads:
                raise UserError(f"{self.model_type} config: num_attention_heads={self.num_heads} must be a "
                                f"positive multiple of num_key_value_heads={self.num_kv_heads}")
            if len(self.windows) != self.num_layers or len(self.inv_freq) * 2 != self.head_dim:
                raise ValueError(f"ModelArch: {len(self.windows)} windows for {self.num_layers} layers, "
                                 f"{len(self.inv_freq)} rotary frequencies for head_dim {self.head_dim}")
        elif self.mamba is None:
            raise ValueError("ModelArch: a mamba2 family needs its MambaSpec")

    @property
    def kv_elements_per_token(self) -> int:
        """K and V of one token over all layers (times the cache dtype's size: bytes)."""
        return 0 if self.family != "decoder" else 2 * self.num_layers * self.num_kv_heads * self.head_dim


def special_floats(obj: Any) -> Any:
    """transformers writes inf and nan into config.json as {"__float__": "Infinity"} (Mamba-2's
    time_step_limit): the floats back."""
    if isinstance(obj, dict):
        if set(obj) == {"__float__"} and obj["__float__"] in SPECIAL_FLOATS:
            return SPECIAL_FLOATS[obj["__float__"]]
        return {k: special_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [special_floats(v) for v in obj]
    return obj


def arch_of(config: dict[str, Any], where: str) -> ModelArch:
    """The ModelArch of a config.json's contents; an unsupported type or field is one UserError line."""
    config = special_floats(config)
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise UserError(f"{where}: model_type {model_type!r} has no engine program; supported: "
                        + ", ".join(sorted(SUPPORTED)))
    conf = transformers_config(config, where)
    act = getattr(conf, "hidden_act", "silu")
    if act != "silu":
        raise UserError(f"{where}: hidden_act {act!r}: the engine's programs implement silu only")
    eos = conf.eos_token_id
    common = dict(model_type=model_type, family=SUPPORTED[model_type], vocab_size=int(conf.vocab_size),
                  hidden_size=int(conf.hidden_size), num_layers=int(conf.num_hidden_layers),
                  tie_word_embeddings=bool(conf.tie_word_embeddings),
                  eos_token_ids=tuple(int(e) for e in (eos if isinstance(eos, list) else [eos])
                                      if e is not None))
    if model_type == "mamba2":
        return ModelArch(**common, norm_eps=float(conf.layer_norm_epsilon), context_window=None,
                         mamba=_mamba_spec(conf))
    heads = int(conf.num_attention_heads)
    head_dim = int(getattr(conf, "head_dim", None) or conf.hidden_size // heads)
    inv_freq, scaling = _rotary(conf, head_dim, where)
    bias = bool(getattr(conf, "attention_bias", False))
    return ModelArch(
        **common, norm_eps=float(conf.rms_norm_eps), context_window=int(conf.max_position_embeddings),
        num_heads=heads, num_kv_heads=int(getattr(conf, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        intermediate_size=int(conf.intermediate_size), qkv_bias=bias or model_type == "qwen2", o_bias=bias,
        mlp_bias=bool(getattr(conf, "mlp_bias", False)), qk_norm=model_type in ("qwen3", "qwen3_moe"),
        windows=_windows(conf), inv_freq=inv_freq, rope_scaling=scaling, moe=_moe_spec(conf, model_type),
    )


def _rotary(conf: Any, head_dim: int, where: str) -> tuple[tuple[float, ...], float]:
    """Inverse frequencies and attention scaling from the config, as transformers computes them."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(conf, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", "default")
    if rope_type not in STATIC_ROPE:
        raise UserError(f"{where}: rope_type {rope_type!r} is not supported; supported: "
                        f"{', '.join(STATIC_ROPE)}")
    if rope_type == "default":
        theta = float(params.get("rope_theta", getattr(conf, "rope_theta", 10000.0)))
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        scaling = 1.0
    else:
        inv, scaling = ROPE_INIT_FUNCTIONS[rope_type](conf, torch.device("cpu"))
    return tuple(float(x) for x in inv.tolist()), float(scaling)


def _windows(conf: Any) -> tuple[int, ...]:
    """Per layer sliding window (0 = full): transformers' layer_types where the config has them (Qwen2/3),
    else the model-wide sliding_window (Mistral, Mixtral)."""
    n = int(conf.num_hidden_layers)
    window = int(getattr(conf, "sliding_window", None) or 0)
    types = getattr(conf, "layer_types", None)
    if types is not None:
        return tuple(window if t == "sliding_attention" else 0 for t in types[:n])
    return (window,) * n


def _moe_spec(conf: Any, model_type: str) -> MoeSpec | None:
    if model_type == "mixtral":
        return MoeSpec(experts=int(conf.num_local_experts), top_k=int(conf.num_experts_per_tok),
                       intermediate_size=int(conf.intermediate_size), renormalize=True, weights_fp32=True,
                       style="mixtral", layers=(True,) * int(conf.num_hidden_layers))
    if model_type == "qwen3_moe":
        n, step, dense = int(conf.num_hidden_layers), int(conf.decoder_sparse_step), set(conf.mlp_only_layers)
        experts = int(conf.num_experts)
        return MoeSpec(experts=experts, top_k=int(conf.num_experts_per_tok),
                       intermediate_size=int(conf.moe_intermediate_size),
                       renormalize=bool(conf.norm_topk_prob),
                       weights_fp32=False, style="qwen3_moe",
                       layers=tuple(i not in dense and experts > 0 and (i + 1) % step == 0 for i in range(n)))
    return None


def _mamba_spec(conf: Any) -> MambaSpec:
    lo, hi = conf.time_step_limit
    return MambaSpec(heads=int(conf.num_heads), head_dim=int(conf.head_dim), groups=int(conf.n_groups),
                     state_size=int(conf.state_size), conv_kernel=int(conf.conv_kernel),
                     intermediate_size=int(conf.expand * conf.hidden_size), chunk_size=int(conf.chunk_size),
                     dt_min=float(lo), dt_max=float(hi) if math.isfinite(float(hi)) else math.inf,
                     conv_bias=bool(conf.use_conv_bias), bias=bool(conf.use_bias),
                     residual_fp32=bool(conf.residual_in_fp32))
