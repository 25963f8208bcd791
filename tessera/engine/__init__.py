"""The inference engine: model programs over an iteration's flattened tokens, a paged KV cache, continuous
batching, sampling, Hugging Face loading (docs/engine.md).

The names below are loaded on first use (PEP 562), so that `tessera --help` does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the submodule that defines it
_EXPORTS = {
    "EngineConfig": "config", "SamplingParams": "config", "Engine": "engine", "load_engine": "engine",
    "IterationInputs": "inputs", "IterationShape": "inputs", "Program": "program", "SplitRun": "program",
    "SplitCopy": "program", "Completion": "request", "kernel_graph": "kernels",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tessera.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tessera.engine.{_EXPORTS[name]}"), name)
