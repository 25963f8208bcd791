"""The synchronous iteration of m micro-batches through a placement, worked by hand."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tessera.graph import Buffer, Kernel, KernelKind, Role, build_graph
from tessera.plan.model.serving import Slo, Traffic, score_point, sync_period_s
from tessera.plan.solver.verify import Message, async_period_s, evaluate, list_schedule_s, pipelined_latency_s

from .helpers import COST, POOL, TableCost, chain3


def chain(times: list[float]) -> tuple:
    """x -> k0 -> k1 -> ... , each value 0 bytes (free to move), one weight per kernel; a cost of
    ``times[i]`` seconds for kernel i on either GPU."""
    n = len(times)
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT)]
    bufs += [Buffer(id=1 + i, name=f"v{i}", bytes=0, role=Role.ACTIVATION) for i in range(n)]
    bufs += [Buffer(id=1 + n + i, name=f"w{i}", bytes=1_000, role=Role.WEIGHT) for i in range(n)]
    ks = [Kernel(id=i, name=f"k{i}", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1,
                 reads=(i, 1 + n + i), writes=(1 + i,), layer=None) for i in range(n)]
    g = build_graph(model="chain", phase="decode", shape={"batch": 1}, kernels=ks, buffers=bufs)
    cost = TableCost(table={(f"k{i}", u.name): t for i, t in enumerate(times) for u in POOL.gpus})
    return g, cost


def test_two_stage_chain_is_latency_plus_bottleneck_per_further_microbatch() -> None:
    # stage 0 takes 1 s, stage 1 2 s: micro-batch j leaves stage 1 at 1 + 2(j + 1): 3, 5, 7
    g, cost = chain([1.0, 2.0])
    for m, want in ((1, 3.0), (2, 5.0), (3, 7.0)):
        assert pipelined_latency_s(g, (0, 1), POOL.gpus, POOL.link, cost, m) == pytest.approx(want)


def test_alternating_placement_overlaps_better_than_the_chain_formula() -> None:
    # a, b, c, d of 0.5 s on devices 0, 1, 0, 1: latency 2, bottleneck 1 per device; chain formula
    # 2 + (m - 1)·1.
    # m = 2: device 0 runs 0a 1a 0c 1c, device 1 0b 1b 0d 1d, each half a second behind: 2.5 (formula 3).
    # m = 3: after 1a, device 0 turns to micro-batch 2 (next in turn) before 0c: 0a 1a 2a 0c 1c 2c, device 1
    # 0b 1b 2b 0d 1d 2d: 3.5, each device's 3 s plus the half-second offset, the least possible (formula 4).
    g, cost = chain([0.5] * 4)
    a = (0, 1, 0, 1)
    assert pipelined_latency_s(g, a, POOL.gpus, POOL.link, cost, 1) == pytest.approx(2.0)
    assert pipelined_latency_s(g, a, POOL.gpus, POOL.link, cost, 2) == pytest.approx(2.5)
    assert pipelined_latency_s(g, a, POOL.gpus, POOL.link, cost, 3) == pytest.approx(3.5)


def test_in_order_runs_each_microbatch_whole_before_the_next() -> None:
    # a CUDA stream in the ordered schedule: device 0 runs 0a 0c 1a 1c 2a 2c, device 1 0b 0d 1b 1d 2b 2d,
    # each waiting for its input. 0a 0-0.5, 0b 0.5-1, 0c 1-1.5, 0d 1.5-2; 1a 1.5-2 (after 0c), 1b 2-2.5,
    # 1c 2.5-3, 1d 3-3.5; 2a 3-3.5, 2b 3.5-4, 2c 4-4.5, 2d 4.5-5: 1.5 s per further micro-batch, where the
    # cyclic policy (above) takes 1 s
    g, cost = chain([0.5] * 4)
    a = (0, 1, 0, 1)
    for m, want in ((1, 2.0), (2, 3.5), (3, 5.0)):
        assert pipelined_latency_s(g, a, POOL.gpus, POOL.link, cost, m, "in_order") == pytest.approx(want)
    # a two-stage chain has nothing to interleave: both orders give 3, 5, 7
    g, cost = chain([1.0, 2.0])
    for m, want in ((1, 3.0), (2, 5.0), (3, 7.0)):
        got = pipelined_latency_s(g, (0, 1), POOL.gpus, POOL.link, cost, m, "in_order")
        assert got == pytest.approx(want)


def test_transfers_hold_their_link() -> None:
    # chain3: a on H100 (2 s), b on L40S (3 s), c on H100 (4 s); each value 0.5 s on the 1 GB/s link.
    # m = 1: a 0-2, b 2.5-5.5, c 6-10. m = 2: a 2-4, its value 4-4.5, b 5.5-8.5 (after 0's b), value 8.5-9,
    # c 10-14 (after 0's c): 14, against latency + bottleneck (device 0's 6 s) = 16.
    a = (0, 1, 0)
    assert pipelined_latency_s(chain3(), a, POOL.gpus, POOL.link, COST, 1) == pytest.approx(10.0)
    assert evaluate(chain3(), a, POOL.gpus, POOL.link, COST).latency_s == pytest.approx(10.0)
    assert pipelined_latency_s(chain3(), a, POOL.gpus, POOL.link, COST, 2) == pytest.approx(14.0)


def test_one_device_is_the_sum() -> None:
    g, cost = chain([0.5, 1.0, 0.25])
    for d in (0, 1):  # the other device idle, whichever it is
        assert pipelined_latency_s(g, (d, d, d), POOL.gpus, POOL.link, cost, 4) == pytest.approx(4 * 1.75)


def test_messages_in_flight_overlap_on_the_link() -> None:
    # a (device 0, 0.5 s) -> b (device 1, 0.5 s), a link with 2 s latency and nothing to carry: 0's value
    # leaves at 0.5 and lands at 2.5, 1's leaves at 1 and lands at 3 (the latency does not hold the link),
    # b runs 2.5-3 and 3-3.5. Held for the latency too, 1's value would land at 4.5 and end at 5.
    g, cost = chain([0.5, 0.5])
    slow = SlowLink(table=cost.table)
    assert pipelined_latency_s(g, (0, 1), POOL.gpus, POOL.link, slow, 1) == pytest.approx(3.0)
    assert pipelined_latency_s(g, (0, 1), POOL.gpus, POOL.link, slow, 2) == pytest.approx(3.5)


def test_values_crossing_one_boundary_do_not_queue_their_latency() -> None:
    # a (0.5 s) and b (0.5 s) on device 0 each write a value c (0.5 s) on device 1 reads, over a link of
    # 2 s latency and nothing to carry: a's value leaves at 0.5 and lands at 2.5, b's leaves at 1 and lands
    # at 3, c runs 3-3.5. evaluate's list schedule holds the link for the latency too: b's value waits for
    # a's to land (2.5) and lands at 4.5, c runs 4.5-5.
    bufs = [Buffer(id=0, name="x", bytes=8, role=Role.INPUT)]
    bufs += [Buffer(id=1 + i, name=f"v{i}", bytes=0, role=Role.ACTIVATION) for i in range(3)]
    reads = ((0,), (0,), (1, 2))
    ks = [Kernel(id=i, name=f"k{i}", kind=KernelKind.GEMM, flops=1, bytes_read=1, bytes_written=1,
                 reads=reads[i], writes=(1 + i,), layer=None) for i in range(3)]
    g = build_graph(model="fork", phase="decode", shape={"batch": 1}, kernels=ks, buffers=bufs)
    slow = SlowLink(table={(f"k{i}", u.name): 0.5 for i in range(3) for u in POOL.gpus})
    assert pipelined_latency_s(g, (0, 0, 1), POOL.gpus, POOL.link, slow, 1) == pytest.approx(3.5)
    assert evaluate(g, (0, 0, 1), POOL.gpus, POOL.link, slow).latency_s == pytest.approx(5.0)


class SlowLink(TableCost):
    def transfer_time_s(self, nbytes: int, link) -> float:  # type: ignore[override]
        return 2.0 + nbytes / 1e9


def test_planner_sync_period_is_the_better_issue_order() -> None:
    # the alternating placement at m = 2: cyclic 2.5 s, in order 3.5 s (above) -> 2.5, between the
    # asynchronous period max(m·T, L) = max(2·1, 2) = 2 and the chain formula's L + T = 3
    g, cost = chain([0.5] * 4)
    p = score_point(g, (0, 1, 0, 1), batch=2, m=2, units=POOL.gpus, link=POOL.link, cost=cost,
                    traffic=Traffic(), slo=Slo(), at=lambda _shape: g)
    assert p.period_s == pytest.approx(2.0)
    assert sync_period_s(g, p, POOL.gpus, POOL.link, cost) == pytest.approx(2.5)
    # a two-stage chain of 1 s and 2 s at m = 3: both orders give 7 s = L + 2·T
    g, cost = chain([1.0, 2.0])
    p = score_point(g, (0, 1), batch=3, m=3, units=POOL.gpus, link=POOL.link, cost=cost, traffic=Traffic(),
                    slo=Slo(), at=lambda _shape: g)
    assert (p.period_s, sync_period_s(g, p, POOL.gpus, POOL.link, cost)) == pytest.approx((6.0, 7.0))


def test_a_message_nothing_sends_is_an_error_not_a_short_schedule() -> None:
    # kernel 1 on device 1 awaits "v", which kernel 0 sends; without the send it would wait forever
    sent = {0: [Message(key="v", link=(0, 1), hold_s=0.0, flight_s=0.5)]}
    assert list_schedule_s([[0], [1]], [1.0, 1.0], {1: ["v"]}, sent, 2) == pytest.approx(3.5)
    with pytest.raises(ValueError, match="never gets its inputs"):
        list_schedule_s([[0], [1]], [1.0, 1.0], {1: ["v"]}, {}, 2)


def test_async_period_of_groups_iterating_back_to_back_by_hand() -> None:
    # groups iterate back to back, the next iteration awaiting the last one's token. A chain of 1 s and 2 s:
    # m = 1 the latency 3; m = 2 device 1 serves both groups' 2 s: 4; m = 3: 6 (max(m·T, L) each time)
    g, cost = chain([1.0, 2.0])
    for m, want in ((1, 3.0), (2, 4.0), (3, 6.0)):
        assert async_period_s(g, (0, 1), POOL.gpus, POOL.link, cost, m) == pytest.approx((want,) * m)
    # the alternating placement of 0.5 s kernels: each device has 1 s per group: m = 2 → 2, m = 3 → 3
    g, cost = chain([0.5] * 4)
    assert async_period_s(g, (0, 1, 0, 1), POOL.gpus, POOL.link, cost, 2) == pytest.approx((2.0, 2.0))
    assert async_period_s(g, (0, 1, 0, 1), POOL.gpus, POOL.link, cost, 3) == pytest.approx((3.0,) * 3)


def test_async_period_when_one_group_carries_more_by_hand() -> None:
    # the 1 s / 2 s chain, but group 0's second kernel takes 3 s (its iterations carry a prompt chunk):
    # device 1 serves 3 s of group 0 and 2 s of group 1 in turn, so both groups cycle every 5 s
    g, cost = chain([1.0, 2.0])
    ks = tuple(replace(k, name=k.name + "+chunk") for k in g.kernels)
    other = replace(g, kernels=ks)
    cost = TableCost(table={**cost.table, **{("k0+chunk", u.name): 1.0 for u in POOL.gpus},
                            **{("k1+chunk", u.name): 3.0 for u in POOL.gpus}})
    assert async_period_s(g, (0, 1), POOL.gpus, POOL.link, cost, 2, other=other, others=1) == \
        pytest.approx((5.0, 5.0))
