"""The one device a worker computes on, and how its work is timed and moved.

Everything a worker allocates or loads goes through these helpers with the worker's ``torch.device``
(weights, KV/state, zeroed allocations, receive buffers, step inputs), so a CUDA worker holds nothing on
the host except what crosses the control queues (step inputs and outputs as plain bytes). Transports:
``gloo`` moves host tensors (a CUDA worker stages each transfer through host memory), ``nccl`` moves
device tensors. Kernel times on CUDA come from events on the compute stream (the host only enqueues),
mapped onto the host's perf_counter timeline once the step is synchronised.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch

from tessera.errors import UserError

BACKENDS = ("auto", "gloo", "nccl")
HOST = torch.device("cpu")  # where the control queues' bytes and gloo's staged transfers live


def torch_device(name: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N`` as a device with an explicit index (``cuda``: this process's
    LOCAL_RANK, as torchrun sets it, else 0)."""
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"unknown device {name!r}; valid: cpu, cuda, cuda:N") from None
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return dev


def choose_backend(devices: Sequence[str], transport: str) -> tuple[str, bool]:
    """(process-group backend, ordered issue) for one worker per entry of ``devices``.

    NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"), so ``auto`` picks
    NCCL only for distinct GPUs and otherwise gloo with host staging. NCCL ignores message tags and
    matches a pair's sends and receives in issue order (and blocks on a send until its receive is
    posted), so it needs the ordered schedule (step_ordered.py); gloo matches by tag."""
    if transport not in BACKENDS:
        raise UserError(f"unknown transport {transport!r}; valid: {', '.join(BACKENDS)}")
    devs = [torch_device(d) for d in devices]
    if all(d.type == "cpu" for d in devs):
        if transport == "nccl":
            raise UserError("transport nccl needs cuda devices; valid for cpu: auto, gloo")
        return "gloo", False
    dup = len(set(devs)) < len(devs)
    if transport == "nccl" and dup:
        raise UserError(f"NCCL cannot run two workers on one GPU ({','.join(devices)}); valid: "
                        "--transport gloo (staged through host memory), or one distinct cuda:N per worker")
    if transport == "gloo" or (transport == "auto" and dup):
        return "gloo", False
    return "nccl", True


def on_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``; the same tensor when it is already there (read-only uses: inputs, constants)."""
    return t if t.device == device else t.to(device)


def fresh_storage(t: torch.Tensor, device: torch.device) -> torch.UntypedStorage:
    """A private copy of ``t``'s bytes on ``device`` (KV/state starting contents, mutated in place)."""
    return t.detach().to(device, copy=True).untyped_storage()


def zero_storage(nbytes: int, device: torch.device) -> torch.UntypedStorage:
    return torch.zeros(nbytes, dtype=torch.uint8, device=device).untyped_storage()


def empty_bytes(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)


def as_bytes(st: torch.UntypedStorage) -> torch.Tensor:
    """A flat uint8 tensor over a storage, on the storage's device (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)


def set_up(device: torch.device) -> None:
    """Bind this process to its GPU before the process group exists (NCCL picks the current device)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Clock:
    """Timestamps of work on one device. ``mark()`` returns a token at the current point of the compute
    stream; ``seconds(token)`` (after ``finish()``) is that point on the host's perf_counter timeline.
    CPU: the token is the time itself. CUDA: an event, resolved against one recorded at ``begin()``."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self._origin: Any = None
        self._origin_s = 0.0

    def begin(self) -> float:
        """Start of a step: the stream is drained so the origin event and the host clock coincide."""
        if not self.cuda:
            return time.perf_counter()
        synchronize(self.device)
        self._origin = torch.cuda.Event(enable_timing=True)
        self._origin.record()
        self._origin_s = time.perf_counter()
        return self._origin_s

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def finish(self) -> float:
        """End of a step: every marked point has executed; returns the host time."""
        synchronize(self.device)
        return time.perf_counter()

    def anchor(self) -> Any:
        """A point to time one step's events from, when steps follow each other without the device going
        idle (``begin`` then only comes once): CUDA's elapsed times are float32 milliseconds, which from an
        origin minutes old lose the microseconds. None on CPU."""
        return self.mark() if self.cuda else None

    def seconds(self, token: Any, anchor: Any = None) -> float:
        """``token`` on the host timeline; with an ``anchor`` (from ``anchor()``) only the anchor is placed
        from the origin, and the token from the anchor."""
        if not self.cuda or isinstance(token, float):
            return float(token)
        if anchor is not None:
            return self.seconds(anchor) + anchor.elapsed_time(token) / 1e3
        return self._origin_s + self._origin.elapsed_time(token) / 1e3  # elapsed_time is in ms
