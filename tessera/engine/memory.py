"""Will an engine fit in this machine's memory? Checked before any real tensor is allocated.

    need = weights + KV pages + per-slot states + activations of the largest iteration

Weights are counted on the meta device in the run's dtype; KV is pages × page_size × layers × 2 ×
kv_heads × head_dim; Mamba-2 states are conv (dtype) and SSM (fp32) per slot; activations are an upper
estimate of one iteration of ``max_num_batched_tokens`` tokens (the residual stream, the widest
projection and its activation, in fp32) plus the attention scratch of the widest case (a decode batch's
gathered keys and values, or one chunk's scores) and the logits of ``max_num_seqs`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tessera.engine.arch import ModelArch
from tessera.engine.config import EngineConfig
from tessera.engine.models import weight_bytes
from tessera.errors import UserError

MEMINFO = Path("/proc/meminfo")
FP32 = 4


@dataclass(frozen=True, kw_only=True)
class MemoryNeed:
    weights_bytes: int
    kv_bytes: int
    state_bytes: int
    activation_bytes: int

    def __post_init__(self) -> None:
        if min(self.weights_bytes, self.kv_bytes, self.state_bytes, self.activation_bytes) < 0:
            raise ValueError(f"MemoryNeed: negative bytes {self}")

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.state_bytes + self.activation_bytes


def memory_need(arch: ModelArch, config: EngineConfig, dtype: torch.dtype) -> MemoryNeed:
    elem = torch.empty(0, dtype=dtype).element_size()
    kv = config.pages(arch) * config.page_size * arch.kv_elements_per_token * elem
    state = 0
    widest = arch.hidden_size
    if arch.mamba is not None:
        m = arch.mamba
        per_layer = m.conv_dim * (m.conv_kernel - 1) * elem + m.heads * m.head_dim * m.state_size * FP32
        state = config.max_num_seqs * arch.num_layers * per_layer
        widest = max(widest, m.proj_size)
    else:
        qkv = (arch.num_heads + 2 * arch.num_kv_heads) * arch.head_dim
        widest = max(widest, arch.intermediate_size * 2, qkv)
    tokens = config.max_num_batched_tokens
    length = config.model_len(arch) or tokens
    scratch = 0
    if arch.family == "decoder":
        decode = config.max_num_seqs * length * arch.num_heads * arch.head_dim * 2 * elem
        chunk = arch.num_heads * tokens * length * FP32
        scratch = max(decode, chunk)
    activations = tokens * (4 * arch.hidden_size + 3 * widest) * FP32 + scratch \
        + 2 * config.max_num_seqs * arch.vocab_size * FP32
    return MemoryNeed(weights_bytes=weight_bytes(arch, dtype), kv_bytes=kv, state_bytes=state,
                      activation_bytes=activations)


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of /proc/meminfo in bytes; None where there is no such file (not Linux)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def check_memory(model: str, need: MemoryNeed, available: int | None, dtype: str) -> None:
    """One UserError line with the figures when ``need`` exceeds what is available; silent otherwise."""
    if available is None or need.total_bytes <= available:
        return
    gb = 1e9
    smaller = ", or use --dtype bf16" if dtype == "float32" else ""
    raise UserError(
        f"{model} needs {need.total_bytes / gb:.2f} GB but {available / gb:.2f} GB is available: weights "
        f"{need.weights_bytes / gb:.2f} GB in {dtype}, KV pages {need.kv_bytes / gb:.2f} GB, states "
        f"{need.state_bytes / gb:.2f} GB, activations {need.activation_bytes / gb:.2f} GB; lower "
        f"--max-num-seqs, --max-model-len or --max-num-batched-tokens{smaller}")
