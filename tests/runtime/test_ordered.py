"""The ordered (NCCL) schedule: pairs messages in the same order at both ends and cannot deadlock.

NCCL ignores tags and pairs a link's messages in issue order; a send completes only when its receive is
posted. Without a GPU this is checked twice: against a strict model of those rules (one in-order queue per
worker, a send and its receive complete together when both are at the heads of their queues), and for
real on gloo with every message on tag 0, where a mis-ordered schedule pairs the wrong buffers.
"""

from __future__ import annotations

import pytest

from tessera.runtime.cluster import Cluster, ClusterConfig
from tessera.runtime.partition import Partition
from tessera.runtime.placements import attention_gemm, interleave, layer_split, milp
from tessera.runtime.recovery import phase_graphs
from tessera.runtime.runner import ClusterExecutor, build_partitions, compare, run_round
from tessera.runtime.step_ordered import POST, RUN, SEND, WAIT, Action, ordered_actions
from tessera.runtime.steps import Job, LocalExecutor, capture_steps


def rendezvous_deadlocks(queues: list[list[tuple[int, Action]]]) -> bool:
    """Run per-worker queues of (micro-batch, action) under NCCL's rules; True if they get stuck."""
    head, done = [0] * len(queues), set()
    while True:
        before = list(head)
        for w, q in enumerate(queues):
            while head[w] < len(q):
                mb, (code, x) = q[head[w]]
                if code == RUN or (code == WAIT and (mb, x.index) in done):
                    head[w] += 1
                    continue
                if code == WAIT:
                    break
                peer = x.dst if code == SEND else x.src
                if head[peer] < len(queues[peer]) and queues[peer][head[peer]] == (mb, (POST if code == SEND
                                                                                       else SEND, x)):
                    head[w] += 1
                    head[peer] += 1
                    done.add((mb, x.index))
                    continue
                break
        if all(h == len(q) for h, q in zip(head, queues, strict=True)):
            return False
        if head == before:
            return True


def queues_for(part: Partition, n_ops: int, m: int, schedule) -> list[list[tuple[int, Action]]]:
    return [[(mb, a) for mb in range(m) for a in schedule(part, d, n_ops)] for d in range(part.devices)]


def receives_first(part: Partition, me: int, n_ops: int) -> tuple[Action, ...]:
    """The gloo schedule's issue order: every receive posted at step start, then the ordered rest."""
    acts = ordered_actions(part, me, n_ops)
    return tuple(a for a in acts if a[0] == POST) + tuple(a for a in acts if a[0] != POST)


@pytest.fixture(scope="module")
def llama():
    job = Job(model="llama-tiny", seq=6, new_tokens=3)
    return job, capture_steps(job)


def test_ordered_schedule_pairs_in_order_and_never_deadlocks(llama) -> None:
    _, programs = llama
    graphs = phase_graphs(programs)
    plans = {"attention_gemm": {ph: attention_gemm(g, 2) for ph, g in graphs.items()},
             "interleave3": {ph: interleave(g, 3) for ph, g in graphs.items()},
             "milp": milp(graphs, 2)}
    for name, plan in plans.items():
        devices = 1 + max(max(a) for a in plan.values())
        for (key, _), part in build_partitions(programs, {name: plan}, devices).items():
            n_ops = len(programs[key].ops)
            assert part.transfers, f"{name} {key}: nothing crosses a link, nothing to check"
            acts = [ordered_actions(part, d, n_ops) for d in range(devices)]
            for s in range(devices):  # on every link the sender's sends and the receiver's posts agree
                for d in range(devices):
                    sends = [x.index for c, x in acts[s] if c == SEND and x.dst == d]
                    posts = [x.index for c, x in acts[d] if c == POST and x.src == s]
                    assert sends == posts, f"{name} {key}: link {s}->{d} pairs out of order"
            assert not rendezvous_deadlocks(queues_for(part, n_ops, 2, ordered_actions)), f"{name} {key}"
    # the model is not vacuous: the gloo path's order (every receive first) deadlocks under NCCL's rules
    part = build_partitions(programs, {"a": plans["attention_gemm"]}, 2)[("prefill", "a")]
    assert rendezvous_deadlocks(queues_for(part, len(programs["prefill"].ops), 1, receives_first))


@pytest.mark.slow
def test_ordered_schedule_on_tag_free_gloo_equals_one_process(llama) -> None:
    """Three placements, two micro-batches, and a three-worker split (two links per worker): bit-identical
    to single-process execution with every message on tag 0, as NCCL would pair them."""
    job, programs = llama
    graphs = phase_graphs(programs)
    for plan, devices in (({ph: attention_gemm(g, 2) for ph, g in graphs.items()}, 2), (milp(graphs, 2), 2),
                          ({ph: layer_split(g, 3) for ph, g in graphs.items()}, 3)):
        parts = build_partitions(programs, {"p": plan}, devices)
        cfg = ClusterConfig(devices=("cpu",) * devices, max_microbatches=2, ordered=True)
        assert cfg.backend == "gloo" and cfg.ordered_issue
        with Cluster(programs, parts, cfg) as cluster:
            got = run_round(ClusterExecutor(cluster), job, programs, "p", 2, 0)
        want = run_round(LocalExecutor(programs), job, programs, "p", 2, 0)
        assert compare([got], [want]) == (True, 0.0, True)
