"""The engine across hosts through torchrun's rendezvous, tested with two torchrun agents over loopback
(`--nnodes 2`, c10d rendezvous): the same `serve-run` command on both, rank 0 the driver, the three other
ranks workers (one beside the driver, two on the other agent), activations crossing between the agents' workers;
every request completes with the single-process engine's greedy tokens (`--verify`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.runtime.cluster import free_port

TORCHRUN = Path(sys.executable).with_name("torchrun")


@pytest.mark.slow
def test_serve_run_over_two_torchrun_agents():
    port = free_port()
    args = ["serve-run", "llama-tiny", "--devices", "cpu,cpu,cpu", "--placement", "layer_split", "--requests",
            "8", "--prompt", "4-10", "--output", "3-6", "--verify", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m",
                                "tessera.cli.torchrun", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env) for node in (0, 1)]
    outs = [a.communicate(timeout=300) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [e[-2000:] for _, e in outs]
    (line,) = [o for o, _ in outs if o.strip()]  # rank 0 alone prints, on whichever agent it ran
    got = json.loads(line)
    assert got["completed"] == got["requests"] == 8 and got["verified"] is True
    # two engine workers at least: ranks 1 and 2, one on each agent (torchrun numbers an agent's ranks
    # together), so activations cross between the agents
    assert sum(c > 0 for c in got["extra"]["assignment_counts"]) >= 2
