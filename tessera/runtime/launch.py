"""The runtime as one SPMD program under torchrun: one rank per device, no driver process.

    torchrun --nproc-per-node 2 -m tessera.runtime.launch llama-tiny --placement layer_split --verify --json

Every rank captures the same programs, plans the same placement, partitions it (runner.build_partitions)
and takes its own share (cluster.worker_specs(...)[RANK]); ranks check they agree by all-gathering a hash
of what they built. Then every rank runs the driver loop `tessera run` runs (runner.serve) over an
SpmdExecutor: a step runs locally and its outputs are all-gathered, so every rank sees every output and
the greedy tokens stay identical everywhere without further messages. Object collectives use their own
gloo group so control never mixes with the data plane's point-to-point messages. Rank 0 prints the result
(api.summarise: the `tessera run --json` contract); a failing rank exits non-zero and torchrun's agent
stops the others (there is no driver-side heartbeat here).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from tessera.contracts.results import RunResult
from tessera.errors import UserError, choices_error
from tessera.runtime.api import RunSpec, Served, render, summarise
from tessera.runtime.cluster import ClusterConfig, worker_specs
from tessera.runtime.partition import Partition
from tessera.runtime.placements import MILP, PLACEMENTS
from tessera.runtime.probe import probe_link
from tessera.runtime.program import CapturedProgram, from_wire, to_wire
from tessera.runtime.recovery import placement_graphs, replan_with
from tessera.runtime.runner import build_partitions, by_microbatch, serve
from tessera.runtime.steps import Job, capture_steps
from tessera.runtime.worker import PartitionWorker, PartitionWorkerSpec, StepCmd, join_group

NOT_TORCHRUN = "run under torchrun (RANK/WORLD_SIZE unset)"


@dataclass(frozen=True, kw_only=True)
class RankEnv:
    """What torchrun tells each process (MASTER_PORT is read by the env:// rendezvous); the engine across
    hosts (tessera.engine.remote) reads it too."""

    rank: int
    world: int
    local_rank: int
    master: str = "127.0.0.1"  # MASTER_ADDR: the rendezvous host

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world or self.local_rank < 0:
            raise UserError(f"RANK={self.rank}, LOCAL_RANK={self.local_rank} do not fit WORLD_SIZE={self.world}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> RankEnv:
        if any(k not in env for k in ("RANK", "WORLD_SIZE")):
            raise UserError(NOT_TORCHRUN)
        try:
            return cls(rank=int(env["RANK"]), world=int(env["WORLD_SIZE"]),
                       local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
                       master=env.get("MASTER_ADDR", "127.0.0.1"))
        except ValueError:
            raise UserError(f"RANK/WORLD_SIZE/LOCAL_RANK must be integers; {NOT_TORCHRUN}") from None


@dataclass(frozen=True, kw_only=True)
class LaunchConfig:
    model: str
    placement: str = "layer_split"
    microbatches: int = 2
    requests: int = 2
    device: str = "cpu"  # every rank's kind; "cuda" is the rank's LOCAL_RANK GPU
    verify: bool = False
    as_json: bool = False
    recv_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        if self.placement not in (*PLACEMENTS, MILP):
            raise choices_error("placement", self.placement, [*PLACEMENTS, MILP])
        if self.device not in ("cpu", "cuda"):
            raise choices_error("device", self.device, ["cpu", "cuda"])
        if self.device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda but this torch build sees no GPU; valid here: cpu")
        if self.microbatches < 1 or self.requests < 1:
            raise UserError(f"--microbatches={self.microbatches} and --requests={self.requests} must be >= 1")


def fingerprint(programs: dict[str, CapturedProgram], parts: dict[tuple[str, str], Partition]) -> str:
    """A hash of everything ranks must agree on: the kernel sequences, the starting bytes (weights, KV)
    and the partitions. Sets are sorted: their iteration order need not match across processes."""
    h = hashlib.sha256()
    for key in sorted(programs):
        p = programs[key]
        h.update(repr((key, p.ops, p.outputs)).encode())
        for b in sorted(p.initial):
            h.update(p.initial[b].contiguous().view(torch.uint8).numpy().tobytes())
    for pk in sorted(parts):
        q = parts[pk]
        h.update(repr((pk, q.assignment, q.kernels, [sorted(s) for s in q.resident],
                       [sorted(s) for s in q.inputs], q.transfers, q.output_device)).encode())
    return h.hexdigest()


def rank_spec(programs: dict[str, CapturedProgram], parts: dict[tuple[str, str], Partition],
              cfg: LaunchConfig, env: RankEnv) -> PartitionWorkerSpec:
    """This rank's spec, as Cluster would hand it to worker RANK of WORLD_SIZE identical devices."""
    devices = (cfg.device,) * env.world
    # One process cannot tell the ranks' GPUs apart ("cuda" is each rank's own LOCAL_RANK GPU, on hosts it
    # cannot see), so ClusterConfig would take them for one shared GPU; plan as gloo, then use NCCL with
    # its ordered schedule, torchrun's one-GPU-per-rank case.
    cc = ClusterConfig(devices=devices, max_microbatches=cfg.microbatches, recv_timeout_s=cfg.recv_timeout_s,
                       transport="gloo")
    spec = worker_specs(programs, parts, cc)[env.rank]
    return replace(spec, backend="nccl", ordered=True) if cfg.device == "cuda" else spec


def all_gather(obj: Any, world: int, group: Any) -> list[Any]:
    """Every rank's ``obj``, by rank, over the control group (under the process group's timeout)."""
    got: list[Any] = [None] * world
    dist.all_gather_object(got, obj, group=group)
    return got


class SpmdExecutor:
    """runtime.steps.Executor over torchrun's ranks: run this rank's share, all-gather every rank's result."""

    def __init__(self, worker: PartitionWorker, programs: dict[str, CapturedProgram], control: Any) -> None:
        self.worker, self.programs, self.control = worker, programs, control
        self.world = worker.spec.world
        self.history: list[dict[str, Any]] = []  # as Cluster.history (for api.summarise's measurement)
        self._next_step = 0

    def run(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool) -> list[dict]:
        """One step on every rank; each rank's outputs and events, as Cluster.step returns them."""
        assert len(inputs) <= self.worker.spec.max_microbatches, "more micro-batches than the ranks hold state for"
        wire = tuple({b: to_wire(t) for b, t in feed.items()} for feed in inputs)
        cmd = StepCmd(step_id=self._next_step, key=key, plan=plan, inputs=wire, reset=reset)
        self._next_step += 1
        per_rank = all_gather(self.worker.run_step(cmd), self.world, self.control)
        for w in per_rank:
            w["outputs"] = {k: from_wire(v) for k, v in w["outputs"].items()}
        self.history.append(dict(key=key, plan=plan, m=len(inputs), workers=per_rank))
        return per_rank

    def step(self, key: str, plan: str, inputs: list[dict[int, torch.Tensor]], *, reset: bool
             ) -> list[list[torch.Tensor]]:
        res = self.run(key, plan, inputs, reset=reset)
        return by_microbatch(res, len(self.programs[key].outputs), len(inputs))


def launch(cfg: LaunchConfig, env: RankEnv) -> RunResult | None:
    """Run on this rank; rank 0 returns the result (api.summarise's), the others None."""
    job = Job(model=cfg.model)
    programs = capture_steps(job)
    # replan_with: the named placement, or everything on the one device of a world of 1
    by_phase = replan_with(cfg.placement, cfg.microbatches)(placement_graphs(programs), env.world)
    spec = RunSpec(job=job, devices=(cfg.device,) * env.world, plans={"latency": by_phase, "throughput": by_phase},
                   microbatches=cfg.microbatches, requests=cfg.requests, recv_timeout_s=cfg.recv_timeout_s)
    parts = build_partitions(programs, spec.plans, env.world)
    wspec = rank_spec(programs, parts, cfg, env)
    timeout = join_group(wspec)
    control = dist.new_group(backend="gloo", timeout=timeout)
    hashes = all_gather(fingerprint(programs, parts), env.world, control)  # before loading anything
    if len(set(hashes)) > 1:
        groups = {h: [r for r, x in enumerate(hashes) if x == h] for h in hashes}
        raise RuntimeError(f"ranks disagree on the captured programs or the {cfg.placement!r} partitions "
                           f"(rank groups {sorted(groups.values())}): capture or placement is not deterministic "
                           "across processes; every rank must build the same plan")
    ex = SpmdExecutor(PartitionWorker(wspec, None), programs, control)  # results: unused (no driver queue)
    link = probe_link(env.rank, env.world, ex.worker.link, ex.worker.waiters)
    resident = all_gather(ex.worker.resident_report(), env.world, control)
    rounds, switches = serve(ex, job, programs, cfg.requests, spec.policy)
    if env.rank != 0:
        return None
    served = Served(rounds=rounds, switches=switches, history=ex.history, parts=parts, devices=spec.devices,
                    link=link, resident=resident, recoveries=[], transport=wspec.backend)
    return summarise(spec, programs, served)


def parse(argv: Sequence[str] | None) -> LaunchConfig:
    ap = argparse.ArgumentParser(prog="torchrun ... -m tessera.runtime.launch",
                                 description="Run a placement of MODEL with one torchrun rank per device.")
    ap.add_argument("model", help="a tiny model name or a small config.json")
    ap.add_argument("--placement", default="layer_split", help=f"one of {', '.join([*PLACEMENTS, MILP])}")
    ap.add_argument("--microbatches", type=int, default=2, help="micro-batches in flight (throughput mode)")
    ap.add_argument("--requests", type=int, default=2, help="requests to serve (one micro-batch each)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (each rank's LOCAL_RANK GPU, NCCL)")
    ap.add_argument("--verify", action="store_true", help="exit 1 unless outputs equal single-process execution")
    ap.add_argument("--json", dest="as_json", action="store_true", help="print the JSON result (rank 0)")
    a = ap.parse_args(argv)
    return LaunchConfig(model=a.model, placement=a.placement, microbatches=a.microbatches, requests=a.requests,
                        device=a.device, verify=a.verify, as_json=a.as_json)


def main(argv: Sequence[str] | None = None) -> int:
    """0 on success; 2 for a user mistake (one line); 1 for a failure or a --verify mismatch."""
    env: RankEnv | None = None
    try:
        env = RankEnv.from_env()
        cfg = parse(argv)
        out = launch(cfg, env)
    except UserError as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    except Exception as e:  # one line naming the rank; torchrun's agent then stops the other ranks
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: rank {env.rank if env else '?'}: {type(e).__name__}: {msg}", file=sys.stderr, flush=True)
        if os.environ.get("TESSERA_DEBUG"):
            traceback.print_exc()
        # peers may be blocked in a collective with us: leave without the process group's teardown
        sys.stderr.flush()
        os._exit(1)
    status = 0
    if out is not None:
        print(render(out, as_json=cfg.as_json), flush=True)
        if cfg.verify and not out.verified:
            print(f"error: outputs differ from single-process execution (max |diff| {out.max_abs_diff:.3g})",
                  file=sys.stderr)
            status = 1
    dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
