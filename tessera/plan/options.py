"""The serving flags every planning verb takes (`plan`, `fleet plan`, `advise`, `compare`), declared once,
and the PlannerConfig they make."""

from __future__ import annotations

from typing import Annotated

import typer

from tessera.errors import UserError
from tessera.hardware import AUTO
from tessera.plan.serve import PlannerConfig
from tessera.plan.serving import Slo, Traffic

BatchCap = Annotated[int | None, typer.Option(
    "--batch", help="cap on the batch (sequences or images in flight per cell); default: the largest that fits "
                    "memory and meets the SLO")]
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
    """The PlannerConfig these flags describe."""
    if budget is not None and budget < 1:
        raise UserError(f"--max-num-batched-tokens {budget} must be a positive number of tokens")
    return PlannerConfig(traffic=Traffic(prompt=prompt, output=output, steps=steps, image_tokens=image_tokens),
                         slo=Slo(ttft_s=slo_ttft_ms / 1e3, tpot_s=slo_tpot_ms / 1e3, image_s=slo_image_s,
                                 target=slo_target),
                         link=link, batch_cap=batch, gpu_memory_utilization=utilization,
                         **({"budgets": (budget,)} if budget else {}))
