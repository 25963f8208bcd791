"""Will a real run fit in this machine's memory? Checked before anything real is allocated.

A real run builds the model with real fp32 weights once per captured step (prefill and each decode
position is its own program with its own copy of the weights: see ``steps.capture_steps``), and the
workers hold at least one more copy between them. KV/state and activations live in the launching
process (the single-process reference) and again on the workers. So a lower bound on what a run needs:

    need = weights_fp32 · (steps + 1) + 2 · (kv + state + activations)

Each term comes from a fake-tensor capture of the run's first step in fp32 (no memory allocated).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from tessera.capture.zoo import resolve
from tessera.contracts.enums import Phase
from tessera.errors import UserError
from tessera.graph import Role
from tessera.runtime.steps import Job, step_keys

MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, kw_only=True)
class RunMemory:
    model: str
    steps: int  # captured programs (prefill + decode positions, or one denoise program)
    weight_bytes: int  # fp32 weights of the model, one copy
    cache_bytes: int  # KV + state of one step, fp32
    activation_bytes: int  # activations, inputs and outputs of one step, fp32

    def __post_init__(self) -> None:
        if self.steps < 1 or min(self.weight_bytes, self.cache_bytes, self.activation_bytes) < 0:
            raise ValueError(f"RunMemory: steps={self.steps} must be >= 1 and bytes >= 0, got weights "
                             f"{self.weight_bytes}, cache {self.cache_bytes}, activations {self.activation_bytes}")

    @property
    def need_bytes(self) -> int:
        return self.weight_bytes * (self.steps + 1) + 2 * (self.cache_bytes + self.activation_bytes)


def estimate_run_memory(model: str, *, phase: str, batch: int, seq: int, context: int | None,
                        steps: int) -> RunMemory:
    """RunMemory of ``model`` from a fake fp32 capture of its first step (seconds, no real tensors)."""
    from tessera.capture import capture_model

    graph = capture_model(model, phase, batch=batch, seq=seq, context=context, dtype=torch.float32)
    roles = graph.bytes_by_role()
    return RunMemory(model=model, steps=steps, weight_bytes=roles[Role.WEIGHT],
                     cache_bytes=roles[Role.KV] + roles[Role.STATE],
                     activation_bytes=roles[Role.ACTIVATION] + roles[Role.INPUT] + roles[Role.OUTPUT])


def available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable from /proc/meminfo (kB there), in bytes; None where the file is missing (not Linux)."""
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def check_fits(mem: RunMemory, available: int | None) -> None:
    """One UserError line when the run cannot fit; silent when it can or when nothing is known."""
    if available is None or mem.need_bytes <= available:
        return
    raise UserError(
        f"a real run of {mem.model} needs at least {mem.need_bytes / 1e9:.1f} GB of memory but "
        f"{available / 1e9:.1f} GB is available: fp32 weights {mem.weight_bytes / 1e9:.1f} GB x "
        f"{mem.steps + 1} (one per captured step, one on the workers), KV/state and activations "
        f"{2 * (mem.cache_bytes + mem.activation_bytes) / 1e9:.2f} GB; run a tiny model "
        f"(tessera models) or fewer --output tokens, or plan it with `tessera plan` and `tessera simulate`")


def check_job(job: Job, available: int | None = None) -> RunMemory | None:
    """Refuse a run that cannot fit (``available``: MemAvailable unless given); tiny zoo models pass at once."""
    if resolve(job.model).tiny or job.family not in ("llm", "moe", "ssm", "dit"):
        return None  # tiny: kilobytes; other families: capture_steps says they cannot run
    keys = step_keys(job)
    phase = Phase.DENOISE if keys[0] == Phase.DENOISE else Phase.PREFILL
    mem = estimate_run_memory(job.model, phase=phase, batch=job.batch, seq=job.seq,
                              context=job.context if phase == Phase.DENOISE else None, steps=len(keys))
    check_fits(mem, available if available is not None else available_bytes())
    return mem
