"""The progress of a generation run, fed by the run's events (runs.RunObserver): tokens done
over every pass's tokens, tau, and a time left that counts prefill (cli/progress.py shows it);
and the run's summary line."""
from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .progress import Progress

if TYPE_CHECKING:  # the engine is imported lazily (a fast --help)
    from ..cpus import Threads
    from ..decode.batch import RoundReport
    from ..runs import Pass, RunJob, RunSummary


class GenerationMeter:
    """A generation run's progress: tokens done over every pass's tokens (native passes and
    timing repeats of --compare-native included), tau, and a time left that counts prefill.

    The run tells it when the decoder takes a job (its prompt is prefilled before the next
    round) and when each round ends (runs.RunObserver). A round interval with no prefill in it
    times decoding alone (per mode: native or speculative); an interval with prefills is that
    plus prefill, so its excess over a plain round times the prefill of the prompts taken in
    it. The time left is the tokens still to decode at each mode's rate plus the prompts still
    to prefill at their estimated cost (`prefill_time`): a long prompt not yet started
    lengthens the estimate instead of stalling the bar's rate later.
    """

    def __init__(self, progress: Progress, passes: list[Pass], records: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.progress, self.passes, self.clock = progress, passes, clock
        self.records_total, self.records_done = records, 0
        self.left = {True: 0, False: 0}  # tokens still to decode, per mode (native?)
        self.todo: Counter[int] = Counter()  # prompt lengths still to prefill, every pass
        for p in passes:
            self.left[p.native] += p.tokens
            self.todo.update(len(j.job.prompt) for j in _first_of_records(p.jobs))
        self.pure_s = {True: 0.0, False: 0.0}  # round intervals without prefill
        self.pure_tokens = {True: 0, False: 0}
        self.pure_rounds = {True: 0, False: 0}
        # (interval, prompts, prompt bases, native?) of the intervals that held prefills
        self.mixed: list[tuple[float, int, int, bool]] = []
        self.pending = self.pending_prompts = 0  # prompts and bases taken since the last round
        self.rows = self.accepted = 0
        self.last = clock()
        self.last_prompt: tuple[Any, Any] | None = None
        self.pass_index = 0
        progress.set_total(sum(p.tokens for p in passes))
        progress.eta = self.time_left

    # runs.RunObserver
    def pass_started(self, p: Pass) -> None:
        self.pass_index += 1
        self.last = self.clock()
        self.last_prompt = None
        self.progress.update(status=self._status(p))

    def job_started(self, job: RunJob, p: Pass) -> None:
        key = (job.job.rng.record, job.job.prompt)
        if key != self.last_prompt:  # a record's samples share one prefill
            self.last_prompt = key
            n = len(job.job.prompt)
            self.pending += n
            self.pending_prompts += 1
            if self.todo[n] > 0:
                self.todo[n] -= 1

    def round_done(self, report: RoundReport, p: Pass) -> None:
        now = self.clock()
        dt, self.last = now - self.last, now
        mode = p.native
        if self.pending:
            self.mixed.append((dt, self.pending_prompts, self.pending, mode))
            self.pending = self.pending_prompts = 0
        else:
            self.pure_s[mode] += dt
            self.pure_tokens[mode] += report.tokens
            self.pure_rounds[mode] += 1
        self.left[mode] = max(0, self.left[mode] - report.tokens)
        if not mode:
            self.rows += report.rows
            self.accepted += report.accepted
        self.progress.update(self.progress.done + report.tokens, detail=self._detail())

    # the writer's side
    def record_done(self) -> None:
        self.records_done += 1
        self.progress.milestone(self._detail())

    # estimates
    def tau(self) -> float | None:
        return (self.accepted + self.rows) / self.rows if self.rows else None

    def rate(self, native: bool) -> float | None:
        """Tokens per second of plain rounds of a mode (the other mode's until it has some)."""
        for mode in (native, not native):
            if self.pure_s[mode] > 0 and self.pure_tokens[mode]:
                return self.pure_tokens[mode] / self.pure_s[mode]
        return None

    def plain_round_s(self, native: bool) -> float | None:
        """The mean duration of a round without prefill, of a mode (else of the other)."""
        for mode in (native, not native):
            if self.pure_rounds[mode]:
                return self.pure_s[mode] / self.pure_rounds[mode]
        return None

    def prefill_time(self) -> Callable[[int], float] | None:
        """The estimated seconds to prefill a prompt of n bases, from the intervals that held
        prefills (their excess over a plain round); None while no plain round has been timed.

        A prefill costs a fixed overhead plus a cost per base: `a * prompts + b * bases`, fitted
        by least squares (both non-negative) once prompts of different lengths have been
        prefilled. Prompts of a single length L, E seconds each, cannot tell the two apart: a
        prompt of n bases is then taken to cost E * sqrt(n / L), the geometric mean of "all
        overhead" (E) and "all per base" (E * n / L), which is never further off than a factor
        sqrt(n / L) whichever is true."""
        rows: list[tuple[int, int, float]] = []
        for dt, k, n, mode in self.mixed:
            plain = self.plain_round_s(mode)
            if plain is None:
                return None
            rows.append((k, n, max(0.0, dt - plain)))
        if not rows:
            return lambda n: 0.0
        kk = sum(k * k for k, _, _ in rows)
        nn = sum(n * n for _, n, _ in rows)
        kn = sum(k * n for k, n, _ in rows)
        ke = sum(k * e for k, _, e in rows)
        ne = sum(n * e for _, n, e in rows)
        det = kk * nn - kn * kn
        if det > 1e-6 * kk * nn:  # prompts of different lengths
            a, b = (ke * nn - ne * kn) / det, (ne * kk - ke * kn) / det
            if a < 0:
                a, b = 0.0, ne / nn
            elif b < 0:
                a, b = ke / kk, 0.0
            return lambda n: a + b * n
        each = sum(e for _, _, e in rows) / sum(k for k, _, _ in rows)
        length = sum(n for _, n, _ in rows) / sum(k for k, _, _ in rows)
        return lambda n: each * math.sqrt(n / length)

    def time_left(self) -> float | None:
        total = 0.0
        for mode in (True, False):
            if self.left[mode]:
                rate = self.rate(mode)
                if rate is None:
                    return None
                total += self.left[mode] / rate
        if +self.todo:
            cost = self.prefill_time()
            if cost is None:
                return None
            total += sum(cost(n) * count for n, count in self.todo.items() if count > 0)
        return total

    def _detail(self) -> str:
        parts = [f"{self.records_done}/{self.records_total} sequences"]
        tau = self.tau()
        if tau is not None:
            parts.append(f"tau {tau:.2f}")
        return ", ".join(parts)

    def _status(self, p: Pass) -> str:
        if len(self.passes) == 1:
            return ""
        what = "native" if p.native else "speculative"
        if p.timing_only:
            what += " (timing repeat)"
        return f"pass {self.pass_index}/{len(self.passes)} {what}"


def _first_of_records(jobs: tuple[RunJob, ...]) -> list[RunJob]:
    """The jobs that prefill (the first of each record's consecutive samples)."""
    out: list[RunJob] = []
    last = None
    for j in jobs:
        key = (j.job.rng.record, j.job.prompt)
        if key != last:
            out.append(j)
            last = key
    return out


def summary_line(s: RunSummary, records: int, samples: int, wall_s: float, threads: Threads,
                 resumed: int = 0, skipped: int = 0) -> str:
    """The run's last line: what was done, how long it took, how fast, with what."""
    done = s.jobs - s.failed
    parts = [f"evspark: generate: {records} record{'s' if records != 1 else ''} x {samples} "
             f"sample{'s' if samples != 1 else ''}, {done} sequences written"
             + (f" ({s.failed} failed)" if s.failed else ""),
             f"{s.tokens:,} tokens in {wall_s:.1f} s",
             f"{s.tokens_per_s or 0:,.0f} tokens/s decoding"]
    if s.tau:
        parts.append(f"mean tau {s.tau:.2f}")
    parts += [threads.describe(), f"batch {s.batch_size}"]
    if resumed:
        parts.append(f"{resumed} resumed from .partial")
    if skipped:
        parts.append(f"{skipped} empty record{'s' if skipped != 1 else ''} skipped")
    if s.speedup:
        parts.append(speedup_text(s))
    return ", ".join(parts)


def speedup_text(s: RunSummary) -> str:
    """The measured speedup with its pairs' range, flagged when the spread makes it
    unreliable (runs.SPREAD_LIMIT)."""
    from ..runs import SPREAD_LIMIT

    ratios, spread = s.ratios, s.spread
    text = f"speedup {s.speedup:.2f}x over native decoding"
    if not ratios:
        return text
    text += (f" ({len(ratios)} timed pairs {min(ratios):.2f}-{max(ratios):.2f}x, spread "
             f"{100 * (spread or 0):.0f}%)")
    if not s.speedup_reliable:
        text += (f" UNRELIABLE: the pairs differ by more than {100 * SPREAD_LIMIT:.0f}% (a busy "
                 "machine?); rerun on an idle one or with fewer --threads")
    return text
