"""`evspark verify`: greedy native and greedy speculative decoding, compared token by token.

A divergence where the native top-1/top-2 logit gap is under the tie tolerance is a tie (both
paths chose within floating-point noise); any other divergence means the engine is not lossless.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..api import DecodeOptions, drafter_name, record_key
from ..decode.drafters.base import Drafter, RngKey
from ..decode.sampling import SamplerConfig
from ..errors import InputError, SettingError
from ..io.fasta import Prompt
from ..model.model import StripedHyena
from .compare import compare_greedy, default_tie_tolerance, side_by_side

GREEDY = SamplerConfig(1.0, 1, 1.0)


@dataclass(frozen=True)
class VerifyOptions:
    """Tokens per prompt, draft length and rollback (`decode`, greedy), and the tie tolerance
    (None: `default_tie_tolerance` of the model's dtype); checked when built."""

    decode: DecodeOptions
    tie_tolerance: float | None = None

    def __post_init__(self) -> None:
        t = self.tie_tolerance
        if t is not None and not t >= 0:
            raise SettingError.of("tie_tolerance", f"must be >= 0, got {t}")


@dataclass
class VerifyResult:
    drafter: str
    gamma: int
    tie_tolerance: float
    rows: list[dict[str, Any]]

    @property
    def ties(self) -> int:
        return sum(1 for r in self.rows if r["divergence"] is not None and r["tie"])

    @property
    def non_tie_divergences(self) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["divergence"] is not None and not r["tie"]]

    def table(self) -> list[str]:
        """The printed report: one line per prompt, then a summary line."""
        w = max([24] + [len(r["record_id"]) for r in self.rows])  # whole ids: they name records
        lines = [f"{'record':<{w}} {'compared':>8} {'first_divergence':>16} {'tie':>5} "
                 f"{'tau':>6} {'speedup':>7}"]
        for r in self.rows:
            div = "-" if r["divergence"] is None else str(r["divergence"])
            tie = "-" if r["divergence"] is None else ("yes" if r["tie"] else "NO")
            lines.append(f"{r['record_id']:<{w}} {r['compared']:>8} {div:>16} {tie:>5} "
                         f"{r['tau']:>6.2f} {r['speedup']:>7.2f}")
        identical = sum(1 for r in self.rows if r["divergence"] is None)
        lines.append(f"drafter={self.drafter} gamma={self.gamma} prompts={len(self.rows)} "
                     f"identical={identical} ties={self.ties} "
                     f"non_tie_divergences={len(self.non_tie_divergences)}")
        return lines

    def report(self) -> dict[str, Any]:
        """The JSON report (`--report`)."""
        return {"drafter": self.drafter, "gamma": self.gamma,
                "tie_tolerance": self.tie_tolerance, "rows": self.rows}


def verify_prompts(model: StripedHyena, prompts: Sequence[Prompt], drafter: Drafter | None,
                   options: VerifyOptions,
                   on_prompt: Callable[[dict[str, Any]], None] | None = None) -> VerifyResult:
    """Greedy native vs greedy speculative decoding of every prompt, compared token by token."""
    if drafter is None:
        raise InputError("verify needs a drafter (not 'none')")
    tol = options.tie_tolerance
    if tol is None:
        tol = default_tie_tolerance(next(model.parameters()).dtype)
    opts = options.decode
    rows = []
    for p in prompts:
        key = RngKey(0, record_key(p.id), 0)
        for _, _, nat, spec in side_by_side(model, p, opts.max_new_tokens, GREEDY, key,
                                            {"d": drafter}, opts.gamma,
                                            lambda _: (opts.rollback,), track_margins=True):
            rows.append(compare_greedy(p.id, nat, spec, tol))
            if on_prompt is not None:
                on_prompt(rows[-1])
    return VerifyResult(drafter_name(drafter), opts.gamma, tol, rows)
