import csv
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tessera.cost import default_cost_model
from tessera.cost.aic import AicCosts, cost_sources
from tessera.cost.aic_import import select_rows
from tessera.cost.aic_validate import Scorer, default_setting, validate_transfer
from tessera.cost.tables import (
    SHIPPED_AIC,
    CacheModel,
    MeasuredTable,
    Roofline,
    fit_roofline,
    ideal_s,
    query_of,
    read_table,
    unit_terms,
)
from tessera.cost.transfer import Measured, TableTransfer
from tessera.errors import UserError
from tessera.graph import Kernel, KernelKind
from tessera.hardware import gpu
from tests.conftest import RunCli

H100 = gpu("H100-SXM")


def _gemm(m: int, n: int, k: int) -> Kernel:
    return Kernel(id=0, name="mm", kind=KernelKind.GEMM, flops=2 * m * n * k, bytes_read=2 * (m * k + k * n),
                  bytes_written=2 * m * n, reads=(), writes=(), dims={"m": m, "n": n, "k": k, "batch": 1})


def test_gemm_ideal_by_hand() -> None:
    # 4096^3 on H100: 2 * 4096^3 FLOPs at 989.4e12 = 138.9 us; memory 3 * 4096^2 * 2 bytes at 3.35e12 =
    # 30 us is smaller.
    compute_s = 2 * 4096**3 / 989.4e12
    assert ideal_s("gemm", np.array([[4096, 4096, 4096]]), H100)[0] == pytest.approx(compute_s)
    # decode attention, batch 1, 1024 cached tokens, 32 heads / 8 KV heads, d 128: bytes-bound,
    # K and V = 2 * 1024 * 8 * 128 * 2 bytes, q and out = 2 * 32 * 128 * 2 bytes
    nbytes = 2 * 1024 * 8 * 128 * 2 + 2 * 32 * 128 * 2
    got = ideal_s("generation_attention", np.array([[1, 1024, 32, 8, 128]]), H100)[0]
    assert got == pytest.approx(nbytes / 3.35e12)


IDEAL = Roofline(compute_eff=1.0, memory_eff=1.0, launch_s=0.0)  # basis = ideal_s


def _table(name: str, points: list[list[int]], times_s: list[float]) -> MeasuredTable:
    return MeasuredTable(name=name, gpu=H100, points=np.array(points), time_s=np.array(times_s), basis=IDEAL)


def test_interpolation_exact_on_grid_and_log_linear_between() -> None:
    t1, t2 = 30e-6, 200e-6
    t = _table("gemm", [[16, 4096, 4096], [256, 4096, 4096]], [t1, t2])
    assert t.time_at((16, 4096, 4096)) == pytest.approx(t1)
    assert t.time_at((256, 4096, 4096)) == pytest.approx(t2)
    # m = 64 is the log-midpoint of 16 and 256: the ratio to the ideal time is the geometric mean of the ends'
    ideal = ideal_s("gemm", np.array([[16, 4096, 4096], [64, 4096, 4096], [256, 4096, 4096]]), H100)
    want = ideal[1] * math.sqrt(t1 / ideal[0] * t2 / ideal[2])
    assert t.time_at((64, 4096, 4096)) == pytest.approx(want)
    # beyond the grid: the edge ratio carried by the ideal (roofline) scaling
    big = ideal_s("gemm", np.array([[4096, 4096, 4096]]), H100)[0]
    assert t.time_at((4096, 4096, 4096)) == pytest.approx(big * t2 / ideal[2])


def test_query_keys_from_captured_dims() -> None:
    dec = Kernel(id=0, name="sdpa", kind=KernelKind.ATTENTION_DECODE, flops=0, bytes_read=0, bytes_written=0,
                 reads=(), writes=(), dims={"batch": 16, "heads": 32, "kv_heads": 8, "q_len": 1, "kv_len": 1025,
                                             "head_dim": 128})
    assert query_of(dec) == ("generation_attention", (16, 1025, 32, 8, 128), None)
    pre = Kernel(id=0, name="sdpa", kind=KernelKind.ATTENTION, flops=0, bytes_read=0, bytes_written=0, reads=(),
                 writes=(), dims={"batch": 2, "heads": 32, "kv_heads": 8, "q_len": 256, "kv_len": 1024, "head_dim": 128})
    assert query_of(pre) == ("context_attention", (2, 256, 32, 8, 128), 1024)
    assert query_of(_gemm(8, 4096, 1024)) == ("gemm", (8, 4096, 1024), None)
    # fp8 checkpoints: GEMMs from the fp8 GEMM table, fused MoE from the block-scaled MoE table
    assert query_of(replace(_gemm(8, 4096, 1024), dtype="float8_e4m3fn")) == ("gemm_fp8", (8, 4096, 1024), None)
    assert query_of(_moe(64, "float8_e4m3fn")) == ("moe_fp8_block", (64, 7168, 256, 8, 256), None)
    assert query_of(_moe(64, "bfloat16")) == ("moe", (64, 7168, 256, 8, 256), None)
    assert query_of(replace(dec, dtype="float8_e4m3fn")) is None  # no fp8 attention tables
    assert query_of(replace(_gemm(8, 4096, 1024), dtype="float32")) is None  # fp32: the roofline


def _moe(tokens: int, dtype: str) -> Kernel:
    """DeepSeek-V3's fused experts, one GPU's share under MoE TP 8 (inter 2048 / 8)."""
    return Kernel(id=0, name="moe", kind=KernelKind.OTHER, flops=6 * tokens * 8 * 7168 * 256, bytes_read=0,
                  bytes_written=0, reads=(), writes=(), dtype=dtype,
                  dims={"tokens": tokens, "hidden": 7168, "inter": 256, "topk": 8, "experts": 256,
                        "expert_bytes": 3 * 7168 * 256})


def test_fp8_gemm_ideal_by_hand() -> None:
    # m=16, n=k=7168 on H100: FLOPs 2*16*7168^2 at the fp8 peak 1978.9e12 = 0.83 us; bytes: bf16 activations
    # in and out 2*(16*7168 + 16*7168), fp8 weight 7168^2 = 51.8 MB (over 15 % of the 50 MiB L2: DRAM)
    p = np.array([[16, 7168, 7168]])
    compute_s, memory_s = unit_terms("gemm_fp8", p, H100)
    assert compute_s[0] == pytest.approx(2 * 16 * 7168**2 / 1978.9e12)
    assert memory_s[0] == pytest.approx((2 * 2 * 16 * 7168 + 7168**2) / 3.35e12)
    # the bf16 table's ideal of the same shape: the bf16 peak, 2-byte weights
    c16, m16 = unit_terms("gemm", p, H100)
    assert c16[0] == pytest.approx(2 * 16 * 7168**2 / 989.4e12)
    assert m16[0] == pytest.approx((2 * 2 * 16 * 7168 + 2 * 7168**2) / 3.35e12)


def test_moe_rows_at_each_tp_degree_are_one_gpus_kernel() -> None:
    # AIConfigurator times a MoE shape at moe_tp_size 1, 2, ...: TP 8 of inter 2048 is one GPU's kernel of
    # inter 256; expert-parallel rows and other dtypes are left out
    cols = {"kernel_source": ["triton"] * 5, "moe_dtype": ["fp8_block"] * 4 + ["bfloat16"],
            "distribution": ["balanced"] * 5, "moe_tp_size": [1, 8, 1, 2, 8], "moe_ep_size": [1, 1, 8, 1, 1],
            "num_tokens": [16, 16, 16, 32, 16], "hidden_size": [7168] * 5, "inter_size": [2048] * 5,
            "topk": [8] * 5, "num_experts": [256] * 5, "latency": [0.5, 0.1, 0.3, 0.4, 0.2]}
    source, rows = select_rows(cols, "moe_fp8_block")
    assert source == "triton"
    assert rows == [[16, 7168, 256, 8, 256, 0.1], [16, 7168, 2048, 8, 256, 0.5], [32, 7168, 1024, 8, 256, 0.4]]
    assert select_rows(cols, "moe")[1] == [[16, 7168, 256, 8, 256, 0.2]]


def test_default_model_prices_fp8_from_the_fp8_tables() -> None:
    model, h200 = default_cost_model(), gpu("H200")
    row = _first_row(SHIPPED_AIC / "h200_sxm" / "gemm_fp8.csv")
    m, n, k = (int(row[c]) for c in "mnk")
    fp8 = replace(_gemm(m, n, k), dtype="float8_e4m3fn")
    assert model.kernel_time_s(fp8, h200) == pytest.approx(float(row["latency_ms"]) * 1e-3)
    # DeepSeek-V3's experts under MoE TP 8 at 8192 tokens: AIConfigurator measured 2.3712 ms (h200_sxm,
    # vLLM 0.24.0, fp8_block, moe_tp_size 8, balanced); the largest token count, so never lowered by repair
    assert model.kernel_time_s(_moe(16384, "float8_e4m3fn"), h200) >= model.kernel_time_s(
        _moe(8192, "float8_e4m3fn"), h200) == pytest.approx(2.3712e-3)
    # A100 measured no fp8 kernel: both are carried over from the GPUs that did
    a100 = gpu("A100-80GB-SXM")
    assert 0 < model.kernel_time_s(fp8, a100) < 1 and 0 < model.kernel_time_s(_moe(64, "float8_e4m3fn"), a100) < 1


def test_select_rows_keeps_majority_kernel_and_bf16() -> None:
    cols = {"kernel_source": ["fa3", "fa3", "fa4", "fa3"], "attn_dtype": ["bfloat16"] * 4,
            "kv_cache_dtype": ["bfloat16", "bfloat16", "bfloat16", "fp8"], "batch_size": [1, 2, 1, 1],
            "isl": [1, 1, 1, 1], "step": [1023, 7, 1023, 1023], "num_heads": [32] * 4,
            "num_key_value_heads": [8] * 4, "head_dim": [128] * 4, "latency": [0.05, 0.01, 0.04, 0.03]}
    source, rows = select_rows(cols, "generation_attention")
    assert source == "fa3" and rows == [[1, 1024, 32, 8, 128, 0.05], [2, 8, 32, 8, 128, 0.01]]


def test_fit_roofline_recovers_known_parameters() -> None:
    c = np.geomspace(1e-6, 1e-3, 40)
    m = c[::-1].copy()
    meas = 5e-6 + np.maximum(c / 0.6, m / 0.8)
    r = fit_roofline(c, m, meas)
    assert r.compute_eff == pytest.approx(0.6, rel=0.03) and r.memory_eff == pytest.approx(0.8, rel=0.03)
    assert r.launch_s == pytest.approx(5e-6, abs=1e-6)


def test_transfer_to_a_datasheet_twin_reproduces_the_measurement() -> None:
    # H800 has H100-SXM's peak, bandwidth, memory family and vendor: with H100 as the only source, its
    # roofline is H100's and the shape residual cancels, so the transfer returns H100's measurement.
    t = AicCosts().tables("H100-SXM")["gemm"]
    x = TableTransfer(target=gpu("H800"), sources=(Measured(table=t),))
    for i in (0, len(t.time_s) // 2, len(t.time_s) - 1):
        assert x.time_s(tuple(int(v) for v in t.points[i])) == pytest.approx(t.time_s[i], rel=1e-9)


def _first_row(path: Path) -> dict[str, str]:
    with path.open(newline="") as f:
        return next(csv.DictReader(f))


def test_default_model_uses_shipped_measurements() -> None:
    row = _first_row(SHIPPED_AIC / "h100_sxm" / "gemm.csv")
    m, n, k = (int(row[c]) for c in "mnk")
    model = default_cost_model()
    assert model.kernel_time_s(_gemm(m, n, k), H100) == pytest.approx(float(row["latency_ms"]) * 1e-3)
    # a GPU without tables gets a transferred time, finite and positive
    assert 0 < model.kernel_time_s(_gemm(m, n, k), gpu("H20")) < 1


def test_malformed_table_is_one_line_naming_file_and_row(tmp_path: Path, run_cli: RunCli) -> None:
    for system in ("h100_sxm", "l40s"):
        (tmp_path / system).mkdir()
        (tmp_path / system / "gemm.csv").write_text("m,n,k,latency_ms\n1,128,128,0.01\n2,128,128,0.02\n")
    (tmp_path / "l40s" / "gemm.csv").write_text("m,n,k,latency_ms\n1,128,128,0.01\n2,128,abc,0.02\n")
    with pytest.raises(UserError, match=r"gemm.csv: row 2: malformed"):
        read_table(tmp_path / "l40s" / "gemm.csv", "gemm", gpu("L40S"))
    code, _, err = run_cli(["cost", "validate", "--source", "aic", "--profiles", str(tmp_path)])
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{tmp_path / 'l40s' / 'gemm.csv'}: row 2: malformed" in err
    code, _, err = run_cli(["cost", "validate", "--source", "nope"])
    assert code == 2 and "valid: aic, vidur" in err


def test_cli_validate_aic_json_shape(run_cli: RunCli) -> None:
    code, out, err = run_cli(["cost", "validate", "--source", "aic", "--holdout", "h200_sxm", "--rows", "20",
                              "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert set(report) == {"holdout", "fit_on", "overall", "ops", "folds"} and report["holdout"] == ["H200"]
    assert "H100-SXM" in report["fit_on"] and "H200" not in report["fit_on"]
    assert set(report["ops"]) == {"gemm", "context_attention", "generation_attention", "moe", "gemm_fp8",
                                  "moe_fp8_block"}


def test_gpus_lists_where_costs_come_from(run_cli: RunCli) -> None:
    code, out, err = run_cli(["gpus", "--json"])
    assert code == 0, err
    costs = {g["name"]: g["costs"] for g in json.loads(out)}
    assert costs["H100-SXM"] == "measured tables" and costs["H20"].startswith("transferred from")
    assert costs["cpu"] == "measured on this machine"
    assert all(costs[g].startswith("measured tables") for g in AicCosts().dirs)


def test_import_without_the_package_is_one_clear_line(run_cli: RunCli) -> None:
    # the project venv does not install aiconfigurator-core: the error path is what runs here
    import importlib.util

    if importlib.util.find_spec("aiconfigurator_core") is not None:
        pytest.skip("aiconfigurator-core is installed here")
    code, _, err = run_cli(["cost", "import", "aic", "--out", "/nonexistent-dir"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pip install 'tessera[aic]'" in err
    code, _, err = run_cli(["cost", "import", "vidur"])
    assert code == 2 and "valid: aic" in err


def test_prefill_chunk_against_a_prefix_scales_by_its_own_kv_length() -> None:
    t = _table("context_attention", [[1, 256, 32, 8, 128]], [20e-6])
    # ideal of the grid row (q = kv = 256): FLOPs 4*32*256*256*128 at 989.4e12 = 1.09 us < bytes
    # 2*128*(2*32*256 + 2*8*256) at 3.35e12 = 1.57 us; the chunk (q 256, kv 1024): FLOPs
    # 4*32*256*1024*128 -> 4.34 us > bytes 2*128*(2*32*256 + 2*8*1024) -> 2.50 us.
    row_s = 2 * 128 * (2 * 32 * 256 + 2 * 8 * 256) / 3.35e12
    chunk_s = 4 * 32 * 256 * 1024 * 128 / 989.4e12
    assert t.time_at((1, 256, 32, 8, 128), kv_len=1024) == pytest.approx(20e-6 * chunk_s / row_s)


def test_cache_model_serves_resident_gemm_operands_from_l2_by_hand() -> None:
    cache = CacheModel(resident_fraction=0.15, l2_bytes_per_fp32_flop=0.02)
    l40s = gpu("L40S")  # L2 100,663,296 B (15.1 MB resident), FP32 91.6e12 -> L2 1.832e12 B/s, DRAM 864e9
    small, big = 8 * 2**20, 32 * 2**20
    got = cache.memory_s(np.array([small, big], dtype=float), l40s)
    assert got[0] == pytest.approx(small / 1.832e12) and got[1] == pytest.approx(big / 864e9)
    # H100: 0.02 x 66.9e12 = 1.34e12 B/s is below its 3.35e12 DRAM: resident or not, DRAM speed
    assert cache.memory_s(np.array([float(small)]), H100)[0] == pytest.approx(small / 3.35e12)
    # the GEMM roofline uses it: m=1, n=k=2048 on L40S is 2 * (2048 + 2048^2 + 2048) B = 8.4 MB, resident
    nbytes = 2 * (2048 + 2048 * 2048 + 2048)
    assert ideal_s("gemm", np.array([[1, 2048, 2048]]), l40s, cache=cache)[0] == pytest.approx(nbytes / 1.832e12)


def test_transfer_carries_launch_floors_in_clock_cycles() -> None:
    # one source, H100 (boost 1980 MHz), floor 4 us: A100 (1410 MHz) gets 4 * 1980 / 1410 = 5.617 us;
    # H20 has no clock in the catalog, so it keeps 4 us
    t = MeasuredTable(name="gemm", gpu=H100, points=np.array([[1, 128, 128]]), time_s=np.array([5e-6]),
                      basis=Roofline(compute_eff=0.8, memory_eff=0.8, launch_s=4e-6))
    assert TableTransfer(target=gpu("A100-80GB-SXM"), sources=(Measured(table=t),)).launch_s() == \
        pytest.approx(5.617e-6, rel=1e-3)
    assert TableTransfer(target=gpu("H20"), sources=(Measured(table=t),)).launch_s() == pytest.approx(4e-6)


def _moe_only_copy(root: Path, slower: str, factor: float) -> AicCosts:
    """The shipped MoE tables under ``root``, with every latency of system ``slower`` times ``factor``."""
    for d in SHIPPED_AIC.iterdir():
        if (d / "moe.csv").exists():
            (root / d.name).mkdir()
            lines = (d / "moe.csv").read_text().splitlines()
            if d.name == slower:
                lines = lines[:1] + [f"{r.rsplit(',', 1)[0]},{float(r.rsplit(',', 1)[1]) * factor}" for r in lines[1:]]
            (root / d.name / "moe.csv").write_text("\n".join(lines) + "\n")
    return AicCosts(root)


def test_nested_choice_never_reads_the_held_out_gpu(tmp_path: Path) -> None:
    # the fold holding out H200 chooses its constants from the other GPUs alone: tripling every H200 MoE
    # time changes that fold's errors but not the constants it chose
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    base = validate_transfer(_moe_only_copy(tmp_path / "a", "h200_sxm", 1.0), holdout="H200", rows=20,
                            nested=True).to_dict()
    slow = validate_transfer(_moe_only_copy(tmp_path / "b", "h200_sxm", 3.0), holdout="H200", rows=20,
                            nested=True).to_dict()
    assert base["folds"][0]["chosen"] == slow["folds"][0]["chosen"]
    assert set(Scorer(AicCosts(tmp_path / "a"), "moe", 20).gpus()) == set(base["fit_on"]) | {"H200"}
    # the held-out GPU's predictions do not move, so each predicted / measured ratio is a third of before
    ratios = [Scorer(AicCosts(tmp_path / d), "moe", 20).ratios("H200", base["fit_on"], default_setting("moe"))
              for d in ("a", "b")]
    np.testing.assert_allclose(ratios[1], ratios[0] / 3, rtol=1e-9)


def test_cost_sources_name_each_gpu_its_source() -> None:
    """`tessera gpus`: a GPU AIConfigurator measured reads its tables, a host measured here is this machine,
    a host not measured falls back to the roofline."""
    cpu = gpu("cpu")
    got = cost_sources([gpu("H100-SXM"), cpu, replace(cpu, name="host-x", measured=False)])
    assert got["H100-SXM"].startswith("measured tables")
    assert got["cpu"] == "measured on this machine" and got["host-x"] == "roofline"
