from dataclasses import replace

import pytest

from tessera.cost import CostModel, Efficiency, default_cost_model
from tessera.cost.model import gemm_waves, split_k
from tessera.cost.profiles import GemmTable, ModelShape, Sample, op_kernel
from tessera.graph import Kernel, KernelKind
from tessera.hardware import gpu, link

A100 = gpu("A100-80GB-SXM")
FLAT = Efficiency(compute=0.5, memory=0.5, launch_s=0.0)


def gemm(m: int, n: int, k: int, dtype: str = "bfloat16") -> Kernel:
    return Kernel(id=0, name="aten.mm.default", kind=KernelKind.GEMM, flops=2 * m * n * k,
                  bytes_read=(m * k + k * n) * 2, bytes_written=m * n * 2, reads=(), writes=(), dtype=dtype,
                  dims={"m": m, "n": n, "k": k, "batch": 1})


def test_gemm_waves_quantise_tiles() -> None:
    assert gemm_waves(1, 4096, 1, 108) == (16, 32, 1)  # thin 16-row tiles for one token
    assert gemm_waves(129, 128, 1, 108) == (128, 2, 1)  # 129 rows need two 128-row tiles
    assert gemm_waves(4096, 4096, 1, 108) == (128, 1024, 10)  # 1024 tiles on 108 SMs: 10 waves


def test_gemm_roofline_by_hand() -> None:
    m = CostModel(efficiency={KernelKind.GEMM: FLAT})
    # 10 waves x (2*128*128*4096 FLOP per tile) at 312e12/108 FLOP/s per SM x 0.5
    assert m.roofline_time_s(gemm(4096, 4096, 4096), A100) == pytest.approx(10 * 134217728 / (312e12 / 108 * 0.5))
    # one token: 32 tiles on 108 SMs split k in 3 (108 // 32); memory bound on the 32 MiB weight:
    # (4096 + 4096*4096 + 4096) * 2 B plus 3 fp32 partial rows written and read (2 * 3 * 4096 * 4 B)
    assert m.roofline_time_s(gemm(1, 4096, 4096), A100) == pytest.approx(
        ((4096 + 4096 * 4096 + 4096) * 2 + 2 * 3 * 4096 * 4) / (2.039e12 * 0.5))


def test_split_k_prices_the_router_gemm_by_hand() -> None:
    # DeepSeek-V3's router: fp32, n = 256 experts, k = 7168, on H200 (132 SMs, fp32 66.9e12 FLOP/s, 4.8e12 B/s)
    h200, m = gpu("H200"), CostModel(efficiency={KernelKind.GEMM: FLAT})
    assert split_k(2, 7168, 132) == 28  # 2 tiles: 66 slices would fill the SMs, k // 256 = 28 allows
    assert split_k(132, 7168, 132) == 1 and split_k(64, 200, 132) == 1  # a full wave; k too short to cut
    per_sm = 66.9e12 / 132 * 0.5
    for rows, tile_m in ((16, 16), (56, 64), (128, 128)):
        k = gemm(rows, 256, 7168, "float32")
        k = replace(k, bytes_read=(rows * 7168 + 7168 * 256) * 4, bytes_written=rows * 256 * 4)
        # 2 tiles x 28 slices = 56 blocks, one wave, each a tile_m x 128 tile over 7168 / 28 = 256 of k;
        # memory: the operands and 28 fp32 partial outputs written and read back
        compute_s = 2 * tile_m * 128 * 256 / per_sm
        memory_s = ((rows * 7168 + 7168 * 256 + rows * 256) * 4 + 2 * 28 * rows * 256 * 4) / (4.8e12 * 0.5)
        assert m.roofline_time_s(k, h200) == pytest.approx(max(compute_s, memory_s))
        # without split-K the one wave runs all of k on 2 SMs: 28x the compute term
        assert m.roofline_time_s(k, h200) < 2 * tile_m * 128 * 7168 / per_sm / 10


def test_memory_bound_kernel_and_launch() -> None:
    k = Kernel(id=0, name="aten.add.Tensor", kind=KernelKind.ELEMENTWISE, flops=0, bytes_read=2_000_000,
               bytes_written=1_000_000, reads=(), writes=())
    m = CostModel(efficiency={KernelKind.ELEMENTWISE: Efficiency(compute=0.3, memory=0.6, launch_s=2e-6)})
    assert m.kernel_time_s(k, A100) == pytest.approx(2e-6 + 3e6 / (2.039e12 * 0.6))


def test_cpu_gemm_counts_flops_without_tiles() -> None:
    m = CostModel(efficiency={KernelKind.GEMM: FLAT})
    cpu = gpu("cpu")
    assert m.roofline_time_s(gemm(1, 64, 64, "float32"), cpu) == pytest.approx(
        max(2 * 64 * 64 / (cpu.peak("float32") * 0.5), (64 + 64 * 64 + 64) * 2 / (cpu.mem_bw_bytes_per_s * 0.5)))


def test_transfer_time() -> None:
    nv = link("nvlink4")
    assert CostModel().transfer_time_s(1_000_000_000, nv) == pytest.approx(3.29e-6 + 1e9 / (450e9 * 0.706))


def _sample(tokens: int, time_s: float) -> Sample:
    shape = ModelShape(heads=32, kv_heads=32, hidden=4096, ffn=11008, gated=True, tp=1)
    return Sample(gpu="A100-80GB-SXM", model="m", op="attn_post_proj", tokens=tokens, time_s=time_s,
                  kernel=op_kernel("attn_post_proj", shape, tokens))


def test_table_overrides_and_interpolates() -> None:
    table = GemmTable.from_samples([_sample(1, 10e-6), _sample(3, 30e-6), _sample(3, 50e-6)])
    m = CostModel(efficiency={KernelKind.GEMM: FLAT}, gemm_tables={"A100-80GB-SXM": table})
    assert m.kernel_time_s(gemm(1, 4096, 4096), A100) == pytest.approx(10e-6)
    assert m.kernel_time_s(gemm(3, 4096, 4096), A100) == pytest.approx(40e-6)  # median of 30 and 50
    assert m.kernel_time_s(gemm(2, 4096, 4096), A100) == pytest.approx(25e-6)  # linear in m
    beyond = m.kernel_time_s(gemm(8192, 4096, 4096), A100)  # past the table: scaled by the roofline ratio
    ratio = m.roofline_time_s(gemm(8192, 4096, 4096), A100) / m.roofline_time_s(gemm(3, 4096, 4096), A100)
    assert beyond == pytest.approx(40e-6 * ratio, rel=1e-3)
    assert m.kernel_time_s(gemm(2, 4096, 1024), A100) == m.roofline_time_s(gemm(2, 4096, 1024), A100)
    assert m.kernel_time_s(gemm(2, 4096, 4096), gpu("H100-SXM")) != pytest.approx(25e-6)  # no H100 table


def test_default_model_uses_measured_gemm_and_predicts_unprofiled_gpus() -> None:
    m = default_cost_model()
    # Llama-2-7b fused QKV (n = 3*4096, k = 4096) at 512 tokens on A100: Vidur median 0.234 ms
    assert m.kernel_time_s(gemm(512, 12288, 4096, "float16"), A100) == pytest.approx(0.234e-3)
    for name in ("L40S", "H20", "B200", "MI300X"):
        assert m.kernel_time_s(gemm(512, 12288, 4096), gpu(name)) > 0
    # bandwidth-bound decode GEMM is faster on H20 (4.0 TB/s) than on L40S (0.864 TB/s)
    assert m.kernel_time_s(gemm(1, 12288, 4096), gpu("H20")) < m.kernel_time_s(gemm(1, 12288, 4096), gpu("L40S"))
    assert "cpu" in m.per_gpu
