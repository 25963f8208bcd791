"""Pages of the KV cache and slots of per-sequence state: free lists the scheduler draws from.

Every attention layer has ``pages`` pages of ``page_size`` tokens (``PagedAttention``'s buffers); a
sequence's block table lists its pages in order, the same page ids in every layer. A Mamba-2 model has
one state slot per running sequence instead (conv history and SSM state in every layer).
"""

from __future__ import annotations

import math
from collections import deque


class FreeList:
    """Ids 0 .. count − 1, handed out and taken back."""

    def __init__(self, count: int) -> None:
        self.count = count
        self._free = deque(range(count))

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        """n ids, or None (and nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.popleft() for _ in range(n)]

    def give(self, ids: list[int]) -> None:
        self._free.extend(ids)


def pages_for(tokens: int, page_size: int) -> int:
    return math.ceil(tokens / page_size)
