"""A generation run: records x samples as jobs through the batched decoder, in input order.

The command line's `generate` and the API's `generate_many` are the same run: every (record,
sample) is a job keyed by (seed, record id, sample), the decoder packs jobs into at most
`batch_size` rows (a record's samples share one prefill), and outcomes come back in input order
whatever order the rows finish in, each with its stats row. A batch size changes speed, not
output: the same seed writes the same tokens with any batch size (docs/batching.md says when a
last-place float difference can change one).

Per-record timings in a batched run: `wall_s` is the record's latency, from the start of its
prefill (or of its fork from a shared prefill) to its last token, while it shared the batch with
other rows; `tokens_per_s` is its tokens over that latency. The run's own throughput is
`RunSummary.tokens_per_s`.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .api import (
    DecodeOptions,
    GenerateOutput,
    check_context,
    check_gamma,
    drafter_name,
    make_stats,
    prompt_ids,
    record_key,
    resolve_drafter,
)
from .decode.batch import BatchDecoder, DecodeResult, Job, RoundReport
from .decode.drafters.base import Drafter, RngKey
from .errors import SettingError
from .model.memory import check_batch_fits, largest_batch, run_budget
from .model.model import StripedHyena
from .model.tokenizer import detokenize
from .resume import job_id

CPU_BATCH = 32  # the most tokens/s for the bundled target on a 2-core CPU (docs/performance.md)
CUDA_BATCH = 64  # a GPU's decode step reads the weights once for all rows (not measured yet)


def default_batch_size(device: torch.device) -> int:
    """The batch size a run uses when none is given, by device (docs/batching.md)."""
    return CUDA_BATCH if device.type == "cuda" else CPU_BATCH


@dataclass(frozen=True)
class RunJob:
    """A job with the record it continues (for output and stats)."""

    job: Job
    record_id: str
    sample: int
    prompt: str | Sequence[int]  # as given (letters for --include-prompt)

    @property
    def id(self) -> str:
        return self.job.label


def make_jobs(records: Sequence[tuple[str, str | Sequence[int]]], options: DecodeOptions,
              model: StripedHyena,
              skip: set[str] | frozenset[str] = frozenset(),
              key: Callable[[int, str], int] | None = None) -> list[RunJob]:
    """(record id, sequence) pairs as jobs, record by record and sample by sample, leaving out
    the output ids in `skip` (finished by an earlier run). `key(i, record_id)` gives a record's
    random-number key (default: a hash of the record id, so output does not depend on order or
    sharding)."""
    key = key or (lambda i, rid: record_key(rid))
    out: list[RunJob] = []
    for i, (rid, seq) in enumerate(records):
        ids = tuple(prompt_ids(model, seq if isinstance(seq, str) else list(seq)))
        for s in range(options.samples):
            jid = job_id(rid, s, options.samples)
            if jid in skip:
                continue
            job = Job(len(out), ids, options.max_new_tokens,
                      RngKey(options.seed, key(i, rid), s), jid)
            out.append(RunJob(job, rid, s, seq))
    return out


def plan_batch(model: StripedHyena, jobs: Sequence[RunJob], options: DecodeOptions,
               drafter: Drafter | None, batch_size: int | None,
               max_memory: str | int | None = None) -> int:
    """The batch size of a run: `batch_size`, or the device's default when None; either way one
    whose state fits in the memory available at the run's longest context (a default shrinks to
    fit; a batch size the user asked for that does not fit is refused, naming the largest that
    does)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise SettingError.of("batch_size", f"must be an integer >= 1, got {batch_size!r}")
    want = batch_size or default_batch_size(model.device)
    rows = max(1, min(want, len(jobs)))
    block = (options.largest_draft + 1) if drafter is not None else 1
    longest = max((len(j.job.prompt) for j in jobs), default=1)
    context = longest + options.max_new_tokens + block + 16
    weights = next(model.parameters()).dtype
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = run_budget(model.device, max_memory, loaded)
    if batch_size is None and budget.bytes is not None:
        fits = largest_batch(model.config, weights, weights, context, block, budget.bytes)
        rows = max(1, min(rows, fits))
    check_batch_fits(model.config, weights, weights, rows, context, block, budget)
    return rows


@dataclass
class JobOutcome:
    """A finished job: its output (tokens, text, stats row), or the error that ended it."""

    run_job: RunJob
    output: GenerateOutput | None = None
    error: Exception | None = None


COMPARE_PAIRS = 3
"""--compare-native times at least this many native/speculative pairs (repeating slices of a
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
        """Native seconds per token over speculative seconds per token."""
        if not (self.native_s and self.native_tokens and self.spec_s and self.spec_tokens):
            return None
        return (self.native_s / self.native_tokens) / (self.spec_s / self.spec_tokens)


@dataclass
class RunSummary:
    """What a whole run did (the summary line and `bench`'s throughput)."""

    jobs: int = 0
    failed: int = 0
    tokens: int = 0
    rounds: int = 0
    accepted: int = 0
    seconds: float = 0.0
    native_seconds: float = 0.0
    native_tokens: int = 0
    batch_size: int = 1
    pairs: list[PairTiming] = field(default_factory=list)  # --compare-native's timed pairs

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def tau(self) -> float | None:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else None

    @property
    def speedup(self) -> float | None:
        """Pooled over every timed pair (repeats included): native seconds per token over
        speculative seconds per token."""
        timed = [p for p in self.pairs if p.ratio is not None]
        if timed:
            native = sum(p.native_s for p in timed) / sum(p.native_tokens for p in timed)
            return native / (sum(p.spec_s for p in timed) / sum(p.spec_tokens for p in timed))
        if not self.native_seconds or not self.seconds or not self.tokens:
            return None
        return (self.native_seconds / self.native_tokens) / (self.seconds / self.tokens)

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
    --compare-native a slice is decoded natively then speculatively (one timed pair); a
    `timing_only` pass repeats a slice for the timing alone (its outcomes are dropped)."""

    jobs: tuple[RunJob, ...]
    native: bool
    pair: int = 0
    timing_only: bool = False

    @property
    def tokens(self) -> int:
        return sum(j.job.max_new_tokens for j in self.jobs)


class RunObserver(Protocol):
    """What a progress display is told while a run goes (all calls come from the run's thread)."""

    def pass_started(self, p: Pass) -> None:
        """A pass begins (its jobs' prompts are prefilled as rows free up)."""

    def job_started(self, job: RunJob, p: Pass) -> None:
        """The decoder took `job`: its prompt is prefilled (or forked from its record's
        prefill) before the next round."""

    def round_done(self, report: RoundReport, p: Pass) -> None:
        """A round of `p` ended, having emitted `report.tokens` tokens."""


@dataclass
class GenerationRun:
    """Jobs through the batched decoder, outcomes in input order (see the module docstring).

    With `compare_native`, each slice of jobs (one batch's worth) is decoded natively with the
    same batch size right before it is decoded speculatively, so every speedup is a ratio of
    two runs measured moments apart in the same process; a run of fewer than COMPARE_PAIRS
    slices repeats slices (timing only) until that many pairs are timed (`passes`).
    """

    model: StripedHyena
    drafter: Drafter | None
    options: DecodeOptions
    batch_size: int = 1
    compare_native: bool = False
    on_round: Callable[[RoundReport], None] | None = None
    summary: RunSummary = field(default_factory=RunSummary)
    observer: RunObserver | None = None

    def passes(self, jobs: Sequence[RunJob]) -> list[Pass]:
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

    def outcomes(self, jobs: Sequence[RunJob]) -> Iterator[JobOutcome]:
        """Every job's outcome, in the order of `jobs` (finished rows wait for earlier ones;
        `waiting` holds them if the run stops early)."""
        self.summary.batch_size = self.batch_size
        self.waiting: dict[int, JobOutcome] = {}
        next_index = 0
        native: dict[int, DecodeResult] = {}
        for p in self.passes(jobs):
            if self.observer is not None:
                self.observer.pass_started(p)
            if p.pair >= len(self.summary.pairs) and self.compare_native and \
                    self.drafter is not None:
                self.summary.pairs.append(PairTiming())
            if p.native:
                native = self._native(p)
                continue
            for o in self._decode(p, self.drafter, native):
                if p.timing_only:
                    continue
                self.waiting[o.run_job.job.index] = o
                while next_index in self.waiting:
                    yield self.waiting.pop(next_index)
                    next_index += 1

    def _feed(self, p: Pass) -> Iterator[Job]:
        """The pass's jobs for the decoder, telling the observer as it takes each one (the
        decoder pulls a job only when it starts it)."""
        for j in p.jobs:
            if self.observer is not None:
                self.observer.job_started(j, p)
            yield j.job

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

    def _native(self, p: Pass) -> dict[int, DecodeResult]:
        """The slice decoded natively (same batch size): job index -> result."""
        t0 = time.perf_counter()
        dec = BatchDecoder(self.model, self.options.sampler, None, 0, self.batch_size,
                           on_round=self._rounds(p, None))
        got = {o.job.index: o.result for o in dec.run(self._feed(p)) if o.result is not None}
        seconds = time.perf_counter() - t0
        tokens = sum(len(r.tokens) for r in got.values())
        pair = self.summary.pairs[p.pair]
        pair.native_s, pair.native_tokens = seconds, tokens
        if not p.timing_only:
            self.summary.native_seconds += seconds
            self.summary.native_tokens += tokens
        return got

    def _decode(self, p: Pass, drafter: Drafter | None,
                native: dict[int, DecodeResult]) -> Iterator[JobOutcome]:
        part = p.jobs
        by_index = {j.job.index: j for j in part}
        opts = self.options
        dec = BatchDecoder(self.model, opts.sampler, drafter, opts.gamma, self.batch_size,
                           opts.rollback,
                           on_round=self._rounds(p, None if p.timing_only else self.on_round),
                           capacity=max(len(j.job.prompt) for j in part) + opts.max_new_tokens
                           + opts.largest_draft + 16)
        name = drafter_name(drafter)
        # a timing-only repeat counts in its pair, not in the run's totals
        summary = self.summary if not p.timing_only else RunSummary()
        tokens, away = 0, 0.0
        t0 = time.perf_counter()
        try:
            for o in dec.run(self._feed(p)):
                rj = by_index[o.job.index]
                summary.jobs += 1
                if o.result is None:
                    summary.failed += 1
                    t_out = time.perf_counter()
                    yield JobOutcome(rj, error=o.error)
                    away += time.perf_counter() - t_out
                    continue
                res = o.result
                tokens += len(res.tokens)
                summary.tokens += len(res.tokens)
                summary.rounds += res.rounds
                summary.accepted += sum(res.accepted)
                stats = make_stats(rj.id, rj.sample, len(rj.job.prompt), res, name, opts.gamma,
                                   native.get(o.job.index) if drafter is not None else None)
                t_out = time.perf_counter()
                yield JobOutcome(rj, GenerateOutput(res.tokens, detokenize(res.tokens), stats, res,
                                                    native.get(o.job.index)))
                away += time.perf_counter() - t_out
        finally:
            seconds = time.perf_counter() - t0 - away  # decoding only, not the caller's writes
            summary.seconds += seconds
            if p.pair < len(self.summary.pairs):
                pair = self.summary.pairs[p.pair]
                pair.spec_s, pair.spec_tokens = seconds, tokens


def generate_many(model: StripedHyena, prompts: Sequence[str | Sequence[int]] | dict[str, str],
                  samples: int = 1, batch_size: int | None = None, max_new_tokens: int = 64,
                  drafter: Any = "auto", gamma: int = 12, temperature: float = 1.0,
                  top_k: int = 4, top_p: float = 1.0, seed: int = 0, rollback: str = "slice",
                  force_drafter: bool = False, max_memory: str | int | None = None,
                  on_round: Callable[[RoundReport], None] | None = None
                  ) -> list[GenerateOutput]:
    """Continue every prompt `samples` times, `batch_size` rows at a time (None: the device's
    default, fewer if memory is short): one output per (prompt, sample), in input order.

    `prompts` is a list (strings or token ids; prompt i is keyed by its index, so prompt 0,
    sample 0 gives what `generate(model, prompt)` gives) or a {record id: sequence} mapping (keyed
    by record id, as the command line does). Lossless per row whatever the batch size."""
    options = DecodeOptions(max_new_tokens, gamma, temperature, top_k, top_p, seed, samples,
                            rollback)
    if isinstance(prompts, dict):
        records = list(prompts.items())
        key = None
    else:
        records = [(f"prompt{i}", p) for i, p in enumerate(prompts)]
        key = lambda i, rid: i  # noqa: E731
    d = resolve_drafter(model, drafter, force=force_drafter)
    check_gamma(d, options.largest_draft)
    jobs = make_jobs(records, options, model, key=key)
    for j in jobs:
        check_context(model, len(j.job.prompt), max_new_tokens, j.record_id)
    run = GenerationRun(model, d, options,
                        plan_batch(model, jobs, options, d, batch_size, max_memory),
                        on_round=on_round)
    outs: list[GenerateOutput] = []
    for o in run.outcomes(jobs):
        if o.error is not None:
            raise o.error
        assert o.output is not None
        outs.append(o.output)
    return outs
