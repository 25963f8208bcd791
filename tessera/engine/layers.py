"""Kernel modules: each call of one of these (or of an nn.Linear / nn.Embedding) is one node of the traced
program, i.e. one kernel. They take and return flat [tokens, features] tensors, so the graph between them
has no reshapes; whatever is per-sequence happens inside the custom ops of ``tessera.engine.ops``.

Parameter names are those of the Hugging Face checkpoints (``weight``, ``bias``); caches and states are
non-persistent buffers (never loaded, allocated by ``allocate_caches``), as is the rotary table, which is
computed from the config.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tessera.engine import ops


class RMSNorm(nn.Module):
    """transformers' RMSNorm: x / rms(x) in fp32, cast back, times the weight. ``cast_input`` rounds the
    input to the weight's dtype first and ``cast_output`` the result (Mamba-2 keeps its residual stream
    in fp32 and does both, at its layers' and at its final norm)."""

    def __init__(self, size: int, eps: float, *, cast_input: bool = False, cast_output: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps
        self.cast_input, self.cast_output = cast_input, cast_output

    def forward(self, x: Tensor) -> Tensor:
        if self.cast_input:
            x = x.to(self.weight.dtype)
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        out = self.weight * h.to(dtype)
        return out.to(self.weight.dtype) if self.cast_output else out


class HeadRMSNorm(RMSNorm):
    """Qwen3's q_norm / k_norm: RMSNorm over each head_dim slice of a flat [T, heads·head_dim] tensor."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.view(x.shape[0], -1, self.weight.shape[0])).view(x.shape)


class Rotary(nn.Module):
    """Rotary position embedding of a flat [T, heads·head_dim] q or k at ``positions`` [T], as
    transformers applies it (rotate_half layout; cos and sin in fp32, cast to x's dtype)."""

    def __init__(self, inv_freq: tuple[float, ...], scaling: float) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.tensor(inv_freq, dtype=torch.float32), persistent=False)
        self.scaling = scaling

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        half = self.inv_freq.shape[0]
        freqs = positions[:, None].float() * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.scaling).to(x.dtype)[:, None, :]
        sin = (emb.sin() * self.scaling).to(x.dtype)[:, None, :]
        h = x.view(x.shape[0], -1, 2 * half)
        rotated = torch.cat((-h[..., half:], h[..., :half]), dim=-1)
        return (h * cos + rotated * sin).view(x.shape)


class SiluAndMul(nn.Module):
    """silu(gate) · up: the MLP's activation between its gate/up and down projections."""

    def forward(self, gate: Tensor, up: Tensor) -> Tensor:
        return F.silu(gate) * up


class PagedAttention(nn.Module):
    """One layer's attention over its paged KV cache (``ops.paged_attention``): writes the iteration's K/V,
    attends causally. The caches are [pages, page_size, kv_heads, head_dim] buffers."""

    def __init__(self, kv_heads: int, head_dim: int, window: int) -> None:
        super().__init__()
        self.kv_heads, self.head_dim, self.window = kv_heads, head_dim, window
        self.scale = head_dim ** -0.5
        self.register_buffer("k_cache", torch.empty(0, 1, kv_heads, head_dim), persistent=False)
        self.register_buffer("v_cache", torch.empty(0, 1, kv_heads, head_dim), persistent=False)

    def allocate(self, pages: int, page_size: int, dtype: torch.dtype, device: torch.device | str) -> None:
        shape = (pages, page_size, self.kv_heads, self.head_dim)
        self.k_cache = torch.zeros(shape, dtype=dtype, device=device)
        self.v_cache = torch.zeros(shape, dtype=dtype, device=device)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, slot_mapping: Tensor, block_table: Tensor,
                query_start_loc: Tensor, seq_lens: Tensor) -> Tensor:
        return ops.paged_attention(q, k, v, self.k_cache, self.v_cache, slot_mapping, block_table,
                                   query_start_loc, seq_lens, self.scale, self.window)


class Expert(nn.Module):
    """One expert's three projections under the checkpoint's names (Mixtral: w1 gate, w3 up, w2 down;
    Qwen3-MoE: gate_proj, up_proj, down_proj)."""

    def __init__(self, hidden: int, inter: int, names: tuple[str, str, str]) -> None:
        super().__init__()
        self.names = names
        gate, up, down = names
        self.add_module(gate, nn.Linear(hidden, inter, bias=False))
        self.add_module(up, nn.Linear(hidden, inter, bias=False))
        self.add_module(down, nn.Linear(inter, hidden, bias=False))

    def weights(self) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(getattr(self, n).weight for n in self.names)  # type: ignore[return-value]


class Experts(nn.ModuleList):
    """A layer's experts as one kernel (``ops.fused_moe``): routing from the router's logits, then the
    selected experts' MLPs. Children are named 0..E-1 as in the checkpoint."""

    def __init__(self, experts: list[Expert], top_k: int, renormalize: bool, weights_fp32: bool) -> None:
        super().__init__(experts)
        self.top_k, self.renormalize, self.weights_fp32 = top_k, renormalize, weights_fp32

    def forward(self, hidden: Tensor, router_logits: Tensor) -> Tensor:
        gate, up, down = zip(*(e.weights() for e in self), strict=True)
        return ops.fused_moe(hidden, router_logits, list(gate), list(up), list(down), self.top_k,
                             self.renormalize, self.weights_fp32)


class MambaConv(nn.Module):
    """Mamba-2's causal depthwise conv + SiLU over in_proj's x·B·C channels, with each slot's history
    (``ops.mamba_conv``); named conv1d with the checkpoint's weight [C, 1, K] and bias [C]."""

    def __init__(self, channels: int, kernel: int, bias: bool, start: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        self.start = start
        self.register_buffer("conv_state", torch.empty(0, channels, kernel - 1), persistent=False)

    def allocate(self, slots: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.conv_state = torch.zeros(slots, *self.conv_state.shape[1:], dtype=dtype, device=device)

    def forward(self, proj: Tensor, state_slots: Tensor, query_start_loc: Tensor, seq_lens: Tensor) -> Tensor:
        return ops.mamba_conv(proj, self.weight, self.bias, self.conv_state, state_slots, query_start_loc,
                              seq_lens, self.start)


class GatedRMSNorm(nn.Module):
    """Mamba-2's norm of the scan output gated by silu(z) (z: in_proj's first ``size`` channels), in fp32
    per group of channels, returned in the weight's dtype for out_proj."""

    def __init__(self, size: int, groups: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.groups, self.eps = groups, eps

    def forward(self, y: Tensor, proj: Tensor) -> Tensor:
        size = self.weight.shape[0]
        dtype = y.dtype
        h = y.float() * F.silu(proj[:, :size].float())
        g = h.view(h.shape[0], self.groups, -1)
        h = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + self.eps)).view(h.shape)
        return (self.weight * h.to(dtype)).to(self.weight.dtype)


class Residual(nn.Module):
    """residual + x, the residual first cast to fp32 where the model keeps its residual stream in fp32."""

    def __init__(self, fp32: bool) -> None:
        super().__init__()
        self.fp32 = fp32

    def forward(self, residual: Tensor, x: Tensor) -> Tensor:
        return (residual.float() if self.fp32 else residual) + x


# Modules the tracer keeps whole: one call, one kernel node.
KERNEL_MODULES = (nn.Linear, nn.Embedding, RMSNorm, Rotary, SiluAndMul, PagedAttention, Experts, MambaConv,
                  GatedRMSNorm, Residual)
