"""A request's tokens against a model's context window: the check every planning verb makes before it plans."""

from __future__ import annotations

from tessera.capture.zoo import resolve
from tessera.errors import UserError

# Config fields that give a model's context window (positions), by architecture: Llama/Qwen/Mixtral,
# GPT-2, some others; a vision-language model's are in its text_config. A model with none (Mamba, a
# diffusion transformer) has no window to check.
POSITION_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")


def max_positions(model: str) -> int | None:
    """The context window of ``model`` (a zoo name or a config.json) in tokens; None where its config gives
    none. An unknown name is the zoo's one-line error."""
    cfg = resolve(model).config
    for c in (cfg, cfg.get("text_config") or {}):
        for k in POSITION_FIELDS:
            v = c.get(k) if isinstance(c, dict) else None
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


def check_context(model: str, prompt: int | None, output: int | None, *, known_only: bool = False) -> None:
    """Prompt + output tokens of one request must fit ``model``'s context window (one UserError line, exit
    2). ``known_only``: a model name that resolves to nothing (a plan file's record of a local config)
    is not checked rather than refused. None for a length: not a fixed number (a trace), not checked."""
    if prompt is None or output is None:
        return
    try:
        window = max_positions(model)
    except UserError:
        if known_only:
            return
        raise
    if window is not None and prompt + output > window:
        raise UserError(f"prompt {prompt:,} + output {output:,} tokens = {prompt + output:,} exceed {model}'s "
                        f"context window of {window:,} tokens; give --prompt and --output that sum to at "
                        f"most {window:,}")
