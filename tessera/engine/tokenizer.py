"""Text in and out: the model directory's own tokenizer, or bytes where a model has none.

A directory with a ``tokenizer.json`` (what ``save_pretrained`` writes for a fast tokenizer) is read as
that file says, through transformers' ``PreTrainedTokenizerFast`` (its normaliser, pre-tokeniser, model,
post-processor adding BOS, decoder; transformers' ``AutoTokenizer`` may instead rebuild a generic
tokenizer as the model type's own class); one with only slow-tokenizer files through ``AutoTokenizer``.
Both read local files only. A zoo model, or a directory without
tokenizer files, uses ``ByteTokenizer``: token id = UTF-8 byte (ids 0..255; the vocabulary must have at
least 256 entries), decoding skips ids above 255. Token ids can always be given directly
(``tessera generate --prompt-ids``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

from tessera.engine.loader import ModelSource
from tessera.errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class Codec(Protocol):
    name: str
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class ByteTokenizer:
    name = "bytes"

    def __init__(self, eos_token_ids: tuple[int, ...] = ()) -> None:
        self.eos_token_ids = eos_token_ids

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        data = bytes(i for i in ids if 0 <= i < 256 and i not in self.eos_token_ids)
        return data.decode("utf-8", "replace")


class HFTokenizer:
    """transformers' tokenizer of a model directory; special tokens (BOS) added as the model expects."""

    def __init__(self, directory: Path, eos_token_ids: tuple[int, ...]) -> None:
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        cls = PreTrainedTokenizerFast if (directory / "tokenizer.json").is_file() else AutoTokenizer
        try:
            self.tok = cls.from_pretrained(str(directory), local_files_only=True)
        except (OSError, ValueError) as e:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise UserError(f"cannot read the tokenizer of {directory}: {first}") from None
        self.name = type(self.tok).__name__
        own = () if self.tok.eos_token_id is None else (int(self.tok.eos_token_id),)
        self.eos_token_ids = tuple(dict.fromkeys((*eos_token_ids, *own)))

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)


def generation_eos(directory: Path | None) -> tuple[int, ...]:
    """eos_token_id of generation_config.json (what transformers' generate() stops on), if any."""
    path = None if directory is None else directory / "generation_config.json"
    if path is None or not path.is_file():
        return ()
    eos = json.loads(path.read_text()).get("eos_token_id")
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)


def tokenizer_for(source: ModelSource) -> Codec:
    """The model's own tokenizer where its directory has one, else bytes."""
    eos = generation_eos(source.directory) or source.arch.eos_token_ids
    if source.directory is not None and any((source.directory / f).is_file() for f in TOKENIZER_FILES):
        return HFTokenizer(source.directory, eos)
    if source.arch.vocab_size < 256:
        raise UserError(f"{source.name} has no tokenizer and a vocabulary of {source.arch.vocab_size} < 256 "
                        f"byte tokens; give token ids (--prompt-ids)")
    return ByteTokenizer(tuple(e for e in eos if e < 256))
