"""One iteration's inputs, laid out flat as vLLM does: every scheduled sequence's tokens one after another.

``IterationInputs`` is what a model program takes (its fields are the traced graph's placeholders, in
order); ``build_inputs`` makes it from the scheduler's per-sequence pieces; ``IterationShape`` names an
iteration by its sizes only, for ``kernel_graph`` and benchmarks (``shape_pieces`` lays it out).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

FIELDS = ("input_ids", "positions", "query_start_loc", "seq_lens", "block_table", "slot_mapping",
          "state_slots", "logits_indices")


@dataclass(frozen=True)
class IterationInputs:
    """Tensors of one iteration (T tokens of S sequences, R of which are sampled), all int64.

    input_ids, positions, slot_mapping [T] (slot = page · page_size + offset of the token's K/V);
    query_start_loc [S+1] (cumulative tokens per sequence); seq_lens [S] (tokens of each sequence after
    this iteration); block_table [S, max pages] (0-padded); state_slots [S] (Mamba-2 state slot);
    logits_indices [R] (rows whose logits are returned, in sequence order)."""

    input_ids: Tensor
    positions: Tensor
    query_start_loc: Tensor
    seq_lens: Tensor
    block_table: Tensor
    slot_mapping: Tensor
    state_slots: Tensor
    logits_indices: Tensor

    def as_dict(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True)
class SeqPiece:
    """One sequence's share of an iteration: ``tokens`` computed at positions start .. start + n − 1."""

    tokens: tuple[int, ...]
    start: int
    pages: tuple[int, ...]  # the sequence's block table, covering start + n tokens
    slot: int  # its state slot (Mamba-2); 0 where unused
    sample: bool  # the last token's logits are wanted (the piece ends the sequence's known tokens)

    def __post_init__(self) -> None:
        if not self.tokens or self.start < 0:
            raise ValueError(f"SeqPiece: {len(self.tokens)} tokens at start {self.start}")


def build_inputs(pieces: list[SeqPiece], page_size: int,
                 device: torch.device | str = "cpu") -> IterationInputs:
    """The flat inputs of an iteration made of ``pieces`` (in order)."""
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    starts = [0]
    lens: list[int] = []
    rows: list[int] = []
    for p in pieces:
        n = len(p.tokens)
        ids.extend(p.tokens)
        pos = range(p.start, p.start + n)
        positions.extend(pos)
        # a model without KV (Mamba-2) has no pages: its slot_mapping is unused
        slots.extend(p.pages[i // page_size] * page_size + i % page_size if p.pages else 0 for i in pos)
        starts.append(starts[-1] + n)
        lens.append(p.start + n)
        if p.sample:
            rows.append(starts[-1] - 1)
    width = max((len(p.pages) for p in pieces), default=0)
    table = [list(p.pages) + [0] * (width - len(p.pages)) for p in pieces]

    def t(values: list[int] | list[list[int]]) -> Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return IterationInputs(
        input_ids=t(ids), positions=t(positions), query_start_loc=t(starts), seq_lens=t(lens),
        block_table=t(table).view(len(pieces), width), slot_mapping=t(slots),
        state_slots=t([p.slot for p in pieces]), logits_indices=t(rows))


@dataclass(frozen=True, kw_only=True)
class IterationShape:
    """An iteration by its sizes: ``decode`` sequences decoding one token each with ``context`` tokens
    already cached, and ``chunks`` prompt pieces of ``chunk_len`` tokens each after ``prefix`` earlier
    tokens of their prompt. Every sequence's logits are computed (``sampled``)."""

    decode: int = 0
    context: int = 0
    chunks: int = 0
    chunk_len: int = 0
    prefix: int = 0

    def __post_init__(self) -> None:
        for k in ("decode", "context", "chunks", "chunk_len", "prefix"):
            if getattr(self, k) < 0:
                raise ValueError(f"IterationShape {k}={getattr(self, k)} must be >= 0")
        if not (self.decode or (self.chunks and self.chunk_len)):
            raise ValueError(f"IterationShape: no tokens (decode={self.decode}, chunks={self.chunks} of "
                             f"{self.chunk_len})")
        if self.decode and not self.context:
            raise ValueError("IterationShape: a decoding sequence has context >= 1")

    @property
    def tokens(self) -> int:
        return self.decode + self.chunks * self.chunk_len

    @property
    def sequences(self) -> int:
        return self.decode + (self.chunks if self.chunk_len else 0)

    @property
    def phase(self) -> str:
        return "mixed" if self.decode and self.chunks else "decode" if self.decode else "prefill"

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)} | {"tokens": self.tokens}


def shape_pieces(shape: IterationShape, page_size: int) -> list[SeqPiece]:
    """A concrete layout of ``shape``: decodes first, then the prompt pieces; pages numbered in order,
    each sequence its own; token ids 0; state slot = sequence index."""
    lengths = [(shape.context, 1)] * shape.decode + [(shape.prefix, shape.chunk_len)] * (
        shape.chunks if shape.chunk_len else 0)
    pieces = []
    next_page = 0
    for i, (start, n) in enumerate(lengths):
        count = -(-(start + n) // page_size)
        pieces.append(SeqPiece(tokens=(0,) * n, start=start, pages=tuple(range(next_page, next_page + count)),
                               slot=i, sample=True))
        next_page += count
    return pieces
