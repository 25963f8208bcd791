"""The next token of each request from its logits row: greedy, or temperature / top-k / top-p sampling.

Rows are sampled one by one, each request drawing from its own generator (seeded when the request has a
seed), so a request's samples do not depend on what it was batched with.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tessera.engine.config import SamplingParams


def filtered_logits(logits: Tensor, params: SamplingParams) -> Tensor:
    """logits [V] (fp32) divided by the temperature, with what top-k and top-p exclude set to −inf: top-k
    keeps the k largest; top-p the smallest set of most probable tokens whose probability reaches p
    (the most probable one always kept), as transformers' warpers do."""
    x = logits / params.temperature
    if params.top_k and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, -torch.inf)
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        cum = torch.softmax(sorted_x, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_x, dim=-1) >= params.top_p  # mass before this token already >= p
        x = x.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), -torch.inf)
    return x


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from a logits row [V]."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(filtered_logits(logits.float(), params), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
