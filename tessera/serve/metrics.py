"""The server's Prometheus figures, in a registry of its own (several servers may live in one test
process). Histograms are in seconds; counters end in ``_total`` on the wire (prometheus_client adds it)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# seconds; from a few ms (a tiny model's token) to minutes (a long prompt waiting behind a full queue)
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                     7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
BUSY_WINDOW_S = 5.0  # each worker's busy share is measured over windows of this length


class Metrics:
    def __init__(self, devices: Sequence[str]) -> None:
        self.registry = r = CollectorRegistry()
        self.devices = tuple(devices)
        self.ttft = Histogram("tessera_time_to_first_token_seconds", "Arrival to first output token",
                              buckets=LATENCY_BUCKETS_S, registry=r)
        self.tpot = Histogram("tessera_time_per_output_token_seconds", "Per output token after the first "
                              "(a request's decode time over its tokens after the first)",
                              buckets=LATENCY_BUCKETS_S, registry=r)
        self.e2e = Histogram("tessera_e2e_request_latency_seconds", "Arrival to last token",
                             buckets=LATENCY_BUCKETS_S, registry=r)
        self.running = Gauge("tessera_num_requests_running", "Requests the scheduler runs", registry=r)
        self.waiting = Gauge("tessera_num_requests_waiting", "Requests accepted, not yet running", registry=r)
        self.pages_used = Gauge("tessera_kv_pages_in_use", "KV cache pages held by requests", registry=r)
        self.pages_total = Gauge("tessera_kv_pages_total", "KV cache pages per layer", registry=r)
        self.busy_share = Gauge("tessera_worker_busy_share", f"A worker's compute seconds per second over "
                                f"the last {BUSY_WINDOW_S:g} s window", ["worker", "device"], registry=r)
        self.busy = Counter("tessera_worker_busy_seconds", "A worker's compute seconds", ["worker", "device"],
                            registry=r)
        self.prompt_tokens = Counter("tessera_prompt_tokens", "Prompt tokens of admitted requests",
                                     registry=r)
        self.generation_tokens = Counter("tessera_generation_tokens", "Output tokens generated", registry=r)
        self.requests = Counter("tessera_requests", "Requests ended, by finish reason (stop, length, abort, "
                                "error)", ["finish_reason"], registry=r)
        self.rejected = Counter("tessera_requests_rejected", "Requests answered at once with an error, by "
                                "reason (invalid, full, draining)", ["reason"], registry=r)
        self.recoveries = Counter("tessera_worker_recoveries", "Lost workers recovered from", registry=r)
        self.throughput_mode = Gauge("tessera_adaptive_throughput_mode", "--adaptive: 1 on the throughput "
                                     "schedule, 0 on the latency one", registry=r)
        self.switches = Counter("tessera_adaptive_switches", "--adaptive: schedule switches", registry=r)
        self._window_start = time.perf_counter()
        self._window_busy: dict[int, float] = {}
        for d, name in enumerate(self.devices):
            self.busy_share.labels(str(d), name).set(0.0)

    def add_busy(self, busy_s: dict[int, float]) -> None:
        """One iteration's compute seconds by --devices index."""
        for d, s in busy_s.items():
            self.busy.labels(str(d), self.devices[d]).inc(s)
            self._window_busy[d] = self._window_busy.get(d, 0.0) + s

    def roll_window(self) -> None:
        """Publish the busy shares once a window has passed (called every loop step and when idle)."""
        now = time.perf_counter()
        span = now - self._window_start
        if span < BUSY_WINDOW_S:
            return
        for d, name in enumerate(self.devices):
            self.busy_share.labels(str(d), name).set(self._window_busy.get(d, 0.0) / span)
        self._window_start, self._window_busy = now, {}

    def render(self) -> bytes:
        return generate_latest(self.registry)
