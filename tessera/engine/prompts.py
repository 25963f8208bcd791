"""Prompts for ``tessera generate``: one from the command line, or JSON lines from a file.

Each line of a prompts file is an object with ``prompt`` (text) or ``prompt_ids`` (token ids), and
optionally any of the sampling fields (``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
``stop`` — a string or a list —, ``ignore_eos``), which override the command line's for that prompt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from tessera.engine.config import SamplingParams
from tessera.errors import UserError, read_text

SAMPLING_FIELDS = tuple(f.name for f in fields(SamplingParams))
PROMPT_FIELDS = ("prompt", "prompt_ids")


@dataclass(frozen=True)
class Prompt:
    """A prompt as text or token ids (exactly one), with its sampling settings."""

    text: str | None
    ids: tuple[int, ...] | None
    params: SamplingParams

    def __post_init__(self) -> None:
        if (self.text is None) == (self.ids is None):
            raise ValueError("a Prompt has text or ids, not both or neither")


def parse_ids(text: str, where: str) -> tuple[int, ...]:
    """``1,2,3`` -> (1, 2, 3); anything else one line."""
    try:
        ids = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{where}: {text!r} is not a comma-separated list of token ids") from None
    if not ids:
        raise UserError(f"{where}: no token ids given")
    return ids


def prompts_of(*, text: str | None = None, ids: str | None = None, file: Path | None = None,
               defaults: SamplingParams) -> list[Prompt]:
    """The prompts given one way, the first of: a JSON-lines ``file`` (sampling fields per line over
    ``defaults``), token ``ids`` as ``1,2,3``, or ``text``."""
    if file is not None:
        return read_prompts(file, defaults)
    if ids is not None:
        return [Prompt(text=None, ids=parse_ids(ids, "--prompt-ids"), params=defaults)]
    return [Prompt(text=text or "", ids=None, params=defaults)]


def read_prompts(path: Path, defaults: SamplingParams) -> list[Prompt]:
    out = []
    for n, line in enumerate(read_text(path, "prompts file").splitlines(), start=1):
        if line.strip():
            out.append(_prompt(line, f"{path}:{n}", defaults))
    if not out:
        raise UserError(f"prompts file {path} holds no prompts")
    return out


def _prompt(line: str, where: str, defaults: SamplingParams) -> Prompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{where}: each line must be a JSON object with 'prompt' or 'prompt_ids'")
    unknown = sorted(set(obj) - set(PROMPT_FIELDS) - set(SAMPLING_FIELDS))
    if unknown:
        raise UserError(f"{where}: unknown field {unknown[0]!r}; valid: "
                        f"{', '.join(PROMPT_FIELDS + SAMPLING_FIELDS)}")
    if ("prompt" in obj) == ("prompt_ids" in obj):
        raise UserError(f"{where}: give exactly one of 'prompt' (text) and 'prompt_ids' (token ids)")
    text, ids = obj.get("prompt"), obj.get("prompt_ids")
    if text is not None and not isinstance(text, str):
        raise UserError(f"{where}: 'prompt' must be a string")
    if ids is not None and not (isinstance(ids, list) and ids and all(isinstance(i, int) for i in ids)):
        raise UserError(f"{where}: 'prompt_ids' must be a non-empty list of integers")
    return Prompt(text=text, ids=None if ids is None else tuple(ids), params=_params(obj, defaults, where))


def _params(obj: dict[str, Any], defaults: SamplingParams, where: str) -> SamplingParams:
    over = {k: v for k, v in obj.items() if k in SAMPLING_FIELDS}
    if "stop" in over:
        stop = over["stop"]
        if not isinstance(stop, str | list):
            raise UserError(f"{where}: 'stop' must be a string or a list of strings")
        over["stop"] = (stop,) if isinstance(stop, str) else tuple(stop)
    try:
        return replace(defaults, **over)
    except UserError as e:
        raise UserError(f"{where}: {e}") from None
