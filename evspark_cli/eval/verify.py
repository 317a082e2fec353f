"""`evspark verify`: native and speculative decoding, compared token by token.

Greedy runs (the default) and sampled runs under the coupled rule promise the same tokens as
native decoding of the same seed, so both are compared token by token; a sampled run under the
residual rule is lossless only in distribution and is refused here (the chi-square and TVD
checks of `evspark bench` and the tests hold it). A divergence where the native margin (the
top-1/top-2 logit gap; for a coupled sampled run the gap of the perturbed scores, in logit units)
is under the tie tolerance is a tie (both paths chose within floating-point noise); any other
divergence means the engine is not lossless.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..decode.batch import BatchDecoder, JobList
from ..decode.drafters.base import Drafter
from ..decode.drafters.registry import drafter_name
from ..decode.interleave import interleave, timed_run
from ..decode.jobs import DecodeResult, Job
from ..decode.sampling import GREEDY, SamplerConfig
from ..errors import InputError, SettingError, printable
from ..generation.jobs import Record, build_jobs
from ..generation.options import DecodeOptions
from ..generation.plan import plan_batch
from ..io.types import Prompt
from ..model.model import StripedHyena
from .compare import compare_greedy, default_tie_tolerance, side_by_side


@dataclass(frozen=True)
class VerifyOptions:
    """Tokens per prompt, sampler, rule, draft length and rollback (`decode`: greedy, or sampled
    under the coupled rule), and the tie tolerance (None: `default_tie_tolerance` of the model's
    dtype); checked when built."""

    decode: DecodeOptions
    tie_tolerance: float | None = None
    batch_size: int = 1

    def __post_init__(self) -> None:
        t = self.tie_tolerance
        if t is not None and not t >= 0:
            raise SettingError.of("tie_tolerance", f"must be >= 0, got {t}")
        b = self.batch_size
        if isinstance(b, bool) or not isinstance(b, int) or b < 1:
            raise SettingError.of("batch_size", f"must be an integer >= 1, got {b!r}")
        sampler = self.decode.sampler
        if not sampler.greedy and not sampler.coupled:
            raise SettingError("sampled output is compared token by token only under {0} "
                               "coupled (residual is lossless in distribution, which `evspark "
                               "bench` checks); add it, or verify greedy with {1} 1",
                               "rule", "top_k")


@dataclass
class VerifyResult:
    drafter: str
    gamma: int
    tie_tolerance: float
    rows: list[dict[str, Any]]
    batch_size: int = 1
    native_s: float = 0.0  # every prompt's native decoding time, prefill included
    spec_s: float = 0.0  # the speculative side's: the sum of the rows', or the batch's
    sampler: SamplerConfig = GREEDY

    @property
    def sampling(self) -> str:
        """The sampler as the summary names it: greedy, or rule, temperature, top-k and top-p."""
        c = self.sampler
        if c.greedy:
            return "greedy"
        return f"rule={c.rule} temperature={c.temperature:g} top_k={c.top_k} top_p={c.top_p:g}"

    @property
    def ties(self) -> int:
        return sum(1 for r in self.rows if r["divergence"] is not None and r["tie"])

    @property
    def non_tie_divergences(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["divergence"] is not None and not r["tie"]]

    def table(self) -> list[str]:
        """The printed report: one line per prompt, then a summary line."""
        ids = [printable(r["record_id"]) for r in self.rows]  # escaped: printed to a terminal
        w = max([24] + [len(i) for i in ids])  # whole ids: they name records
        lines = [f"{'record':<{w}} {'compared':>8} {'first_divergence':>16} {'tie':>5} "
                 f"{'tau':>6} {'speedup':>7}"]
        for rid, r in zip(ids, self.rows):
            div = "-" if r["divergence"] is None else str(r["divergence"])
            tie = "-" if r["divergence"] is None else ("yes" if r["tie"] else "NO")
            speedup = "-" if r["speedup"] is None else f"{r['speedup']:.2f}"
            lines.append(f"{rid:<{w}} {r['compared']:>8} {div:>16} {tie:>5} "
                         f"{r['tau']:>6.2f} {speedup:>7}")
        identical = sum(1 for r in self.rows if r["divergence"] is None)
        batch = ""
        if self.batch_size > 1:
            ratio = self.native_s / self.spec_s if self.spec_s else 0.0
            batch = (f" batch_size={self.batch_size} native_s={self.native_s:.2f} "
                     f"speculative_s={self.spec_s:.2f} speedup={ratio:.2f}")
        lines.append(f"drafter={self.drafter} gamma={self.gamma} {self.sampling} "
                     f"prompts={len(self.rows)} "
                     f"identical={identical} ties={self.ties} "
                     f"non_tie_divergences={len(self.non_tie_divergences)}{batch}")
        return lines

    def report(self) -> dict[str, Any]:
        """The JSON report (`--report`)."""
        c = self.sampler
        return {"drafter": self.drafter, "gamma": self.gamma, "rule": c.rule,
                "temperature": c.temperature, "top_k": c.top_k, "top_p": c.top_p,
                "greedy": c.greedy, "tie_tolerance": self.tie_tolerance,
                "batch_size": self.batch_size,
                "native_s": self.native_s, "speculative_s": self.spec_s, "rows": self.rows}


def verify_prompts(model: StripedHyena, prompts: Sequence[Prompt], drafter: Drafter | None,
                   options: VerifyOptions,
                   on_prompt: Callable[[dict[str, Any]], None] | None = None,
                   batch_size: int = 1, max_memory: str | int | None = None) -> VerifyResult:
    """Native vs speculative decoding of every prompt with the options' sampler, compared token
    by token.

    With `batch_size` > 1 the speculative side decodes all prompts in batches of that many rows
    and each is compared with its own single-stream native run: the batched engine is held to
    the plain one-row reference. The batch is checked against the memory there is (and
    `max_memory`) before any decoding, as `generate` checks its own."""
    if drafter is None:
        raise InputError("verify needs a drafter (not 'none')")
    tol = options.tie_tolerance
    if tol is None:
        tol = default_tie_tolerance(next(model.parameters()).dtype)
    opts = options.decode
    jobs = build_jobs([Record.of(p, model.config.vocab_size) for p in prompts], opts)
    rows_at_once = plan_batch(model, jobs, opts, drafter, batch_size, max_memory)
    if rows_at_once > 1:
        return _verify_batched(model, jobs, drafter, opts, tol, rows_at_once, on_prompt)
    rows = []
    native_s = spec_s = 0.0
    for p, job in zip(prompts, jobs):
        for _, _, nat, spec in side_by_side(model, p, opts.max_new_tokens, opts.sampler, job.rng,
                                            {"d": drafter}, opts.gamma,
                                            lambda _: (opts.rollback,), track_margins=True,
                                            adaptive=opts.adaptive):
            native_s, spec_s = native_s + nat.wall_s, spec_s + spec.wall_s
            rows.append(compare_greedy(p.id, nat, spec, tol))
            if on_prompt is not None:
                on_prompt(rows[-1])
    return VerifyResult(drafter_name(drafter), opts.gamma, tol, rows, 1, native_s, spec_s,
                        opts.sampler)


def _verify_batched(model: StripedHyena, jobs: list[Job], drafter: Drafter,
                    opts: DecodeOptions, tol: float, batch_size: int,
                    on_prompt: Callable[[dict[str, Any]], None] | None) -> VerifyResult:
    """Every job natively, one at a time, and all of them speculatively, `batch_size` rows at
    once (planned: at most the jobs, and fitting in memory), the two decoders in turns
    (decode/interleave.py)."""
    rows_at_once = batch_size
    native, batched = (
        timed_run(lambda clock: BatchDecoder(model, opts.sampler, None, 0, track_margins=True,
                                             clock=clock), JobList(iter(jobs))),
        timed_run(lambda clock: BatchDecoder(
            model, opts.sampler, drafter, opts.largest_draft, rows_at_once, opts.rollback,
            adaptive=opts.adaptive, tree_rows=opts.tree_rows, clock=clock), JobList(iter(jobs))))
    interleave([native, batched])
    results: list[dict[int, DecodeResult]] = []
    for run in (native, batched):
        got = {}
        for o in run.outcomes:
            if o.error is not None:
                raise o.error
            assert o.result is not None
            got[o.job.index] = o.result
        results.append(got)
    rows = []
    for j in jobs:
        row = compare_greedy(j.label, results[0][j.index], results[1][j.index], tol)
        row["speedup"] = None  # a row's latency in a batch is not its cost: see the summary
        rows.append(row)
        if on_prompt is not None:
            on_prompt(row)
    return VerifyResult(drafter_name(drafter), opts.gamma, tol, rows, rows_at_once,
                        native.seconds, batched.seconds, opts.sampler)
