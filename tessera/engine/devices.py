"""Where an engine runs: one worker process per ``--devices`` entry, each of a kind the planner can price.

Entries (comma-separated):

- ``cpu``: a worker with one intra-op thread;
- ``cpu:threads=N``: N intra-op threads;
- ``cpu:speed=S`` (0 < S ≤ 1): a worker that idles (1/S − 1) times as long as it computed before it hands
  its results on (each send, and the end of its share of an iteration): a device S times as fast, on a core
  of its own. Options combine: ``cpu:threads=2:speed=0.5``;
- ``cuda`` / ``cuda:N``: a GPU (its catalog type is what the planner prices).

Why a duty cycle rather than thread counts for heterogeneous CPU workers: on a 2-core machine, workers of 1
and 2 threads share a core whenever both compute, so a worker's speed would depend on what the other does at
that moment, which no per-kind profile can describe; a duty cycle gives each worker a fixed fraction of its
own core, as a slower GPU has a fixed speed, and leaves the rest of that core to the driver.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from tessera.errors import UserError

CPU_OPTIONS = ("threads", "speed")


@dataclass(frozen=True, kw_only=True)
class WorkerKind:
    """One worker: its torch device (``cpu`` or ``cuda:N``), intra-op threads and duty-cycle speed."""

    device: str
    threads: int = 1
    speed: float = 1.0

    def __post_init__(self) -> None:
        if self.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", self.device):
            raise UserError(f"unknown device {self.device!r}; valid: cpu, cpu:threads=N, cpu:speed=S, cuda:N")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or self.threads < 1:
            raise UserError(f"device {self.device}: threads={self.threads!r} must be a positive integer")
        if not (isinstance(self.speed, int | float) and math.isfinite(self.speed) and 0 < self.speed <= 1):
            raise UserError(f"device {self.device}: speed={self.speed!r} must be in (0, 1]")
        if self.device.startswith("cuda") and (self.threads != 1 or self.speed != 1):
            raise UserError(f"device {self.device}: threads and speed are options of cpu workers only")

    @property
    def cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def name(self) -> str:
        """The kind's label: what a profile is kept under and the planner prices (cuda: the device)."""
        opts = ([f"threads={self.threads}"] if self.threads != 1 else []) + (
            [f"speed={self.speed:g}"] if self.speed != 1 else [])
        return ":".join([self.device, *opts])


def parse_device(text: str) -> WorkerKind:
    parts = text.strip().split(":")
    if parts[0] != "cpu":
        return WorkerKind(device=text.strip())
    opts: dict[str, str] = {}
    for p in parts[1:]:
        key, _, value = p.partition("=")
        if key not in CPU_OPTIONS or not value or key in opts:
            raise UserError(f"device {text!r}: cpu options are {', '.join(o + '=' for o in CPU_OPTIONS)}"
                            f" (e.g. cpu:threads=2, cpu:speed=0.5), each at most once")
        opts[key] = value
    try:
        threads, speed = int(opts.get("threads", "1")), float(opts.get("speed", "1"))
    except ValueError:
        raise UserError(f"device {text!r}: threads must be an integer and speed a number") from None
    return WorkerKind(device="cpu", threads=threads, speed=speed)


def parse_devices(text: str) -> tuple[WorkerKind, ...]:
    """``--devices``: one worker per entry; all CPU or all CUDA (one transport per run), GPUs that exist."""
    kinds = tuple(parse_device(d) for d in text.split(",") if d.strip())
    if not kinds:
        raise UserError("--devices is empty; give one or more of: cpu, cpu:threads=N, cpu:speed=S, cuda:N")
    if len({k.cuda for k in kinds}) > 1:
        raise UserError(f"devices {text} mix cpu and cuda; one transport per run")
    if kinds[0].cuda:
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        valid = ", ".join(["cpu", *(f"cuda:{i}" for i in range(n))])
        for k in kinds:
            index = int(k.device.split(":")[1]) if ":" in k.device else 0
            if not 0 <= index < n:
                raise UserError(f"device {k.device} does not exist here; valid: {valid}")
    return kinds
