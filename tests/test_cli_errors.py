"""Issue 17's CLI defects on bad input: each ends in one line naming the problem, exit status 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.errors import plain_os_errors
from tessera.sim.workload import LengthSpec

TESSERA = [sys.executable, "-m", "tessera"]
CATALOG_NAMES = {"A100-80GB-SXM", "H100-SXM", "L40S", "cpu"}  # a few names the shipped gpus.toml holds


def _subprocess(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TESSERA, *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line, got {lines!r}"
    assert lines[0].startswith("error: ") and "Traceback" not in err and "[Errno" not in err
    return lines[0]


# defect 1: a catalog file in the pool file's [[gpu]] form
def test_catalog_array_of_gpu_tables_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[gpu]]\ntype = "H100-SXM"\nusd_per_hour = 1.0\n')
    r = _subprocess("gpus", env={"TESSERA_CATALOG": str(bad)})
    assert r.returncode == 2
    line = _one_error_line(r.stderr)
    assert str(bad) in line and "[[gpu]]" in line and "[gpu.NAME]" in line


def test_catalog_alias_not_a_table_is_one_line(tmp_path: Path, run_cli, monkeypatch) -> None:
    from tessera.hardware import catalog

    bad = tmp_path / "bad.toml"
    bad.write_text("alias = 3\n")
    monkeypatch.setenv("TESSERA_CATALOG", str(bad))
    catalog._cached.cache_clear()
    code, _, err = run_cli(["gpus"])
    catalog._cached.cache_clear()
    assert code == 2 and "'alias' is a int" in _one_error_line(err)


# defect 7: missing files and directories are worded for people; a model directory works
@pytest.mark.parametrize("verb", [["ptx", "analyze"], ["trace"]])
def test_missing_file_has_no_errno(tmp_path: Path, run_cli, verb: list[str]) -> None:
    missing = tmp_path / "nothing.json"
    extra = ["--phase", "prefill"] if verb == ["trace"] else []
    code, _, err = run_cli([*verb, str(missing), *extra])
    line = _one_error_line(err)
    assert code == 2 and str(missing) in line and "no such file or directory" in line


def test_directory_given_for_a_file(tmp_path: Path, run_cli) -> None:
    code, _, err = run_cli(["ptx", "analyze", str(tmp_path)])
    assert code == 2 and "is a directory, not a file" in _one_error_line(err)


def test_model_directory_without_config(tmp_path: Path, run_cli) -> None:
    code, _, err = run_cli(["trace", str(tmp_path), "--phase", "prefill"])
    assert code == 2 and f"model directory {tmp_path} holds no config.json" in _one_error_line(err)


def test_raw_errno_text_from_any_stage_is_reworded() -> None:
    # what e.g. a stage's `ValueError(f"cannot read plan {path}: {e}")` carries from an OSError
    raw = "cannot read plan x.json: [Errno 2] No such file or directory: 'x.json'"
    assert plain_os_errors(raw) == "cannot read plan x.json: no such file or directory"
    assert plain_os_errors("[Errno 21] Is a directory: 'out'") == "is a directory, not a file"
    assert plain_os_errors("[Errno 28] No space left on device") == "no space left on device"


def test_simulate_missing_plan_has_no_errno(tmp_path: Path, run_cli) -> None:
    code, _, err = run_cli(["simulate", str(tmp_path / "p.json")])
    assert code == 2 and "no such file or directory" in _one_error_line(err)


# defect 8: a well-formed length out of range is named by its value
def test_length_zero_names_the_value() -> None:
    with pytest.raises(ValueError, match=r"length '0': 0 tokens; a length must be >= 1"):
        LengthSpec.parse("0")


def test_inverted_range_names_both_ends() -> None:
    with pytest.raises(ValueError, match=r"'5000-100' is inverted: LO 5000 > HI 100; write 100-5000"):
        LengthSpec.parse("5000-100")


def test_malformed_length_still_names_the_formats() -> None:
    with pytest.raises(ValueError, match="is not N, LO-HI or a trace name"):
        LengthSpec.parse("12x")
    assert (LengthSpec.parse("64-512").lo, LengthSpec.parse("64-512").hi) == (64, 512)
    assert LengthSpec.parse(" 7 ") == LengthSpec(lo=7, hi=7)


# defect 9: valid-GPU lists name catalog GPUs only; advise prints no blank line before its error
def test_valid_gpu_list_has_no_aliases(run_cli) -> None:
    code, _, err = run_cli(["cost", "validate", "--holdout", "NOPE"])
    line = _one_error_line(err)
    valid = set(line.split("valid: ", 1)[1].split(", "))
    assert code == 2 and CATALOG_NAMES <= valid
    assert not {"a100", "h100", "l40s"} & valid  # lower-case aliases of catalog GPUs


def test_advise_error_is_the_only_line() -> None:
    r = _subprocess("advise", "llama-3-8b", "--budget-usd-per-hour", "10", "--gpus", "NOPE")
    assert r.returncode == 2 and r.stdout == ""
    line = _one_error_line(r.stderr)
    valid = set(line.split("valid: ", 1)[1].split(", "))
    assert "unknown GPU 'NOPE'" in line and CATALOG_NAMES <= valid and not {"a100", "h100", "l40s"} & valid
