"""The SPMD entry point under torchrun: two ranks on this host, outputs equal single-process execution."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.runtime.cluster import free_port
from tessera.runtime.launch import NOT_TORCHRUN, RankEnv

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


def _env() -> dict[str, str]:
    """This environment without anything torchrun sets (a test run under torchrun must not leak it)."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    return env | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run in a new session and kill the whole process group when done or on timeout: torchrun's agent and
    its ranks must never outlive the test, whatever it asserts."""
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args)} ran past {timeout_s:g} s; stderr tail:\n{err[-3000:]}")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers in the group (the leader has exited)
        except ProcessLookupError:
            pass
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _torchrun(*args: str) -> list[str]:
    return ["-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()), *args]


def test_without_torchrun_exits_2_with_one_line() -> None:
    got = _run(["-m", "tessera.runtime.launch", "llama-tiny"], timeout_s=60)
    assert got.returncode == 2
    assert got.stderr.strip() == f"error: {NOT_TORCHRUN}"
    assert got.stdout == ""


def test_rank_env_is_validated() -> None:
    assert RankEnv.from_env({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).rank == 1
    for bad in ({"WORLD_SIZE": "2"}, {"RANK": "2", "WORLD_SIZE": "2"}, {"RANK": "x", "WORLD_SIZE": "2"}):
        with pytest.raises(ValueError):
            RankEnv.from_env(bad)


@pytest.mark.slow
def test_two_ranks_layer_split_equal_single_process() -> None:
    got = _run(_torchrun("-m", "tessera.runtime.launch", "llama-tiny", "--placement", "layer_split",
                         "--requests", "2", "--microbatches", "2", "--verify", "--json"), timeout_s=150)
    assert got.returncode == 0, got.stderr[-3000:]
    lines = [ln for ln in got.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"only rank 0 prints the result: {got.stdout}"
    out = json.loads(lines[0])
    assert {"devices", "microbatches", "verified", "max_abs_diff", "tokens_identical", "measured_step_s",
            "predicted_step_s", "throughput_tokens_per_s", "link_bytes"} <= set(out)
    assert out["verified"] is True and out["tokens_identical"] is True and out["max_abs_diff"] == 0
    assert out["devices"] == ["cpu", "cpu"] and out["link_bytes"] > 0  # a real cut: bytes crossed ranks


@pytest.mark.slow
def test_ranks_that_disagree_fail_clearly(tmp_path: Path) -> None:
    """A rank whose partitions hash differently (as a non-deterministic capture or plan would) stops the
    run with a message naming the disagreement, and torchrun exits non-zero."""
    script = tmp_path / "skewed.py"
    script.write_text("import os, sys\nfrom tessera.runtime import launch\n"
                      "launch.fingerprint = lambda programs, parts: os.environ['RANK']\n"
                      "sys.exit(launch.main(sys.argv[1:]))\n")
    got = _run(_torchrun(str(script), "llama-tiny", "--requests", "1"), timeout_s=150)
    assert got.returncode != 0
    assert "ranks disagree on the captured programs or the 'layer_split' partitions" in got.stderr
