"""The engine flags `tessera generate`, `tessera serve-run` and `tessera serve` share, declared once (vLLM's
names where the meaning is the same); each verb gives its own default."""

from __future__ import annotations

from typing import Annotated

import typer

PLACEMENT_HELP = ("over several devices: plan (tessera.plan, profiled workers), layer_split, attention_gemm, "
                  "interleave, or a PLAN.json")
DEVICES_HELP = ("one worker per entry: cpu, cpu:threads=N, cpu:speed=S (0 < S <= 1), cuda:N; a lone cpu "
                "runs in this process")

Devices = Annotated[str, typer.Option("--devices", help=DEVICES_HELP)]
PlacementFlag = Annotated[str, typer.Option("--placement", help=PLACEMENT_HELP)]
Dtype = Annotated[str, typer.Option("--dtype", help="auto (the checkpoint's), bf16, fp16 or fp32")]
LoadFormat = Annotated[str, typer.Option("--load-format", help="auto: the directory's safetensors; dummy: "
                                         "random weights")]
MaxNumSeqs = Annotated[int, typer.Option("--max-num-seqs", help="requests running at once")]
MaxNumBatchedTokens = Annotated[int, typer.Option(
    "--max-num-batched-tokens", help="tokens per iteration of a group (decodes + prompt chunks)")]
PageSize = Annotated[int, typer.Option("--page-size", help="tokens per KV page")]
Microbatches = Annotated[int, typer.Option(
    "--microbatches", help="groups of running requests advancing independently (iterations in flight)")]
Adaptive = Annotated[bool, typer.Option(
    "--adaptive", help="switch between a latency schedule (--latency-microbatches, --latency-placement) and "
    "this one by queue depth, as `tessera simulate --adaptive` (no recovery from a lost worker meanwhile)")]
LatencyMicrobatches = Annotated[int, typer.Option(
    "--latency-microbatches", help="--adaptive: micro-batches of the latency schedule")]
LatencyPlacement = Annotated[str | None, typer.Option(
    "--latency-placement", help="--adaptive: placement of the latency schedule (default: --placement)")]
HighLoad = Annotated[int | None, typer.Option(
    "--high-load", help="--adaptive: outstanding requests -> throughput schedule (default: --max-num-seqs)")]
LowLoad = Annotated[int | None, typer.Option(
    "--low-load", help="--adaptive: outstanding requests -> latency schedule (default: half of --high-load)")]
