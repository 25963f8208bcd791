"""A worker lost mid-run: the driver re-plans onto the survivors and every request completes, exactly."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tessera.capture.zoo import SPECS
from tessera.graph import Role
from tessera.runtime.cluster import ClusterConfig
from tessera.runtime.placements import layer_split
from tessera.runtime.recovery import RecoveringExecutor, phase_graphs, replan_with
from tessera.runtime.runner import SwitchPolicy, compare, serve
from tessera.runtime.steps import Job, LocalExecutor, capture_steps

pytestmark = pytest.mark.slow


def test_lost_worker_is_replanned_onto_survivors_and_requests_complete(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(dict(SPECS["llama-tiny"].config, num_hidden_layers=3)))
    job = Job(model=str(tmp_path / "config.json"), seq=6, new_tokens=3)  # 3 steps per request
    programs = capture_steps(job)
    plan = {ph: layer_split(g, 3) for ph, g in phase_graphs(programs).items()}
    policy = SwitchPolicy(throughput_microbatches=1, threshold=1)
    cfg = ClusterConfig(devices=("cpu", "cpu", "cpu"), max_microbatches=1)
    pids: list[int] = []
    with RecoveringExecutor(programs, {"latency": plan, "throughput": plan}, cfg, replan_with("layer_split")) as rex:
        pids += [p.pid for p in rex.cluster.procs]
        victim = pids[1]

        def kill_after_four_steps() -> None:  # mid-run: request 1 (steps 3..5) is in flight
            while len(rex.cluster.history) < 4:
                time.sleep(0.005)
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill_after_four_steps, daemon=True).start()
        rounds, _ = serve(rex, job, programs, 3, policy, recover=rex.recover)
        pids += [p.pid for p in rex.cluster.procs]
        assert rex.config.devices == ("cpu", "cpu") and rex.device_ids == [0, 2]
        for d in range(2):  # each survivor holds exactly the weights its new share touches
            want = {p.name(b) for (k, _), part in rex.parts.items() for p in [programs[k]]
                    for b in part.resident[d] if p.role(b) is Role.WEIGHT}
            assert set(rex.cluster.resident[d]) == want
    assert len(rex.events) == 1
    assert rex.events[0].startswith(f"worker 1 (cpu, pid {victim}) died: killed by SIGKILL")
    assert "re-planned onto 2 surviving workers (original devices [0, 2])" in rex.events[0]
    assert len(rounds) == 3 and all(len(r.tokens) == 1 for r in rounds)
    assert len(rex.runs) == 2 and len(rex.runs[0][0]) >= 4  # the first cluster ran 4 steps before the loss
    assert sum(len(h) for h, _, _ in rex.runs) > 9  # 3 requests x 3 steps, plus the interrupted one's redone
    ref, _ = serve(LocalExecutor(programs), job, programs, 3, policy)
    same, diff, tokens = compare(rounds, ref)
    assert same and diff == 0.0 and tokens is True
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids), "a worker process was left behind"


def test_no_survivor_means_the_failure_stands() -> None:
    job = Job(model="dit-tiny", seq=16, context=4, denoise_steps=1)
    programs = capture_steps(job)
    plan = {ph: tuple(0 for _ in g.kernels) for ph, g in phase_graphs(programs).items()}
    cfg = ClusterConfig(devices=("cpu",), max_microbatches=1)
    with RecoveringExecutor(programs, {"latency": plan, "throughput": plan}, cfg, replan_with("layer_split")) as rex:
        pid = rex.cluster.procs[0].pid
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception, match=f"worker 0 \\(cpu, pid {pid}\\) died: killed by SIGKILL"):
            serve(rex, job, programs, 1, SwitchPolicy(throughput_microbatches=1, threshold=1), recover=rex.recover)
    assert rex.events == [] and not Path(f"/proc/{pid}").exists()
