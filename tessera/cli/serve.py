"""`tessera serve`: the OpenAI-compatible server. Imports are made inside the verb so that `tessera --help`
does not load torch or FastAPI."""

from __future__ import annotations

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


def register(app: typer.Typer) -> None:
    @app.command("serve")
    def serve_cmd(
        model: str = typer.Argument(..., help="a Hugging Face model directory, or a zoo name "
                                    "(tessera models)"),
        devices: Devices = "cpu",
        placement: PlacementFlag = "layer_split",
        replan: str = typer.Option("layer_split", help="placement onto the survivors after a lost worker"),
        host: str = typer.Option("127.0.0.1", help="address to listen on (0.0.0.0: every interface)"),
        port: int = typer.Option(8000, help="port to listen on (0: any free port, printed)"),
        served_model_name: str | None = typer.Option(None, help="the name clients send as `model` "
                                                     "(default: MODEL as given)"),
        api_key: str | None = typer.Option(None, help="require 'Authorization: Bearer KEY' on /v1"),
        max_waiting: int = typer.Option(256, help="requests accepted beyond the running ones; more: 429"),
        dtype: Dtype = "auto",
        load_format: LoadFormat = "auto",
        max_num_seqs: MaxNumSeqs = 16,
        max_num_batched_tokens: MaxNumBatchedTokens = 256,
        max_model_len: int | None = typer.Option(None, help="longest prompt + output (default: the model's "
                                                 "context, at most 2048)"),
        page_size: PageSize = 16,
        microbatches: Microbatches = 1,
        transport: str = typer.Option("auto", help="between workers: auto, gloo, nccl"),
        seed: int = typer.Option(0, help="dummy-weight seed"),
        adaptive: Adaptive = False,
        latency_microbatches: LatencyMicrobatches = 1,
        latency_placement: LatencyPlacement = None,
        high_load: HighLoad = None,
        low_load: LowLoad = None,
    ) -> None:
        """Serve a model over HTTP with OpenAI's API (/v1/completions, /v1/chat/completions), /metrics."""
        from tessera.engine.adaptive import AdaptiveSettings
        from tessera.engine.cluster import ClusterSettings
        from tessera.engine.config import EngineConfig
        from tessera.engine.devices import parse_devices
        from tessera.serve.config import ServerConfig
        from tessera.serve.launch import ServeSpec, serve

        kinds = parse_devices(devices)
        # 0 as not given, as before: serve() defaults it to the model's context, at most 2048
        config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              page_size=page_size, max_model_len=max_model_len or None,
                              microbatches=microbatches)
        server = ServerConfig(served_model_name=served_model_name or model, api_key=api_key,
                              max_waiting=max_waiting, host=host, port=port)
        serve(ServeSpec(model=model, kinds=kinds, placement=placement, replan=replan, config=config,
                        dtype=dtype, load_format=load_format, seed=seed,
                        settings=ClusterSettings(transport=transport), server=server,
                        adaptive=AdaptiveSettings(latency_microbatches=latency_microbatches,
                                                  latency_placement=latency_placement, high_load=high_load,
                                                  low_load=low_load) if adaptive else None))

