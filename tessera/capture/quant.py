"""Weights as a quantised checkpoint stores them (``quantization_config`` of config.json).

transformers builds the model in the default dtype whatever the config says; this pass replaces each
Linear the checkpoint quantises by a ``QuantLinear`` holding the stored tensors, so weight bytes and GEMM
dtypes are those of the checkpoint:

| quant_method | stored per weight [out, in] | GEMM dtype |
| --- | --- | --- |
| fp8, fbgemm_fp8, compressed-tensors (8-bit float) | float8_e4m3fn + fp32 scale per ``weight_block_size`` block (else per row) | float8_e4m3fn |
| awq, gptq, compressed-tensors (4-bit int) | two 4-bit codes per byte + a bf16 scale per ``group_size`` (default 128) | int4 |
| mxfp4 | two E2M1 codes per byte + a uint8 E8M0 scale per 32 | mxfp4 |

The output embedding (lm_head) and ``modules_to_not_convert`` / ``ignore`` / ``ignored_layers`` stay as built,
as in transformers' quantisers; mxfp4 quantises the experts only (gpt-oss).
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
from torch import nn

from tessera.capture import ops
from tessera.capture.anymodel import set_resident
from tessera.errors import UserError

FORMATS = ("fp8", "int4", "mxfp4")
_METHODS = {"fp8": "fp8", "fbgemm_fp8": "fp8", "awq": "int4", "gptq": "int4", "mxfp4": "mxfp4"}


def stored_format(qcfg: dict[str, Any]) -> str:
    """fp8 | int4 | mxfp4 from a quantization_config, or a one-line error naming the method."""
    method = str(qcfg.get("quant_method", ""))
    if method == "compressed-tensors":  # config_groups.*.weights: {num_bits, type: float | int}
        w = next(iter(qcfg.get("config_groups", {}).values()), {}).get("weights", {})
        fmt = {(8, "float"): "fp8", (4, "int"): "int4"}.get((w.get("num_bits"), w.get("type")))
    else:
        fmt = _METHODS.get(method)
        if fmt == "int4" and qcfg.get("bits", 4) != 4:
            fmt = None
    if fmt is None:
        raise UserError(f"quantization_config quant_method {method!r} ({qcfg.get('bits') or ''} bits) is not "
                        f"modelled; valid: {', '.join(sorted(_METHODS))}, compressed-tensors fp8/int4")
    return fmt


class QuantLinear(nn.Module):
    """A Linear whose weight is stored as ``fmt``: ``weight`` (float8 [out, in] or uint8 [out, in/2]) and
    ``scale``; forward is one ``tessera::quant_linear`` GEMM."""

    def __init__(self, linear: nn.Linear, fmt: str, block: tuple[int, int], group: int) -> None:
        super().__init__()
        out_f, in_f = linear.out_features, linear.in_features
        self.fmt, self.in_features, self.out_features = fmt, in_f, out_f
        if fmt == "fp8":
            rows, cols = (-(-out_f // block[0]), -(-in_f // block[1])) if block[0] else (out_f, 1)
            weight = torch.zeros(out_f, in_f, dtype=torch.float8_e4m3fn)
            scale = torch.ones(rows, cols, dtype=torch.float32)
        else:  # two 4-bit codes per byte
            weight = torch.zeros(out_f, in_f // 2, dtype=torch.uint8)
            per = 32 if fmt == "mxfp4" else group
            scale = (torch.full((out_f, -(-in_f // per)), 127, dtype=torch.uint8) if fmt == "mxfp4"
                     else torch.full((out_f, -(-in_f // per)), 1e-2, dtype=torch.bfloat16))
        set_resident(self, "weight", weight)
        set_resident(self, "scale", scale)
        if isinstance(linear.bias, nn.Parameter):
            self.bias = linear.bias
        else:  # None, or an expert's bias held as a buffer under fake tensors: still a weight
            set_resident(self, "bias", linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ops.quant_linear(x, self.weight, self.scale, self.bias, self.fmt, self.in_features)


def _skip_patterns(qcfg: dict[str, Any]) -> list[str]:
    names = [*(qcfg.get("modules_to_not_convert") or []), *(qcfg.get("ignore") or []),
             *(qcfg.get("ignored_layers") or [])]
    return [n.removeprefix("re:") for n in names]


def _skipped(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or fnmatch.fnmatch(path, p + ".*") or path.endswith("." + p) or path == p
               for p in patterns)


def quantise(model: nn.Module, qcfg: dict[str, Any]) -> int:
    """Replace the Linears the checkpoint stores quantised; returns how many."""
    fmt = stored_format(qcfg)
    block = tuple(qcfg.get("weight_block_size") or (0, 0))
    group = int(qcfg.get("group_size") or 128)
    skip = _skip_patterns(qcfg)
    out_emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    done = 0
    for path, mod in list(model.named_modules()):
        for name, child in list(mod.named_children()):
            full = f"{path}.{name}" if path else name
            if not isinstance(child, nn.Linear) or child is out_emb or _skipped(full, skip):
                continue
            if fmt == "mxfp4" and "experts" not in full:
                continue
            if fmt != "fp8" and child.in_features % 2:
                continue
            setattr(mod, name, QuantLinear(child, fmt, block, group))
            done += 1
    return done
