"""The progress of a generation run, fed by the run's events (generation.run.RunObserver):
tokens done over every pass's tokens, tau, the prefill in progress, and a time left that
counts prefill and decoding apart (cli/progress.py shows it); and the run's summary line."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .estimates import DecodeTiming, PrefillFit
from .formats import fmt_count, fmt_rate, fmt_rough
from .progress import Progress

if TYPE_CHECKING:  # the engine is imported lazily (a fast --help)
    from ..cpus import Threads
    from ..decode.jobs import Job, RoundReport
    from ..generation.run import Pass, RunSummary
    from ..model.config import ModelConfig


@dataclass
class _Prefill:
    """The prefill in progress: whose, how far, since when."""

    name: str
    total: int
    t_start: float
    t_last: float
    done: int = 0


class GenerationMeter:
    """A generation run's progress: tokens done over every pass's tokens (native passes and timing
    repeats of --compare-native included), tau, the prefill in progress, and a time left.

    The time left counts the two kinds of work apart, each at its own measured rate: the tokens
    still to decode (per mode, native or speculative: `DecodeTiming`) and the bases still to
    prefill, the rest of the prompt being prefilled and the prompts not yet started (timed
    chunk by chunk from the run's prefill events: `PrefillFit`, shaped by `prefill_work`). A
    long prompt after short ones thus costs its own length, never the short ones' time per
    token; a pass's first round interval, which also holds the decoder's setup (graphs, a
    measured schedule), times neither.
    """

    def __init__(self, progress: Progress, passes: list[Pass], records: int,
                 work: Callable[[int], float] = float,
                 clock: Callable[[], float] = time.monotonic,
                 names: Mapping[str, str] | None = None) -> None:
        """`work(n)`: the relative work of prefilling n bases (`prefill_work`; default n).
        `names`: a job's record (the base of its output ids) -> the name a user knows it by
        (`chr1`, not `chr1.cont`), for the prefill's status."""
        self.progress, self.passes, self.clock, self.work = progress, passes, clock, work
        self.names = dict(names or {})
        self.records_total, self.records_done = records, 0
        self.left = {True: 0, False: 0}  # tokens still to decode, per mode (native?)
        self.todo: Counter[int] = Counter()  # prompt lengths not yet started, every pass
        for p in passes:
            self.left[p.native] += p.tokens
            self.todo.update(len(j.prompt) for j in _first_of_records(p.jobs))
        self.decoding = {True: DecodeTiming(), False: DecodeTiming()}
        self.fit = PrefillFit()
        self.current: _Prefill | None = None
        self.prefill_s = 0.0  # prefill seconds since the last round
        self.setup = True  # the pass's first round interval is still to come
        self.rows = self.accepted = 0
        self.last = clock()
        self.pass_index = 0
        self.started: set[int] = set()  # the passes begun (their places in `passes`)
        self.pass_status = ""
        self.decoded = {True: [0, 0.0], False: [0, 0.0]}  # per mode: tokens, rounds' seconds
        self.mode = False  # the mode of the pass in progress (native?)
        progress.set_total(sum(p.tokens for p in passes))
        progress.eta = self.time_left
        progress.per_s = self.decoding_rate

    # generation.run.RunObserver
    def pass_started(self, p: Pass) -> None:
        """A pass begins, or takes its turn again (--compare-native's two passes alternate):
        only a new pass's first round interval holds its decoder's setup."""
        at = self._place(p)
        first = at not in self.started
        if first:
            self.started.add(at)
            self.pass_index += 1
        self.mode = p.native
        self.last = self.clock()
        self.setup, self.prefill_s, self.current = first, 0.0, None
        self.pass_status = self._status(p)
        self.progress.update(status=self.pass_status)

    def job_started(self, job: Job, p: Pass) -> None:
        """Nothing to do: a prefill is timed by its own events (`prefill_progress`)."""

    def prefill_progress(self, job: Job, done: int, total: int, p: Pass) -> None:
        now = self.clock()
        cur = self.current
        if done == 0 or cur is None:  # a prefill starts
            self._end_prefill(now)  # one still open had failed
            if self.todo[total] > 0:
                self.todo[total] -= 1
            cur = self.current = _Prefill(self._name(job), total, now, now)
        if done > cur.done:
            self.fit.add(cur.done == 0, self.work(done) - self.work(cur.done), now - cur.t_last)
            cur.done, cur.t_last = done, now
        if done >= total:
            self._end_prefill(now)
            self.progress.update(status=self.pass_status)
        else:
            self.progress.update(status=", ".join(
                x for x in (self.pass_status, self.prefill_text(now)) if x))

    def round_done(self, report: RoundReport, p: Pass) -> None:
        now = self.clock()
        dt, self.last = now - self.last, now
        self._end_prefill(now)  # a prefill still open when rounds go on had failed
        mode, timing = p.native, self.decoding[p.native]
        if self.prefill_s and not self.setup:
            timing.mixed_s += max(0.0, dt - self.prefill_s)
            timing.mixed_tokens += report.tokens
        elif not self.setup:
            timing.plain_s += dt
            timing.plain_tokens += report.tokens
        self.setup, self.prefill_s = False, 0.0
        self.decoded[mode][0] += report.tokens
        self.decoded[mode][1] += report.seconds
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

    def decoding_rate(self) -> float | None:
        """Decoding tokens/s so far, of the mode in progress: its tokens over its rounds' time
        (the summary's and the stats' definition: generation/results.py)."""
        tokens, seconds = self.decoded[self.mode]
        return tokens / seconds if seconds > 0 else None

    def rate(self, native: bool) -> float | None:
        """Decoded tokens per second of a mode (the other mode's until it has some)."""
        return self.decoding[native].rate() or self.decoding[not native].rate()

    def prefill_time(self) -> Callable[[int], float] | None:
        """The estimated seconds to prefill a prompt of n bases; None before any chunk."""
        coef = self.fit.coefficients()
        if coef is None:
            return None
        a, b = coef
        return lambda n: a + b * self.work(n)

    def prefill_left(self) -> float | None:
        """Seconds of prefill still to do: the rest of the prompt in progress and the prompts
        not yet started; None while that is some and no chunk has been timed."""
        cur, todo = self.current, +self.todo
        if cur is None and not todo:
            return 0.0
        coef = self.fit.coefficients()
        if coef is None:
            return None
        a, b = coef
        total = sum((a + b * self.work(n)) * count for n, count in todo.items())
        if cur is not None:
            total += b * (self.work(cur.total) - self.work(cur.done)) + (a if not cur.done else 0)
        return total

    def time_left(self) -> float | None:
        total = self.prefill_left()
        for mode in (True, False):
            if total is not None and self.left[mode]:
                rate = self.rate(mode)
                total = total + self.left[mode] / rate if rate else None
        return total

    def prefill_text(self, now: float) -> str:
        """'prefill chr1: 40,960 of 200,000 bases, 1,234 bases/s, ~2 min left'."""
        cur = self.current
        if cur is None:
            return ""
        parts = [f"prefill {cur.name}: {fmt_count(cur.done)} of {fmt_count(cur.total)} bases"]
        if cur.done and now > cur.t_start:
            parts.append(fmt_rate(cur.done / (now - cur.t_start), "bases"))
        coef = self.fit.coefficients()
        if coef is not None and cur.done:
            parts.append(f"{fmt_rough(coef[1] * (self.work(cur.total) - self.work(cur.done)))} "
                         "left")
        return ", ".join(parts)

    def _name(self, job: Job) -> str:
        """The record a prefill is for, safe on a terminal (an id may hold escape sequences)."""
        from ..errors import printable

        return printable(self.names.get(job.record) or job.record or job.label
                         or f"#{job.index}")

    def _end_prefill(self, now: float) -> None:
        if self.current is not None:
            self.prefill_s += now - self.current.t_start
            self.current = None

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
        return f"pass {self._place(p) + 1}/{len(self.passes)} {what}"

    def _place(self, p: Pass) -> int:
        """Where `p` is in the run's passes (the run makes equal ones: same jobs, same mode)."""
        return next((i for i, q in enumerate(self.passes) if q == p), self.pass_index)


def prefill_work(config: ModelConfig) -> Callable[[int], float]:
    """The relative work of prefilling n bases with a model: per base, the multiply-adds of the
    projections and MLPs of every layer (about 4d + 3m per unit of d, with d the hidden size and
    m the MLP size), and per attention layer the look-back over the prefix (about n d on
    average), so n + n^2 / n0 with n0 = layers (4d + 3m) / attention layers. The Hyena
    convolutions' n log n is small beside either and left out. Only the shape matters: the
    meter fits the seconds per unit."""
    attention = len(config.attn_layer_idxs)
    if not attention:
        return float
    n0 = config.num_layers * (4 * config.hidden_size + 3 * config.mlp_size) / attention
    return lambda n: n + n * n / n0


def _first_of_records(jobs: tuple[Job, ...]) -> list[Job]:
    """The jobs that prefill (the first of each record's consecutive samples)."""
    out: list[Job] = []
    last = None
    for j in jobs:
        key = (j.rng.record, j.prompt)
        if key != last:
            out.append(j)
            last = key
    return out


def summary_line(s: RunSummary, records: int, samples: int, wall_s: float, threads: Threads,
                 resumed: int = 0, skipped: int = 0, shard: tuple[str, int] | None = None) -> str:
    """The run's last line: what was done, how long it took, how fast, with what. `shard`:
    the `--shard` given and how many of the records' jobs are in it."""
    done = s.jobs - s.failed
    held = f" (shard {shard[0]}: {shard[1]} of them)" if shard else ""
    parts = [f"evspark: generate: {records} record{'s' if records != 1 else ''} x {samples} "
             f"sample{'s' if samples != 1 else ''}{held}, {done} "
             f"sequence{'s' if done != 1 else ''} written"
             + (f" ({s.failed} failed)" if s.failed else ""),
             f"{s.tokens:,} tokens in {wall_s:.1f} s (prefill {s.prefill_seconds:.1f} s)",
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
    unreliable (generation.run.SPREAD_LIMIT)."""
    from ..generation.run import SPREAD_LIMIT

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
