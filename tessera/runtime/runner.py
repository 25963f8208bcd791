"""Serve requests on a Cluster: rounds of micro-batches, the online latency/throughput switch, greedy
generation or denoising, and the same rounds replayed in one process for verification."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tessera.capture.zoo import resolve
from tessera.contracts.enums import Objective, Phase
from tessera.graph import KernelGraph, Role
from tessera.runtime.cluster import Cluster, WorkerFailure
from tessera.runtime.partition import Partition, partition
from tessera.runtime.program import CapturedProgram
from tessera.runtime.steps import Executor, Job, as_input, input_buffer, step_keys

log = logging.getLogger("tessera.runtime")

Assign = Callable[[KernelGraph], tuple[int, ...]]  # phase graph -> kernel -> device


def phase_of(key: str) -> str:
    return key.split("@")[0]


def build_partitions(programs: dict[str, CapturedProgram], plans: dict[str, dict[str, tuple[int, ...]]],
                     devices: int) -> dict[tuple[str, str], Partition]:
    """plans: plan name -> phase -> assignment (per kernel of that phase's program).

    KV and state carry between steps by name, so every device that touches a cache in a later step of any
    plan holds it and gets its current version after each step that writes it elsewhere. Prefill starts a
    request from the initial contents (run_round resets), so its devices need no later versions."""
    holders: dict[str, set[int]] = {}
    for by_phase in plans.values():
        for key, prog in programs.items():
            if phase_of(key) == Phase.PREFILL:
                continue
            a = by_phase[phase_of(key)]
            for k in range(len(prog.ops)):
                for b in prog.needs(k) | prog.writes(k):
                    if prog.role(b) in (Role.KV, Role.STATE):
                        holders.setdefault(prog.name(b), set()).add(a[k])
    frozen = {n: frozenset(d) for n, d in holders.items()}
    return {(key, name): partition(prog, by_phase[phase_of(key)], devices, frozen)
            for name, by_phase in plans.items() for key, prog in programs.items()}


class ClusterExecutor:
    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def step(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool
             ) -> list[list[torch.Tensor]]:
        res = self.cluster.step(key, plan, inputs, reset=reset)
        return by_microbatch(res, len(self.cluster.programs[key].outputs), len(inputs))


def by_microbatch(per_worker: list[dict], n_outputs: int, m: int) -> list[list[torch.Tensor]]:
    """Each worker's step outputs ((micro-batch, output index) -> tensor) as one list per micro-batch."""
    got = {k: v for r in per_worker for k, v in r["outputs"].items()}
    return [[got[(mb, i)] for i in range(n_outputs)] for mb in range(m)]


@dataclass
class RoundResult:
    plan: str
    microbatches: int
    outputs: list[torch.Tensor] = field(default_factory=list)  # every step output, in order
    tokens: list[torch.Tensor] = field(default_factory=list)  # llm/ssm: [mb] (batch, new_tokens)
    processed_tokens: int = 0


def run_round(ex: Executor, job: Job, programs: dict[str, CapturedProgram], plan: str, m: int, round_id: int
              ) -> RoundResult:
    """One group of ``m`` micro-batches (requests) from their first step to their last."""
    out = RoundResult(plan=plan, microbatches=m)
    gens = [torch.Generator().manual_seed(job.seed * 1_000_003 + round_id * 1009 + mb) for mb in range(m)]
    if job.family == "dit":
        prog = programs["denoise"]
        hs, ts = input_buffer(prog, "hidden_states"), input_buffer(prog, "timestep")
        shape = prog.graph.buffers[hs].shape
        lat = [torch.randn(shape, generator=g) for g in gens]
        for s in range(job.denoise_steps):
            t, t_next = 1 - s / job.denoise_steps, 1 - (s + 1) / job.denoise_steps
            feed = [{hs: as_input(x), ts: as_input(torch.full((job.batch,), t))} for x in lat]
            preds = ex.step("denoise", plan, feed, reset=False)
            lat = [x + (t_next - t) * p[0] for x, p in zip(lat, preds, strict=True)]
            out.outputs += [p[0] for p in preds]
            out.processed_tokens += m * job.batch * job.seq
        out.outputs += lat
        return out
    cfg = resolve(job.model).config
    vocab = int(cfg.get("text_config", cfg).get("vocab_size", cfg.get("vocab_size")))
    keys = step_keys(job)
    ids = [torch.randint(0, vocab, (job.batch, job.seq), generator=g) for g in gens]
    toks: list[list[torch.Tensor]] = [[] for _ in range(m)]
    for i, key in enumerate(keys):
        b = input_buffer(programs[key], "input_ids")
        res = ex.step(key, plan, [{b: as_input(x)} for x in ids], reset=i == 0)
        ids = []
        for mb, r in enumerate(res):
            nxt = r[0][:, -1].argmax(-1)  # greedy
            toks[mb].append(nxt)
            ids.append(nxt.reshape(job.batch, 1))
            out.outputs.append(r[0])
        out.processed_tokens += m * job.batch * (job.seq if i == 0 else 1)
    out.tokens = [torch.stack(t, dim=1) for t in toks]
    return out


@dataclass(frozen=True, kw_only=True)
class SwitchPolicy:
    """Throughput plan while at least ``threshold`` requests wait, latency plan otherwise."""

    throughput_microbatches: int
    threshold: int

    def __post_init__(self) -> None:
        if self.throughput_microbatches < 1 or self.threshold < 1:
            raise ValueError(f"switch policy needs positive values, got {self}")

    def choose(self, queue_depth: int) -> tuple[Objective, int, str]:
        if queue_depth >= self.threshold:
            why = f"queue depth {queue_depth} >= {self.threshold}"
            return Objective.THROUGHPUT, self.throughput_microbatches, why
        return Objective.LATENCY, 1, f"queue depth {queue_depth} < {self.threshold}"


def serve(ex: Executor, job: Job, programs: dict[str, CapturedProgram], requests: int, policy: SwitchPolicy,
          plan_names: dict[str, str] | None = None, recover: Callable[[WorkerFailure], None] | None = None
          ) -> tuple[list[RoundResult], list[str]]:
    """Drain a queue of ``requests`` requests (one micro-batch each); log each plan switch with its cause.

    plan_names maps mode -> plan (both modes may share one placement and differ only in micro-batches).
    recover: called with a lost worker's failure (it re-plans ``ex`` onto the survivors, or raises); the
    interrupted round then runs again from its first step under the same index (same seeds).
    """
    names = plan_names or {Objective.THROUGHPUT: "throughput", Objective.LATENCY: "latency"}
    rounds: list[RoundResult] = []
    switches: list[str] = []
    mode, queue_depth = "", requests
    while queue_depth > 0:
        want, m, cause = policy.choose(queue_depth)
        m = min(m, queue_depth)
        if want != mode:
            msg = f"round {len(rounds)}: {mode or 'start'} -> {want} ({cause})"
            switches.append(msg)
            log.info("plan switch: %s", msg)
            mode = want
        try:
            rounds.append(run_round(ex, job, programs, names[want], m, len(rounds)))
        except WorkerFailure as failure:
            if recover is None:
                raise
            recover(failure)
            continue
        queue_depth -= m
    return rounds, switches


def compare(a: list[RoundResult], b: list[RoundResult]) -> tuple[bool, float, bool | None]:
    """(every output bit-identical, max |difference|, greedy tokens identical or None if no tokens)."""
    same, diff = True, 0.0
    for x, y in zip(a, b, strict=True):
        for p, q in zip(x.outputs, y.outputs, strict=True):
            same &= torch.equal(p, q)
            diff = max(diff, float((p - q).abs().max()) if p.numel() else 0.0)
    has_tokens = any(r.tokens for r in a)
    tok = all(torch.equal(p, q) for x, y in zip(a, b, strict=True) for p, q in zip(x.tokens, y.tokens, strict=True))
    return same, diff, (tok if has_tokens else None)
