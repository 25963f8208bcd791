"""Capture: turn a model step into a KernelGraph (fake tensors) or a replayable program (tiny, real).

The names below are loaded on first use (PEP 562), so that `tessera --help` and the verbs that never
capture do not pay for importing torch and Triton (about 3 s).
"""

from __future__ import annotations

import importlib
from typing import Any

# public name -> the submodule that defines it
_EXPORTS = {
    "block_layers": "core", "capture_model": "core", "capture_program": "core",
    "Capture": "program", "replay": "program",
    "OpRecord": "recorder", "Recorder": "recorder", "TensorRef": "recorder",
    "summarize": "summary",
    "SPECS": "zoo", "ModelSpec": "zoo", "model_names": "zoo", "model_phases": "zoo", "resolve": "zoo",
    "image_patches": "zoo",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tessera.capture' has no attribute {name!r}")
    return getattr(importlib.import_module(f"tessera.capture.{_EXPORTS[name]}"), name)
