"""`tessera generate`: text in, text out through the engine (one device for now)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

DEVICES = ("cpu",)


def register(app: typer.Typer) -> None:
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
        dtype: str = typer.Option("auto", help="auto (the checkpoint's), bf16, fp16 or fp32"),
        load_format: str = typer.Option("auto", help="auto: the directory's safetensors; dummy: random "
                                        "weights"),
        max_num_seqs: int = typer.Option(16, help="requests running at once"),
        max_num_batched_tokens: int = typer.Option(256, help="tokens per iteration (decodes + prompt "
                                                   "chunks)"),
        max_model_len: int | None = typer.Option(None, help="longest prompt + output (default: the longest "
                                                 "request given, within the model's context)"),
        page_size: int = typer.Option(16, help="tokens per KV page"),
        microbatches: int = typer.Option(1, help="groups of running requests taking turns"),
        devices: str = typer.Option("cpu", help="where the model runs: cpu (one device for now)"),
        as_json: bool = typer.Option(False, "--json", help="one JSON object per prompt (JSON lines)"),
    ) -> None:
        """Generate text: prompts served together by continuous batching, greedy or sampled."""
        from tessera.engine.config import EngineConfig, SamplingParams
        from tessera.engine.engine import load_engine
        from tessera.engine.loader import open_model
        from tessera.engine.prompts import Prompt, parse_ids, read_prompts
        from tessera.engine.tokenizer import tokenizer_for
        from tessera.errors import UserError

        devs = tuple(d.strip() for d in devices.split(",") if d.strip())
        if devs != DEVICES:
            raise UserError(f"--devices {devices!r}: the engine runs on one device for now; valid: cpu")
        given = [x for x in (prompt, prompt_ids, prompts_file) if x is not None]
        if len(given) != 1:
            raise UserError("give exactly one of --prompt, --prompt-ids and --prompts-file")
        defaults = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  seed=seed, stop=tuple(stop), ignore_eos=ignore_eos)
        if prompts_file is not None:
            prompts = read_prompts(prompts_file, defaults)
        elif prompt_ids is not None:
            prompts = [Prompt(text=None, ids=parse_ids(prompt_ids, "--prompt-ids"), params=defaults)]
        else:
            prompts = [Prompt(text=prompt, ids=None, params=defaults)]
        source = open_model(model)
        codec = tokenizer_for(source)
        ids = [list(p.ids) if p.ids is not None else codec.encode(p.text or "") for p in prompts]
        longest = max(len(i) + p.params.max_tokens for i, p in zip(ids, prompts, strict=True))
        config = EngineConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                              page_size=page_size, max_model_len=max_model_len or longest,
                              microbatches=microbatches)
        t0 = time.perf_counter()
        engine = load_engine(source, config, dtype=dtype, load_format=load_format, codec=codec)
        t1 = time.perf_counter()
        outs = engine.generate(ids, [p.params for p in prompts])
        t2 = time.perf_counter()
        for c in outs:
            typer.echo(c.to_json() if as_json else c.text)
        tokens = sum(len(c.token_ids) for c in outs)
        print(f"{len(outs)} prompt(s), {tokens} tokens in {len(engine.history)} iterations, {t2 - t1:.2f} s "
              f"({tokens / max(t2 - t1, 1e-9):.1f} tokens/s); load {t1 - t0:.2f} s", file=sys.stderr)
