"""Every Prometheus series the service exports, defined in one place.

Names follow Prometheus conventions: ``esp_`` prefix, base units, ``_seconds`` and
``_total`` suffixes. Labels are bounded: route templates, status codes, backend names,
and experiment/arm names taken from the registry, never user ids or raw weights.
Dashboards and alert rules (helm/) use exactly the names in :data:`METRIC_NAMES`.

The registry is injectable so each app (and each test) starts from clean counters. It also
carries prometheus-client's process and garbage-collector collectors (:data:`PROCESS_METRIC_NAMES`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.process_collector import ProcessCollector

M = TypeVar("M", bound=MetricWrapperBase)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
#: Why a search was refused (``esp_admission_refusals_total{reason}``; service.search.admission):
#: ``inflight`` the in-flight limit, ``forecast`` its wait forecast past the latency budget (before
#: its body is read, or when queued), ``queue_full`` no room in the queue, ``shed`` it waited out
#: the budget in the queue.
REFUSAL_REASONS = ("inflight", "forecast", "queue_full", "shed")
WEIGHT_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 2.0, 5.0, 10.0)


class Metrics:
    """The service's metric objects, registered on ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        # process_* (CPU, memory, open fds, start time) and python_gc_* on the service's registry
        ProcessCollector(registry=r)
        GCCollector(registry=r)
        self.requests = Counter(
            "esp_requests_total", "HTTP requests by route template and status code.",
            ["route", "status"], registry=r,
        )
        self.request_duration = Histogram(
            "esp_request_duration_seconds", "HTTP request latency by route template.",
            ["route"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.encode_duration = Histogram(
            "esp_encode_duration_seconds", "Time to encode one batch of query texts.",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.engine_duration = Histogram(
            "esp_engine_duration_seconds", "Time for one exhaustive weighted top-k batch.",
            ["backend"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "esp_batch_size", "Queries scored together in one engine call.",
            buckets=BATCH_BUCKETS, registry=r,
        )
        self.queue_depth = Gauge(
            "esp_queue_depth", "Queries waiting for the micro-batcher.", registry=r
        )
        self.queue_capacity = Gauge(
            "esp_queue_capacity", "Queries the micro-batcher accepts before answering 429.",
            registry=r,
        )
        self.admission_refusals = Counter(
            "esp_admission_refusals_total",
            "Searches refused by admission (429), by reason.",
            ["reason"], registry=r,
        )
        for reason in REFUSAL_REASONS:
            self.admission_refusals.labels(reason=reason)
        self.admission_inflight = Gauge(
            "esp_admission_inflight", "Searches admitted (their body read) and not yet answered.", registry=r
        )
        self.admission_limit = Gauge(
            "esp_admission_limit",
            "The in-flight search limit (ESP_MAX_INFLIGHT_SEARCHES or the adaptive one; 0 until set).",
            registry=r,
        )
        self.loop_lag = Histogram(
            "esp_event_loop_lag_seconds", "How late the event loop ran a callback that was due (sampled).",
            buckets=LAG_BUCKETS, registry=r,
        )
        self.index_documents = Gauge(
            "esp_index_documents", "Documents in the served index.", registry=r
        )
        self.bundle_info = Gauge(
            "esp_bundle_info", "The served bundle (value 1); labels say which.",
            ["version", "dtype", "backend"], registry=r,
        )
        self.ready = Gauge(
            "esp_ready", "1 when a bundle is loaded and warmed, else 0.", registry=r
        )
        self.weights_requested = Histogram(
            "esp_weights_requested", "Weight used per subspace, one observation per query.",
            ["subspace"], buckets=WEIGHT_BUCKETS, registry=r,
        )
        self.experiment_requests = Counter(
            "esp_experiment_requests_total", "Queries served per experiment arm.",
            ["experiment", "arm"], registry=r,
        )
        self.experiment_request_duration = Histogram(
            "esp_experiment_request_duration_seconds",
            "Search request latency per experiment arm (observe once per request served by an arm).",
            ["experiment", "arm"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.registry_reloads = Counter(
            "esp_registry_reloads_total", "Operating-point/experiment registry reloads by result.",
            ["result"], registry=r,
        )
        self.bundle_reloads = Counter(
            "esp_bundle_reloads_total", "Bundle hot reloads by result.", ["result"], registry=r,
        )
        self.bundle_in_sync = Gauge(
            "esp_bundle_in_sync",
            "1 when the served bundle is the one the registry file names (or it names none), else 0.",
            registry=r,
        )
        self.bundle_in_sync.set(1)
        self.bundle_rollout_refusals = Counter(
            "esp_bundle_rollout_refusals_total",
            "Bundles named by the registry file that this replica refused (digest, checksums, layout).",
            registry=r,
        )
        for result in ("success", "failure"):
            self.registry_reloads.labels(result=result)
            self.bundle_reloads.labels(result=result)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    def child(self, metric: M, *values: str) -> M:
        """``metric.labels(*values)``, cached: the hot path skips prometheus-client's label checks
        and lock on every request (label values are bounded, so the cache is too)."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found


#: Every series name the service exposes (histograms as their _bucket/_sum/_count family name).
METRIC_NAMES: tuple[str, ...] = (
    "esp_requests_total",
    "esp_request_duration_seconds",
    "esp_encode_duration_seconds",
    "esp_engine_duration_seconds",
    "esp_batch_size",
    "esp_queue_depth",
    "esp_queue_capacity",
    "esp_admission_refusals_total",
    "esp_admission_inflight",
    "esp_admission_limit",
    "esp_event_loop_lag_seconds",
    "esp_index_documents",
    "esp_bundle_info",
    "esp_ready",
    "esp_weights_requested",
    "esp_experiment_requests_total",
    "esp_experiment_request_duration_seconds",
    "esp_registry_reloads_total",
    "esp_bundle_reloads_total",
    "esp_bundle_in_sync",
    "esp_bundle_rollout_refusals_total",
)

#: The process and GC series on the same registry (Linux; Prometheus' own conventions).
PROCESS_METRIC_NAMES: tuple[str, ...] = (
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
    "python_gc_objects_collected_total",
    "python_gc_collections_total",
)
