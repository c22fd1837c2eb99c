"""What the model server counts, in the two shapes its readers speak: Triton's statistics
extension (``GET /v2/models/{m}/stats``, which ``tritonclient``'s
``get_inference_statistics`` reads) and Prometheus (``GET /metrics``).

Both are updated on the event loop only (the batcher reports executions there), so
nothing here takes a lock of its own. Triton's meaning of the counts is kept:
``inference_count`` counts rows (a request of 8 rows is 8 inferences),
``execution_count`` forward calls; ``inference_stats`` are per request (``success`` is
the whole time in the server, from its arrival to its reply; ``queue`` the wait for an
execution; ``compute_*`` the execution it ran in: the batch's time is every one of its
requests' time, as in Triton); ``batch_stats`` are per execution, by its rows.

``gpufleet_model_busy_seconds_total`` is the time the model spent in forward calls
(the simulated launch cost included, as a GPU is busy then): its rate is the fraction
of time the model's device was busy, from which the node agent derives a simulated
GPU's utilisation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpufleet.modelserver.batcher import Execution

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(slots=True)
class Duration:
    """Triton's ``StatisticDuration``: how many, and their total nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        self.count += 1
        self.ns += ns

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(slots=True)
class _BatchSize:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelMetrics:
    """The Prometheus series, in a registry of this app's own (several apps in one test
    process must not share one); the labelled children are kept, so a request costs no
    label lookup."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.registry = r = CollectorRegistry(auto_describe=True)
        label = ["model"]
        self._requests = Counter(
            "gpufleet_model_requests",
            "Infer requests answered, by HTTP status.",
            ["model", "code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "gpufleet_model_request_seconds",
            "Time from an infer request's arrival to its reply.",
            label,
            registry=r,
            buckets=LATENCY_BUCKETS,
        ).labels(model)
        self.queue_seconds = Histogram(
            "gpufleet_model_queue_seconds",
            "Time an infer request waited for an execution.",
            label,
            registry=r,
            buckets=LATENCY_BUCKETS,
        ).labels(model)
        self.batch_size = Histogram(
            "gpufleet_model_batch_size", "Rows per execution.", label, registry=r, buckets=BATCH_BUCKETS
        ).labels(model)
        self.busy_seconds = Counter(
            "gpufleet_model_busy_seconds", "Time the model spent computing.", label, registry=r
        ).labels(model)
        self.inflight = Gauge(
            "gpufleet_model_inflight", "Infer requests in the server.", label, registry=r
        ).labels(model)
        # text generation (``engine``), as vLLM's num_requests_running/waiting and
        # generation_tokens: the queue is the signal a saturated replica's utilisation hides
        self.sequences_running = Gauge(
            "gpufleet_model_sequences_running", "Text sequences in the decoding batch.", label, registry=r
        ).labels(model)
        self.sequences_waiting = Gauge(
            "gpufleet_model_sequences_waiting", "Text sequences waiting for a batch slot.", label, registry=r
        ).labels(model)
        self.generated_tokens = Counter(
            "gpufleet_model_generated_tokens", "Text tokens generated.", label, registry=r
        ).labels(model)
        self._codes: dict[int, Any] = {}

    def answered(self, code: int) -> None:
        child = self._codes.get(code)
        if child is None:
            child = self._codes[code] = self._requests.labels(self.model, str(code))
        child.inc()


class ModelStats:
    """Triton's statistics of one model version, and its Prometheus series."""

    def __init__(self, *, name: str, version: str, metrics: ModelMetrics | None = None) -> None:
        self.name = name
        self.version = version
        self.metrics = metrics or ModelMetrics(name)
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        self._batches: dict[int, _BatchSize] = {}

    def executed(self, run: Execution) -> None:
        """One forward call (the batcher's ``on_execution``)."""
        seconds = (run.input_ns + run.infer_ns + run.output_ns) / 1e9
        self.metrics.busy_seconds.inc(seconds)
        if not run.ok:
            return
        self.execution_count += 1
        self.metrics.batch_size.observe(run.rows)
        per_size = self._batches.get(run.rows)
        if per_size is None:
            per_size = self._batches[run.rows] = _BatchSize()
        per_size.compute_input.add(run.input_ns)
        per_size.compute_infer.add(run.infer_ns)
        per_size.compute_output.add(run.output_ns)

    def decoded(self, tokens: int, seconds: float) -> None:
        """One decoding step of text generation (the engine's ``on_step``): the device
        is busy for it, as for a forward call."""
        self.metrics.busy_seconds.inc(seconds)
        self.metrics.generated_tokens.inc(tokens)

    def succeeded(self, *, rows: int, total_ns: int, queue_ns: int, run: Execution) -> None:
        """One request answered with the model's output."""
        self.inference_count += rows
        self.last_inference_ms = int(time.time() * 1000)
        self.success.add(total_ns)
        self.queue.add(queue_ns)
        self.compute_input.add(run.input_ns)
        self.compute_infer.add(run.infer_ns)
        self.compute_output.add(run.output_ns)
        self.metrics.queue_seconds.observe(queue_ns / 1e9)

    def failed(self, *, total_ns: int) -> None:
        """One request that reached the model and failed (bad inputs included)."""
        self.fail.add(total_ns)

    def answered(self, *, code: int, total_ns: int) -> None:
        """Every infer request's reply, whatever its outcome."""
        self.metrics.answered(code)
        self.metrics.request_seconds.observe(total_ns / 1e9)

    def as_triton(self) -> dict[str, Any]:
        """This model's entry of ``model_stats``."""
        zero = Duration().as_json()
        return {
            "name": self.name,
            "version": self.version,
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": self.success.as_json(),
                "fail": self.fail.as_json(),
                "queue": self.queue.as_json(),
                "compute_input": self.compute_input.as_json(),
                "compute_infer": self.compute_infer.as_json(),
                "compute_output": self.compute_output.as_json(),
                "cache_hit": zero,
                "cache_miss": zero,
            },
            "batch_stats": [
                {
                    "batch_size": size,
                    "compute_input": s.compute_input.as_json(),
                    "compute_infer": s.compute_infer.as_json(),
                    "compute_output": s.compute_output.as_json(),
                }
                for size, s in sorted(self._batches.items())
            ],
            "memory_usage": [],
        }


__all__ = ["BATCH_BUCKETS", "LATENCY_BUCKETS", "Duration", "ModelMetrics", "ModelStats"]
