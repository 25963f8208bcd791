"""The evaluation's workload shapes: what a request looks like in each kind of traffic, with its source.

The serving model (tessera.plan.model.serving) runs the steady state of a continuous-batching engine at one
prompt length P and one output length O: each iteration decodes B tokens and prefills C = B·P/O prompt
tokens. Over a long run of a trace, prefill tokens per decoded token are ΣP / ΣO = mean(P) / mean(O), and
the work of an iteration is linear in the tokens it carries, so a trace's shape is its **mean** prompt and
output length (rounded). Medians would understate the long prompts that carry most of the prefill work
(the conversation trace's median ratio is 414/160 ≈ 2.6 prompt tokens per output token; the true ratio
ΣP/ΣO is 4.5); percentiles describe the tail that the SLO check in the simulator sees, not the throughput.
Shapes of the tessera.sim traces are derived from the shipped rows at import, not copied by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tessera.errors import UserError, choices_error
from tessera.sim.workload import traces


@dataclass(frozen=True, kw_only=True)
class Shape:
    """One kind of traffic: tokens per request (or an image step count), and where the numbers come from."""
    name: str
    prompt: int = 1  # tokens per request (LLMs; for a VLM, image tokens + text)
    output: int = 1  # generated tokens per request
    steps: int = 28  # denoising steps per image (diffusion)
    images: bool = False  # an image-generation shape (diffusion models only)
    image_tokens: int = 0  # of the prompt, one input image's tokens (a VLM's vision tower encodes it)
    source: str

    def __post_init__(self) -> None:
        for k in ("prompt", "output", "steps"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise UserError(f"shape {self.name!r}: {k}={v!r} must be a positive integer")
        if not self.source:
            raise UserError(f"shape {self.name!r} names no source")

    @property
    def label(self) -> str:
        return f"{self.steps} steps" if self.images else f"P {self.prompt} / O {self.output}"


def trace_shape(name: str, rows: np.ndarray, source: str) -> Shape:
    """A shape from trace rows [n, 2] of (prompt tokens, output tokens): their means, rounded half up."""
    a = np.asarray(rows, dtype=np.float64)
    if a.ndim != 2 or a.shape[1] != 2 or len(a) == 0:
        raise UserError(f"trace for shape {name!r} must be rows of (prompt, output) tokens; got shape {a.shape}")
    p, o = (int(np.floor(v + 0.5)) for v in a.mean(axis=0))
    return Shape(name=name, prompt=max(1, p), output=max(1, o), source=f"{source}: mean of {len(a)} requests")


def _trace(name: str) -> np.ndarray:
    return traces()[name]


AZURE = ("Azure LLM inference trace 2023 (Splitwise, Patel et al., ISCA 2024), CC-BY 4.0, the sample "
         "shipped in tessera/sim/data/{}.json")

# Fixed shapes: the ranges are the evaluation issue's; the point inside each range and the output lengths
# are the midpoints or the cited typical sizes.
SUMMARISE = Shape(name="summarise", prompt=6144, output=256, source=(
    "long-document summarisation: prompts of 4k–8k tokens (midpoint 6,144); a summary of 256 tokens (≈ 190 "
    "words, the size of the arXiv/PubMed abstracts of Cohan et al., NAACL 2018, ≈ 200 words)"))
REASON = Shape(name="reason", prompt=256, output=3072, source=(
    "long generation as reasoning models produce: a short question (256 tokens) and 2k–4k output tokens "
    "(midpoint 3,072)"))
# Qwen2.5-VL turns an image into one token per 28×28 pixels (14-pixel patches merged 2×2): a COCO image
# (typically 640×480) becomes 23×17 = 391 tokens; with a short instruction ≈ 400. COCO captions average
# about 10.5 words (Chen et al., "Microsoft COCO Captions", 2015) ≈ 14 tokens; 16 with the end token.
CAPTION = Shape(name="caption", prompt=400, output=16, image_tokens=391, source=(
    "image + caption, COCO-captions-like: a 640×480 image as 391 Qwen2.5-VL tokens (28×28 pixels each) plus "
    "a short instruction; a caption of ≈ 10.5 words (Chen et al. 2015) ≈ 16 tokens with the end token"))
# FLUX.1-dev's default in diffusers' FluxPipeline is 28 steps; the capture's step is a 1024² image (4,096
# image tokens after the 16× VAE downsampling and 2×2 packing).
IMAGE = Shape(name="image-1024", steps=28, images=True, source=(
    "one 1024×1024 image at FLUX.1-dev's default 28 denoising steps (diffusers FluxPipeline)"))


def shapes() -> dict[str, Shape]:
    """Every shape of the study by name."""
    conv = trace_shape("conversation", _trace("azure_conv_2023"), AZURE.format("azure_conv_2023"))
    code = trace_shape("code", _trace("azure_code_2023"), AZURE.format("azure_code_2023"))
    return {s.name: s for s in (conv, code, SUMMARISE, REASON, CAPTION, IMAGE)}


def shape(name: str) -> Shape:
    all_ = shapes()
    if name not in all_:
        raise choices_error("workload shape", name, list(all_))
    return all_[name]
