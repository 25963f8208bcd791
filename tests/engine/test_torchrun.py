"""The engine across hosts through torchrun's rendezvous, tested with two torchrun agents over loopback
(`--nnodes 2`, c10d rendezvous): the same `serve-run` command on both, rank 0 the driver, the three other
ranks workers (one beside the driver, two on the other agent), activations crossing between the agents' workers;
every request completes with the single-process engine's greedy tokens (`--verify`); and `tessera serve` as
rank 0 answering over HTTP; and `tessera run`'s SPMD program across the two agents."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
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


def rank0_pid(agent: int) -> int | None:
    """The process of RANK 0 among a torchrun agent's children (Linux /proc), None if not there."""
    try:
        children = Path(f"/proc/{agent}/task/{agent}/children").read_text().split()
    except OSError:
        return None
    for c in children:
        try:
            env = Path(f"/proc/{c}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"RANK=0" in env:
            return int(c)
    return None


@pytest.mark.slow
def test_serve_over_two_torchrun_agents(run_cli):
    """`tessera serve` as rank 0 (static rendezvous: node 0 runs the driver) with three workers over two
    agents answers a completion with the single-process engine's greedy text, and SIGTERM ends both."""
    port, http = free_port(), free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    args = ["serve", "llama-tiny", "--load-format", "dummy", "--dtype", "fp32", "--devices", "cpu,cpu,cpu",
            "--placement", "layer_split", "--port", str(http)]
    agents = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2",
                                "--master-addr", "127.0.0.1", "--master-port", str(port), "-m",
                                "tessera.cli.torchrun", *args], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env) for node in (0, 1)]
    try:
        body = json.dumps({"model": "llama-tiny", "prompt": "Hello", "max_tokens": 8, "temperature": 0}).encode()
        deadline = time.monotonic() + 240
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{http}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                got = json.loads(urllib.request.urlopen(req, timeout=60).read())
                break
            except OSError:
                assert time.monotonic() < deadline and all(a.poll() is None for a in agents), \
                    [a.stderr.read()[-2000:] for a in agents if a.poll() is not None]
                time.sleep(1.0)
    finally:  # SIGTERM to the driver (rank 0): it drains, tells the workers to exit, and every rank ends
        pid = rank0_pid(agents[0].pid)
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        else:
            for a in agents:
                a.send_signal(signal.SIGTERM)
        codes = [a.wait(timeout=60) for a in agents]
    code, out, err = run_cli(["generate", "llama-tiny", "--prompt", "Hello", "--max-tokens", "8", "--load-format",
                              "dummy", "--dtype", "fp32", "--json"])
    assert code == 0, err
    assert got["choices"][0]["text"] == json.loads(out)["text"] and got["usage"]["completion_tokens"] == 8
    assert codes == [0, 0]


@pytest.mark.slow
def test_runtime_spmd_over_two_torchrun_agents():
    """`tessera run`'s SPMD program (every rank a worker, no driver) over two agents, one rank each: the
    split run's outputs equal single-device execution."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    agents = [subprocess.Popen([str(TORCHRUN), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m",
                                "tessera.runtime.launch", "llama-tiny", "--placement", "layer_split", "--verify",
                                "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
              for node in (0, 1)]
    outs = [a.communicate(timeout=300) for a in agents]
    assert [a.returncode for a in agents] == [0, 0], [e[-2000:] for _, e in outs]
    (line,) = [o for o, _ in outs if o.strip()]
    got = json.loads(line)
    assert got["verified"] is True and got["tokens_identical"] is True and got["max_abs_diff"] == 0.0
