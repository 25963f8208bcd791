"""Split a CapturedProgram by a kernel->device assignment: per-device kernel lists, resident buffers,
transfers.

Every buffer has a set of devices holding its current version. A kernel needs every buffer its
arguments view; when its device lacks the current version, a BufferTransfer brings it from the device that
wrote it, sent right after that write and awaited right before the reading kernel. KV and state
written on one device but touched on another are synced at the end of the step, so every step starts
with each device holding current copies of what it touches (the first step starts from loaded copies).
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.graph import RESIDENT_ROLES, Role
from tessera.runtime.program import CapturedProgram

STEP_START = -1  # BufferTransfer.after: send before any kernel runs


@dataclass(frozen=True, kw_only=True)
class BufferTransfer:
    """A captured buffer's current version sent from ``src`` to ``dst`` within one step, placed by kernel ids
    (the engine's ``routes.Transfer`` moves a traced node's value instead)."""

    index: int  # position in the step's schedule; part of the message tag
    buffer: int
    src: int
    dst: int
    after: int  # kernel id on src after which the send is posted; STEP_START: at step start
    before: int  # kernel id on dst that waits for it; len(kernels): step end
    nbytes: int
    snapshot: bool  # src mutates the buffer in place later: send a copy, not the live storage


@dataclass(frozen=True, kw_only=True)
class Partition:
    devices: int
    assignment: tuple[int, ...]
    kernels: tuple[tuple[int, ...], ...]  # per device, program order
    resident: tuple[frozenset[int], ...]  # weight/kv/state buffers loaded on each device
    inputs: tuple[frozenset[int], ...]  # per-step inputs (role input) each device is handed
    transfers: tuple[BufferTransfer, ...]
    output_device: tuple[int, ...]  # device holding each step output at step end

    def __post_init__(self) -> None:
        if len(self.kernels) != self.devices:
            raise AssertionError(f"{len(self.kernels)} kernel lists for {self.devices} devices")

    def link_bytes(self) -> dict[tuple[int, int], int]:
        out: dict[tuple[int, int], int] = {}
        for t in self.transfers:
            out[(t.src, t.dst)] = out.get((t.src, t.dst), 0) + t.nbytes
        return out

    def sends_after(self, device: int) -> dict[int, list[BufferTransfer]]:
        out: dict[int, list[BufferTransfer]] = {}
        for t in self.transfers:
            if t.src == device:
                out.setdefault(t.after, []).append(t)
        return out

    def recvs_before(self, device: int) -> dict[int, list[BufferTransfer]]:
        out: dict[int, list[BufferTransfer]] = {}
        for t in self.transfers:
            if t.dst == device:
                out.setdefault(t.before, []).append(t)
        return out


def partition(program: CapturedProgram, assignment: tuple[int, ...], devices: int,
              holders: dict[str, frozenset[int]] | None = None) -> Partition:
    """``holders``: KV/state buffer name -> devices that touch it in *other* steps or plans of the run
    (e.g. decode placed apart from prefill, or the other plan of an online switch). They keep it
    resident and receive its current version at the end of every step that writes it (the handoff)."""
    n = len(program.ops)
    if len(assignment) != n:
        raise ValueError(f"assignment has {len(assignment)} entries but the program has {n} kernels")
    bad = sorted({d for d in assignment if not 0 <= d < devices})
    if bad:
        raise ValueError(f"assignment names devices {bad}; valid: 0..{devices - 1}")
    needs = [program.needs(k) for k in range(n)]
    writes = [program.writes(k) for k in range(n)]
    touching: dict[int, set[int]] = {}
    for k in range(n):
        for b in needs[k] | writes[k]:
            touching.setdefault(b, set()).add(assignment[k])
    keepers = {b: set(touching.get(b, ())) for b in program.initial}  # devices holding b between steps
    for b in program.initial:
        if program.role(b) in RESIDENT_ROLES and program.role(b) is not Role.WEIGHT and holders:
            keepers[b] |= holders.get(program.name(b), frozenset())
    given = set(program.initial)
    zeroed = program.zeroed()  # each device allocates its own zeros until the first write
    valid: dict[int, set[int]] = {b: set(touching.get(b, ())) for b in given | zeroed}
    last_write: dict[int, tuple[int, int]] = {}
    transfers: list[BufferTransfer] = []

    def snapshot(b: int, src: int, after: int) -> bool:
        # a copy only if src writes b in place later in this step; sends complete before the step ends,
        # so the next step's in-place writes (KV appends) cannot race a send
        return any(assignment[k] == src and b in writes[k] and b in needs[k] for k in range(after + 1, n))

    def bring(b: int, d: int, before: int) -> None:
        src, after = last_write.get(b, (min(valid[b]), STEP_START))
        transfers.append(BufferTransfer(index=len(transfers), buffer=b, src=src, dst=d, after=after,
                                        before=before, nbytes=program.nbytes(b),
                                        snapshot=snapshot(b, src, after)))
        valid[b].add(d)

    for k in range(n):
        d = assignment[k]
        for b in sorted(needs[k]):
            if b not in valid:
                raise AssertionError(f"kernel {k} reads buffer {b} before any kernel writes it")
            if d not in valid[b]:
                bring(b, d, k)
        for b in writes[k]:
            valid[b] = {d}
            last_write[b] = (d, k)
    for b in sorted(last_write):  # end-of-step sync of resident state touched on several devices
        if b in given and program.role(b) in RESIDENT_ROLES:
            for d in sorted(keepers[b] - valid[b]):
                bring(b, d, n)
    out_dev = []
    for r in program.outputs:
        assert r.buffer in last_write, f"step output buffer {r.buffer} is never written"
        out_dev.append(last_write[r.buffer][0])
    resident = tuple(
        frozenset(b for b in given if d in keepers[b] and program.role(b) in RESIDENT_ROLES)
        for d in range(devices))
    inputs = tuple(
        frozenset(b for b in given if d in touching.get(b, ()) and program.role(b) not in RESIDENT_ROLES)
        for d in range(devices))
    return Partition(
        devices=devices, assignment=tuple(assignment),
        kernels=tuple(tuple(k for k in range(n) if assignment[k] == d) for d in range(devices)),
        resident=resident, inputs=inputs, transfers=tuple(transfers), output_device=tuple(out_dev))


def state_roles() -> frozenset[Role]:
    """Resident roles that each micro-batch owns a private copy of (weights are shared)."""
    return frozenset({Role.KV, Role.STATE})
