"""/metrics through prometheus_client (docs/HTTP.md §1): our ``waste_`` series, and vLLM's
names for the series its Grafana dashboards read (latency histograms, token counters,
running/waiting gauges), each with a HELP line.

One registry per app (tests run several apps in one process). Request counts land when the
HTTP exchange ends, so a client that left (499) or a stream cut short is counted as such.
Engine totals are read from the engine's own statistics at scrape time, so tokens of a
cancelled generation count too.
"""

from __future__ import annotations

from typing import Callable, Iterator

import attrs
import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from waste.domain.ports import EngineStats

# No ``_created`` twin per series: it doubles the scrape for a value no dashboard reads.
prometheus_client.disable_created_metrics()

# generate_latest writes the 0.0.4 text format (CONTENT_TYPE_LATEST names a newer version).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OUTCOME = "waste.outcome"  # the ASGI scope key of a request's route, status and arrival
CLIENT_CLOSED = 499  # the client left before the answer ended (nginx's status for it)

# Requests here run seconds to minutes (experts stream from SSD), so the buckets reach far.
_LATENCY = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0,
            1280.0, 2560.0, 7680.0)
_PER_TOKEN = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
              7.5, 10.0, 20.0, 40.0, 80.0)


@attrs.frozen
class Snapshot:
    """What the service and the engine say at scrape time."""

    cancelled: int
    queue_depth: int
    running: int
    stats: EngineStats | None
    info: dict[str, str]


@attrs.frozen
class RequestTimes:
    """One finished generation's timings, in seconds (time to first token and end-to-end
    are measured from the request's arrival)."""

    queue_s: float
    prefill_s: float
    decode_s: float
    first_token_s: float | None
    e2e_s: float
    prompt_tokens: int
    generated_tokens: int


class Metrics:
    """The app's registry: request outcomes, timing histograms, and a scrape-time collector."""

    def __init__(self, model_name: str = "waste") -> None:
        self.model_name = model_name
        self.registry = CollectorRegistry(auto_describe=True)
        self.snapshot: Callable[[], Snapshot] | None = None
        self.prompt_tokens = 0
        self.queue_s = self.prefill_s = self.decode_s = 0.0
        self._requests = Counter("waste_requests", "HTTP requests by route template (or "
                                 "'other') and final status; 499: the client left first",
                                 ["route", "status"], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, ["model_name"], buckets=buckets,
                             registry=self.registry).labels(model_name)

        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Time from the request's arrival to its first generated token",
                              _LATENCY)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "Decode time per output token after the first (one observation "
                              "per request: its mean)", _PER_TOKEN)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Time from the request's arrival to its last token", _LATENCY)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Time a request waited for the engine", _LATENCY)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Time the engine spent on a request's prompt", _LATENCY)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Time the engine spent generating a request's tokens", _LATENCY)
        self.registry.register(_Scrape(self))

    def count_request(self, route: str, status: int) -> None:
        self._requests.labels(route, str(status)).inc()

    def observe(self, times: RequestTimes) -> None:
        """A finished generation: its timings go into the histograms and the totals."""
        self.prompt_tokens += times.prompt_tokens
        self.queue_s += times.queue_s
        self.prefill_s += times.prefill_s
        self.decode_s += times.decode_s
        self.queue.observe(times.queue_s)
        self.prefill.observe(times.prefill_s)
        self.decode.observe(times.decode_s)
        self.e2e.observe(times.e2e_s)
        if times.first_token_s is not None:
            self.ttft.observe(times.first_token_s)
        if times.generated_tokens > 1:
            self.tpot.observe(times.decode_s / (times.generated_tokens - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Scrape:
    """Series read at scrape time from the service and the engine."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> list[Metric]:
        return []  # read at scrape time only: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        m = self.m
        snap = m.snapshot() if m.snapshot is not None else None
        model = {"model_name": m.model_name}
        generated = snap.stats.tokens_generated if snap is not None and snap.stats else 0
        yield _counter("waste_requests_cancelled", "Generation requests whose client left "
                       "before the answer was read", snap.cancelled if snap else 0)
        yield _counter("waste_prompt_tokens", "Prompt tokens of finished generations",
                       m.prompt_tokens)
        yield _counter("waste_generated_tokens", "Tokens the engine generated, including "
                       "those of cancelled generations", generated)
        yield _counter("waste_queue_seconds", "Seconds finished requests waited for the engine",
                       m.queue_s)
        yield _counter("waste_prefill_seconds", "Seconds spent on prompts", m.prefill_s)
        yield _counter("waste_decode_seconds", "Seconds spent generating tokens", m.decode_s)
        yield _counter("vllm:prompt_tokens", "Prompt tokens of finished generations",
                       m.prompt_tokens, model)
        yield _counter("vllm:generation_tokens", "Tokens generated (cancelled ones too)",
                       generated, model)
        queue_depth = snap.queue_depth if snap else 0
        running = snap.running if snap else 0
        yield _gauge("waste_queue_depth", "Requests waiting for the engine", queue_depth)
        yield _gauge("waste_requests_running", "Requests the engine is running (0 or 1)", running)
        yield _gauge("vllm:num_requests_waiting", "Requests waiting for the engine",
                     queue_depth, model)
        yield _gauge("vllm:num_requests_running", "Requests the engine is running", running,
                     model)
        stats = snap.stats if snap else None
        if stats is not None:
            yield _counter("waste_expert_hits", "Routed-expert loads served from the cache "
                           "since the engine opened", stats.experts_hit)
            yield _counter("waste_expert_misses", "Routed-expert loads read from the SSD",
                           stats.experts_missed)
            yield _counter("waste_expert_bytes_read", "Expert bytes read from the SSD",
                           stats.bytes_read)
            yield _gauge("waste_direct_io", "1 when experts are read with O_DIRECT",
                         int(stats.direct_io))
            yield _counter("waste_lookahead_guesses", "Speculative expert reads issued by the "
                           "router lookahead", stats.guesses)
            yield _counter("waste_lookahead_hits", "Lookahead guesses the real router then "
                           "selected", stats.guess_hits)
            yield _counter("waste_lookahead_wasted_bytes", "Bytes of lookahead guesses never "
                           "selected by the token they were read for", stats.wasted_bytes)
            yield _gauge("waste_io_queue_depth_max", "Most expert reads queued or in flight at "
                         "once in the reader pool", stats.io_queue_depth_max)
            yield _counter("waste_disk_busy_seconds", "Time at least one expert read was in "
                           "flight", stats.disk_busy_s)
            yield _gauge("waste_memory_budget_bytes", "The memory budget", stats.budget_bytes)
            yield _gauge("waste_memory_peak_bytes", "Peak memory the engine accounted",
                         stats.peak_bytes)
            pc = stats.prefix_cache  # docs/ENGINE.md §2 "Prefix cache"
            yield _counter("waste_prefix_cache_reused_tokens", "Prompt tokens restored from the "
                           "prefix cache instead of prefilled", pc.reused_tokens)
            yield _counter("waste_prefix_cache_hits", "Requests that restored a stored prefix",
                           pc.hits)
            yield _counter("waste_prefix_cache_evictions", "Prefix-cache entries evicted",
                           pc.evictions)
            yield _gauge("waste_prefix_cache_entries", "Entries in the prefix cache", pc.entries)
            yield _gauge("waste_prefix_cache_bytes", "Bytes held by the prefix cache", pc.bytes)
            yield _gauge("waste_prefix_cache_capacity_bytes", "The prefix cache's size",
                         pc.capacity_bytes)
        if snap is not None:
            info = GaugeMetricFamily("waste_info", "The served model, server version and chat "
                                     "format", labels=list(snap.info))
            info.add_metric(list(snap.info.values()), 1)
            yield info


def _counter(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = CounterMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family


def _gauge(name: str, doc: str, value: float, labels: dict[str, str] | None = None) -> Metric:
    family = GaugeMetricFamily(name, doc, labels=list(labels or {}))
    family.add_metric(list((labels or {}).values()), value)
    return family
