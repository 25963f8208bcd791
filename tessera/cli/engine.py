"""`tessera generate` (text in, text out) and `tessera serve-run` (a request stream, measured), on one device
in this process or on worker processes split by a placement. Imports are made inside the verbs so that
`tessera --help` does not load torch."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from tessera.cli.engine_flags import (
    Adaptive,
    Devices,
    Dtype,
    HighLoad,
    LatencyMicrobatches,
    LatencyPlacement,
    LoadFormat,
    LowLoad,
    MaxNumBatchedTokens,
    MaxNumSeqs,
    Microbatches,
    PageSize,
    PlacementFlag,
)

if TYPE_CHECKING:  # the engine is imported inside the verbs (torch)
    from tessera.engine.request import Completion


def register(app: typer.Typer) -> None:
    register_generate(app)
    register_serve(app)


def register_generate(app: typer.Typer) -> None:
    @app.command("generate")
    def generate_cmd(
        model: str = typer.Argument(..., help="a Hugging Face model directory, or a zoo name "
                                    "(tessera models)"),
        prompt: str | None = typer.Option(None, help="prompt text (through the model's tokenizer)"),
        prompt_ids: str | None = typer.Option(None, help="prompt as token ids, e.g. 1,2,3"),
        prompts_file: Path | None = typer.Option(None, help="JSON lines: {\"prompt\": ...} or "
                                                 "{\"prompt_ids\": [...]}, sampling fields per line"),
        max_tokens: int = typer.Option(16, help="tokens to generate at most"),
        temperature: float = typer.Option(0.0, help="0: greedy"),
        top_k: int = typer.Option(0, help="sample among the k most probable tokens (0: all)"),
        top_p: float = typer.Option(1.0, help="sample among the most probable tokens of total probability p"),
        seed: int | None = typer.Option(None, help="per-request seed: the same samples whatever the batch"),
        stop: list[str] = typer.Option([], help="stop string (repeatable); cut from the text"),
        ignore_eos: bool = typer.Option(False, help="do not stop at the EOS token"),
        dtype: Dtype = "auto",
        load_format: LoadFormat = "auto",
        max_num_seqs: MaxNumSeqs = 16,
        max_num_batched_tokens: MaxNumBatchedTokens = 256,
        max_model_len: int | None = typer.Option(None, help="longest prompt + output (default: the longest "
                                                 "request given, within the model's context)"),
        page_size: PageSize = 16,
        microbatches: Microbatches = 1,
        devices: Devices = "cpu",
        placement: PlacementFlag = "layer_split",
        transport: str = typer.Option("auto", help="between workers: auto (nccl for distinct GPUs, else "
                                      "gloo), gloo, nccl"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object per prompt (JSON lines)"),
    ) -> None:
        """Generate text: prompts served together by continuous batching, greedy or sampled."""
        from tessera.engine.cluster import ClusterSettings
        from tessera.engine.config import EngineConfig, SamplingParams
        from tessera.engine.devices import parse_devices
        from tessera.engine.generate import GenerateSpec, generate
        from tessera.engine.prompts import prompts_of
        from tessera.errors import UserError

        kinds = parse_devices(devices)
        given = [x for x in (prompt, prompt_ids, prompts_file) if x is not None]
        if len(given) != 1:
            raise UserError("give exactly one of --prompt, --prompt-ids and --prompts-file")
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  seed=seed, stop=tuple(stop), ignore_eos=ignore_eos)
        prompts = prompts_of(text=prompt, ids=prompt_ids, file=prompts_file, defaults=defaults)
        # 0 as not given, as before: generate() defaults it to the longest request
        config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              page_size=page_size, max_model_len=max_model_len or None,
                              microbatches=microbatches)
        r = generate(GenerateSpec(model=model, prompts=tuple(prompts), kinds=kinds, placement=placement,
                                  config=config, dtype=dtype, load_format=load_format,
                                  settings=ClusterSettings(transport=transport)))
        show_completions(r.completions, as_json)
        print(f"{len(r.completions)} prompt(s), {r.tokens} tokens in {r.iterations} iterations, "
              f"{r.generate_s:.2f} s ({r.tokens / max(r.generate_s, 1e-9):.1f} tokens/s); load {r.load_s:.2f} s",
              file=sys.stderr)


def show_completions(completions: Sequence[Completion], as_json: bool) -> None:
    """`tessera generate`: each completion's text, or its JSON line, in prompt order."""
    for c in completions:
        typer.echo(c.to_json() if as_json else c.text)


def register_serve(app: typer.Typer) -> None:
    @app.command("serve-run")
    def serve_run_cmd(
        model: str = typer.Argument(..., help="a zoo name or a model directory"),
        devices: Devices = "cpu,cpu",
        placement: PlacementFlag = "layer_split",
        workload: str = typer.Option("poisson", help="offline | poisson | bursty (tessera.sim's workloads)"),
        rate: float = typer.Option(20.0, help="mean arrivals per second (poisson, bursty)"),
        requests: int = typer.Option(8, help="requests in the stream (real runs: 8, as run; simulate: 1000)"),
        prompt: str = typer.Option("4-8", help="prompt tokens: N, LO-HI or a length trace name"),
        output: str = typer.Option("2-6", help="generated tokens per request: N, LO-HI or a trace name"),
        workload_file: Path | None = typer.Option(None, help="explicit requests instead "
                                                  "(bench/workloads/*.json)"),
        burst: str = typer.Option("gamma", help="bursty shape: gamma (inter-arrival CV --burst-cv) | onoff "
                                  "(arrivals only in --on-s periods, none in --off-s ones)"),
        burst_cv: float = typer.Option(3.0, help="gamma bursts: coefficient of variation of inter-arrivals"),
        on_s: float = typer.Option(10.0, help="onoff bursts: seconds of arrivals"),
        off_s: float = typer.Option(20.0, help="onoff bursts: seconds without arrivals"),
        max_num_seqs: MaxNumSeqs = 8,
        max_num_batched_tokens: MaxNumBatchedTokens = 64,
        microbatches: Microbatches = 2,
        page_size: PageSize = 16,
        max_model_len: int | None = typer.Option(None, help="longest prompt + output (default: the longest "
                                                 "request of the stream)"),
        dtype: Dtype = "auto",
        load_format: LoadFormat = "dummy",
        seed: int = typer.Option(0, help="workload, prompt and dummy-weight seed"),
        verify: bool = typer.Option(False, help="exit 1 unless every request's greedy tokens equal the "
                                    "single-process engine's"),
        recover: bool = typer.Option(False, help="on a lost worker, re-place onto the survivors and go on"),
        replan: str = typer.Option("layer_split", help="placement after a loss (a lone survivor runs all)"),
        kill_at: int | None = typer.Option(None, help="fault injection: SIGKILL a worker when request N is "
                                           "first scheduled"),
        kill_rank: int = typer.Option(1, help="the worker --kill-at kills"),
        predict: bool = typer.Option(False, help="also the planner's and the simulator's throughput for this "
                                     "placement (profiles each worker kind once)"),
        transport: str = typer.Option("auto", help="auto (nccl for distinct GPUs, else gloo), gloo, nccl"),
        adaptive: Adaptive = False,
        latency_microbatches: LatencyMicrobatches = 1,
        latency_placement: LatencyPlacement = None,
        high_load: HighLoad = None,
        low_load: LowLoad = None,
        as_json: bool = typer.Option(False, "--json", help="print the JSON result"),
    ) -> None:
        """Serve a request stream with the engine on worker processes: throughput, TTFT, TPOT, verified."""
        from tessera.engine.adaptive import AdaptiveSettings
        from tessera.engine.cluster import ClusterSettings
        from tessera.engine.config import EngineConfig
        from tessera.engine.devices import parse_devices
        from tessera.engine.serve import Fault
        from tessera.engine.serve_run import ServeRunSpec, serve_run
        from tessera.errors import UserError
        from tessera.runtime.cluster import WorkerFailure
        from tessera.sim.workload import LengthSpec, WorkloadSpec

        kinds = parse_devices(devices)
        wl = None if workload_file else WorkloadSpec(
            kind=workload, requests=requests, rate_per_s=rate, prompt=LengthSpec.parse(prompt),
            output=LengthSpec.parse(output), burst=burst, burst_cv=burst_cv, on_s=on_s, off_s=off_s)
        if kill_at is not None and kill_at < 0:
            raise UserError(f"--kill-at {kill_at}: a request index >= 0")
        # 0 as not given, as before: serve_run() defaults it to the stream's longest request
        config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              page_size=page_size, microbatches=microbatches,
                              max_model_len=max_model_len or None)
        spec = ServeRunSpec(model=model, kinds=kinds, placement=placement, workload=wl,
                            workload_file=str(workload_file) if workload_file else None, config=config,
                            dtype=dtype,
                            load_format=load_format, seed=seed, verify=verify, recover=recover, replan=replan,
                            fault=Fault(at_request=kill_at, rank=kill_rank) if kill_at is not None else None,
                            predict=predict, settings=ClusterSettings(transport=transport),
                            adaptive=AdaptiveSettings(latency_microbatches=latency_microbatches,
                                                      latency_placement=latency_placement, high_load=high_load,
                                                      low_load=low_load) if adaptive else None)
        try:
            out = serve_run(spec)
        except WorkerFailure as e:
            typer.echo(f"error: {e}", err=True)
            sys.exit(1)
        typer.echo(out.to_json() if as_json else out.summary())
        if verify and not out.verified:
            typer.echo("error: greedy tokens differ from the single-process engine's", err=True)
            sys.exit(1)
