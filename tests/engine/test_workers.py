"""The engine over worker processes: a two-worker split of a saved checkpoint (each worker reading only its
share) gives the single-process engine's logits bit for bit and its greedy tokens, with one group or with
two groups' iterations in flight at once, and on NCCL's issue order (checked on gloo); a worker killed
mid-stream is re-placed onto the survivor with nothing lost and the same tokens; a worker stopped or killed
during start-up is named."""

from __future__ import annotations

import os
import signal
from dataclasses import replace

import pytest
import torch
from safetensors import safe_open

from tessera.engine import EngineConfig, SamplingParams, load_engine
from tessera.engine.cluster import ClusterSettings, EngineCluster
from tessera.engine.devices import WorkerKind
from tessera.engine.engine import Engine
from tessera.engine.layers import Experts, MambaConv, PagedAttention
from tessera.engine.loader import open_model
from tessera.engine.routes import Placement
from tessera.engine.serve import Arrival, Fault, WorkerPool, drive
from tessera.engine.worker import worker_main
from tessera.runtime.cluster import WorkerFailure
from tests.engine.conftest import texts

CONFIG = EngineConfig(max_num_seqs=4, max_num_batched_tokens=6, page_size=4, max_model_len=64)
TWO = (WorkerKind(device="cpu"), WorkerKind(device="cpu"))
PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)


def attention_side(program) -> tuple[int, ...]:
    """Attention, MoE, conv and scan kernels and the LM head on worker 1, the rest on worker 0: the hidden
    state crosses twice per layer and the logits come from worker 1."""
    def on_one(node) -> bool:
        callee = program.callee(node)
        return (isinstance(callee, PagedAttention | Experts | MambaConv) or node.name == "lm_head"
                or callee is torch.ops.tessera_engine.mamba_scan.default)
    return tuple(int(on_one(n)) for n in program.kernels)


def served(directory, config: EngineConfig, assignment=None, settings: ClusterSettings = ClusterSettings(),
           fault: Fault | None = None):
    """(single-process engine after serving the prompts, driver after serving them on two workers, the
    pool's ready reports, the drive log)."""
    source = open_model(str(directory))
    ref = load_engine(source, config, dtype="fp32", keep_logits=True)
    ids = [tuple(ref.codec.encode(t)) for t in texts([3, 11, 17, 1, 8])]
    ref.generate([list(i) for i in ids], PARAMS)
    placed = Placement(assignment=assignment or attention_side(ref.program), label="attention side")
    alone = Placement(assignment=(0,) * len(ref.program.kernels), label="one worker")
    driver = Engine(None, source, config, ref.codec, keep_logits=True)
    with WorkerPool(source, torch.float32, config, TWO, lambda kinds: placed if len(kinds) == 2 else alone,
                    load_format="auto", seed=0, settings=settings) as pool:
        ready = pool.cluster.ready_info
        _, _, log = drive(driver, pool, [Arrival(arrival_s=0.0, prompt_ids=i, params=PARAMS) for i in ids],
                          recover=fault is not None, fault=fault)
    return ref, driver, ready, log


def checkpoint_bytes(directory) -> int:
    total = 0
    for f in directory.glob("*.safetensors"):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                t = st.get_tensor(k)
                total += t.numel() * t.element_size()
    return total


@pytest.mark.parametrize("family", ["llama", "mixtral", "mamba2"])
def test_two_workers_equal_one(saved, family):
    directory, _ = saved(family)
    ref, driver, ready, _ = served(directory, CONFIG)
    assert [r.output_ids for r in driver.requests.values()] == [r.output_ids for r in ref.requests.values()]
    assert len(ref.history) == len(driver.history)
    for a, b in zip(ref.history, driver.history, strict=True):  # one group: the same iterations, in order
        assert a.tokens == b.tokens and torch.equal(a.logits, b.logits)
    # each worker read only its share of the checkpoint: together every tensor once (fp32 here)
    loaded = [r["loaded_bytes"] for r in ready]
    assert all(0 < x for x in loaded) and sum(loaded) == checkpoint_bytes(directory)


def test_groups_in_flight_and_the_ordered_schedule(saved):
    """Two groups, so two iterations in flight on the workers at once (gloo), then the same on NCCL's one
    global issue order (every message on tag 0 here): the single-process engine's tokens both times."""
    directory, _ = saved("llama")
    config = replace(CONFIG, microbatches=2)
    for settings in (ClusterSettings(), ClusterSettings(ordered=True)):
        ref, driver, _, log = served(directory, config, settings=settings)
        want = [r.output_ids for r in ref.requests.values()]
        assert [r.output_ids for r in driver.requests.values()] == want
        assert {it.group for it in driver.history} == {0, 1}


def test_killed_worker_is_replaced_and_nothing_is_lost(saved):
    directory, _ = saved("llama")
    ref, driver, _, log = served(directory, CONFIG, fault=Fault(at_request=2, rank=1))
    (event,) = log.recoveries
    assert event.startswith("worker 1 (cpu, pid ") and "died: killed by SIGKILL" in event
    assert "onto 1 surviving worker (devices [0])" in event
    assert all(r.finished for r in driver.requests.values()) and len(driver.requests) == 5
    assert [r.output_ids for r in driver.requests.values()] == [r.output_ids for r in ref.requests.values()]
    assert driver.scheduler.preempted > 0  # the running requests were recomputed on the survivor


@pytest.mark.parametrize("sig, reason", [(signal.SIGSTOP, "stopped during start-up (process state T"),
                                         (signal.SIGKILL, "died: killed by SIGKILL")])
def test_start_up_faults_are_named(sig, reason):
    """A worker stopped or killed right after it is spawned: the driver names it (not the start timeout,
    a minute here) and stops the other one."""
    source = open_model("llama-tiny")
    n = len(load_engine(source, CONFIG, dtype="fp32", load_format="dummy").program.kernels)
    cluster = EngineCluster(source, torch.float32, CONFIG, TWO, (0,) * n, load_format="dummy", seed=0,
                            settings=ClusterSettings(start_timeout_s=60.0))
    cluster.spawn(worker_main, cluster.specs())
    pids = [p.pid for p in cluster.procs]
    os.kill(pids[1], sig)
    try:
        with pytest.raises(WorkerFailure) as err:
            cluster.ready()
    finally:
        for pid in pids:
            if os.path.exists(f"/proc/{pid}") and cluster.procs[pids.index(pid)].is_alive():
                os.kill(pid, signal.SIGKILL)
    assert str(err.value).startswith(f"worker 1 (cpu, pid {pids[1]}) {reason}"), str(err.value)
    assert err.value.rank == 1
    assert not any(p.is_alive() for p in cluster.procs)
