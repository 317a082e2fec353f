"""The progress of a generation run, fed by the run's events (generation.run.RunObserver):
tokens done over every pass's tokens, tau, and a time left that counts prefill
(cli/progress.py shows it); and the run's summary line."""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .progress import Progress

if TYPE_CHECKING:  # the engine is imported lazily (a fast --help)
    from ..cpus import Threads
    from ..decode.jobs import Job, RoundReport
    from ..generation.run import Pass, RunSummary
    from ..model.config import ModelConfig


class GenerationMeter:
    """A generation run's progress: tokens done over every pass's tokens (native passes and timing
    repeats of --compare-native included), tau, and a time left that counts prefill.

    The run tells it when the decoder takes a job (its prompt is prefilled before the next
    round) and when each round ends (generation.run.RunObserver). A round interval with no
    prefill in it times decoding alone (per mode: native or speculative); an interval with
    prefills is that plus prefill, so its excess over a plain round times the prefill of the
    prompts taken in it. The time left is the tokens still to decode at each mode's rate plus
    the prompts still to prefill at their estimated cost (`prefill_time`, shaped by
    `prefill_work`): a long prompt not yet started lengthens the estimate instead of stalling
    the bar's rate later.
    """

    def __init__(self, progress: Progress, passes: list[Pass], records: int,
                 work: Callable[[int], float] = float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`work(n)`: the relative work of prefilling n bases (`prefill_work`; default n)."""
        self.progress, self.passes, self.clock, self.work = progress, passes, clock, work
        self.records_total, self.records_done = records, 0
        self.left = {True: 0, False: 0}  # tokens still to decode, per mode (native?)
        self.todo: Counter[int] = Counter()  # prompt lengths still to prefill, every pass
        for p in passes:
            self.left[p.native] += p.tokens
            self.todo.update(len(j.prompt) for j in _first_of_records(p.jobs))
        self.pure_s = {True: 0.0, False: 0.0}  # round intervals without prefill
        self.pure_tokens = {True: 0, False: 0}
        self.pure_rounds = {True: 0, False: 0}
        # sums over the round intervals that held prefills, per mode: k prompts of work n
        # prefilled in an interval of dt seconds (O(1) to update and to fit, however many)
        self.sums = {mode: dict.fromkeys(("k", "n", "kk", "nn", "kn", "kdt", "ndt"), 0.0)
                     for mode in (True, False)}
        self.pending = 0.0  # prefill work taken since the last round
        self.pending_prompts = 0
        self.rows = self.accepted = 0
        self.last = clock()
        self.last_prompt: tuple[Any, Any] | None = None
        self.pass_index = 0
        progress.set_total(sum(p.tokens for p in passes))
        progress.eta = self.time_left

    # generation.run.RunObserver
    def pass_started(self, p: Pass) -> None:
        self.pass_index += 1
        self.last = self.clock()
        self.last_prompt = None
        self.progress.update(status=self._status(p))

    def job_started(self, job: Job, p: Pass) -> None:
        key = (job.rng.record, job.prompt)
        if key != self.last_prompt:  # a record's samples share one prefill
            self.last_prompt = key
            n = len(job.prompt)
            self.pending += self.work(n)
            self.pending_prompts += 1
            if self.todo[n] > 0:
                self.todo[n] -= 1

    def round_done(self, report: RoundReport, p: Pass) -> None:
        now = self.clock()
        dt, self.last = now - self.last, now
        mode = p.native
        if self.pending:
            k, n, sums = self.pending_prompts, self.pending, self.sums[mode]
            for key, value in (("k", k), ("n", n), ("kk", k * k), ("nn", n * n), ("kn", k * n),
                               ("kdt", k * dt), ("ndt", n * dt)):
                sums[key] += value
            self.pending, self.pending_prompts = 0.0, 0
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

        A prefill costs a fixed overhead plus a cost per unit of work (`prefill_work`: the
        architecture's multiply-adds, which grow faster than the length where attention looks
        back over the whole prefix): `a * prompts + b * work`, fitted by least squares (both
        non-negative) once prompts of different lengths have been prefilled. While all had one
        length, the two cannot be told apart and the time is taken as all work (exact when
        compute dominates, as it does for the long prompts whose prefill matters; an
        overestimate for short prompts on a busy machine, where overhead dominates)."""
        # the excess of an interval is dt minus a plain round of its mode: e = dt - plain
        kk = nn = kn = ke = ne = k_all = 0.0
        for mode, sums in self.sums.items():
            if not sums["k"]:
                continue
            plain = self.plain_round_s(mode)
            if plain is None:
                return None
            kk, nn, kn = kk + sums["kk"], nn + sums["nn"], kn + sums["kn"]
            ke += sums["kdt"] - plain * sums["k"]  # sum of k * e
            ne += sums["ndt"] - plain * sums["n"]  # sum of n * e
            k_all += sums["k"]
        if not k_all:
            return lambda n: 0.0
        det = kk * nn - kn * kn
        if det > 1e-6 * kk * nn:  # prompts of different lengths
            a, b = (ke * nn - ne * kn) / det, (ne * kk - ke * kn) / det
            if a < 0:
                a, b = 0.0, max(0.0, ne / nn)
            elif b < 0:
                a, b = max(0.0, ke / kk), 0.0
            return lambda n: a + b * self.work(n)
        per_work = max(0.0, ne / nn)
        return lambda n: per_work * self.work(n)

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
