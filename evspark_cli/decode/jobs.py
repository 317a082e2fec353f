"""What the decoder is given and gives back: jobs, their results, and the rules that size a row.

A `Job` is one sequence to generate (built by `generation.jobs.build_jobs`, the one job
builder); an `Outcome` is its `DecodeResult` or the error that ended it. A round never drafts past
a job's last token (`largest_draft`), and a row reserves its KV positions once for the whole job
(`row_reserve`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .drafters.base import RngKey


@dataclass
class DecodeResult:
    tokens: list[int]
    wall_s: float  # from the start of the row's prefill (or fork) to its last token
    mode: str  # "native" or "speculative"
    rounds: int = 0
    accepted: list[int] = field(default_factory=list)  # drafts accepted per round
    proposed: list[int] = field(default_factory=list)  # drafts proposed per round
    verified: int = 0  # positions of the verification blocks this row took part in (padding too)
    draft_s: float = 0.0  # time of the drafting of the rounds this row took part in
    verify_s: float = 0.0  # time of those rounds' verification and commit
    margins: list[float] = field(default_factory=list)  # native top1 - top2 logit gap per token
    position_accepts: list[int] = field(default_factory=list)  # per draft slot: times accepted
    position_trials: list[int] = field(default_factory=list)  # per draft slot: times reached
    prefill_s: float = 0.0  # time spent in the prompt's prefill (inside wall_s; 0 for a fork)
    decode_s: float = 0.0  # its share of the rounds it took part in (each round's time split
    #                        evenly among the round's rows): its rows' shares add up to the
    #                        run's decoding time, so tokens / decode_s is one definition of
    #                        decoding tokens/s for a row, a batch and a run (docs/cli.md)
    progress: list[tuple[int, float]] = field(default_factory=list)  # (tokens so far, seconds)
    branch_rows: int = 0  # branch rows (token trees) summed over the rounds this row took part in
    branch_wins: int = 0  # rounds whose tokens came from a branch row, not the row's own drafts

    @property
    def tau(self) -> float | None:
        """Committed tokens per round, bonus/correction token included."""
        return (sum(self.accepted) + self.rounds) / self.rounds if self.rounds else None

    @property
    def acceptance_rate(self) -> float | None:
        return sum(self.accepted) / sum(self.proposed) if sum(self.proposed) else None

    @property
    def efficiency(self) -> float | None:
        """Committed tokens over verified positions: the share of the verification compute
        spent on tokens that were kept (1 for native decoding, whose blocks are one token)."""
        return len(self.tokens) / self.verified if self.verified else None


KV_SLACK = 16
"""KV positions a row reserves beyond its prompt, its tokens and one block: rounds never write
past them, so a row's caches are sized once (docs/batching.md)."""


def largest_draft(gamma: int, remaining: int) -> int:
    """The most drafts a round proposes when `remaining` tokens are still asked: a round never
    drafts past a job's last token (its bonus token is that last one)."""
    return max(0, min(gamma, remaining - 1))


def row_reserve(max_new_tokens: int, draft: int) -> int:
    """KV positions a row needs past its prompt: its tokens, the largest block's drafts and
    the slack."""
    return max_new_tokens + draft + KV_SLACK


@dataclass(frozen=True)
class Job:
    """One sequence to generate: a prompt, how many tokens, and its random-number key. Jobs
    with the same prompt and record key (consecutive in the job list: a record's samples)
    share one prefill. Built by `generation.jobs.build_jobs`, the one job builder."""

    index: int  # place in the input order
    prompt: tuple[int, ...]
    max_new_tokens: int
    rng: RngKey
    label: str = ""  # the job's output id (messages, stats): record, then `_s{i}` if sampled
    record: str = ""  # the base of the output ids of the record it continues
    sample: int = 0


@dataclass
class Outcome:
    """A finished job: its result, or the error that ended it (the other jobs go on)."""

    job: Job
    result: DecodeResult | None = None
    error: Exception | None = None


@dataclass
class RoundReport:
    """What one round did (for progress displays)."""

    tokens: int  # tokens emitted by all rows
    rows: int
    accepted: int  # drafts accepted
    proposed: int  # drafts proposed
    seconds: float = 0.0  # the round's time (its rows' `decode_s` shares add up to it)
