"""The serving model: the async MILP objective and its bound worked by hand on chain3, the steady-state
shape, tensor-parallel costs, and the rescaled iteration graph against a direct capture."""

from __future__ import annotations

import itertools

import pytest

from tessera.graph import KernelKind, Role
from tessera.hardware import link
from tessera.plan import PlannerConfig, plan_serving
from tessera.plan.model.serving import Slo, Traffic, steady_shape
from tessera.plan.model.shapes import IterShape, iteration_graph
from tessera.plan.model.units import UnitCost, allreduce_s, group_link, make_unit, shard
from tessera.plan.solver.bound import async_bound
from tessera.plan.solver.milp import objective_value, solve_flat
from tessera.plan.solver.problem import build_problem

from .helpers import COST, POOL, chain3


def test_async_objective_by_hand() -> None:
    # chain3, (H100, L40S) times a (2, 4), b (3, 3), c (4, 2), a cut costs 0.5 s on the link.
    # per micro-batch: max(T, (Σ work + Σ transfers) / m); {a,b}|{c}: T = 5, total = 7.5.
    # m = 2: max(5, 3.75) = 5 (all on one GPU: max(9, 4.5) = 9); m = 1: max(5, 7.5) = 7.5 (all on one: 9).
    p = build_problem(chain3(), POOL, COST)
    assert solve_flat(p, objective="async", m=2, mip_rel_gap=0.0).objective == pytest.approx(5.0, rel=1e-3)
    assert solve_flat(p, objective="async", m=1, mip_rel_gap=0.0).objective == pytest.approx(7.5, rel=1e-3)


def test_async_bound_by_hand() -> None:
    # relaxed: a -> H100 (2), c -> L40S (2), b a fraction f on H100. The flow rows make the two values
    # cross in proportion to where b's share changes: va is received on L40S by 1 − f of b, vb by the f of
    # c not matched by b: 0.5·(1 − f) + 0.5·f = 0.5 s of transfers whatever f. m = 2: loads 2 + 3f and
    # 2 + 3(1 − f), total 7 + 0.5 ≤ 2·T → T = 3.75 at f = ½; period bound 7.5 (best integral plan: 10).
    assert async_bound(chain3(), POOL, COST, 2) == pytest.approx(7.5, rel=1e-6)
    # m = 4: the loads decide, T = 3.5 at f = ½, bound 14 (best integral: 4·5 = 20)
    assert async_bound(chain3(), POOL, COST, 4) == pytest.approx(14.0, rel=1e-6)


def test_async_bound_flow_rows_active_by_hand() -> None:
    # m = 1: the period is one micro-batch's path. With transfers free the relaxation would run a on H100
    # and c on L40S for free: 2 + 3 + 2 = 7. The flow rows charge the switch between them: any split
    # crosses 0.5 s in total (test above), so the bound is 7.5, the best integral plan's period
    # ({a, b} on H100, c on L40S: 2 + 3 + 0.5 + 2), and the bound is tight.
    p = build_problem(chain3(), POOL, COST)
    best = solve_flat(p, objective="async", m=1, mip_rel_gap=0.0).objective
    assert best == pytest.approx(7.5, rel=1e-6)
    assert async_bound(chain3(), POOL, COST, 1) == pytest.approx(7.5, rel=1e-6)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_async_bound_below_every_placement(m: int) -> None:
    # validity by enumeration: the bound is at most the async period of each of the 8 placements of chain3
    # (objective_value: max(T, Σ/m) per micro-batch, times m), also with a and c sharing one weight
    for g in (chain3(), chain3(shared=True)):
        p = build_problem(g, POOL, COST)
        periods = [m * objective_value(p, gd, "async", m) for gd in itertools.product(range(2), repeat=p.G)]
        assert async_bound(g, POOL, COST, m) <= min(periods) + 1e-9


def test_period_floor_by_hand_and_below_every_placement() -> None:
    # the search's floor: the larger of m × the relaxed busiest device with memory kept (chain3: a on
    # H100 (2), c on L40S (2), b split evenly: 3.5 per device, so 3.5·m) and the critical path at each
    # kernel's fastest GPU (a 2 + b 3 + c 2 = 7): 7, 7, 14 for m = 1, 2, 4; never above a placement's
    # verifier period
    from tessera.plan.solver.bound import latency_floor, period_floor
    from tessera.plan.solver.verify import evaluate

    assert latency_floor(chain3(), POOL.gpus, COST) == pytest.approx(7.0, rel=1e-9)
    for m, want in ((1, 7.0), (2, 7.0), (4, 14.0)):
        floor = period_floor(chain3(), POOL, COST, m)
        assert floor == pytest.approx(want, rel=1e-6)
        for a in itertools.product(range(2), repeat=3):
            ev = evaluate(chain3(), a, POOL.gpus, POOL.link, COST)
            assert floor <= max(m * ev.bottleneck_s, ev.latency_s) + 1e-9


def test_steady_shape_by_hand() -> None:
    # B = 64, m = 2, P = 1024, O = 256: b = 32 decode sequences, C = 64·1024/256 = 256 → c = 128 per
    # micro-batch; mean context P + O/2 = 1152; a chunk piece attends to (1024 − 128)/2 = 448 earlier tokens;
    # KV per sequence: 1152 + two standard deviations of the mean age of 64 sequences with ages uniform over
    # [0, 256] (256/√(12·64) = 9.2376 each): 1170.475, × 32 = 37455.2, rounded up: 37456 tokens.
    s = steady_shape(64, 2, Traffic(prompt=1024, output=256))
    assert (s.decode, s.chunk, s.context, s.prefix, s.kv_tokens) == (32, 128, 1152, 448, 37456)
    # a chunk longer than a prompt holds whole prompts: B = 64, m = 1, P = 128, O = 16 → C = 512 = 4 prompts
    s2 = steady_shape(64, 1, Traffic(prompt=128, output=16))
    assert (s2.chunk, s2.chunk_len, s2.prefix) == (512, 128, 0)


def test_slo_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="tpot of 0 s"):
        Slo(tpot_s=0)
    with pytest.raises(ValueError, match="target 1.5"):
        Slo(target=1.5)


def test_allreduce_by_hand() -> None:
    # ring all-reduce over 2 GPUs on NVLink 4 (450 GB/s per direction, efficiency 0.706, 3.29 µs):
    # 2·(1/2)·1 MB / (450e9·0.706) + 2·3.29 µs
    lk = link("nvlink4")
    want = 1e6 / (450e9 * 0.706) + 2 * 3.29e-6
    assert allreduce_s(1_000_000, 2, lk) == pytest.approx(want)
    assert allreduce_s(1_000_000, 1, lk) == 0.0


def test_shard_splits_gemms_by_megatron_rules() -> None:
    from tessera.graph import Kernel

    # q_proj is column-parallel (n split), o_proj row-parallel (k split); each GPU does half the FLOPs
    q = Kernel(id=0, name="mm", kind=KernelKind.GEMM, flops=2 * 8 * 4096 * 4096, bytes_read=0, bytes_written=0,
               reads=(), writes=(), module="model.layers.0.self_attn.q_proj", dims={"m": 8, "n": 4096, "k": 4096})
    o = Kernel(id=1, name="mm", kind=KernelKind.GEMM, flops=2 * 8 * 4096 * 4096, bytes_read=0, bytes_written=0,
               reads=(), writes=(), module="model.layers.0.self_attn.o_proj", dims={"m": 8, "n": 4096, "k": 4096})
    assert shard(q, 2).dims == {"m": 8, "n": 2048, "k": 4096}
    assert shard(o, 2).dims == {"m": 8, "n": 4096, "k": 2048}
    assert shard(q, 2).flops == q.flops // 2


def test_moe_block_is_all_reduced_once_under_tp() -> None:
    from tessera.graph import Kernel
    from tessera.hardware import gpu

    from .helpers import TableCost

    # a shared expert's down_proj joins the routed experts before the block's one all-reduce (charged on the
    # router), so under TP 2 it costs its shard alone; a dense layer's down_proj pays its own all-reduce
    h100 = gpu("H100-SXM")
    cost = UnitCost.over(TableCost(table={("mm", h100.name): 1e-3}), ((h100, 2),))
    unit = make_unit(h100, 2)
    dims = {"m": 8, "n": 4096, "k": 1024}

    def down(module: str) -> Kernel:
        return Kernel(id=0, name="mm", kind=KernelKind.GEMM, flops=2 * 8 * 4096 * 1024, bytes_read=0,
                      bytes_written=8 * 4096 * 2, reads=(), writes=(), module=module, dims=dims)

    shared = cost.kernel_time_s(down("model.layers.3.mlp.shared_experts.down_proj"), unit)
    dense = cost.kernel_time_s(down("model.layers.0.mlp.down_proj"), unit)
    assert shared == pytest.approx(1e-3)  # the table's time for the shard, nothing more
    assert dense == pytest.approx(1e-3 + allreduce_s(8 * 4096 * 2, 2, group_link(h100, 2)))


@pytest.mark.slow
def test_iteration_graph_matches_a_direct_capture() -> None:
    """Rescaling a batch-8 decode capture to 4 sequences at context 99 gives what capturing that shape
    directly gives: GEMM FLOPs, weight bytes, KV bytes; decode attention FLOPs by hand."""
    from tessera.capture import capture_model

    base = capture_model("llama-3-8b", "decode", batch=8, context=16)
    direct = capture_model("llama-3-8b", "decode", batch=4, context=99)  # 100 KV slots per sequence
    g = iteration_graph(base, IterShape(decode=4, context=100, kv_tokens=4 * 100))

    def gemm_flops(x):
        return sum(k.flops for k in x.kernels if k.kind is KernelKind.GEMM)

    def role_bytes(x, role):
        return sum(b.bytes for b in x.buffers if b.role == role)

    assert gemm_flops(g) == gemm_flops(direct)
    assert role_bytes(g, Role.WEIGHT) == role_bytes(direct, Role.WEIGHT)
    assert role_bytes(g, Role.KV) == role_bytes(direct, Role.KV)
    att = [k for k in g.kernels if k.kind is KernelKind.ATTENTION_DECODE]
    assert len(att) == 32  # one per layer
    # Llama-3-8B: 32 heads of 128; QK and PV: 4·seqs·heads·head_dim·kv_len
    assert att[0].flops == 4 * 4 * 32 * 128 * 100
    # a chunk adds one causal attention kernel per layer: 16 tokens against 48 earlier ones
    g2 = iteration_graph(base, IterShape(decode=4, context=100, chunk=16, prefix=48, kv_tokens=464))
    ch = [k for k in g2.kernels if k.kind is KernelKind.ATTENTION]
    assert len(ch) == 32
    assert ch[0].flops == 4 * 32 * 128 * (16 * 48 + 16 * 17 // 2)
    assert gemm_flops(g2) == gemm_flops(direct) * 20 // 4  # 20 tokens instead of 4


@pytest.mark.slow
def test_latency_variant_is_the_same_placement_and_switchable() -> None:
    """The online switch's latency schedule: same kernel assignment, a quarter of the batch, one micro-batch;
    the simulator's residency rule accepts it as one placement (one paged KV pool), not two."""
    from tessera.plan.search import PlannerConfig, latency_variant, plan_serving
    from tessera.sim import check_switchable

    r = plan_serving("llama-tiny", "H100,L40S", PlannerConfig(traffic=Traffic(prompt=16, output=8)))
    thr = r.strategies["layer_pipeline"].plan
    lat = latency_variant(r, "layer_pipeline")
    assert lat is not None and thr is not None
    assert lat.phases["mixed"].assignment == thr.phases["mixed"].assignment
    assert (lat.batch, lat.microbatches) == (max(1, thr.batch // 4), 1) and lat.mode == "latency"
    assert check_switchable(thr, lat) == "same-placement"
    # the latency-oriented placement: the MILP minimising one micro-batch's path at the same shape, with
    # the same placement as its MIP start, so its step is no longer than the same-placement schedule's
    lat_milp = latency_variant(r, "layer_pipeline", placement="milp")
    assert lat_milp is not None and (lat_milp.batch, lat_milp.microbatches) == (lat.batch, 1)
    assert lat_milp.tpot_s <= lat.tpot_s * (1 + 1e-9)


def test_an_engine_fills_ninety_percent_of_a_gpu_less_its_runtime() -> None:
    from tessera.hardware import gpu
    from tessera.plan.pool import engine_gpu

    # an H100's 80 GiB (85,899,345,920 B), 90% of it (vLLM's gpu_memory_utilization), less 2 GiB of runtime:
    # 77,309,411,328 − 2,147,483,648 = 75,161,927,680 B = 70 GiB
    h100 = gpu("H100-SXM")
    assert h100.mem_bytes == 80 * 2**30
    assert engine_gpu(h100, 0.9).mem_bytes == 70 * 2**30
    assert engine_gpu(h100, 1.0).mem_bytes == 78 * 2**30


def test_step_tables_sample_the_shapes_the_engine_runs() -> None:
    # The simulator interpolates a plan's step table, and kernel costs are not linear in tokens: each decode
    # count's full iteration (n decodes and a K − n chunk, the engine's iteration while prompts queue) is a
    # grid point. An image table's rows are whole steps with every group at n images, labelled n·m images,
    # so a batch that does not divide by m (6 over 4 groups) is interpolated, not priced as 8 images.
    cfg = PlannerConfig(traffic=Traffic(prompt=16, output=8))
    r = plan_serving("llama-tiny", "H100,L40S", cfg)
    for s in r.strategies.values():
        if s.plan is None or "mixed" not in s.plan.phases:
            continue
        k = s.plan.engine.max_num_batched_tokens
        pts = s.plan.phases["mixed"].points
        for n in {p.batch for p in pts}:
            assert any(p.batch == n and p.tokens == max(k, n) for p in pts), (s.name, n, k)
    r = plan_serving("dit-tiny", "H100,L40S", PlannerConfig(batch_cap=6, microbatches=(4,)))
    seen = 0
    for s in r.strategies.values():
        if s.plan is None:
            continue
        ph = s.plan.phases["denoise"]
        assert all(p.batch % ph.microbatches == 0 for p in ph.points), (s.name, [p.batch for p in ph.points])
        seen += ph.microbatches == 4 and s.plan.engine.max_num_seqs == 6
    assert seen  # the case the labels are for: 6 images over 4 groups
