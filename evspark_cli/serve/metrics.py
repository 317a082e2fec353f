"""What `GET /metrics` shows, in Prometheus' text format (the standard client library), in a
registry of the server's own so that several servers in one process keep separate counts."""
from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..decode.prefill import PromptCache

TOKENS_PER_S_WINDOW = 10.0
"""Seconds over which the tokens/s gauge averages the tokens the rounds emitted."""


class ServerMetrics:
    """The server's counters, gauges and histograms (names prefixed `evspark_`)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("evspark_requests", "HTTP requests answered, by endpoint and "
                                "status", ["endpoint", "status"], registry=r)
        self.rejected = Counter("evspark_rejected_requests", "Requests refused before they "
                                "were queued, by reason", ["reason"], registry=r)
        self.cancelled = Counter("evspark_cancelled_sequences", "Sequences dropped because "
                                 "their client went away", registry=r)
        self.queue_depth = Gauge("evspark_queue_depth", "Sequences waiting for a row",
                                 registry=r)
        self.rows_busy = Gauge("evspark_rows_busy", "Rows decoding now", registry=r)
        self.tokens = Counter("evspark_generated_tokens", "Tokens the rounds emitted",
                              registry=r)
        self.rounds = Counter("evspark_rounds", "Decoding rounds run", registry=r)
        self.tokens_per_s = Gauge("evspark_tokens_per_second", "Tokens emitted per second "
                                  f"over the last {TOKENS_PER_S_WINDOW:g} s", registry=r)
        self.tokens_per_s.set_function(self._rate)
        self.tau = Histogram("evspark_tau", "Committed tokens per round of each finished "
                             "sequence", buckets=(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 16, 24,
                                                  32), registry=r)
        self.prefill_seconds = Histogram("evspark_prefill_seconds", "Seconds of each new "
                                         "row's prefill (0 for a sample forked from it)",
                                         registry=r)
        self._cache_collector: _PromptCacheCollector | None = None
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    def watch_prompt_cache(self, cache: PromptCache) -> None:
        """Report the prompt cache's hits, misses, entries and bytes (read at each scrape; a
        later engine's cache replaces an earlier one's)."""
        if self._cache_collector is not None:
            self.registry.unregister(self._cache_collector)
        self._cache_collector = _PromptCacheCollector(cache)
        self.registry.register(self._cache_collector)

    def note_tokens(self, n: int) -> None:
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, n))
            self._trim(now)

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - TOKENS_PER_S_WINDOW:
            self._recent.popleft()

    def _rate(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._trim(now)
            return sum(n for _, n in self._recent) / TOKENS_PER_S_WINDOW

    def text(self) -> bytes:
        return generate_latest(self.registry)


class _PromptCacheCollector:
    """The prompt cache's counts, read when /metrics is scraped (the cache counts them)."""

    def __init__(self, cache: PromptCache) -> None:
        self.cache = cache

    def describe(self) -> list:
        return []  # read at scrape time only: nothing to check at registration

    def collect(self):  # noqa: ANN201 - prometheus_client's collector protocol
        c = self.cache
        hits = CounterMetricFamily("evspark_prompt_cache_hits", "Prompts whose prefill was "
                                   "taken from the prompt cache")
        hits.add_metric([], c.hits)
        misses = CounterMetricFamily("evspark_prompt_cache_misses", "Prompts prefilled because "
                                     "the prompt cache did not hold them")
        misses.add_metric([], c.misses)
        yield hits
        yield misses
        yield GaugeMetricFamily("evspark_prompt_cache_bytes", "Bytes the prompt cache holds",
                                value=c.bytes)
        yield GaugeMetricFamily("evspark_prompt_cache_entries", "Prompts the prompt cache "
                                "holds", value=len(c))
