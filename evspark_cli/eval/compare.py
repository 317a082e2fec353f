"""Native vs speculative decoding side by side, and the greedy token-by-token comparison.

`side_by_side` is the one loop that runs both decoders on a prompt: `evspark verify`, every
speed section of `evspark bench` and its sweeps go through it, so they all compare the same way.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from ..decode.drafters.base import Drafter, RngKey
from ..decode.jobs import DecodeResult
from ..decode.native import decode_native
from ..decode.sampling import SamplerConfig
from ..decode.speculative import decode_speculative
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
                 track_margins: bool = False, adaptive: bool = False
                 ) -> Iterator[tuple[str, str, DecodeResult, DecodeResult]]:
    """Decode `prompt` natively once, then with each drafter (and each of its rollbacks) right
    after it, from the same random key: yields (drafter name, rollback, native, speculative).

    Each speculative run is compared with the native run of the same prompt measured moments
    before it, warm, in the same process: a speedup is always a ratio measured side by side.
    """
    ids = list(prompt.seq.encode())
    nat = decode_native(model, ids, new_tokens, sampler, key, prompt.id,
                        track_margins=track_margins)
    for name, d in drafters.items():
        for rb in rollbacks(name):
            spec = decode_speculative(model, ids, new_tokens, sampler, d, gamma, key, rb,
                                      prompt.id, adaptive=adaptive)
            yield name, rb, nat, spec


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
