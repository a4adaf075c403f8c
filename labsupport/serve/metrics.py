"""`GET /metrics`: the server's figures for Prometheus, with its standard client library.

Introduced in notebook 09 (serving over HTTP). What a dashboard of an inference server
plots, named as vLLM names its own (prefix ``labsupport:``):

    requests_total{endpoint}            requests answered or refused after validation, per route
    prompt_tokens_total                 prompt tokens of the requests handed to the engine
    generation_tokens_total             tokens the engine generated for clients
    num_requests_running / _waiting     sequences in the batch / in the queue (read at scrape time)
    kv_cache_blocks_used / _total       paged-cache blocks held by sequences, and the pool's size
    prefix_cache_hit_tokens             prompt positions admissions found in the prefix cache, in all
    time_to_first_token_seconds         histogram: from the request's arrival to its first token
    inter_token_latency_seconds         histogram: between two tokens of one choice

Each app has its own registry (`prometheus_client.CollectorRegistry`), so several servers in
one process (tests, a notebook) never share counts. The gauges read the engine's queue
lengths from the web server's thread: a length read between two steps may be one step old,
which a scrape every few seconds cannot tell.
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.responses import Response

PREFIX = "labsupport:"
LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class Metrics:
    """The counters, gauges and histograms of one server. Notebook 09 (serving over HTTP)."""

    def __init__(self, engine):
        self.registry = registry = CollectorRegistry()
        self.requests = Counter(PREFIX + "requests", "Requests past validation, per endpoint.", ["endpoint"],
                                registry=registry)
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens handed to the engine.",
                                     registry=registry)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated for clients.",
                                         registry=registry)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first token.",
                              buckets=LATENCY_BUCKETS, registry=registry)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Between two tokens of one choice.",
                             buckets=LATENCY_BUCKETS, registry=registry)
        gauges = {"num_requests_running": ("Sequences in the batch.", lambda: len(engine.scheduler.running)),
                  "num_requests_waiting": ("Sequences in the queue.", lambda: len(engine.scheduler.waiting)),
                  "kv_cache_blocks_used": ("Paged-cache blocks held.", lambda: engine.blocks.num_used),
                  "kv_cache_blocks_total": ("Paged-cache blocks in the pool.", lambda: engine.blocks.num_blocks),
                  "prefix_cache_hit_tokens": ("Prompt positions found in the prefix cache.",
                                              lambda: engine.prefix_hit_tokens)}
        for name, (doc, read) in gauges.items():
            Gauge(PREFIX + name, doc, registry=registry).set_function(read)

    def token(self, previous: float | None, arrival: float, now: float) -> None:
        """One token reached its client at `now` (time.perf_counter); previous: the choice's
        last token's time, or None for its first (then the wait since `arrival` is the TTFT)."""
        self.generation_tokens.inc()
        if previous is None:
            self.ttft.observe(now - arrival)
        else:
            self.itl.observe(now - previous)

    def response(self) -> Response:
        """The text exposition format Prometheus scrapes."""
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)
