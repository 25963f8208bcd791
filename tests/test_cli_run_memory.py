"""Issue 17 defect 2: `tessera run` on a model too big for this machine refuses in one line, before any
real weights exist (it used to grow to 24 GB and be killed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.errors import UserError
from tessera.runtime import budget
from tessera.runtime.budget import RunMemory, available_bytes, check_fits, check_job
from tessera.runtime.steps import Job

# Meta-Llama-3-70B parameters from its config.json, by hand: hidden 8192, 80 layers, FFN 28672,
# 64 query / 8 KV heads of 128, vocab 128256, untied embeddings.
#   per layer: q 8192² + k, v 2·8192·1024 + o 8192² + gate/up/down 3·8192·28672 + 2 norms 2·8192
#            = 67,108,864 + 16,777,216 + 67,108,864 + 704,643,072 + 16,384 = 855,654,400
#   embed + lm_head 2·128256·8192 = 2,101,346,304; final norm 8192
LLAMA3_70B_PARAMS = 80 * 855_654_400 + 2_101_346_304 + 8192  # 70,553,706,496


@pytest.mark.slow
def test_70b_estimate_counts_fp32_weights_per_step() -> None:
    job = Job(model="llama-3-70b", new_tokens=4)  # prefill + 3 decode positions = 4 captured steps
    mem = check_job(job, available=10**15)  # a petabyte: fits, returns the estimate
    assert mem is not None and mem.steps == 4
    assert mem.weight_bytes == pytest.approx(4 * LLAMA3_70B_PARAMS, rel=1e-3)
    assert mem.need_bytes >= 5 * 4 * LLAMA3_70B_PARAMS  # 4 steps' copies + the workers' copy, ≈ 1.41 TB


def test_refusal_says_needed_and_available() -> None:
    mem = RunMemory(model="m", steps=3, weight_bytes=10 * 10**9, cache_bytes=10**9, activation_bytes=10**9)
    assert mem.need_bytes == 10 * 10**9 * 4 + 2 * 2 * 10**9  # 44 GB
    with pytest.raises(UserError) as e:
        check_fits(mem, available=24 * 10**9)
    msg = str(e.value)
    assert "needs at least 44.0 GB" in msg and "24.0 GB is available" in msg and "\n" not in msg
    check_fits(mem, available=44 * 10**9)  # exactly enough: no error
    check_fits(mem, available=None)  # unknown (no /proc/meminfo): no error


def test_tiny_models_skip_the_estimate() -> None:
    assert check_job(Job(model="llama-tiny"), available=1) is None


def test_available_bytes_reads_meminfo(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       25165824 kB\nMemFree:         1000000 kB\nMemAvailable:   20971520 kB\n")
    assert available_bytes(f) == 20 * 2**30  # 20,971,520 kB = 20 GiB
    assert available_bytes(tmp_path / "missing") is None


@pytest.mark.slow
def test_run_70b_cli_refuses_before_capturing(run_cli, monkeypatch) -> None:
    monkeypatch.setattr(budget, "available_bytes", lambda: 24 * 2**30)

    def must_not_capture(*a: object, **k: object) -> None:  # a real capture of 70B is what ran out of memory
        raise AssertionError("capture_steps ran")

    monkeypatch.setattr("tessera.runtime.steps.capture_steps", must_not_capture)
    monkeypatch.setattr("tessera.runtime.api.capture_steps", must_not_capture)  # run_job's own name for it
    code, out, err = run_cli(["run", "llama-3-70b", "--devices", "cpu,cpu"])
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and "a real run of llama-3-70b needs at least" in lines[0]
    assert "25.8 GB is available" in lines[0]  # 24 GiB
