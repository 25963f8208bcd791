"""Triton launch capture: binding, PTX-derived reads/writes, schema checks, Liger zoo variants, replay."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensorMode

from tessera.capture import capture_model, capture_program, replay
from tessera.capture.recorder import Recorder
from tessera.capture.triton_launch import bind, capturing, launcher
from tessera.graph import KernelGraph, KernelKind, Role, build_graph
from tessera.ptx.analysis import Access
from tessera.ptx.triton_ptx import kernel_access


@triton.jit
def _double_into(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2·x over n elements: reads x, writes y."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


# A custom op whose schema declares y read-only (no "(a!)"), though its kernel writes y: the classic mistake.
_LIB = torch.library.Library("tessera_test", "DEF")
_LIB.define("double_into(Tensor x, Tensor y) -> ()")


def _double_into_cpu(x: torch.Tensor, y: torch.Tensor) -> None:
    _double_into[(triton.cdiv(x.numel(), 16),)](x, y, x.numel(), BLOCK=16)


_LIB.impl("double_into", _double_into_cpu, "CPU")
torch.library.register_fake("tessera_test::double_into", lambda x, y: None, lib=_LIB)  # shapes only


def _rms_norm_launch(rows: int, cols: int) -> tuple:
    from liger_kernel.ops.rms_norm import _rms_norm_forward_kernel as k

    x = torch.ones(rows, cols, dtype=torch.bfloat16)
    y, w, rstd = torch.empty_like(x), torch.ones(cols, dtype=torch.bfloat16), torch.empty(rows)
    # the argument list of liger_kernel.ops.rms_norm.rms_norm_forward (llama casting mode 0)
    args = (y, y.stride(0), x, x.stride(0), w, w.stride(0), rstd, rstd.stride(0), cols, 1e-6, 0.0, 0)
    return k, args, {"elementwise_affine": True, "BLOCK_SIZE": triton.next_power_of_2(cols), "num_warps": 4}


def test_bind_follows_triton_specialisation_rules() -> None:
    k, args, kwargs = _rms_norm_launch(3, 64)
    launch = bind(k, args, kwargs, (3,))
    types = dict(zip(launch.spec.params, launch.spec.types, strict=True))
    # pointers typed by dtype; an int equal to 1 becomes a constexpr (W and RSTD strides); floats fp32
    assert types["Y_ptr"] == "*bf16" and types["RSTD_ptr"] == "*fp32"
    assert types["X_row_stride"] == "i32" and types["W_row_stride"] == "constexpr"
    assert types["eps"] == "fp32" and types["BLOCK_SIZE"] == "constexpr"
    assert launch.grid == (3, 1, 1) and launch.options == {"num_warps": 4}
    # 64 is 16-divisible (Triton's "D" attribute); pointers at offset 0 are aligned
    assert {"Y_ptr", "X_row_stride", "n_cols"} <= {launch.spec.params[i] for i in launch.spec.aligned}


def test_liger_rms_norm_ptx_access_matches_its_source() -> None:
    # the kernel's source: tl.load(X, W), tl.store(Y, RSTD)
    k, args, kwargs = _rms_norm_launch(3, 64)
    ka = kernel_access(k, bind(k, args, kwargs, (3,)).spec)
    assert ka.access == {"Y_ptr": Access.WRITTEN, "X_ptr": Access.READ, "W_ptr": Access.READ,
                         "RSTD_ptr": Access.WRITTEN}
    assert not ka.indirect


def _record_custom_op() -> tuple[Recorder, KernelGraph, torch.Tensor, torch.Tensor]:
    rec = Recorder(phase="decode", module_info={}, keep_program=True)
    x = torch.arange(40, dtype=torch.float32)
    y = torch.zeros(40)
    rec.register(x, Role.INPUT, "x")
    rec.register(y, Role.INPUT, "y")
    with torch.no_grad(), rec, capturing(rec):
        torch.ops.tessera_test.double_into(x, y)
        z = y + 1  # reads y: must depend on the Triton kernel
    graph = build_graph(model="t", phase="decode", shape={}, kernels=rec.kernels, buffers=rec.graph_buffers())
    return rec, graph, y, z


def test_schema_missing_write_is_reported_and_the_ptx_write_wins() -> None:
    rec, graph, y, z = _record_custom_op()
    triton_k, add = graph.kernels
    assert triton_k.deps_from == "ptx" and add.deps_from == "schema"
    assert triton_k.reads == (0,) and triton_k.writes == (1,)  # x read, y written (the schema said read-only)
    assert len(rec.findings) == 1 and "'y'" in rec.findings[0] and "tessera_test.double_into" in rec.findings[0]
    assert [(e.src, e.dst, e.kind.value, e.buffer) for e in graph.edges] == [(0, 1, "raw", 1)]
    assert triton_k.bytes_read == 160 and triton_k.bytes_written == 160  # 40 fp32 each
    # executed through Triton's interpreter (no PyTorch reference registered): y = 2x, z = 2x + 1
    assert torch.equal(y, 2 * torch.arange(40.0)) and torch.equal(z, 2 * torch.arange(40.0) + 1)


def test_replayed_launch_runs_the_recorded_arguments() -> None:
    rec, _, y, _ = _record_custom_op()
    op = rec.program[0]
    assert op.func == "triton:" + __name__ + "._double_into" and op.outputs == ()
    x2, y2 = torch.full((40,), 3.0), torch.zeros(40)
    values = [x2, y2, *op.args[2:]]
    launcher(op.func)(*values, **op.kwargs)
    assert torch.equal(y2, torch.full((40,), 6.0))


def test_liger_tiny_decode_takes_norm_rope_swiglu_from_ptx() -> None:
    g = capture_model("llama-tiny-liger", "decode", batch=1, context=8, eager=True)
    ptx = [k for k in g.kernels if k.deps_from == "ptx"]
    names = [k.name.rsplit(".", 1)[-1] for k in ptx]
    # 2 layers: 2 RMSNorms + 1 rotary + 1 SwiGLU each, and the final norm
    assert names.count("_rms_norm_forward_kernel") == 5
    assert names.count("_triton_rope") == 2 and names.count("_swiglu_forward_kernel") == 2
    norm = ptx[0]
    assert norm.kind is KernelKind.NORM and norm.module == "model.layers.0.input_layernorm"
    assert [g.buffers[b].name for b in norm.reads][1] == "model.layers.0.input_layernorm.weight"
    assert len(norm.writes) == 2  # Y and RSTD
    # bf16 hidden 64: X and W read (128 B each), Y written (128 B) and RSTD (one fp32); 4 FLOPs per element
    assert (norm.bytes_read, norm.bytes_written, norm.flops) == (256, 132, 256)
    rope = next(k for k in ptx if "rope" in k.name)
    # reads q, k, cos, sin; writes q and k in place
    assert len(rope.reads) == 4 and len(rope.writes) == 2 and set(rope.writes) < set(rope.reads)
    # q 4 heads × 16, k 2 × 16, cos and sin 16 each, all bf16: 256 B read, q and k (192 B) written
    assert (rope.bytes_read, rope.bytes_written) == (256, 192)
    swiglu = next(k for k in ptx if "swiglu" in k.name)
    assert (swiglu.bytes_read, swiglu.bytes_written, swiglu.flops) == (512, 256, 5 * 128)  # ffn 128, bf16
    g.check_invariants()
    fused = capture_model("llama-tiny-liger", "decode", batch=1, context=8)
    assert sum(k.deps_from == "ptx" for k in fused.kernels) == 9  # Triton kernels are fusion anchors


def test_liger_variant_computes_what_the_plain_model_computes() -> None:
    liger = capture_program("llama-tiny-liger", "decode", batch=1, context=8)
    plain = capture_program("llama-tiny", "decode", batch=1, context=8)
    assert sum(op.func.startswith("triton:") for op in liger.program) == 9
    # same seed, same weights: Liger's kernels (via their references) compute the same logits up to rounding
    torch.testing.assert_close(liger.expected[0], plain.expected[0], rtol=1e-5, atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(replay(liger), liger.expected, strict=True))


def test_liger_patch_is_undone_after_capture() -> None:
    import transformers.models.llama.modeling_llama as ml

    before = (ml.LlamaRMSNorm, ml.LlamaMLP, ml.apply_rotary_pos_emb)
    capture_model("llama-tiny-liger", "decode", batch=1, context=8)
    assert (ml.LlamaRMSNorm, ml.LlamaMLP, ml.apply_rotary_pos_emb) == before
    g = capture_model("llama-tiny", "decode", batch=1, context=8)
    assert all(k.deps_from == "schema" for k in g.kernels)


def test_deps_from_round_trips_through_json_and_is_validated() -> None:
    _, graph, _, _ = _record_custom_op()
    back = KernelGraph.from_json(graph.to_json())
    assert [k.deps_from for k in back.kernels] == ["ptx", "schema"]
    with pytest.raises(ValueError, match="deps_from='cuda'"):
        replace(graph.kernels[0], deps_from="cuda")


def test_trace_json_reports_deps_from(run_cli) -> None:
    code, out, _ = run_cli(["trace", "llama-tiny-liger", "--phase", "decode", "--context", "8", "--json"])
    assert code == 0
    s = json.loads(out)
    # fused view: the 9 Triton kernels stay whole; every other kernel's deps come from ATen schemas
    assert s["deps_from"] == {"schema": s["kernels"] - 9, "ptx": 9}


def test_triton_kernels_are_costed_like_any_kernel() -> None:
    from tessera.cost.model import CostModel
    from tessera.hardware.catalog import gpu

    g = capture_model("llama-tiny-liger", "decode", batch=1, context=8)
    model = CostModel()
    for k in (k for k in g.kernels if k.deps_from == "ptx"):
        h100, l40s = (model.kernel_time_s(k, gpu(n)) for n in ("H100-SXM", "L40S"))
        assert h100 > model.launch_s and l40s > model.launch_s  # launch plus its bytes


def test_mixtral_liger_takes_norm_and_rope_from_ptx() -> None:
    # Liger's Mixtral patch here: RMSNorm (2 per layer + the final norm) and rotary (1 per layer); its
    # fused-MoE SwiGLU is left out (tessera.capture.liger), so the experts stay ATen GEMMs
    g = capture_model("mixtral-tiny-liger", "decode", batch=1, context=8, eager=True)
    names = [k.name.rsplit(".", 1)[-1] for k in g.kernels if k.deps_from == "ptx"]
    assert sorted(set(names)) == ["_rms_norm_forward_kernel", "_triton_rope"]
    assert names.count("_rms_norm_forward_kernel") == 5 and names.count("_triton_rope") == 2
    g.check_invariants()


def test_custom_op_under_fake_tensors_records_its_launch_from_ptx() -> None:
    # a full-size capture runs on fake tensors, where the op would run only its fake implementation and
    # launch nothing; its Python CPU implementation runs instead, so the launch is recorded from its PTX
    with FakeTensorMode() as mode:
        x, y = torch.empty(1 << 20), torch.empty(1 << 20)
    rec = Recorder(phase="decode", module_info={})
    rec.register(x, Role.INPUT, "x")
    rec.register(y, Role.INPUT, "y")
    with mode, torch.no_grad(), rec, capturing(rec):
        torch.ops.tessera_test.double_into(x, y)
    (k,) = rec.kernels
    assert k.deps_from == "ptx" and k.reads == (0,) and k.writes == (1,)  # x read, y written
    assert k.bytes_read == k.bytes_written == 4 << 20  # 2^20 fp32 each
    assert len(rec.findings) == 1 and "'y'" in rec.findings[0]  # the schema's missing write, reported
