"""Plain autoregressive decoding: the reference everything is checked against.

Both decoders start the same way: the prompt except its last token is prefilled, and that last
token becomes the *anchor* — the newest token not yet fed to the model. A native step feeds the
anchor, samples the next token from p̃ with the SAMPLE stream at its absolute position, and makes
it the new anchor. (A speculative round feeds the anchor plus gamma drafts instead.) Both are the
batched decoder's round (`batch.py`); this module runs one prompt through it.
"""
from __future__ import annotations

from ..model.model import StripedHyena
from .batch import (
    BatchDecoder,
    DecodeResult,
    Job,
    Prefilled,
    all_finite,
    prefill_prompt,
    run_one,
    start,
)
from .drafters.base import RngKey
from .sampling import SamplerConfig

__all__ = ["DecodeResult", "Prefilled", "all_finite", "decode_native", "prefill_prompt",
           "start"]


def decode_native(model: StripedHyena, prompt: list[int], max_new_tokens: int,
                  sampler: SamplerConfig, rng: RngKey | None = None, label: str = "",
                  track_margins: bool = False, prefilled: Prefilled | None = None) -> DecodeResult:
    """Generate `max_new_tokens` tokens one `extend(k=1)` at a time (after `prefilled` if given)."""
    decoder = BatchDecoder(model, sampler, None, 0, track_margins=track_margins)
    return run_one(decoder, Job(0, tuple(prompt), max_new_tokens, rng or RngKey(), label),
                   prefilled)
