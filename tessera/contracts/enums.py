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


class Phase(StrEnum):
    """A kind of model step, as captured and placed: a prompt's prefill, a decode step, the serving model's
    mixed iteration (decodes and prompt chunks together), a vision tower's encode, a diffusion denoise."""

    PREFILL = "prefill"
    DECODE = "decode"
    MIXED = "mixed"
    ENCODE = "encode"
    DENOISE = "denoise"


class Objective(StrEnum):
    """What a plan is made for (``Plan.mode``): the most goodput per cell, or the lowest latency of one step
    (the engine's latency plan beside its throughput plan)."""

    THROUGHPUT = "throughput"
    LATENCY = "latency"
