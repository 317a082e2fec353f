"""What a finished job gives back: its tokens and text, and its row of the stats file.

One definition of each time, for a row, a batch and a run (the progress line, the summary line
and the stats agree): `prefill_s` is the time of the job's prompt prefill (0 for a sample forked
from its record's prefill); `decode_s` is its share of the decoding rounds it took part in, each
round's time split evenly among the round's rows, so the rows' shares add up to the run's
decoding time; `tokens_per_s` (decoding tokens/s) is its new tokens over `decode_s`. With a
batch of one these are the job's own times; in a batch, the pooled figure of the rows it shared
rounds with. `wall_s` is the job's latency, from the start of its prefill (or fork) to its last
token, while it shared the batch with other rows. The run's figure is `RunSummary.tokens_per_s`
(generation/run.py): its tokens over the sum of the rows' `decode_s`.

A speedup has one definition everywhere (the summary line, the stats' `speedup` column,
`bench`): native seconds per token over speculative seconds per token, each side the wall time
of decoding the same jobs, prefill included, measured side by side (`speedup`). A job's stats
row carries the speedup of the timed pair of passes it was decoded in: with a batch of one, the
job alone; otherwise its slice of the run, pooled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decode.jobs import DecodeResult, Job

STATS_COLUMNS = ["record_id", "sample", "prompt_len", "new_tokens", "mode", "drafter", "gamma",
                 "rounds", "tau", "acceptance_rate", "wall_s", "tokens_per_s", "native_wall_s",
                 "native_tokens_per_s", "speedup", "rule", "verified_positions", "efficiency",
                 "decode_s", "prefill_s", "batch", "input_id", "region", "seed", "job",
                 "branch_rows", "branch_wins"]
"""The stats file's columns (docs/cli.md, "Stats"); columns added later go last."""


@dataclass
class GenerateOutput:
    tokens: list[int]
    text: str
    stats: dict[str, Any] = field(default_factory=dict)
    result: DecodeResult | None = None
    native: DecodeResult | None = None


@dataclass
class JobOutcome:
    """A finished job: its output (tokens, text, stats row), or the error that ended it."""

    job: Job
    output: GenerateOutput | None = None
    error: Exception | None = None


def speedup(native_s: float, native_tokens: int, spec_s: float,
            spec_tokens: int) -> float | None:
    """Native seconds per token over speculative seconds per token (None without timings)."""
    if not (native_s > 0 and native_tokens and spec_s > 0 and spec_tokens):
        return None
    return (native_s / native_tokens) / (spec_s / spec_tokens)


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def per_s(tokens: int, seconds: float) -> float | None:
    """Tokens per second, None without a time."""
    return tokens / seconds if seconds > 0 else None


def make_stats(job: Job, res: DecodeResult, drafter: str, gamma: int,
               native: DecodeResult | None, pair_speedup: float | None = None,
               rule: str = "residual", batch: int = 1) -> dict[str, Any]:
    """A job's stats row (STATS_COLUMNS, but for the columns of its input: RecordScheme); the
    native columns when it was also decoded natively, with `pair_speedup` (the speedup of its
    timed pair of passes, prefills included) as `speedup`."""
    n = len(res.tokens)
    spec = res.mode == "speculative"
    row: dict[str, Any] = {
        "record_id": job.label, "sample": job.sample, "prompt_len": len(job.prompt),
        "new_tokens": n, "mode": res.mode, "drafter": drafter, "gamma": gamma if spec else None,
        "rounds": res.rounds if spec else None, "tau": _round(res.tau),
        "acceptance_rate": _round(res.acceptance_rate), "wall_s": _round(res.wall_s),
        "tokens_per_s": _round(per_s(n, res.decode_s), 2),
        "native_wall_s": None, "native_tokens_per_s": None, "speedup": None,
        "rule": rule, "verified_positions": res.verified, "efficiency": _round(res.efficiency),
        "decode_s": _round(res.decode_s), "prefill_s": _round(res.prefill_s), "batch": batch,
        "branch_rows": res.branch_rows if spec else None,
        "branch_wins": res.branch_wins if spec else None,
    }
    if native is not None:
        row["native_wall_s"] = _round(native.wall_s)
        row["native_tokens_per_s"] = _round(per_s(len(native.tokens), native.decode_s), 2)
        row["speedup"] = _round(pair_speedup, 3)
    return row
