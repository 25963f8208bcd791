"""A worker holds and computes everything on its one device: checked on the "meta" device, where any host
tensor in the hot path fails (``set_`` refuses a storage on another device, and ops refuse mixed devices)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tessera.errors import UserError
from tessera.graph import Role
from tessera.runtime.cluster import ClusterConfig, worker_specs
from tessera.runtime.device import HOST, choose_backend, torch_device
from tessera.runtime.placements import all_on
from tessera.runtime.program import to_wire
from tessera.runtime.runner import build_partitions
from tessera.runtime.step_threaded import run_threaded
from tessera.runtime.steps import Job, as_input, capture_steps, input_buffer
from tessera.runtime.worker import PartitionWorker, StepCmd

META = torch.device("meta")


def one_worker(programs, device: str, backend: str = "gloo") -> PartitionWorker:
    """A world of one (no transfers, so no process group is needed) on ``device``."""
    graphs = {}
    for key, p in programs.items():
        graphs.setdefault(key.split("@")[0], p.graph)
    parts = build_partitions(programs, {"p": {ph: all_on(g) for ph, g in graphs.items()}}, 1)
    (spec,) = worker_specs(programs, parts, ClusterConfig(devices=("cpu",), recv_timeout_s=1.0))
    spec = replace(spec, device=device, backend=backend)  # the cpu config's share, placed on ``device``
    return PartitionWorker(spec, results=None)


@pytest.mark.parametrize("job", [Job(model="llama-tiny", seq=6, new_tokens=3),
                                 Job(model="dit-tiny", seq=16, context=4, denoise_steps=1)], ids=["llama", "dit"])
def test_every_tensor_a_worker_makes_is_on_its_device(job: Job) -> None:
    """Weights, KV/state (fresh and carried to the next context length), step inputs, zeroed allocations,
    factory ops recorded with device=cpu (aten.arange, aten.scalar_tensor), every kernel output."""
    programs = capture_steps(job)
    w = one_worker(programs, "meta")
    assert {s.device for s in w.weights.values()} == {META}
    name = "input_ids" if job.family == "llm" else "hidden_states"
    for i, key in enumerate(programs):  # prefill, then decode steps that carry the cache to a longer one
        prog = programs[key]
        b = input_buffer(prog, name)
        feed = torch.zeros(prog.graph.buffers[b].shape, dtype=getattr(torch, prog.graph.buffers[b].dtype))
        cmd = StepCmd(step_id=i, key=key, plan="p", inputs=({b: to_wire(as_input(feed))},), reset=i == 0)
        stores = [w._store(prog, w.spec.partitions[(key, "p")], 0, cmd)]
        run_threaded(w, w.local[(key, "p")], stores, i)
        assert {st.device for st in stores[0].values()} == {META}, key
        touched = set().union(*(prog.needs(k) | prog.writes(k) for k in range(len(prog.ops))))
        assert touched <= set(stores[0])  # every buffer a kernel touches was made (none skipped)
        for mb_state in w.state:  # what carries into the next step
            mb_state.update({prog.name(b): stores[0][b] for b in stores[0] if prog.role(b) in (Role.KV, Role.STATE)})


def test_transfer_tensors_live_where_the_transport_moves_them() -> None:
    """NCCL moves device tensors; gloo moves host tensors (a device worker stages through the host)."""
    programs = capture_steps(Job(model="llama-tiny", seq=6, new_tokens=2))
    st = torch.zeros(8, dtype=torch.uint8, device=META).untyped_storage()
    nccl = one_worker(programs, "meta", backend="nccl")
    assert nccl.link == META and nccl.recv_buffer(8).device == META
    assert nccl.outgoing(st, snapshot=True).device == META and nccl.landed(nccl.recv_buffer(8)).device == META
    gloo = one_worker(programs, "cpu")
    assert gloo.link == HOST and gloo.recv_buffer(8).device == HOST


def test_backend_choice() -> None:
    assert choose_backend(["cpu", "cpu"], "auto") == ("gloo", False)
    assert choose_backend(["cuda:0", "cuda:1"], "auto") == ("nccl", True)
    assert choose_backend(["cuda:0", "cuda:0"], "auto") == ("gloo", False)  # NCCL: one rank per GPU
    assert choose_backend(["cuda:0", "cuda:1"], "gloo") == ("gloo", False)
    with pytest.raises(UserError, match="NCCL cannot run two workers on one GPU"):
        choose_backend(["cuda:0", "cuda"], "nccl")
    with pytest.raises(UserError, match="valid for cpu: auto, gloo"):
        choose_backend(["cpu"], "nccl")
    with pytest.raises(UserError, match="valid: auto, gloo, nccl"):
        choose_backend(["cpu"], "mpi")
    with pytest.raises(UserError, match="valid: cpu, cuda, cuda:N"):
        torch_device("cuda:x")


def test_bare_cuda_is_the_local_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert torch_device("cuda") == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert torch_device("cuda") == torch.device("cuda", 3) and torch_device("cuda:1") == torch.device("cuda", 1)
