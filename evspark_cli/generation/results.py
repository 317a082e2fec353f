"""What a finished job gives back: its tokens and text, and its row of the stats file.

Per-job timings in a batched run: `wall_s` is the job's latency, from the start of its prefill
(or of its fork from a shared prefill) to its last token, while it shared the batch with other
rows; `tokens_per_s` is its tokens over that latency. The run's own throughput is
`RunSummary.tokens_per_s` (generation/run.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..decode.jobs import DecodeResult, Job

STATS_COLUMNS = ["record_id", "sample", "prompt_len", "new_tokens", "mode", "drafter", "gamma",
                 "rounds", "tau", "acceptance_rate", "wall_s", "tokens_per_s", "native_wall_s",
                 "native_tokens_per_s", "speedup"]


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


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def make_stats(job: Job, res: DecodeResult, drafter: str, gamma: int,
               native: DecodeResult | None) -> dict[str, Any]:
    """A job's stats row (STATS_COLUMNS); the native columns when it was also decoded
    natively."""
    n = len(res.tokens)
    spec = res.mode == "speculative"
    row: dict[str, Any] = {
        "record_id": job.label, "sample": job.sample, "prompt_len": len(job.prompt),
        "new_tokens": n, "mode": res.mode, "drafter": drafter, "gamma": gamma if spec else None,
        "rounds": res.rounds if spec else None, "tau": _round(res.tau),
        "acceptance_rate": _round(res.acceptance_rate), "wall_s": _round(res.wall_s),
        "tokens_per_s": _round(n / res.wall_s if res.wall_s > 0 else None, 2),
        "native_wall_s": None, "native_tokens_per_s": None, "speedup": None,
    }
    if native is not None:
        row["native_wall_s"] = _round(native.wall_s)
        row["native_tokens_per_s"] = _round(len(native.tokens) / native.wall_s, 2)
        row["speedup"] = _round(native.wall_s / res.wall_s, 3)
    return row
