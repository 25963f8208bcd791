"""The server's own settings (the engine's are ``EngineConfig``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from tessera.errors import UserError

DEFAULT_MODEL_LEN = 2048  # tokens: keeps the default KV cache (max-num-seqs sequences of it) small


def default_model_len(context_window: int | None) -> int:
    """`tessera serve`'s longest prompt + output when none is given: the model's context window (tokens;
    None: unbounded), at most DEFAULT_MODEL_LEN."""
    return min(x for x in (context_window, DEFAULT_MODEL_LEN) if x is not None)


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """``served_model_name``: the name clients put in ``model``; ``api_key``: when set, /v1 requests need
    ``Authorization: Bearer <key>``; ``max_waiting``: requests accepted beyond the running ones before a
    429; ``created``: the Unix time /v1/models reports."""

    served_model_name: str
    api_key: str | None = None
    max_waiting: int = 256
    host: str = "127.0.0.1"
    port: int = 8000
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.served_model_name:
            raise UserError("--served-model-name must not be empty")
        if not isinstance(self.max_waiting, int) or self.max_waiting < 0:
            raise UserError(f"--max-waiting {self.max_waiting!r} must be an integer >= 0")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise UserError(f"--port {self.port!r} must be 0..65535 (0: any free port)")
        if self.api_key is not None and not self.api_key:
            raise UserError("--api-key must not be empty")
