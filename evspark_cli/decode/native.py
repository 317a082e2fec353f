"""Plain autoregressive decoding: the reference everything is checked against.

Both decoders start from the prefilled prompt and its anchor (`prefill.py`). A native step feeds
the anchor, samples the next token from p̃ with the SAMPLE stream at its absolute position, and makes
it the new anchor. (A speculative round feeds the anchor plus gamma drafts instead.) Both are the
batched decoder's round (`batch.py`); this module runs one prompt through it.
"""
from __future__ import annotations

from ..model.model import StripedHyena
from .batch import BatchDecoder, run_one
from .drafters.base import RngKey
from .jobs import DecodeResult, Job
from .prefill import Prefilled
from .sampling import SamplerConfig

__all__ = ["decode_native"]


def decode_native(model: StripedHyena, prompt: list[int], max_new_tokens: int,
                  sampler: SamplerConfig, rng: RngKey | None = None, label: str = "",
                  track_margins: bool = False, prefilled: Prefilled | None = None) -> DecodeResult:
    """Generate `max_new_tokens` tokens one `extend(k=1)` at a time (after `prefilled` if given)."""
    decoder = BatchDecoder(model, sampler, None, 0, track_margins=track_margins)
    return run_one(decoder, Job(0, tuple(prompt), max_new_tokens, rng or RngKey(), label),
                   prefilled)
