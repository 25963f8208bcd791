"""The inference engine: model programs over an iteration's flattened tokens, a paged KV cache, continuous
batching, sampling, Hugging Face loading (docs/engine.md)."""

from tessera.engine.config import EngineConfig, SamplingParams
from tessera.engine.engine import Engine, load_engine
from tessera.engine.inputs import IterationInputs, IterationShape
from tessera.engine.program import Program, SplitRun, Transfer
from tessera.engine.request import Completion

__all__ = ["Completion", "Engine", "EngineConfig", "IterationInputs", "IterationShape", "Program",
           "SamplingParams", "SplitRun", "Transfer", "load_engine"]
