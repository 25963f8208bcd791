"""Zoo variants with Liger-Kernel's Triton kernels (RMSNorm, SwiGLU, rotary) in place of the PyTorch modules.

Liger-Kernel (BSD-2) patches a transformers model family's module classes and functions; its kernels are
plain ``@triton.jit`` functions launched from autograd Functions, so a traced step meets real third-party
Triton launches (``tessera.capture.triton_launch`` records them). The patch is global to the modeling
module, so it is applied only while a variant is built and traced, and undone afterwards: the plain zoo
models in the same process keep their PyTorch modules.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# variant -> the zoo model it patches
LIGER_VARIANTS = {
    "llama-tiny-liger": "llama-tiny", "llama-3-8b-liger": "llama-3-8b",
    "qwen-tiny-liger": "qwen-tiny", "qwen2.5-7b-liger": "qwen2.5-7b",
    "mixtral-tiny-liger": "moe-tiny", "mixtral-8x7b-liger": "mixtral-8x7b",
}
# Liger's Mixtral "swiglu" (transformers 5) swaps the whole experts module for one fused-MoE Triton kernel
# whose work depends on the router's choice; the capture models routing as balanced and splits the
# experts into per-expert GEMMs (tessera.capture.anymodel), which that module does not support (it has
# no act_fn). Mixtral's variant therefore takes Liger's RMSNorm and rotary kernels only.
_NO_SWIGLU = frozenset({"mixtral"})
KERNELS_KEY = "_kernels"  # config key marking a variant ("liger"); build() drops "_" keys
_APPLY = {"llama": "apply_liger_kernel_to_llama", "qwen2": "apply_liger_kernel_to_qwen2",
          "mixtral": "apply_liger_kernel_to_mixtral"}


def variant_config(base: dict[str, Any]) -> dict[str, Any]:
    if base.get("model_type") not in _APPLY:
        raise ValueError(f"Liger variants exist for model_type {sorted(_APPLY)}, not {base.get('model_type')!r}")
    return {**base, KERNELS_KEY: "liger"}


@contextmanager
def kernels_applied(config: dict[str, Any]) -> Iterator[None]:
    """Liger's kernels patched into the config's modeling module for the duration (nothing for other models)."""
    if config.get(KERNELS_KEY) != "liger":
        yield
        return
    model_type = config["model_type"]
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    saved = dict(vars(module))
    # Liger probes optional CUDA-only backends at import and logs each miss; nothing here uses them
    logging.getLogger("liger_kernel").setLevel(logging.ERROR)
    import liger_kernel.transformers as lt

    getattr(lt, _APPLY[model_type])(rope=True, rms_norm=True, swiglu=model_type not in _NO_SWIGLU,
                                    cross_entropy=False, fused_linear_cross_entropy=False)
    try:
        yield
    finally:
        for name in [n for n in vars(module) if n not in saved]:
            delattr(module, name)
        for name, value in saved.items():
            setattr(module, name, value)
