"""Operators capture adds to a model: MoE token dispatch/combine and GEMMs on weights stored quantised.

Each is one ``torch.library`` custom op, so the recorder sees one kernel per call (as a serving engine
launches one), with a fake implementation for fake tensors and a plain PyTorch one for real tiny runs
and replay. Their names decide their kind in ``classify``: dispatch/combine are MoE routing, the linear
ops GEMMs whose dtype is the stored weight's.
"""

from __future__ import annotations

import torch
from torch import Tensor

# MXFP4 (OCP microscaling): 4-bit E2M1 values, the 16 codes in order (sign bit high), one E8M0 scale per
# 32 values: value = code · 2^(scale − 127).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


@torch.library.custom_op("tessera::moe_dispatch", mutates_args=())
def moe_dispatch(hidden: Tensor, token: Tensor) -> Tensor:
    """Rows ``token`` of ``hidden`` [tokens, hidden]: the token-slots one expert receives."""
    return hidden.index_select(0, token)


@moe_dispatch.register_fake
def _moe_dispatch_fake(hidden: Tensor, token: Tensor) -> Tensor:
    return hidden.new_empty((token.shape[0], hidden.shape[-1]))


@torch.library.custom_op("tessera::moe_combine_", mutates_args=("out",))
def moe_combine_(out: Tensor, token: Tensor, rows: Tensor, weight: Tensor) -> None:
    """``out[token] += rows · weight``: an expert's outputs weighted by the router and added back."""
    out.index_add_(0, token, rows * weight[:, None].to(rows.dtype))


@moe_combine_.register_fake
def _moe_combine_fake(out: Tensor, token: Tensor, rows: Tensor, weight: Tensor) -> None:
    return None


def _unpack_nibbles(packed: Tensor) -> Tensor:
    """uint8 [n, k/2] -> int64 codes [n, k], low nibble first."""
    low, high = packed & 0xF, packed >> 4
    return torch.stack([low, high], dim=-1).reshape(packed.shape[0], -1).long()


def _group_expand(scale: Tensor, n: int, k: int) -> Tensor:
    """A [n/bn, k/bk] (or [n, k/bk]) scale broadcast to [n, k]."""
    return scale.repeat_interleave(n // scale.shape[0], 0).repeat_interleave(k // scale.shape[1], 1)


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


@torch.library.custom_op("tessera::quant_linear", mutates_args=())
def quant_linear(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, fmt: str, in_features: int) -> Tensor:
    """``x @ Wᵀ + b`` with W [out, in] stored as ``fmt``: fp8 (float8_e4m3fn, fp32 block scales), int4
    (two codes per uint8, one scale per group) or mxfp4 (two E2M1 codes per uint8, E8M0 scale per 32)."""
    w = dequantise(weight, scale, fmt, in_features).to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)


@quant_linear.register_fake
def _quant_linear_fake(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, fmt: str,
                       in_features: int) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))
