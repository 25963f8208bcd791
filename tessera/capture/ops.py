"""Operators capture adds to a model: MoE token dispatch/combine and GEMMs on weights stored quantised.

Each is one operator in the ``tessera`` namespace, so the recorder sees one kernel per call (as a serving
engine launches one), with a CPU implementation (real tiny runs and replay) and a Meta one (fake tensors
use it for shapes). Their names decide their kind in ``classify``: dispatch/combine are MoE routing, the
linear op a GEMM whose dtype is the stored weight's. Defined with ``torch.library.Library`` rather than
``custom_op``: the latter's wrapper costs ~4× more per call under fake tensors (0.9 ms vs 0.2 ms for
combine), and DeepSeek-V3 has 14,848 experts to dispatch and combine.
"""

from __future__ import annotations

import torch
from torch import Tensor

# MXFP4 (OCP microscaling): 4-bit E2M1 values, the 16 codes in order (sign bit high), one E8M0 scale per
# 32 values: value = code · 2^(scale − 127).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)

_LIB = torch.library.Library("tessera", "DEF")
_LIB.define("moe_dispatch(Tensor hidden, Tensor token) -> Tensor")
_LIB.define("moe_combine_(Tensor(a!) out, Tensor token, Tensor rows, Tensor weight) -> ()")
_LIB.define("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, bool causal) -> Tensor")
_LIB.define("mla_attention(Tensor q_latent, Tensor q_rope, Tensor kv_latent, Tensor k_rope, Tensor? mask, float scale) "
            "-> Tensor")
_LIB.define("quant_linear(Tensor x, Tensor weight, Tensor scale, Tensor? bias, str fmt, int in_features) -> Tensor")


def _dispatch_cpu(hidden: Tensor, token: Tensor) -> Tensor:
    """Rows ``token`` of ``hidden`` [tokens, hidden]: the token-slots one expert receives."""
    return hidden.index_select(0, token)


def _dispatch_meta(hidden: Tensor, token: Tensor) -> Tensor:
    return hidden.new_empty((token.shape[0], hidden.shape[-1]))


def _combine_cpu(out: Tensor, token: Tensor, rows: Tensor, weight: Tensor) -> None:
    """``out[token] += rows · weight``: an expert's outputs weighted by the router and added back."""
    out.index_add_(0, token, rows * weight[:, None].to(rows.dtype))


def _combine_meta(out: Tensor, token: Tensor, rows: Tensor, weight: Tensor) -> None:
    return None


def _unpack_nibbles(packed: Tensor) -> Tensor:
    """uint8 [n, k/2] -> int64 codes [n, k], low nibble first."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1).long()


def _group_expand(scale: Tensor, n: int, k: int) -> Tensor:
    """A [n/bn, k/bk] (or [n, k/bk]) scale broadcast to [n, k]."""
    rows = scale.repeat_interleave(-(-n // scale.shape[0]), 0)[:n]
    return rows.repeat_interleave(-(-k // scale.shape[1]), 1)[:, :k]


def dequantise(weight: Tensor, scale: Tensor, fmt: str, k: int) -> Tensor:
    """The float32 [n, k] weight a stored one stands for (real mode; fake mode never computes it)."""
    n = weight.shape[0]
    if fmt == "fp8":
        return weight.float() * _group_expand(scale.float(), n, k)
    codes = _unpack_nibbles(weight)
    if fmt == "int4":  # symmetric: code − 8
        return (codes - 8).float() * _group_expand(scale.float(), n, k)
    assert fmt == "mxfp4", f"unknown stored format {fmt}"
    values = torch.tensor(_E2M1)[codes]
    return values * torch.exp2(_group_expand(scale.float(), n, k) - 127.0)


def _quant_linear_cpu(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, fmt: str,
                      in_features: int) -> Tensor:
    """``x @ Wᵀ + b`` with W [out, in] stored as ``fmt``: fp8 (float8_e4m3fn, fp32 block scales), int4
    (two codes per uint8, one scale per group) or mxfp4 (two E2M1 codes per uint8, E8M0 scale per 32)."""
    w = dequantise(weight, scale, fmt, in_features).to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)


def _quant_linear_meta(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, fmt: str,
                       in_features: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _attention_cpu(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool) -> Tensor:
    """softmax(q·kᵀ·scale + mask)·v for a value head dim other than the key's (MLA: 192 vs 128), one kernel
    as FlashAttention/FlashMLA run it; q [B, H, q, dk], k [B, H, kv, dk], v [B, H, kv, dv]."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, is_causal=causal)


def _mla_attention_cpu(q_latent: Tensor, q_rope: Tensor, kv_latent: Tensor, k_rope: Tensor, mask: Tensor | None,
                       scale: float) -> Tensor:
    """Absorbed MLA attention over the compressed cache, one kernel as FlashMLA runs it: the latent is both
    key (with the rope part) and value. q_latent [B, H, q, r] (the no-rope query through W_UK), q_rope
    [B, H, q, p], kv_latent [B, 1, S, r], k_rope [B, 1, S, p] -> [B, H, q, r] (to go through W_UV)."""
    scores = (q_latent @ kv_latent.transpose(-1, -2) + q_rope @ k_rope.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return torch.softmax(scores.float(), dim=-1).to(kv_latent.dtype) @ kv_latent


def _mla_attention_meta(q_latent: Tensor, q_rope: Tensor, kv_latent: Tensor, k_rope: Tensor, mask: Tensor | None,
                        scale: float) -> Tensor:
    return q_latent.new_empty(q_latent.shape)


def _attention_meta(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float, causal: bool) -> Tensor:
    return q.new_empty((*q.shape[:-1], v.shape[-1]))


for _name, _cpu, _meta in (("attention", _attention_cpu, _attention_meta), ("moe_dispatch", _dispatch_cpu, _dispatch_meta),
                           ("mla_attention", _mla_attention_cpu, _mla_attention_meta),
                           ("moe_combine_", _combine_cpu, _combine_meta),
                           ("quant_linear", _quant_linear_cpu, _quant_linear_meta)):
    _LIB.impl(_name, _cpu, "CPU")
    _LIB.impl(_name, _meta, "Meta")

moe_dispatch = torch.ops.tessera.moe_dispatch
moe_combine_ = torch.ops.tessera.moe_combine_
quant_linear = torch.ops.tessera.quant_linear
attention = torch.ops.tessera.attention
mla_attention = torch.ops.tessera.mla_attention
