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
from typing import Any

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

CPU_BATCH = 16  # the batch size with the most tokens/s on a CPU for the bundled target
CUDA_BATCH = 32  # a GPU's decode step is memory-bound: more rows cost little (not measured here)


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

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def tau(self) -> float | None:
        return (self.accepted + self.rounds) / self.rounds if self.rounds else None

    @property
    def speedup(self) -> float | None:
        if not self.native_seconds or not self.seconds or not self.tokens:
            return None
        return (self.native_seconds / self.native_tokens) / (self.seconds / self.tokens)


@dataclass
class GenerationRun:
    """Jobs through the batched decoder, outcomes in input order (see the module docstring).

    With `compare_native`, each slice of jobs (four batches' worth) is decoded natively with the
    same batch size right before it is decoded speculatively, so every speedup is a ratio of
    two runs measured moments apart in the same process.
    """

    model: StripedHyena
    drafter: Drafter | None
    options: DecodeOptions
    batch_size: int = 1
    compare_native: bool = False
    on_round: Callable[[RoundReport], None] | None = None
    summary: RunSummary = field(default_factory=RunSummary)

    def outcomes(self, jobs: Sequence[RunJob]) -> Iterator[JobOutcome]:
        """Every job's outcome, in the order of `jobs` (finished rows wait for earlier ones;
        `waiting` holds them if the run stops early)."""
        self.summary.batch_size = self.batch_size
        self.waiting: dict[int, JobOutcome] = {}
        next_index = 0
        slices = [list(jobs)]
        if self.compare_native and self.drafter is not None:
            n = 4 * self.batch_size
            slices = [list(jobs[i: i + n]) for i in range(0, len(jobs), n)]
        for part in slices:
            native = self._native(part) if self.compare_native else {}
            for o in self._decode(part, self.drafter, native):
                self.waiting[o.run_job.job.index] = o
                while next_index in self.waiting:
                    yield self.waiting.pop(next_index)
                    next_index += 1

    def _native(self, part: list[RunJob]) -> dict[int, DecodeResult]:
        """The slice decoded natively (same batch size): job index -> result."""
        if self.drafter is None:
            return {}
        t0 = time.perf_counter()
        dec = BatchDecoder(self.model, self.options.sampler, None, 0, self.batch_size)
        got = {o.job.index: o.result for o in dec.run([j.job for j in part])
               if o.result is not None}
        self.summary.native_seconds += time.perf_counter() - t0
        self.summary.native_tokens += sum(len(r.tokens) for r in got.values())
        return got

    def _decode(self, part: list[RunJob], drafter: Drafter | None,
                native: dict[int, DecodeResult]) -> Iterator[JobOutcome]:
        by_index = {j.job.index: j for j in part}
        opts = self.options
        dec = BatchDecoder(self.model, opts.sampler, drafter, opts.gamma, self.batch_size,
                           opts.rollback, on_round=self.on_round,
                           capacity=max(len(j.job.prompt) for j in part) + opts.max_new_tokens
                           + opts.largest_draft + 16)
        name = drafter_name(drafter)
        t0 = time.perf_counter()
        try:
            for o in dec.run([j.job for j in part]):
                rj = by_index[o.job.index]
                self.summary.jobs += 1
                if o.result is None:
                    self.summary.failed += 1
                    yield JobOutcome(rj, error=o.error)
                    continue
                res = o.result
                self.summary.tokens += len(res.tokens)
                self.summary.rounds += res.rounds
                self.summary.accepted += sum(res.accepted)
                stats = make_stats(rj.id, rj.sample, len(rj.job.prompt), res, name, opts.gamma,
                                   native.get(o.job.index) if drafter is not None else None)
                yield JobOutcome(rj, GenerateOutput(res.tokens, detokenize(res.tokens), stats, res,
                                                    native.get(o.job.index)))
        finally:
            self.summary.seconds += time.perf_counter() - t0


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
