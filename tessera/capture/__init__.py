"""Capture: turn a model step into a KernelGraph (fake tensors) or a replayable program (tiny, real)."""

from tessera.capture.core import block_layers, capture_model, capture_program
from tessera.capture.program import Capture, replay
from tessera.capture.recorder import OpRecord, Recorder, TensorRef
from tessera.capture.summary import summarize
from tessera.capture.zoo import SPECS, ModelSpec, model_names, model_phases, resolve

__all__ = [
    "SPECS", "Capture", "ModelSpec", "OpRecord", "Recorder", "TensorRef", "block_layers", "capture_model",
    "capture_program", "model_names", "model_phases", "replay", "resolve", "summarize",
]
