"""Kernel kind, FLOPs and shape facts (``Kernel.dims``) of one ATen operator call."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry, sdpa_flop_count

from tessera.graph import KernelKind

aten = torch.ops.aten

# Operator packet names (``func.overloadpacket.__name__`` without a trailing "_") by kind.
_GEMM = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "_grouped_mm", "dot", "mv", "addmv"}
_ATTENTION = {
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention",
    "attention",  # tessera::attention (ops.py): value head dim ≠ key head dim (MLA)
    "mla_attention",  # tessera::mla_attention (ops.py): absorbed MLA over the compressed cache
}
_NORM = {
    "native_layer_norm", "_fused_rms_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "_softmax", "_log_softmax", "softmax", "log_softmax", "sum", "mean",
    "amax", "amin", "max", "min", "var", "var_mean", "std", "std_mean", "linalg_vector_norm", "norm", "prod",
    "argmax", "argmin", "topk", "sort", "logsumexp", "any", "all", "histc", "bincount",
}
# Addresses come from data (an index tensor): these are `indirect`.
_EMBEDDING = {
    "embedding", "index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "index", "_unsafe_index",
    "index_put", "_index_put_impl", "index_add", "index_fill", "masked_scatter", "take", "embedding_bag",
    "_embedding_bag", "nonzero", "masked_select",
}
_COPY = {
    "copy", "_to_copy", "clone", "cat", "stack", "index_copy", "repeat", "constant_pad_nd", "slice_scatter",
    "select_scatter", "as_strided_scatter", "diagonal_scatter", "flip", "roll", "_unsafe_view_copy", "lift_fresh_copy",
    "reflection_pad1d", "replication_pad1d", "tril", "triu", "where_self_copy",
}
_INDIRECT_COPY = {"index_copy"}
# Capture's own MoE ops (tessera/capture/ops.py): tokens to their expert and the weighted results back.
_MOE_ROUTING = {"moe_dispatch", "moe_combine"}
# GEMMs on weights stored quantised (ops.quant_linear): x [..., k] · W [n, k]ᵀ; dtype = the stored format.
_QUANT_GEMM = {"quant_linear"}
_STORED_DTYPE = {"fp8": "float8_e4m3fn", "int4": "int4", "mxfp4": "mxfp4"}
# Chunked SSM state passing and other prefix scans.
_SCAN = {"cumsum", "cumprod", "logcumsumexp", "_cummax_helper", "_cummin_helper"}
_CONV = {"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "_conv_depthwise2d", "mkldnn_convolution",
         "_slow_conv2d_forward", "slow_conv3d_forward", "convolution_overrideable"}
# Fills and ranges touch every element once, like pointwise ops.
_FILL = {"fill", "zero", "zeros", "ones", "full", "arange", "scalar_tensor", "zeros_like", "ones_like", "full_like",
         "linspace", "floor_divide", "randn", "rand", "normal", "uniform", "bernoulli", "masked_fill", "where", "clamp"}


def op_name(func: Any) -> str:
    """Packet name with the in-place suffix dropped: ``add_`` -> ``add``, ``__and__`` kept."""
    name: str = func.overloadpacket.__name__
    return name[:-1] if name.endswith("_") and not name.startswith("__") else name


def kind_of(func: Any) -> tuple[KernelKind, bool]:
    """(kind, indirect) of an operator."""
    name = op_name(func)
    if name in _GEMM or name in _QUANT_GEMM:
        return KernelKind.GEMM, False
    if name in _MOE_ROUTING:
        return KernelKind.MOE_ROUTING, True
    if name in _ATTENTION:
        return KernelKind.ATTENTION, False  # decode vs prefill decided from q_len by the caller
    if name in _INDIRECT_COPY:
        return KernelKind.COPY, True
    if name in _EMBEDDING:
        return KernelKind.EMBEDDING, True
    if name in _COPY:
        return KernelKind.COPY, False
    if name in _SCAN:
        return KernelKind.SCAN, False
    if name in _CONV:
        return KernelKind.CONV, False
    if name in _NORM:
        return KernelKind.NORM, False
    if name in _FILL or torch.Tag.pointwise in func.tags:
        return KernelKind.ELEMENTWISE, False
    return KernelKind.OTHER, False


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def flops_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> int:
    """Matmul/conv/attention FLOPs from torch's flop counter; our formula where it has none."""
    packet = func.overloadpacket
    if op_name(func) in _QUANT_GEMM:  # 2·m·n·k, as for any GEMM: dequantisation is not counted
        x, w = _shape(args[0]), _shape(args[1])
        return 2 * math.prod(x[:-1]) * w[0] * x[-1]
    if op_name(func) == "mla_attention":  # scores over latent + rope dims, then values over the latent
        b, h, q, r = _shape(args[0])
        s, p = _shape(args[2])[2], _shape(args[3])[-1]
        return 2 * b * h * q * s * (r + p) + 2 * b * h * q * s * r
    if packet in flop_registry:
        return int(flop_registry[packet](*args, **kwargs, out_val=out))
    if op_name(func) in _ATTENTION:
        # torch's counter has no entry for the CPU flash kernel: same formula as its SDPA entries,
        # 2·B·H·q·kv·d for QKᵀ plus the same for PV = 4·B·H·q·kv·d (causal masking not discounted).
        return int(sdpa_flop_count(_shape(args[0]), _shape(args[1]), _shape(args[2])))
    return 0


def dims_of(kind: KernelKind, func: Any, args: tuple[Any, ...], out_tensors: list[torch.Tensor]) -> dict[str, int]:
    """Shape facts per kind, as documented on ``Kernel.dims``."""
    name = op_name(func)
    if kind is KernelKind.GEMM and name in {"mm", "addmm", "bmm", "baddbmm"}:
        a, b = (args[1], args[2]) if name in {"addmm", "baddbmm"} else (args[0], args[1])
        sa, sb = _shape(a), _shape(b)
        batch = sa[0] if len(sa) == 3 else 1
        return {"m": sa[-2], "k": sa[-1], "n": sb[-1], "batch": batch}
    if name == "mla_attention":  # one KV "head": the latent + rope key of each token
        q, kv, rope = _shape(args[0]), _shape(args[2]), _shape(args[3])
        return {"batch": q[0], "heads": q[1], "kv_heads": kv[1], "q_len": q[2], "kv_len": kv[2],
                "head_dim": q[3] + rope[-1], "latent": q[3]}
    if kind in (KernelKind.ATTENTION, KernelKind.ATTENTION_DECODE):
        q, k = _shape(args[0]), _shape(args[1])
        return {"batch": q[0], "heads": q[1], "kv_heads": k[1], "q_len": q[2], "kv_len": k[2], "head_dim": q[3]}
    if name in _QUANT_GEMM:
        x, w = _shape(args[0]), _shape(args[1])
        return {"m": math.prod(x[:-1]), "k": x[-1], "n": w[0], "batch": 1}
    numel = max((math.prod(_shape(t)) for t in out_tensors), default=0)
    if numel == 0:
        numel = max((math.prod(_shape(a)) for a in args if isinstance(a, torch.Tensor)), default=0)
    return {"numel": int(numel)}


def kernel_dtype(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], first: torch.Tensor) -> str:
    """The dtype a kernel computes in: a quantised GEMM's stored weight format, else its first output's."""
    if op_name(func) in _QUANT_GEMM:
        fmt = args[4] if len(args) > 4 else kwargs["fmt"]
        return _STORED_DTYPE[fmt]
    return str(first.dtype).removeprefix("torch.")
