"""The server's decoder loop: every client's jobs in the running batches, one round at a time.

One thread owns the model. Requests put their jobs (records x samples, built by the one job
builder, so a job decodes exactly as `evspark generate` decodes it) in the queue of the *lane*
of their decoding settings: the rows of a batch share one sampler, drafter and draft length, so
requests that ask for different ones decode in different batches, interleaved round by round.
Between rounds each lane's decoder takes queued jobs into its free slots (`BatchDecoder.step`:
a new request joins the running batch, it does not wait for it to drain), its finished jobs go
back to their requests, and the rows of a request whose client went away are dropped.

A row's tokens do not depend on the rows beside it (decode/batch.py), so a request's output is
what a local run of the same prompt, seed and settings writes, whatever else is being served.

The thread that loads the model should be the one that decodes (`run`; the server does so):
torch's OpenMP runtime keeps a team of worker threads per calling thread for as long as that
thread lives, and once two teams exist on a machine with as many cores as one team, libgomp
stops spinning between parallel regions and every small op of a round pays a wake-up (measured
on 2 cores: the same batched run took 1.8x as long on a second thread as on the loading one).
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..decode.batch import BatchDecoder
from ..decode.drafters.base import Drafter
from ..decode.jobs import Job, Outcome, RoundReport
from ..decode.prefill import PromptCache
from ..defaults import PROMPT_CACHE_MB
from ..errors import InputError
from ..generation.jobs import Record, build_jobs
from ..generation.options import DecodeOptions, check_context, check_gamma
from ..model.memory import available_bytes, gib, run_memory
from ..model.model import StripedHyena
from .metrics import ServerMetrics


class Busy(Exception):
    """The queue is full: the client should retry later (HTTP 429 with Retry-After)."""


class TooLarge(InputError):
    """A request no batch of this server can hold (HTTP 413)."""


@dataclass(frozen=True)
class Lane:
    """The settings the rows of one batch share."""

    drafter: str
    gamma: int
    temperature: float
    top_k: int
    top_p: float
    rule: str
    rollback: str
    draft_length: str
    alphabet: str
    tree_rows: int = 0

    @classmethod
    def of(cls, drafter: str, o: DecodeOptions) -> Lane:
        return cls(drafter, o.gamma, o.temperature, o.top_k, o.top_p, o.rule, o.rollback,
                   o.draft_length, o.alphabet, o.tree_rows)


@dataclass(eq=False)
class Ticket:
    """One request's jobs and the events its handler waits on (posted from the loop thread
    into the handler's event loop)."""

    jobs: list[Job]
    options: DecodeOptions
    drafter: str
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    started: float | None = None  # when its first job took a row
    checked: float = field(default_factory=time.monotonic)  # when its client was last seen

    def post(self, *event: Any) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self) -> None:
        """The client went away: its rows leave at the next round, its queued jobs never run."""
        self.cancelled.set()


class _Queue:
    """A lane's queued jobs: the decoder's job source (`JobSource`), filled by request threads."""

    def __init__(self, lock: threading.Lock) -> None:
        self.jobs: deque[Job] = deque()
        self.lock = lock

    def peek(self) -> Job | None:
        with self.lock:
            return self.jobs[0] if self.jobs else None

    def next(self) -> Job:
        with self.lock:
            return self.jobs.popleft()


@dataclass
class _LaneRun:
    decoder: BatchDecoder
    queue: _Queue
    sent: dict[int, int] = field(default_factory=dict)  # job index -> tokens streamed so far


class Engine:
    """The loaded model and drafter, the lanes and the thread that decodes them."""

    def __init__(self, model: StripedHyena, drafter: Drafter | None, drafter_name: str,
                 batch_size: int, max_queue: int, metrics: ServerMetrics | None = None,
                 extra_drafters: dict[str, Drafter | None] | None = None,
                 prompt_cache_bytes: int = PROMPT_CACHE_MB << 20) -> None:
        self.model, self.batch_size, self.max_queue = model, batch_size, max_queue
        # every lane's decoder takes prefills from it: a prompt sent again (another sample,
        # another shard) is prefilled once while it stays in the cache
        self.prompt_cache = PromptCache(prompt_cache_bytes)
        self.drafters: dict[str, Drafter | None] = {drafter_name: drafter, "none": None}
        self.drafters.update(extra_drafters or {})
        self.default_drafter = drafter_name
        self.metrics = metrics or ServerMetrics()
        self.metrics.watch_prompt_cache(self.prompt_cache)
        self._lock = threading.Lock()  # the queues, the tickets and the lanes
        self._wake = threading.Condition(self._lock)
        self._lanes: dict[Lane, _LaneRun] = {}
        self._tickets: dict[int, Ticket] = {}  # job index -> its request
        self._index = itertools.count()
        self._side: deque[Callable[[], None]] = deque()  # work run between rounds
        self._stop = False
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ requests
    def run(self) -> None:
        """Decode on this thread until `stop` (best the thread that loaded the model: see the
        module docstring)."""
        self._thread = threading.current_thread()
        self._loop()

    def start(self) -> None:
        """Decode on a new thread (`run` there)."""
        threading.Thread(target=self.run, name="evspark-decoder", daemon=True).start()

    def submit(self, records: Sequence[Record], options: DecodeOptions, drafter: str | None,
               loop: asyncio.AbstractEventLoop, samples: Sequence[Sequence[int]] | None = None
               ) -> Ticket:
        """Queue a request's jobs (every sample of every record, or the sample indices in
        `samples`, one list per record). Refused with InputError (a bad setting), TooLarge
        (a request no batch can hold) or Busy (the queue is full) before anything is queued."""
        name = self.default_drafter if drafter is None else drafter
        if name not in self.drafters:
            raise InputError(f"drafter {name!r} is not served here (served: "
                             f"{', '.join(sorted(self.drafters))})")
        d = self.drafters[name]
        check_gamma(d, options.largest_draft)
        for r in records:
            check_context(self.model.config, len(r.tokens), options.max_new_tokens, r.id)
        jobs: list[Job] = []
        for k, r in enumerate(records):
            which = range(options.samples) if samples is None else samples[k]
            jobs += build_jobs([r], options, samples=which)
        if not jobs:
            raise InputError("the request asks for no sequences")
        if len(jobs) > self.max_queue:
            raise TooLarge(f"the request asks for {len(jobs)} sequences; this server queues at "
                           f"most {self.max_queue}: split it")
        self._check_memory(jobs, options, d is not None)
        with self._lock:
            if self._waiting() + len(jobs) > self.max_queue:
                self.metrics.rejected.labels("queue_full").inc()
                raise Busy(f"the queue is full ({self.max_queue} sequences waiting)")
            ticket = Ticket([], options, name, loop)
            lane = Lane.of(name, options)
            run = self._lanes.get(lane)
            if run is None:
                run = self._lanes[lane] = _LaneRun(self._decoder(d, options), _Queue(self._lock))
            for j in jobs:  # server-wide job indices: a job's rng key is its own
                job = Job(next(self._index), j.prompt, j.max_new_tokens, j.rng, j.label,
                          j.record, j.sample)
                ticket.jobs.append(job)
                self._tickets[job.index] = ticket
                run.queue.jobs.append(job)
            self.metrics.queue_depth.set(self._waiting())
            self._wake.notify()
        return ticket

    def call_between_rounds(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the decoder thread between two rounds (it owns the model)."""
        with self._lock:
            self._side.append(fn)
            self._wake.notify()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop after the round in progress (requests still queued are abandoned)."""
        with self._lock:
            self._stop = True
            self._wake.notify()
        t = self._thread
        if t is not None and t is not threading.current_thread() and t.is_alive():
            t.join(timeout)

    @property
    def busy_rows(self) -> int:
        return sum(len(r.decoder.rows) for r in list(self._lanes.values()))

    def _waiting(self) -> int:
        return sum(len(r.queue.jobs) for r in self._lanes.values())

    def _decoder(self, drafter: Drafter | None, options: DecodeOptions) -> BatchDecoder:
        return BatchDecoder(self.model, options.sampler, drafter,
                            options.gamma if drafter is not None else 0, self.batch_size,
                            options.rollback, adaptive=options.adaptive, on_round=self._round,
                            tree_rows=options.tree_rows, prompt_cache=self.prompt_cache)

    def _check_memory(self, jobs: Sequence[Job], options: DecodeOptions, spec: bool) -> None:
        """Refuse a request whose rows alone (a batch of them, at most `batch_size`) would not
        fit in the memory the machine has left now, so a large request never runs the server
        out of memory."""
        room = available_bytes(self.model.device)
        if room is None:
            return
        rows = min(len(jobs), self.batch_size)
        needs = [options.row_capacity(len(j.prompt), spec) + 1 for j in jobs][:rows]
        weights = next(self.model.parameters()).dtype
        est = run_memory(self.model.config, weights, weights, max(needs), options.block(spec),
                         rows, with_parameters=False,
                         needs=None if self.model.device.type != "cpu" else needs,
                         chunk=self.model.prefill_chunk())
        need = est.total(rows)
        if need > room:
            self.metrics.rejected.labels("memory").inc()
            raise TooLarge(f"the request's rows need about {gib(need)} of memory, "
                           f"{gib(room)} is left: ask for fewer or shorter sequences")

    # ------------------------------------------------------------------ the loop
    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            with self._lock:
                while not self._stop and not self._side and not any(
                        r.decoder.rows or r.queue.jobs for r in self._lanes.values()):
                    self._wake.wait()
                if self._stop:
                    return
                side = list(self._side)
                self._side.clear()
                lanes = list(self._lanes.items())
            for fn in side:
                fn()
            self._drop_cancelled([run for _, run in lanes])
            for lane, run in lanes:
                self._step(lane, run)
            self.metrics.rows_busy.set(self.busy_rows)
            with self._lock:
                self.metrics.queue_depth.set(self._waiting())

    def _step(self, lane: Lane, run: _LaneRun) -> None:
        before = {j.index for j, _ in run.decoder.live()}
        try:
            outcomes = run.decoder.step(run.queue)
        except Exception as exc:  # noqa: BLE001 - a broken batch fails its rows, not the loop
            self._fail_lane(lane, run, exc)
            return
        now = time.perf_counter()
        for job, res in run.decoder.live():
            t = self._tickets.get(job.index)
            if t is None:
                continue
            if job.index not in before:
                self.metrics.prefill_seconds.observe(res.prefill_s)
                if t.started is None:
                    t.started = now
            sent = run.sent.get(job.index, 0)
            if len(res.tokens) > sent:
                t.post("tokens", job, res.tokens[sent:])
                run.sent[job.index] = len(res.tokens)
        for o in outcomes or []:
            self._finish(run, o)
        if outcomes is None:
            with self._lock:
                if not run.decoder.rows and not run.queue.jobs:
                    self._lanes.pop(lane, None)

    def _finish(self, run: _LaneRun, o: Outcome) -> None:
        sent = run.sent.pop(o.job.index, 0)
        with self._lock:
            t = self._tickets.pop(o.job.index, None)
        if t is None:
            return
        if o.result is not None:
            if len(o.result.tokens) > sent:
                t.post("tokens", o.job, o.result.tokens[sent:])
            if o.result.tau is not None:
                self.metrics.tau.observe(o.result.tau)
        t.post("done", o)

    def _fail_lane(self, lane: Lane, run: _LaneRun, exc: Exception) -> None:
        jobs = [j for j, _ in run.decoder.live()]
        with self._lock:
            jobs += list(run.queue.jobs)
            run.queue.jobs.clear()
            self._lanes.pop(lane, None)
        for j in jobs:
            self._finish(run, Outcome(j, error=exc))

    def _drop_cancelled(self, runs: Sequence[_LaneRun]) -> None:
        """The jobs of requests whose client went away leave the queues and the batches."""
        with self._lock:
            gone = {i for i, t in self._tickets.items() if t.cancelled.is_set()}
            if not gone:
                return
            for run in runs:
                run.queue.jobs = deque(j for j in run.queue.jobs if j.index not in gone)
            for i in gone:
                self._tickets.pop(i)
        self.metrics.cancelled.inc(len(gone))
        for run in runs:
            run.decoder.drop(gone)
            for i in gone:
                run.sent.pop(i, None)

    def _round(self, report: RoundReport) -> None:
        self.metrics.tokens.inc(report.tokens)
        self.metrics.rounds.inc()
        self.metrics.note_tokens(report.tokens)
