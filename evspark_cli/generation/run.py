"""A generation run: jobs through the batched decoder, outcomes back in input order.

The decoder packs jobs into at most `batch_size` rows (a record's samples share one prefill)
and finishes them in any order; the run hands each outcome back in the order of its jobs, with
its stats row. A batch size changes speed, not output: the same seed writes the same tokens with
any batch size (docs/batching.md says when a last-place float difference can change one).

With `compare_native`, each slice of jobs (one batch's worth) is decoded natively and
speculatively at once, with the same batch size, the two decoders taking turns of a few tens of
milliseconds (decode/interleave.py): every speedup is a ratio of two runs that saw the same
machine. A run of fewer than COMPARE_PAIRS slices repeats slices (timing only) until that many
pairs are timed.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..decode.batch import BatchDecoder, JobList
from ..decode.drafters.base import Drafter
from ..decode.drafters.registry import drafter_name
from ..decode.interleave import interleave, timed_run
from ..decode.jobs import DecodeResult, Job, Outcome, RoundReport
from ..model.config import ModelConfig
from ..model.model import StripedHyena
from ..model.tokenizer import detokenize
from .options import DecodeOptions, default_batch_size
from .plan import plan_batch
from .results import GenerateOutput, JobOutcome, make_stats, speedup

COMPARE_PAIRS = 3
"""compare_native times at least this many native/speculative pairs (repeating slices of a
small run), so that their spread shows whether the machine was quiet enough to trust the ratio."""
SPREAD_LIMIT = 0.2
"""A speedup is reported as unreliable when its pairs' ratios range over more than this fraction
of their median ((max - min) / median), e.g. 2.0x, 2.3x and 2.6x (30%)."""


@dataclass
class PairTiming:
    """One native pass and the speculative pass of the same jobs right after it."""

    native_s: float = 0.0
    native_tokens: int = 0
    spec_s: float = 0.0
    spec_tokens: int = 0

    @property
    def ratio(self) -> float | None:
        """Native seconds per token over speculative seconds per token (`results.speedup`)."""
        return speedup(self.native_s, self.native_tokens, self.spec_s, self.spec_tokens)


@dataclass
class RunSummary:
    """What a whole run did (the summary line and `bench`'s throughput)."""

    jobs: int = 0
    failed: int = 0
    tokens: int = 0
    rounds: int = 0
    accepted: int = 0
    seconds: float = 0.0  # the passes' whole time: prefills, rounds and the rows' comings
    decode_seconds: float = 0.0  # the rounds' time alone (the rows' `decode_s` added up)
    prefill_seconds: float = 0.0  # the prompts' prefills (the rows' `prefill_s` added up)
    native_seconds: float = 0.0
    native_tokens: int = 0
    batch_size: int = 1
    pairs: list[PairTiming] = field(default_factory=list)  # compare_native's timed pairs

    @property
    def tokens_per_s(self) -> float | None:
        """Decoding tokens/s: new tokens over the rounds' time, prefills left out (the same
        definition as the progress line's and each stats row's `tokens_per_s`)."""
        return self.tokens / self.decode_seconds if self.decode_seconds > 0 else None

    @property
    def tau(self) -> float | None:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else None

    @property
    def speedup(self) -> float | None:
        """Pooled over every timed pair (repeats included): native seconds per token over
        speculative seconds per token."""
        timed = [p for p in self.pairs if p.ratio is not None]
        if timed:
            return speedup(sum(p.native_s for p in timed), sum(p.native_tokens for p in timed),
                           sum(p.spec_s for p in timed), sum(p.spec_tokens for p in timed))
        return speedup(self.native_seconds, self.native_tokens, self.seconds, self.tokens)

    @property
    def ratios(self) -> list[float]:
        """Each timed pair's speedup, in the order they ran."""
        return [r for r in (p.ratio for p in self.pairs) if r is not None]

    @property
    def spread(self) -> float | None:
        """(max - min) / median of the pairs' speedups; None with fewer than two."""
        r = sorted(self.ratios)
        if len(r) < 2:
            return None
        mid = len(r) // 2
        median = r[mid] if len(r) % 2 else (r[mid - 1] + r[mid]) / 2
        return (r[-1] - r[0]) / median

    @property
    def speedup_reliable(self) -> bool:
        """At least COMPARE_PAIRS pairs whose speedups agree within SPREAD_LIMIT."""
        spread = self.spread
        return len(self.ratios) >= COMPARE_PAIRS and spread is not None and spread <= SPREAD_LIMIT


@dataclass(frozen=True)
class Pass:
    """One decoding pass over a slice of a run's jobs, natively or speculatively. With
    compare_native a slice is decoded natively then speculatively (one timed pair); a
    `timing_only` pass repeats a slice for the timing alone (its outcomes are dropped)."""

    jobs: tuple[Job, ...]
    native: bool
    pair: int = 0
    timing_only: bool = False

    @property
    def tokens(self) -> int:
        return sum(j.max_new_tokens for j in self.jobs)


class RunObserver(Protocol):
    """What a progress display is told while a run goes (all calls come from the run's thread)."""

    def pass_started(self, p: Pass) -> None:
        """A pass begins (its jobs' prompts are prefilled as rows free up), or takes its turn
        again: with compare_native a native pass and its speculative twin run in turns, and
        this is told at every turn."""

    def job_started(self, job: Job, p: Pass) -> None:
        """The decoder took `job`: its prompt is prefilled (or forked from its record's
        prefill) before the next round."""

    def round_done(self, report: RoundReport, p: Pass) -> None:
        """A round of `p` ended, having emitted `report.tokens` tokens."""

    def prefill_progress(self, job: Job, done: int, total: int, p: Pass) -> None:
        """`job`'s prompt (`total` bases) is being prefilled: `done` of them so far, told when it
        starts (0), between its chunks, and when it ends (`total`). A record's other samples
        share that prefill and tell nothing."""


class DecodingRun(Protocol):
    """What `evspark generate` drives: this module's run on the model loaded here, or
    serve/remote.py's on a server. Outcomes come back in input order."""

    summary: RunSummary
    observer: RunObserver | None
    batch_size: int

    @property
    def config(self) -> ModelConfig:
        """The model's config (its vocabulary and context)."""

    @property
    def drafter_label(self) -> str:
        """The drafter's name as outputs record it (`none`: native decoding)."""

    def plan(self, jobs: Sequence[Job], batch_size: int | None, max_memory: str | None) -> None:
        """Choose the batch size for `jobs` (refused when it cannot fit), before any output is
        opened."""

    def lowered_from(self, jobs: Sequence[Job]) -> int | None:
        """The default batch size `plan` lowered to fit in memory, or None."""

    def passes(self, jobs: Sequence[Job]) -> list[Pass]:
        """The passes `outcomes(jobs)` makes (a progress display sizes its work from them)."""

    def outcomes(self, jobs: Sequence[Job]) -> Iterator[JobOutcome]:
        """Every job's outcome, in the order of `jobs`."""

    def unsent(self) -> list[JobOutcome]:
        """Outcomes finished but not handed back when the run stopped early, in input order."""


@dataclass
class GenerationRun:
    """Jobs through the batched decoder, outcomes in input order (see the module docstring)."""

    model: StripedHyena
    drafter: Drafter | None
    options: DecodeOptions
    batch_size: int = 1
    compare_native: bool = False
    on_round: Callable[[RoundReport], None] | None = None
    summary: RunSummary = field(default_factory=RunSummary)
    observer: RunObserver | None = None
    waiting: dict[int, JobOutcome] = field(default_factory=dict)
    """Outcomes that finished before an earlier job: handed back when their turn comes, or by
    `unsent` when the run stops early."""

    @property
    def config(self) -> ModelConfig:
        return self.model.config

    @property
    def drafter_label(self) -> str:
        return drafter_name(self.drafter)

    def plan(self, jobs: Sequence[Job], batch_size: int | None, max_memory: str | None) -> None:
        """The batch size for `jobs`: `batch_size` or the device's default, one whose state
        fits in memory (plan.plan_batch)."""
        paired = self.compare_native and self.drafter is not None
        self.batch_size = plan_batch(self.model, jobs, self.options, self.drafter, batch_size,
                                     max_memory, decoders=2 if paired else 1)

    def lowered_from(self, jobs: Sequence[Job]) -> int | None:
        wanted = min(default_batch_size(self.model.device), len(jobs))
        return wanted if self.batch_size < wanted else None

    def passes(self, jobs: Sequence[Job]) -> list[Pass]:
        """The passes `outcomes(jobs)` makes, in order (a progress display sizes its work from
        them)."""
        if not jobs:
            return []
        if not (self.compare_native and self.drafter is not None):
            return [Pass(tuple(jobs), native=False)]
        n = self.batch_size
        slices = [tuple(jobs[i: i + n]) for i in range(0, len(jobs), n)]
        out: list[Pass] = []
        for k, part in enumerate(slices):
            out += [Pass(part, True, k), Pass(part, False, k)]
        for r in range(max(0, COMPARE_PAIRS - len(slices))):
            part = slices[r % len(slices)]
            k = len(slices) + r
            out += [Pass(part, True, k, True), Pass(part, False, k, True)]
        return out

    def outcomes(self, jobs: Sequence[Job]) -> Iterator[JobOutcome]:
        """Every job's outcome, in the order of `jobs` (finished rows wait for earlier ones in
        `waiting`)."""
        self.summary.batch_size = self.batch_size
        self.waiting = {}
        order = {j.index: k for k, j in enumerate(jobs)}
        next_place = 0
        todo = iter(self.passes(jobs))
        for p in todo:
            if p.native:  # compare_native: the slice natively and speculatively, in turns
                twin = next(todo)
                self.summary.pairs.append(PairTiming())
                done: Iterable[JobOutcome] = self._pair(p, twin)
                p = twin
            else:
                if self.observer is not None:
                    self.observer.pass_started(p)
                done = self._decode(p)
            for o in done:
                if p.timing_only:
                    continue
                self.waiting[order[o.job.index]] = o
                while next_place in self.waiting:
                    yield self.waiting.pop(next_place)
                    next_place += 1

    def unsent(self) -> list[JobOutcome]:
        """The outcomes a stopped run finished but had not handed back, in input order (they
        were waiting for an earlier job)."""
        out = [self.waiting[k] for k in sorted(self.waiting)]
        self.waiting = {}
        return out

    def _feed(self, p: Pass) -> Iterator[Job]:
        """The pass's jobs for the decoder, telling the observer as it takes each one (the
        decoder pulls a job only when it starts it)."""
        for j in p.jobs:
            if self.observer is not None:
                self.observer.job_started(j, p)
            yield j

    def _rounds(self, p: Pass, user: Callable[[RoundReport], None] | None
                ) -> Callable[[RoundReport], None] | None:
        """The decoder's round hook: the observer's, then `user`'s (the API's on_round)."""
        observer = self.observer
        if observer is None:
            return user

        def hook(report: RoundReport) -> None:
            observer.round_done(report, p)
            if user is not None:
                user(report)

        return hook

    def _prefills(self, p: Pass) -> Callable[[Job, int, int], None] | None:
        """The decoder's prefill hook: the observer's, told which pass it is in."""
        observer = self.observer
        if observer is None:
            return None

        def hook(job: Job, done: int, total: int) -> None:
            observer.prefill_progress(job, done, total, p)

        return hook

    def _decoder(self, p: Pass, drafter: Drafter | None, clock: Callable[[], float]
                 ) -> BatchDecoder:
        """The decoder of a pass: natively (no drafter) or with `drafter`, at the run's batch
        size; `clock` its own time (interleave.py)."""
        opts = self.options
        # the drafts a round can use (not a --gamma past the tokens asked: the schedule's
        # cost table and calibration are sized by it)
        if drafter is None:
            return BatchDecoder(self.model, opts.sampler, None, 0, self.batch_size,
                                on_round=self._rounds(p, None), on_prefill=self._prefills(p),
                                clock=clock)
        return BatchDecoder(self.model, opts.sampler, drafter, opts.largest_draft,
                            self.batch_size, opts.rollback, adaptive=opts.adaptive,
                            on_round=self._rounds(p, None if p.timing_only else self.on_round),
                            capacity=opts.row_capacity(max(len(j.prompt) for j in p.jobs)),
                            on_prefill=self._prefills(p), tree_rows=opts.tree_rows, clock=clock)

    def _pair(self, nat: Pass, spec: Pass) -> list[JobOutcome]:
        """A slice decoded natively and speculatively at once, in turns (interleave.py): the
        speculative pass's outcomes, each stats row carrying the pair's speedup."""
        assert self.drafter is not None
        passes = (nat, spec)
        runs = [timed_run(lambda c, p=p, d=d: self._decoder(p, d, c), JobList(self._feed(p)))
                for p, d in ((nat, None), (spec, self.drafter))]

        def on_turn(i: int) -> None:
            if self.observer is not None:
                self.observer.pass_started(passes[i])

        interleave(runs, on_turn=on_turn)
        native = {o.job.index: o.result for o in runs[0].outcomes if o.result is not None}
        pair = self.summary.pairs[nat.pair]
        pair.native_s = runs[0].seconds
        pair.native_tokens = sum(len(r.tokens) for r in native.values())
        if not nat.timing_only:
            self.summary.native_seconds += pair.native_s
            self.summary.native_tokens += pair.native_tokens
        # a timing-only repeat counts in its pair, not in the run's totals
        summary = self.summary if not spec.timing_only else RunSummary()
        for o in runs[1].outcomes:
            pair.spec_tokens += _count(summary, o)
        summary.seconds += runs[1].seconds
        pair.spec_s = runs[1].seconds
        return [self._outcome(o.job, o.result, o.error, self.drafter, native.get(o.job.index),
                              pair.ratio) for o in runs[1].outcomes]

    def _decode(self, p: Pass) -> Iterator[JobOutcome]:
        """The pass decoded (with the run's drafter, or natively without one), its outcomes as
        the decoder finishes them; its decoding time (not the caller's time between them)
        counted in the summary."""
        dec = self._decoder(p, self.drafter, time.perf_counter)
        away = 0.0
        t0 = time.perf_counter()
        try:
            for o in dec.run(self._feed(p)):
                _count(self.summary, o)
                t_out = time.perf_counter()
                yield self._outcome(o.job, o.result, o.error, self.drafter, None, None)
                away += time.perf_counter() - t_out
        finally:  # decoding only, not the caller's writes
            self.summary.seconds += time.perf_counter() - t0 - away

    def _outcome(self, job: Job, res: DecodeResult | None, error: Exception | None,
                 drafter: Drafter | None, nat: DecodeResult | None,
                 ratio: float | None) -> JobOutcome:
        if res is None:
            return JobOutcome(job, error=error)
        stats = make_stats(job, res, drafter_name(drafter), self.options.gamma,
                           nat if drafter is not None else None, ratio, self.options.rule,
                           self.batch_size)
        return JobOutcome(job, GenerateOutput(res.tokens, detokenize(res.tokens), stats, res,
                                              nat))



def _count(summary: RunSummary, o: Outcome) -> int:
    """Add a finished job to `summary`: its tokens (returned), rounds and times."""
    summary.jobs += 1
    res = o.result
    if res is None:
        summary.failed += 1
        return 0
    summary.tokens += len(res.tokens)
    summary.rounds += res.rounds
    summary.accepted += sum(res.accepted)
    summary.decode_seconds += res.decode_s
    summary.prefill_seconds += res.prefill_s
    return len(res.tokens)
