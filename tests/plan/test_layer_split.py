"""The layer pipeline's split searched by memory and speed: worked by hand on a chain where memory moves the
split off the speed-proportional one, against every contiguous split scored by the verifier, and the
search against enumeration under its own model."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from tessera.cost import CostModel
from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.hardware import LinkSpec
from tessera.plan.baselines.layer_pipeline import (
    LayerCosts,
    best_split,
    device_orders,
    layer_costs,
    layer_pipeline,
    layer_units,
    rule,
)
from tessera.plan.model.serving import over_memory, whole_step_memory
from tessera.plan.pool import resolve_gpu
from tessera.plan.solver.verify import evaluate
from tessera.plan.synthetic import SynthConfig, llama_like

from .helpers import H, L, TableCost

GB = 10**9
LINK = LinkSpec(name="test", bytes_per_s=1e9, latency_s=0.0)  # TableCost: transfers at 1 GB/s


def layer_chain(n: int, kv_bytes: int = 0):
    """x -> L0 -> ... -> L{n-1}, one kernel per layer, 1 GB of weights each, 0.1 GB values between
    layers (0.1 s on the 1 GB/s link), ``kv_bytes`` of KV per layer."""
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT)]
    ks = []
    prev = 0
    for i in range(n):
        v = len(bufs)
        bufs.append(Buffer(id=v, name=f"v{i}", bytes=GB // 10,
                           role=Role.OUTPUT if i == n - 1 else Role.ACTIVATION))
        bufs.append(Buffer(id=v + 1, name=f"w{i}", bytes=GB, role=Role.WEIGHT))
        reads = (prev, v + 1)
        if kv_bytes:
            bufs.append(Buffer(id=v + 2, name=f"kv{i}", bytes=kv_bytes, role=Role.KV))
            reads = (*reads, v + 2)
        ks.append(Kernel(id=i, name=f"L{i}", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1,
                         reads=reads, writes=(v,), layer=i))
        prev = v
    return build_graph(model="chain", phase="decode", shape={"batch": 1}, kernels=ks, buffers=bufs)


def chain_cost(n: int) -> TableCost:
    """Every layer 1 s on H100, 3 s on L40S."""
    return TableCost(table={(f"L{i}", g): t for i in range(n) for g, t in ((H, 1.0), (L, 3.0))})


def period(g, a, units, cost, m: int) -> tuple[float, bool]:
    """The verifier's async period max(m·T, L) of placement ``a`` and whether it fits memory."""
    ev = evaluate(g, a, units, LINK, cost)
    return max(m * ev.bottleneck_s, ev.latency_s), over_memory(whole_step_memory(ev, m), units) is None


def test_memory_moves_the_split_off_the_speed_proportional_one() -> None:
    # 8 layers, 1 s each on H100 and 3 s on L40S: by speed H100 takes 6 (6 s | 2·3 = 6 s). H100 is given
    # 5.5 GB: 5 layers' weights (5 GB) and the live activations (a layer's input and output, 0.2 GB) fit, 6
    # do not. The best that fits, enumerated by hand:
    #   H100 5 | L40S 3: stages 5 s and 9 s, cut 0.1 s → m = 2: max(2·9, 5 + 0.1 + 9) = 18; m = 1: 14.1
    #   H100 4 | L40S 4: 4 s and 12 s → m = 2: 24 (the even split); fewer on H100 only worse;
    #   L40S first (3 | 5, 4 | 4, ...) gives the same stages mirrored, no better.
    n = 8
    g, cost = layer_chain(n), chain_cost(n)
    units = (replace(resolve_gpu(H), mem_bytes=55 * GB // 10), resolve_gpu(L))
    c = layer_costs(g, units, LINK, cost)
    assert c.seconds[:, 0].tolist() == [1.0] * n and c.seconds[:, 1].tolist() == [3.0] * n
    assert c.cut_s[1:n].tolist() == pytest.approx([0.1] * (n - 1)) and c.cut_s[0] == c.cut_s[n] == 0.0
    assert c.act_bytes.tolist() == [1e8 + 8] + [2e8] * (n - 1)  # input and output of each layer
    for m, want in ((2, 18.0), (1, 14.1)):
        s = best_split(c, (0, 1), tuple(u.mem_bytes for u in units), m)
        assert s is not None and s.counts == (5, 3) and s.period_s == pytest.approx(want)
        a = rule(units, LINK, cost)(g, 64, m)
        assert sorted(a.count(d) for d in (0, 1)) == [3, 5] and a.count(0) == 5
        assert period(g, a, units, cost, m) == (pytest.approx(want), True)
    # the speed-proportional split does not fit; the even one is 24 at m = 2
    assert not period(g, layer_pipeline(g, [0, 1], [6, 2]), units, cost, 2)[1]
    assert period(g, layer_pipeline(g, [0, 1], [4, 4]), units, cost, 2) == (pytest.approx(24.0), True)


def test_kv_of_more_microbatches_moves_the_split() -> None:
    # the same chain with 0.06 GB of KV per layer and 5.6 GB on H100. m = 1: 5 layers need
    # 5 + 5·0.06 + 0.2 = 5.5 GB (fits): 5 | 3 as above. m = 2 holds two micro-batches' KV:
    # 5 + 2·0.3 + 0.2 = 5.8 GB (does not fit), 4 layers 4 + 2·0.24 + 0.2 = 4.68 GB: 4 | 4, max(2·12, 16.1) = 24.
    n = 8
    g, cost = layer_chain(n, kv_bytes=6 * GB // 100), chain_cost(n)
    units = (replace(resolve_gpu(H), mem_bytes=56 * GB // 10), resolve_gpu(L))
    c = layer_costs(g, units, LINK, cost)
    assert c.kv_bytes.tolist() == [6e7] * n and c.weight_bytes.tolist() == [1e9] * n
    mem = tuple(u.mem_bytes for u in units)
    assert best_split(c, (0, 1), mem, 1).counts == (5, 3)
    s = best_split(c, (0, 1), mem, 2)
    assert s.counts == (4, 4) and s.period_s == pytest.approx(24.0)
    a = rule(units, LINK, cost)(g, 64, 2)
    assert a.count(0) == 4 and period(g, a, units, cost, 2) == (pytest.approx(24.0), True)


@pytest.mark.parametrize(("mem_gb", "m"), [(80, 4), (3, 2), (2.5, 1), (2, 4)])
def test_rule_finds_the_best_of_every_contiguous_split(mem_gb: float, m: int) -> None:
    """A llama-like graph of 6 layers (0.44 GB of weights and 0.13 GB of KV each at batch 32, the first and
    last 0.26 GB more for the embedding and the head) on H100 (its memory cut to ``mem_gb``) + L40S under a
    roofline cost model (L40S 3.4× slower): every contiguous split in both orders scored by the verifier;
    the rule's placement fits and reaches the best period that fits. At 80 GB nothing binds (H100 takes 5
    layers); at 3 GB and m = 2 the speed-proportional 5 | 1 does not fit and 3 | 3 is best; at 2 GB and
    m = 4 only one layer fits on H100 (1 | 5, or 5 | 1 with L40S first)."""
    g = llama_like("decode", batch=32, context=1024, cfg=SynthConfig(layers=6, vocab=32000))
    cost = CostModel()
    units = (replace(resolve_gpu(H), mem_bytes=int(mem_gb * GB)), resolve_gpu(L))
    link = LinkSpec(name="pcie", bytes_per_s=64e9, latency_s=5e-6)
    best = None
    for order in ((0, 1), (1, 0)):
        for cut in range(1, 6):
            a = layer_pipeline(g, list(order), [cut, 6 - cut])
            ev = evaluate(g, a, units, link, cost)
            if over_memory(whole_step_memory(ev, m), units) is None:
                p = max(m * ev.bottleneck_s, ev.latency_s)
                best = p if best is None else min(best, p)
    a = rule(units, link, cost)(g, 32, m)
    ev = evaluate(g, a, units, link, cost)
    assert over_memory(whole_step_memory(ev, m), units) is None
    assert max(m * ev.bottleneck_s, ev.latency_s) == pytest.approx(best, rel=1e-9)


def test_split_search_is_exact_against_enumeration() -> None:
    """best_split against every contiguous split of random LayerCosts (up to 8 units, 4 stages), same model:
    period max(m·B, S), every stage's weights + m·KV + peak activations within its device."""
    rng = np.random.default_rng(7)
    for _ in range(60):
        n, m = int(rng.integers(2, 9)), int(rng.choice([1, 2, 4, 8]))
        k = int(rng.integers(1, min(n, 4) + 1))
        c = LayerCosts(seconds=rng.uniform(1, 5, (n, k)).round(1), weight_bytes=rng.integers(1, 10, n) * 1.0,
                       kv_bytes=rng.integers(0, 3, n) * 1.0, act_bytes=rng.integers(0, 4, n) * 1.0,
                       cut_s=np.concatenate([[0], rng.uniform(0, 2, n - 1).round(1), [0]]))
        mem = tuple(int(x) for x in rng.integers(5, 40, k))
        order = tuple(int(d) for d in rng.permutation(k))
        best = None
        for cuts in itertools.combinations(range(1, n), k - 1):
            b = (0, *cuts, n)
            need = [c.weight_bytes[i:j].sum() + m * c.kv_bytes[i:j].sum() + c.act_bytes[i:j].max()
                    for i, j in zip(b, b[1:], strict=False)]
            if any(x > mem[d] for x, d in zip(need, order, strict=True)):
                continue
            terms = [c.seconds[i:j, d].sum() for i, j, d in zip(b, b[1:], order, strict=False)]
            terms += [c.cut_s[x] for x in cuts]
            p = max(m * max(terms), sum(terms))
            best = p if best is None else min(best, p)
        s = best_split(c, order, mem, m)
        assert (s is None) == (best is None)
        if s is not None:
            assert s.period_s == pytest.approx(best, abs=1e-9)
            assert sum(s.counts) == n and min(s.counts) >= 1


def test_layer_units_and_orders() -> None:
    g = llama_like("decode", batch=2, context=16, cfg=SynthConfig(layers=3, hidden=64, ffn=128, heads=4,
                                                                   kv_heads=2, vocab=100))
    unit, n = layer_units(g)
    assert n == 3
    # embedding and rotary (before layer 0) join layer 0; final norm and LM head join layer 2
    assert unit[:2] == [0, 0] and unit[-2:] == [2, 2]
    assert unit == sorted(unit)
    h, l4 = resolve_gpu(H), resolve_gpu(L)
    # devices of one type are interchangeable: 2 H100 + 1 L40S have 3 distinct orders, not 6
    assert device_orders((h, h, l4)) == [(0, 1, 2), (0, 2, 1), (2, 0, 1)]
    # 8 + 8 GPUs of two types: 12,870 distinct orders; each type's devices kept together instead
    many = device_orders((h,) * 8 + (l4,) * 8)
    assert many == [tuple(range(16)), tuple(range(8, 16)) + tuple(range(8))]


def test_split_search_at_128_layers_and_16_devices() -> None:
    """The largest case the search is built for (no timing asserted: the DP runs are a few (n+1)² array
    passes per stage). 1 GB of weights and 0.1 GB of KV per unit, m = 2: a 12 GB device holds 9 units."""
    rng = np.random.default_rng(0)
    n, k = 128, 16
    c = LayerCosts(seconds=rng.uniform(1e-3, 3e-3, (n, k)), weight_bytes=np.full(n, 1e9),
                   kv_bytes=np.full(n, 1e8), act_bytes=np.full(n, 1e7),
                   cut_s=np.concatenate([[0], np.full(n - 1, 1e-4), [0]]))
    s = best_split(c, tuple(range(k)), (12 * 10**9,) * k, 2)
    assert s is not None and sum(s.counts) == n and len(s.counts) == k
    assert max(s.counts) <= 9
