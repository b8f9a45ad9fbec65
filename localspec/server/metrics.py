"""Prometheus metrics of every answer (chat window and API), in vLLM's names and meanings where vLLM has them.

Names (prefix `localspec:`), matched to vLLM's v1 metrics:
  spec_decode_num_drafts_total                  steps that drafted (vLLM: number of drafts)
  spec_decode_num_draft_tokens_total            draft positions: a chain's tokens, a token tree's depth (usage's
                                                drafted_tokens)
  spec_decode_num_accepted_tokens_total         of those, kept: a tree's accepted path (usage's accepted_tokens)
  spec_decode_num_accepted_tokens_per_pos_total{position}  accepted tokens at draft position 0, 1, …
  spec_decode_num_draft_tree_nodes_total        every node of the token trees drafted, siblings included (localspec's)
  request_success_total{finished_reason}        finished answers (stop, length; cancelled and error too here)
  prompt_tokens_total, generation_tokens_total  tokens in and out; generation counts the tokens delivered
  (each request is counted once, when it ends, with what its response carried: Outcome. The counters are the sums
  of the responses' usage, exactly; a non-streamed answer whose client left before its body was sent delivered
  nothing and counts 0 generated and drafted tokens, as request_success_total{finished_reason="cancelled"})
  time_to_first_token_seconds, e2e_request_latency_seconds (histograms)
  num_requests_running, num_requests_waiting    the shared FIFO queue (gauges)
localspec's own (vLLM has none):
  spec_decode_step_seconds{phase=propose|score|sample}  per-step time split (histogram)
  spec_decode_adaptive_k, spec_decode_predicted_speedup  the adaptive controller's latest K and E / (K·c + v)
Every metric carries model_name (as vLLM's do); the request counter also carries source (chat / api).
This module imports prometheus_client and the engine's events only: never Gradio, never the server's app.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import prometheus_client
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from localspec.engine.events import StatsSnapshot, StepEvent

prometheus_client.disable_created_metrics()  # no *_created series (vLLM's exposition has none either)

PREFIX = "localspec:"
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class Outcome:
    """How one request ended, as its client was told: the response's finish_reason and completion_tokens."""

    finish_reason: str  # stop | length | cancelled | error
    prompt_tokens: int
    completion_tokens: int  # delivered to the client
    elapsed_s: float
    stats: StatsSnapshot = StatsSnapshot()  # the drafting of what was delivered (the usage's drafted / accepted)


class MetricsRecorder:
    """One registry per recorder (so tests and two servers in one process do not share counters)."""

    def __init__(self, admission=None) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        reg = self.registry

        def counter(name: str, doc: str, labels=("model_name",)) -> Counter:
            return Counter(PREFIX + name, doc, labels, registry=reg)

        self.num_drafts = counter("spec_decode_num_drafts", "Number of spec decoding drafts (steps that drafted).")
        self.num_draft_tokens = counter(
            "spec_decode_num_draft_tokens", "Number of draft positions (a token tree counts its depth)."
        )
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Number of accepted tokens.")
        self.num_tree_nodes = counter(
            "spec_decode_num_draft_tree_nodes", "Number of token-tree nodes drafted, siblings included."
        )
        self.accepted_per_pos = counter(
            "spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.", ("model_name", "position")
        )
        self.requests = counter(
            "request_success", "Count of finished requests.", ("model_name", "finished_reason", "source")
        )
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Number of generation tokens delivered.")
        self.ttft = Histogram(
            PREFIX + "time_to_first_token_seconds",
            "Time to first token in seconds.",
            ("model_name",),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e = Histogram(
            PREFIX + "e2e_request_latency_seconds",
            "Engine time of a request in seconds.",
            ("model_name",),
            buckets=LATENCY_BUCKETS,
            registry=reg,
        )
        self.step_seconds = Histogram(
            PREFIX + "spec_decode_step_seconds",
            "Time of one step's phase (propose, score, sample) in seconds.",
            ("model_name", "phase"),
            buckets=STEP_BUCKETS,
            registry=reg,
        )
        self.adaptive_k = Gauge(
            PREFIX + "spec_decode_adaptive_k",
            "K of the latest step (the adaptive controller's choice when adaptive).",
            ("model_name",),
            registry=reg,
        )
        self.predicted_speedup = Gauge(
            PREFIX + "spec_decode_predicted_speedup",
            "Predicted speedup E / (K*c + v) of the latest step.",
            ("model_name",),
            registry=reg,
        )
        self.model_name = lambda: "unknown"  # the loaded pair, for the queue gauges (set by the server)
        if admission is not None:
            reg.register(QueueGauges(admission, lambda: self.model_name()))

    def observe_step(self, event: StepEvent, *, model: str) -> None:
        """One engine step's times and the controller's latest K (the counts are the request's: observe_end)."""
        model = model or "unknown"
        with self._lock:
            if event.tokens:
                for phase, us in (
                    ("propose", event.propose_time_us),
                    ("score", event.score_time_us),
                    ("sample", event.sampler_time_us),
                ):
                    self.step_seconds.labels(model, phase).observe(us / 1e6)
                if event.stats.target_forwards == 1:
                    self.ttft.labels(model).observe(event.stats.elapsed_s)
            if event.stats.k:
                self.adaptive_k.labels(model).set(event.stats.k)
            if event.stats.predicted_speedup is not None:
                self.predicted_speedup.labels(model).set(event.stats.predicted_speedup)

    def observe_end(self, outcome: Outcome, *, model: str, source: str) -> None:
        """Count one finished request with what its client was told (the one source of both)."""
        model = model or "unknown"
        stats = outcome.stats
        with self._lock:
            self.requests.labels(model, outcome.finish_reason, source).inc()
            self.prompt_tokens.labels(model).inc(outcome.prompt_tokens)
            self.generation_tokens.labels(model).inc(outcome.completion_tokens)
            self.e2e.labels(model).observe(outcome.elapsed_s)
            if stats.drafted:
                self.num_drafts.labels(model).inc(stats.per_position_drafted[0])
                self.num_draft_tokens.labels(model).inc(stats.drafted)
                self.num_accepted_tokens.labels(model).inc(stats.accepted)
                self.num_tree_nodes.labels(model).inc(stats.tree_nodes_drafted)
                for position, accepted in enumerate(stats.per_position_accepted):
                    if accepted:
                        self.accepted_per_pos.labels(model, str(position)).inc(accepted)

    def observe(self, event: StepEvent, *, model: str, source: str, prompt_tokens: int) -> None:
        """A chat-window step; its last event (finished) also counts the request: there the engine's finish reason
        and token count are what the window shows."""
        self.observe_step(event, model=model)
        if event.finished:
            stats = event.stats
            outcome = Outcome(event.finish_reason or "stop", prompt_tokens, stats.emitted, stats.elapsed_s, stats)
            self.observe_end(outcome, model=model, source=source)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class QueueGauges:
    """num_requests_running / num_requests_waiting of the shared queue, labelled with the loaded pair's name."""

    def __init__(self, admission, model_name) -> None:
        self.admission, self.model_name = admission, model_name

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        name = self.model_name() or "unknown"
        for metric, doc, value in (
            ("num_requests_running", "Requests the engine is answering.", self.admission.running),
            ("num_requests_waiting", "Requests waiting in the FIFO queue.", self.admission.waiting),
        ):
            family = GaugeMetricFamily(PREFIX + metric, doc, labels=["model_name"])
            family.add_metric([name], value)
            yield family


def observer_for(recorder: MetricsRecorder | None):
    """The manager's hook: (event, model, prompt_tokens) -> None, counting chat-window answers; None without one."""
    if recorder is None:
        return None
    return lambda event, model, prompt_tokens: recorder.observe(
        event, model=model, source="chat", prompt_tokens=prompt_tokens
    )
