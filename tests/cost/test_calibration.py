import json
from pathlib import Path

import pytest

from tessera.cost import CostModel, Efficiency
from tessera.cost.calibrate import ALL_GPUS, efficiency_rows, fit_kind, validate
from tessera.cost.network import fit_send_recv
from tessera.cost.profiler import vidur_op
from tessera.cost.profiles import GEMM_OPS, ModelShape, Sample, load_profiles, op_kernel, read_mlp_csv
from tessera.errors import UserError
from tessera.graph import Kernel, KernelKind
from tessera.hardware import gpu, link
from tests.conftest import RunCli

SHAPE_HDR = "n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,num_tensor_parallel_workers"


def _csv(path: Path, rows: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("time_stats.add.median,time_stats.mlp_up_proj.median," + SHAPE_HDR + "\n" + "\n".join(rows) + "\n")
    return path


def test_read_mlp_csv_median_of_medians_ms_to_s(tmp_path: Path) -> None:
    f = _csv(tmp_path / "x.csv", ["0.010,1.0,32,32,4096,11008,32000,True,8,1",
                                  "0.030,3.0,32,32,4096,11008,32000,True,8,1",
                                  "0.020,2.5,32,32,4096,11008,32000,True,8,1",
                                  "9.0,9.0,32,32,4096,11008,32000,True,8,2"])  # tp=2: dropped
    got = {s.op: s for s in read_mlp_csv(f, gpu="A100-80GB-SXM", model="m")}
    assert got["add"].time_s == pytest.approx(20e-6) and got["mlp_up_proj"].time_s == pytest.approx(2.5e-3)
    up = got["mlp_up_proj"].kernel
    assert up.dims == {"m": 8, "n": 2 * 11008, "k": 4096} and up.flops == 2 * 8 * 22016 * 4096


def test_op_kernel_bytes() -> None:
    s = ModelShape(heads=64, kv_heads=8, hidden=8192, ffn=28672, gated=True, tp=1)
    assert op_kernel("attn_pre_proj", s, 1).dims == {"m": 1, "n": (64 + 16) * 128, "k": 8192}
    add = op_kernel("add", s, 4)
    assert (add.bytes_read, add.bytes_written, add.flops) == (2 * 4 * 8192 * 2, 4 * 8192 * 2, 0)


def test_bad_profiles_are_user_errors(tmp_path: Path) -> None:
    _csv(tmp_path / "zz9000" / "m" / "mlp.csv", ["0.01,1.0,32,32,4096,11008,32000,True,8,1"])
    with pytest.raises(UserError, match="unknown GPU 'zz9000'; valid: .*H100-SXM"):
        load_profiles(tmp_path)
    (tmp_path / "l4" / "m").mkdir(parents=True)
    (tmp_path / "l4" / "m" / "mlp.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="not a Vidur mlp.csv"):
        read_mlp_csv(tmp_path / "l4" / "m" / "mlp.csv", gpu="L4", model="m")


def test_fit_recovers_known_efficiency() -> None:
    truth = CostModel(efficiency={KernelKind.GEMM: Efficiency(compute=0.6, memory=0.8, launch_s=3e-6)})
    shape = ModelShape(heads=32, kv_heads=32, hidden=4096, ffn=11008, gated=True, tp=1)
    samples = []
    for name in ("A100-80GB-SXM", "H100-SXM"):
        for t in (1, 16, 64, 256, 1024, 4096):
            k = op_kernel("mlp_up_proj", shape, t)
            samples.append(Sample(gpu=name, model="m", op="mlp_up_proj", tokens=t, kernel=k,
                                  time_s=truth.roofline_time_s(k, gpu(name))))
    fit = fit_kind(samples)
    assert fit.compute == pytest.approx(0.6, rel=0.02) and fit.memory == pytest.approx(0.8, rel=0.02)
    assert fit.launch_s == pytest.approx(3e-6, abs=0.5e-6)


def test_nvlink_efficiency_matches_vidur_fit() -> None:
    latency_s, bytes_per_s = fit_send_recv()
    nv = link("nvlink4")
    assert nv.latency_s == pytest.approx(latency_s, rel=0.01)
    assert nv.efficiency == pytest.approx(bytes_per_s / nv.bytes_per_s, abs=0.001)


def test_vidur_op_mapping() -> None:
    def k(module: str, name: str = "aten.mm.default", kind: KernelKind = KernelKind.GEMM) -> Kernel:
        return Kernel(id=0, name=name, kind=kind, flops=0, bytes_read=0, bytes_written=0, reads=(), writes=(),
                      module=module, layer=0)

    assert vidur_op(k("model.layers.0.self_attn.k_proj")) == "attn_pre_proj"
    assert vidur_op(k("model.layers.0.mlp.gate_proj")) == "mlp_up_proj"
    assert vidur_op(k("model.layers.0.mlp.act_fn", "aten.silu.default", KernelKind.ELEMENTWISE)) == "mlp_act"
    assert vidur_op(k("model.layers.0", "aten.add.Tensor", KernelKind.ELEMENTWISE)) == "add"
    assert vidur_op(k("model.layers.0.self_attn", "aten.mul.Tensor", KernelKind.ELEMENTWISE)) == "attn_rope"


@pytest.mark.slow
def test_leave_one_gpu_out_meets_targets() -> None:
    report = validate(load_profiles()).to_dict()
    assert report["holdout"] == report["fit_on"] == ["A100-80GB-SXM", "H100-SXM"]
    assert report["overall"]["points"] == 2 * 3 * 259 * 10
    for op in GEMM_OPS:
        assert report["ops"][op]["median_ape"] <= 0.12, op
    assert report["overall"]["median_ape"] <= 0.25
    with pytest.raises(UserError, match="overlap"):
        validate(load_profiles(), fit_on="a100", holdout="a100")


@pytest.mark.slow
def test_cli_validate_json_and_errors(tmp_path: Path, run_cli: RunCli) -> None:
    code, out, err = run_cli(["cost", "validate", "--holdout", "h100", "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert report["holdout"] == ["H100-SXM"] and report["fit_on"] == ["A100-80GB-SXM"]
    assert set(report["overall"]) == {"median_ape", "p90_ape", "points"} and set(report["ops"]) >= set(GEMM_OPS)
    code, _, err = run_cli(["cost", "validate", "--holdout", "X9"])
    assert code == 2 and "unknown GPU 'X9'; valid:" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "h100" / "m").mkdir(parents=True)
    (tmp_path / "h100" / "m" / "mlp.csv").write_text("garbage\n")
    code, _, err = run_cli(["cost", "validate", "--profiles", str(tmp_path)])
    assert code == 2 and "not a Vidur mlp.csv" in err
    code, _, err = run_cli(["profile", "llama-tiny", "--device", "tpu"])
    assert code == 2 and "valid: cpu" in err


def test_efficiency_rows_shared_first_then_per_gpu() -> None:
    """`tessera cost calibrate`'s table: every shared efficiency, then each GPU's own, in order."""
    shared = {KernelKind.GEMM: Efficiency(compute=0.5, memory=0.6)}
    own = {KernelKind.ATTENTION: Efficiency(compute=0.7, memory=0.8, launch_s=2e-6)}
    model = CostModel(efficiency=shared, per_gpu={"H100-SXM": own})
    assert efficiency_rows(model) == [(ALL_GPUS, "gemm", Efficiency(compute=0.5, memory=0.6)),
                                      ("H100-SXM", "attention", Efficiency(compute=0.7, memory=0.8, launch_s=2e-6))]
