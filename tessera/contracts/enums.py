"""Names that cross stage boundaries as closed sets."""

from __future__ import annotations

from enum import StrEnum


class Strategy(StrEnum):
    """How a cell's GPUs serve the model: Tessera's kernel placement, then the four coarse baselines."""

    TESSERA = "tessera"
    HOMOGENEOUS = "homogeneous"
    PREFILL_DECODE = "prefill_decode"
    ATTENTION_FFN = "attention_ffn"
    LAYER_PIPELINE = "layer_pipeline"


# The strategies' names in the order every table and file lists them (plain strings: JSON keys).
STRATEGIES: tuple[str, ...] = tuple(s.value for s in Strategy)
