"""Lossless speculative decoding: draft gamma tokens, verify them in one target block, commit.

A round (anchor = newest emitted token not yet fed to the target):
1. the drafter proposes d_1..d_g with their exact distributions q_1..q_g;
2. the target runs one `extend` over [anchor, d_1..d_g] -> p̃_1..p̃_{g+1};
3. the rule accepts a prefix d_1..d_m and draws one more token x (correction or bonus);
4. rollback: the state after [anchor, d_1..d_m] is `block.commit(m + 1)` — a slice, no
   recomputation ("slice"). The "replay" baseline instead snapshots the state before the block
   and re-feeds the m + 1 committed tokens;
5. x becomes the next anchor.
g is clipped so a round never emits more than the tokens still requested. With g = 0 a round is a
native step, which is how the tail of a generation ends. The round itself is the batched
decoder's (`batch.py`), which runs it for every row of a batch at once; this module runs one
prompt through it.
"""
from __future__ import annotations

from ..model.model import StripedHyena
from .batch import BatchDecoder, run_one
from .drafters.base import Drafter, RngKey
from .jobs import DecodeResult, Job, largest_draft
from .prefill import Prefilled
from .sampling import SamplerConfig

__all__ = ["decode_speculative"]


def decode_speculative(model: StripedHyena, prompt: list[int], max_new_tokens: int,
                       sampler: SamplerConfig, drafter: Drafter, gamma: int,
                       rng: RngKey | None = None, rollback: str = "slice", label: str = "",
                       prefilled: Prefilled | None = None, adaptive: bool = False
                       ) -> DecodeResult:
    """Generate `max_new_tokens` tokens with `drafter`; the output has the target's distribution.
    `adaptive`: the draft length by confidence (decode/schedule.py; greedy or coupled only)."""
    # the drafts a round can use, not a gamma past the tokens asked (the schedule is sized by it)
    decoder = BatchDecoder(model, sampler, drafter, largest_draft(gamma, max_new_tokens),
                           rollback=rollback, adaptive=adaptive)
    return run_one(decoder, Job(0, tuple(prompt), max_new_tokens, rng or RngKey(), label),
                   prefilled)
