"""PyTorch references of Triton kernels, for running a recorded launch on a CPU worker.

Keyed by the kernel's ``module.qualname``; each reference takes the launch's arguments by the kernel's
parameter names plus ``grid`` (a 3-tuple), and writes what the kernel writes, in place. Triton 3.9's
interpreter cannot run every kernel (Liger's RMSNorm and SwiGLU call ``.to`` on a scalar argument, a
Python float there), so a kernel with a reference runs it; any other kernel goes through the interpreter.
The arithmetic follows each kernel's source (its casts included), so a reference's result is the
kernel's up to rounding order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

REFERENCES: dict[str, Callable[..., None]] = {}

_LLAMA, _GEMMA = 0, 1  # Liger's casting modes (rms_norm.py): -1 none, 0 llama, 1 gemma


def _reference(qualname: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    def add(fn: Callable[..., None]) -> Callable[..., None]:
        REFERENCES[qualname] = fn
        return fn
    return add


@_reference("liger_kernel.ops.rms_norm._rms_norm_forward_kernel")
def rms_norm_forward(*, Y_ptr: torch.Tensor, X_ptr: torch.Tensor, W_ptr: torch.Tensor | None,
                     RSTD_ptr: torch.Tensor, n_cols: int, eps: float, offset: float, casting_mode: int,
                     elementwise_affine: bool, grid: tuple[int, int, int], **_: Any) -> None:
    """One program per row: y = x·rstd·(offset + w), rstd = 1/sqrt(mean(x²) + eps); X, Y (rows, n_cols)."""
    rows = grid[0]
    x = X_ptr.reshape(rows, -1)[:, :n_cols]
    xf = x.float() if casting_mode in (_LLAMA, _GEMMA) else x
    rstd = torch.rsqrt(xf.pow(2).mean(dim=-1) + eps)
    RSTD_ptr.reshape(rows).copy_(rstd)
    xn = xf * rstd[:, None]
    if casting_mode == _LLAMA:
        xn = xn.to(x.dtype)  # Llama: only rstd in fp32, the weight multiply in the input dtype
    if elementwise_affine:
        w = W_ptr[:n_cols].float() if casting_mode == _GEMMA else W_ptr[:n_cols]
        xn = xn * (offset + w)
    Y_ptr.reshape(rows, -1)[:, :n_cols].copy_(xn.to(Y_ptr.dtype))


@_reference("liger_kernel.ops.swiglu._swiglu_forward_kernel")
def swiglu_forward(*, a_ptr: torch.Tensor, b_ptr: torch.Tensor, c_ptr: torch.Tensor, gate_multiplier: float,
                   n_cols: int, grid: tuple[int, int, int], **_: Any) -> None:
    """c = silu(a·gate_multiplier in fp32) cast to b's dtype, times b; rows of n_cols."""
    rows = grid[0]
    a = a_ptr.reshape(rows, -1)[:, :n_cols].float() * float(gate_multiplier)
    b = b_ptr.reshape(rows, -1)[:, :n_cols]
    c_ptr.reshape(rows, -1)[:, :n_cols].copy_((a * torch.sigmoid(a)).to(b.dtype) * b)


@_reference("liger_kernel.ops.rope._triton_rope")
def rope(*, q_ptr: torch.Tensor, k_ptr: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sl: int, bs: int,
         cos_bs: int, n_qh: int, n_kh: int, hd: int, rd: int, BACKWARD_PASS: bool = False, **_: Any) -> None:
    """Rotate the first ``rd`` dims of every head in place; q (bs, sl, n_qh, hd), cos/sin (cos_bs, sl, ≥rd/2)."""
    half = rd // 2
    c = cos.reshape(cos_bs, sl, -1)[:, :, None, :half]
    s = sin.reshape(cos_bs, sl, -1)[:, :, None, :half]
    sign = 1 if BACKWARD_PASS else -1  # the backward pass rotates by the opposite angle
    for t, heads in ((q_ptr, n_qh), (k_ptr, n_kh)):
        x = t.reshape(bs, sl, heads, hd)
        x1 = x[..., :half].to(c.dtype)
        x2 = x[..., half:rd].to(c.dtype)
        new1 = x1 * c + sign * x2 * s
        new2 = x2 * c - sign * x1 * s
        x[..., :half].copy_(new1)
        x[..., half:rd].copy_(new2)
