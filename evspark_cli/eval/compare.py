"""Native vs speculative decoding side by side, and the greedy token-by-token comparison.

`side_by_side` is the one loop that runs both decoders on a prompt: `evspark verify`, every
speed section of `evspark bench` and its sweeps go through it, so they all compare the same way.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..decode.batch import BatchDecoder, JobList
from ..decode.drafters.base import Drafter, RngKey
from ..decode.interleave import TimedRun, interleave, timed_run
from ..decode.jobs import DecodeResult, Job, largest_draft
from ..decode.prefill import Prefilled
from ..decode.sampling import SamplerConfig
from ..generation.results import speedup
from ..io.types import Prompt
from ..model.model import StripedHyena


def default_tie_tolerance(dtype: torch.dtype) -> float:
    """Logit gap under which a greedy divergence counts as a tie: fp32 noise between a step and
    a block is ~1e-5; bf16 keeps 8 bits of mantissa, so logits near 10 are 0.03-0.06 apart and
    a step and a block, rounded differently through every layer, can differ by ~0.1."""
    return 1e-3 if dtype == torch.float32 else 0.1


def side_by_side(model: StripedHyena, prompt: Prompt, new_tokens: int, sampler: SamplerConfig,
                 key: RngKey, drafters: Mapping[str, Drafter], gamma: int,
                 rollbacks: Callable[[str], Sequence[str]] = lambda name: ("slice",),
                 track_margins: bool = False, adaptive: bool = False,
                 prefilled: Prefilled | None = None
                 ) -> Iterator[tuple[str, str, DecodeResult, DecodeResult]]:
    """Decode `prompt` natively and with each drafter (and each of its rollbacks) from the same
    random key, all at once in turns (decode/interleave.py): yields (drafter name, rollback,
    native, speculative). `prefilled`: every decoder starts from a copy of this prefill of the
    prompt (its time then counted by none of them).

    Each result's `wall_s` is its decoder's own time (prefill included), measured while the
    others waited, so every speedup is a ratio of runs that saw the same machine.
    """
    job = Job(0, tuple(prompt.seq.encode()), new_tokens, key, prompt.id)
    ways = [(name, rb, d) for name, d in drafters.items() for rb in rollbacks(name)]

    def started(dec: BatchDecoder) -> BatchDecoder:
        if prefilled is not None:
            dec.share_prefill(job, prefilled)
        return dec

    def native(clock: Callable[[], float]) -> BatchDecoder:
        return started(BatchDecoder(model, sampler, None, 0, track_margins=track_margins,
                                    clock=clock))

    def drafting(d: Drafter, rb: str) -> Callable[[Callable[[], float]], BatchDecoder]:
        # the drafts a round can use, not a gamma past the tokens asked (the schedule's size)
        return lambda clock: started(BatchDecoder(
            model, sampler, d, largest_draft(gamma, new_tokens), rollback=rb, adaptive=adaptive,
            clock=clock))

    runs = [timed_run(native, JobList(iter([job])))] + [
        timed_run(drafting(d, rb), JobList(iter([job]))) for _, rb, d in ways]
    interleave(runs)
    results = [_result(r) for r in runs]
    for (name, rb, _), spec in zip(ways, results[1:]):
        yield name, rb, results[0], spec


def _result(run: TimedRun) -> DecodeResult:
    """The one job's result (its error raised), its wall time the decoder's own seconds."""
    outcome = run.outcomes[0]
    if outcome.error is not None:
        raise outcome.error
    assert outcome.result is not None
    outcome.result.wall_s = run.seconds
    return outcome.result


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_greedy(record_id: str, native: DecodeResult, spec: DecodeResult,
                   tie_tolerance: float) -> dict[str, Any]:
    """A row of the verify table. A divergence is a tie when the native top-1/top-2 logit gap at
    that position is below `tie_tolerance`: both paths then chose legitimately within fp noise."""
    div = first_divergence(native.tokens, spec.tokens)
    margin = native.margins[div] if div is not None and div < len(native.margins) else None
    return {
        "record_id": record_id,
        "compared": len(native.tokens) if div is None else div + 1,
        "divergence": div,
        "native_margin": margin,
        "tie": bool(div is not None and margin is not None and margin < tie_tolerance),
        "tau": spec.tau or 0.0,
        "native_s": native.wall_s,
        "spec_s": spec.wall_s,
        "speedup": speedup(native.wall_s, len(native.tokens), spec.wall_s, len(spec.tokens)),
    }
