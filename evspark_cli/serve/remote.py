"""`evspark generate --server URL`: a generate run whose decoding happens on a running
`evspark serve`, so the shards of a pipeline share one loaded model.

It takes the place of `GenerationRun` in the command (the same `passes`, `outcomes`, `unsent`
and `summary`), so the writer, `.partial` files, `--resume` and exit codes are the local run's.
Each record's jobs still to decode go as one streamed `POST /v1/generate` (split when the
server queues fewer sequences), keyed as the local run keys them, so the server writes the
tokens a local run writes. Requests are sent a window at a time (twice the server's batch, as
many sequences in flight), worker threads doing the HTTP and the run's own thread everything
else: the progress display, the outcomes in input order. A server that is busy (429) or still
loading (503) is waited for; a lost connection fails the run, its finished records kept.
"""
from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..decode.jobs import Job, RoundReport
from ..errors import RunError, ServerLost, SettingError
from ..generation.options import DecodeOptions, check_context
from ..generation.results import GenerateOutput, JobOutcome
from ..generation.run import Pass, RunObserver, RunSummary
from ..io.types import Prompt
from ..model.config import ModelConfig
from .client import Client, ServerError

WAIT_BUSY_S = 600.0
"""How long one request waits, retrying, for a server that keeps answering 429 or 503."""
RETRY_S = 2.0
"""The wait between retries when the server does not say (Retry-After)."""


@dataclass
class RemoteRun:
    """A generate run decoded by the server `client` talks to (see the module docstring).
    `drafter`: the drafter name to ask for (None: the server's own); `info`: the server's
    `GET /v1/models` entry."""

    client: Client
    info: dict[str, Any]
    options: DecodeOptions
    drafter: str | None = None
    observer: RunObserver | None = None
    summary: RunSummary = field(default_factory=RunSummary)
    waiting: dict[int, JobOutcome] = field(default_factory=dict)
    batch_size: int = field(init=False)

    def __post_init__(self) -> None:
        self.batch_size = int(self.info.get("batch_size") or 1)

    @property
    def config(self) -> ModelConfig:
        return ModelConfig.from_dict(self.info["config"])

    @property
    def drafter_label(self) -> str:
        return self.drafter if self.drafter is not None else str(self.info["drafter"])

    def plan(self, jobs: Sequence[Job], batch_size: int | None, max_memory: str | None) -> None:
        """Nothing to plan: the server's batch decodes, and it refuses what does not fit."""

    def lowered_from(self, jobs: Sequence[Job]) -> int | None:
        return None

    def passes(self, jobs: Sequence[Job]) -> list[Pass]:
        return [Pass(tuple(jobs), native=False)] if jobs else []

    def unsent(self) -> list[JobOutcome]:
        """Finished outcomes not handed back yet (an earlier job was still decoding)."""
        out = [self.waiting[k] for k in sorted(self.waiting)]
        self.waiting = {}
        return out

    def outcomes(self, jobs: Sequence[Job]) -> Iterator[JobOutcome]:
        """Every job's outcome, in the order of `jobs`."""
        self.summary.batch_size = self.batch_size
        self.waiting = {}
        if not jobs:
            return
        p = self.passes(jobs)[0]
        if self.observer is not None:
            self.observer.pass_started(p)
        place = {(j.record, j.sample): k for k, j in enumerate(jobs)}
        requests = self._requests(jobs)
        window = max(self.batch_size * 2, max(len(r) for r in requests))
        events: queue.Queue[tuple[str, Any]] = queue.Queue()
        stop = threading.Event()
        pool = ThreadPoolExecutor(max(1, min(len(requests), window)),
                                  thread_name_prefix="evspark-client")
        sent, in_flight, next_place = 0, 0, 0
        t0 = last = time.monotonic()
        try:
            while next_place < len(jobs):
                while sent < len(requests) and in_flight + len(requests[sent]) <= window:
                    pool.submit(self._send, requests[sent], events, stop)
                    in_flight += len(requests[sent])
                    sent += 1
                kind, data = events.get()
                if kind == "error":
                    raise data
                if kind == "end":
                    in_flight -= data
                elif kind == "tokens":
                    now = time.monotonic()
                    n = len(data["tokens"])
                    if self.observer is not None and n:
                        self.observer.round_done(RoundReport(n, 1, n - 1, 0, now - last), p)
                    last = now
                else:  # an output
                    k = place[(data["record"], data["sample"])]
                    self.waiting[k] = self._outcome(jobs[k], data)
                    while next_place in self.waiting:
                        yield self.waiting.pop(next_place)
                        next_place += 1
        finally:
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            self.summary.seconds += time.monotonic() - t0

    def _requests(self, jobs: Sequence[Job]) -> list[list[Job]]:
        """The jobs in requests: a record's consecutive jobs together (one prefill on the
        server), at most the server's queue (`max_queue`) sequences each."""
        cap = max(1, int(self.info.get("max_queue") or len(jobs)))
        out: list[list[Job]] = []
        for j in jobs:
            last = out[-1] if out else None
            if last is not None and last[0].record == j.record and len(last) < cap:
                last.append(j)
            else:
                out.append([j])
        return out

    def _body(self, jobs: list[Job]) -> dict[str, Any]:
        """A request for `jobs` (all of one record): its token ids, its random-number key and
        the samples, with the run's settings."""
        o, s = self.options, self.options.sampler
        first = jobs[0]
        record = {"id": first.record, "sequence": list(first.prompt), "key": first.rng.record,
                  "samples": [j.sample for j in jobs]}
        body: dict[str, Any] = {
            "records": [record], "samples": o.samples, "max_new_tokens": o.max_new_tokens,
            "gamma": o.gamma, "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p,
            "seed": o.seed, "rule": s.rule, "rollback": o.rollback,
            "draft_length": o.draft_length, "alphabet": s.alphabet, "tree_rows": o.tree_rows}
        if self.drafter is not None:
            body["drafter"] = self.drafter
        return body

    def _send(self, jobs: list[Job], events: queue.Queue, stop: threading.Event) -> None:
        """One request on a worker thread: its events to the run's thread, then ("end", the
        request's sequences), or ("error", what ended it)."""
        body = self._body(jobs)
        waited = 0.0
        try:
            while not stop.is_set():
                try:
                    answered = 0
                    for event, data in self.client.stream(body):
                        if stop.is_set():
                            return
                        if event in ("tokens", "output"):
                            events.put((event, data))
                            answered += event == "output"
                    if answered < len(jobs):
                        raise ServerError(f"the stream ended after {answered} of {len(jobs)} "
                                          "sequences")
                    events.put(("end", len(jobs)))
                    return
                except ServerError as e:
                    if e.status not in (429, 503) or waited >= WAIT_BUSY_S:
                        raise
                    pause = e.retry_after or RETRY_S
                    waited += pause
                    stop.wait(pause)
        except Exception as e:  # noqa: BLE001 - handed to the run's thread, which raises it
            if not stop.is_set():
                events.put(("error", _lost(e)))

    def _outcome(self, job: Job, data: dict[str, Any]) -> JobOutcome:
        """A job's outcome from its `output` event, counted in the summary."""
        s = self.summary
        s.jobs += 1
        if data.get("error") is not None:
            s.failed += 1
            return JobOutcome(job, error=RunError(str(data["error"])))
        stats = data["stats"]
        tokens = data["tokens"]
        s.tokens += len(tokens)
        rounds = stats.get("rounds") or 0
        s.rounds += rounds
        if rounds and stats.get("tau"):
            s.accepted += round((stats["tau"] - 1.0) * rounds)
        s.decode_seconds += stats.get("decode_s") or 0.0
        s.prefill_seconds += stats.get("prefill_s") or 0.0
        return JobOutcome(job, GenerateOutput(tokens, data["sequence"], stats))


def _lost(e: Exception) -> Exception:
    """What a failed request ends the run with: the server's refusal as it is, anything else a
    ServerLost saying the server went away."""
    if isinstance(e, ServerError) and e.status is None:
        return ServerLost(f"lost the connection to the server ({e})")
    return e


def remote_run(client: Client, info: dict[str, Any], prompts: Sequence[Prompt],
               options: DecodeOptions, drafter: str) -> tuple[RemoteRun, str]:
    """A run on the server `info` describes, and its model's name: the drafter asked for must
    be one it serves (`auto`: its own), and every prompt must fit its model's context."""
    served = info.get("drafters", [])
    if drafter != "auto" and drafter not in served:
        raise SettingError("{0} " + f"{drafter!r}: the server serves {', '.join(served)} (a "
                           "drafter folder must be loaded by the server)", "drafter")
    config = ModelConfig.from_dict(info["config"])
    for p in prompts:
        check_context(config, len(p.seq), options.max_new_tokens, p.id)
    return RemoteRun(client, info, options, None if drafter == "auto" else drafter), \
        config.model_name
