"""The IR: edges derived from reads/writes, JSON round-trip, invariants."""

from __future__ import annotations

import pytest

from tessera.graph import Buffer, EdgeKind, Kernel, KernelGraph, KernelKind, Role, build_graph


def _k(i: int, reads: tuple[int, ...], writes: tuple[int, ...], kind: KernelKind = KernelKind.ELEMENTWISE) -> Kernel:
    return Kernel(id=i, name=f"k{i}", kind=kind, flops=10 * (i + 1), bytes_read=8 * len(reads),
                  bytes_written=8 * len(writes), reads=reads, writes=writes, layer=i // 2, dims={"numel": 2})


def three_kernel_graph() -> KernelGraph:
    # buffers: 0 input x, 1 weight w, 2 activation a, 3 kv cache
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT), Buffer(id=1, name="w", bytes=16, role=Role.WEIGHT),
            Buffer(id=2, name="a", bytes=8, role=Role.ACTIVATION), Buffer(id=3, name="kv", bytes=32, role=Role.KV)]
    ks = [_k(0, (0, 1), (2,), KernelKind.GEMM),  # a = x @ w
          _k(1, (2, 3), (3,), KernelKind.COPY),  # kv[...] = a   (in-place: read-write)
          _k(2, (3,), (2,), KernelKind.ATTENTION_DECODE)]  # a = attn(kv)  (overwrites a)
    return build_graph(model="toy", phase="decode", shape={"batch": 1}, kernels=ks, buffers=bufs)


def test_edges_worked_by_hand() -> None:
    g = three_kernel_graph()
    got = {(e.src, e.dst, e.kind, e.buffer) for e in g.edges}
    assert got == {
        (0, 1, EdgeKind.RAW, 2),  # k1 reads a written by k0
        (1, 2, EdgeKind.RAW, 3),  # k2 reads kv written by k1
        (0, 2, EdgeKind.WAW, 2),  # k2 overwrites a written by k0
        (1, 2, EdgeKind.WAR, 2),  # k2 overwrites a read by k1
    }
    assert g.predecessors[2] == (0, 1)
    assert g.topological_order() == [0, 1, 2]


def test_totals_and_roles() -> None:
    g = three_kernel_graph()
    assert g.flops == 10 + 20 + 30
    assert g.layers == 2
    roles = g.bytes_by_role()
    assert roles[Role.WEIGHT] == 16 and roles[Role.KV] == 32 and roles[Role.ACTIVATION] == 8
    assert g.kinds()[KernelKind.GEMM] == 1


def test_json_round_trip_exact(tmp_path) -> None:
    g = three_kernel_graph()
    p = tmp_path / "g.json"
    g.save(p)
    h = KernelGraph.load(p)
    assert h == g and h.to_dict() == g.to_dict() and h.edges == g.edges


def test_invariants_catch_read_before_write() -> None:
    g = three_kernel_graph()
    g.check_invariants()
    bad = build_graph(model="toy", phase="decode", shape={}, buffers=g.buffers,
                      kernels=[_k(0, (2,), (3,))])  # reads activation nobody wrote
    with pytest.raises(AssertionError, match="before any write"):
        bad.check_invariants()


def test_load_bad_file_is_value_error(tmp_path) -> None:
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read kernel graph"):
        KernelGraph.load(p)


def test_load_non_object_is_value_error(tmp_path) -> None:
    p = tmp_path / "list.json"
    p.write_text("[1, 2]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        KernelGraph.load(p)


def test_cli_error_line_prints_user_text_verbatim(tmp_path, run_cli) -> None:
    p = tmp_path / "x.ptx"
    p.write_text("root:x:0:0:[bold]root[/bold]\n")  # an emoji code and markup, as a user file may hold
    code, _, err = run_cli(["ptx", "analyze", str(p)])
    assert code == 2 and "root:x:0:0:[bold]root[/bold]" in err and len(err.strip().splitlines()) == 1
