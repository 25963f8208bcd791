"""The planner's graph source: captures of a zoo model, cached per process.

``capture_source(model)(phase, batch, seq, context)`` returns the model's captured KernelGraph at that
shape. Captures do not depend on the GPU, so one process plans many pools (compare, a fleet's cells) from
the same few captures.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from tessera.contracts.enums import Phase
from tessera.graph import KernelGraph

GraphSource = Callable[[str, int, int, int], KernelGraph]  # (phase, batch, seq, context) -> graph


@cache
def _captured(model: str, phase: str, batch: int, seq: int, context: int) -> KernelGraph:
    from tessera.capture import capture_model  # the capture stage imports torch: only when a graph is needed

    kw: dict[str, int] = {}
    if phase in (Phase.PREFILL, Phase.ENCODE) and seq:  # encode: image patches
        kw["seq"] = seq
    if phase == Phase.DECODE and context:
        kw["context"] = context
    return capture_model(model, phase, batch=batch, **kw)


def capture_source(model: str) -> GraphSource:
    return lambda phase, batch, seq, context: _captured(model, phase, batch, seq, context)


__all__ = ["GraphSource", "capture_source"]
