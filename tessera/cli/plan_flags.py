"""The serving flags every planning verb takes (`plan`, `fleet plan`, `advise`, `compare`), declared once,
and the PlannerConfig they make."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from tessera.capture.context import check_context as check_context  # the verbs take it from here
from tessera.errors import UserError
from tessera.hardware import AUTO
from tessera.plan import PlannerConfig, Slo, Traffic

BatchCap = Annotated[int | None, typer.Option(
    "--max-num-seqs", "--batch", help="cap on the sequences (images) in flight per cell, vLLM's max_num_seqs "
                    "(--batch: the same); default: the largest that fits memory and meets the SLO")]
Prompt = Annotated[int, typer.Option("--prompt", help="prompt tokens per request")]
Output = Annotated[int, typer.Option("--output", help="output tokens per request")]
DenoiseSteps = Annotated[int, typer.Option("--steps", help="denoising steps per image (diffusion models)")]
SloTtftMs = Annotated[float, typer.Option("--slo-ttft-ms", help="SLO: time to first token, ms")]
SloTpotMs = Annotated[float, typer.Option("--slo-tpot-ms", help="SLO: time per output token, ms")]
SloImageS = Annotated[float, typer.Option("--slo-image-s", help="SLO: latency of one image, s (diffusion)")]
SloTarget = Annotated[float, typer.Option(
    "--slo-target", help="share of requests that must meet the SLO for an arrival rate to count as goodput")]
MemoryUtilization = Annotated[float, typer.Option(
    "--gpu-memory-utilization", help="share of each GPU's memory the engine may fill (vLLM's flag; less a "
                                     "2 GiB runtime reserve per GPU)")]
TokenBudget = Annotated[int | None, typer.Option(
    "--max-num-batched-tokens", help="token budget of one micro-batch iteration (its decodes + prompt chunks, "
                                     "vLLM's max_num_batched_tokens); default: searched over "
                                     "512-16384 with the batch and micro-batches")]

# the flags' defaults, read from PlannerConfig's (one place for them)
DEFAULTS = PlannerConfig()
PROMPT, OUTPUT, STEPS = DEFAULTS.traffic.prompt, DEFAULTS.traffic.output, DEFAULTS.traffic.steps
TTFT_MS, TPOT_MS, IMAGE_S = DEFAULTS.slo.ttft_s * 1e3, DEFAULTS.slo.tpot_s * 1e3, DEFAULTS.slo.image_s
TARGET = DEFAULTS.slo.target
UTILIZATION = DEFAULTS.gpu_memory_utilization
ImageTokens = Annotated[int, typer.Option(
    "--image-tokens", help="of the prompt, one image's LM tokens (a vision-language model encodes that image with "
                           "its vision tower once per request; e.g. 391 for a 640×480 image on Qwen2.5-VL)")]


def config_of(batch: int | None, prompt: int, output: int, steps: int, slo_ttft_ms: float, slo_tpot_ms: float,
              slo_image_s: float, link: str = AUTO, image_tokens: int = 0, *, slo_target: float = TARGET,
              budget: int | None = None, utilization: float = UTILIZATION) -> PlannerConfig:
    """The PlannerConfig these flags describe; a value out of range is one line naming its flag."""
    if budget is not None and budget < 1:
        raise UserError(f"--max-num-batched-tokens {budget} must be a positive number of tokens")
    for flag, v in (("--prompt", prompt), ("--output", output), ("--steps", steps)):
        if v < 1:
            raise UserError(f"{flag} {v} must be a positive number of {'steps' if flag == '--steps' else 'tokens'}")
    for flag, v in (("--slo-ttft-ms", slo_ttft_ms), ("--slo-tpot-ms", slo_tpot_ms), ("--slo-image-s", slo_image_s)):
        if not v > 0:
            raise UserError(f"{flag} {v:g} must be a positive time")
    if not 0 < slo_target < 1:
        raise UserError(f"--slo-target {slo_target:g} must be a share of requests between 0 and 1, e.g. 0.9")
    if not 0 <= image_tokens <= prompt:
        raise UserError(f"--image-tokens {image_tokens} must be from 0 to the prompt's {prompt} tokens")
    return PlannerConfig(traffic=Traffic(prompt=prompt, output=output, steps=steps, image_tokens=image_tokens),
                         slo=Slo(ttft_s=slo_ttft_ms / 1e3, tpot_s=slo_tpot_ms / 1e3, image_s=slo_image_s,
                                 target=slo_target),
                         link=link, batch_cap=batch, gpu_memory_utilization=utilization,
                         **({"budgets": (budget,)} if budget else {}))


def check_out_file(path: Path | None) -> None:
    """An output file (-o) that cannot be written is said before any planning, not after it."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserError(f"-o {path} is a directory; give a file name, e.g. {path / 'plan.json'}")
    if not parent.is_dir():
        raise UserError(f"-o {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"-o {path}: permission denied")
