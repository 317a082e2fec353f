"""The drafter interface: propose gamma tokens with the exact distributions they came from.

A drafter sees the committed sequence (prompt + emitted tokens), the target's hidden states of
committed positions (taken from the verification pass, no extra target work) and the target's
committed inference state. `propose` must return q[k] = the distribution d_k was drawn from,
in fp32 over the full vocabulary: the acceptance rule is only lossless with the true q.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from ...model.model import StripedHyena
from ...model.state import InferenceState
from ..sampling import Purpose, SamplerConfig, uniform


@dataclass
class RngKey:
    """(seed, record, sample): with a position and a purpose, it keys every random number."""

    seed: int = 0
    record: int = 0
    sample: int = 0

    def u(self, position: int | range | Tensor, purpose: Purpose) -> Tensor:
        return uniform(self.seed, self.record, self.sample, position, int(purpose))


@dataclass
class DraftContext:
    """What a drafter is told at the start of a sequence."""

    model: StripedHyena
    prompt: list[int]
    sampler: SamplerConfig
    rng: RngKey
    prefill_hidden: Tensor | None = None  # (n, layers, D) hidden states of prompt[:-1] (tail)


@dataclass
class Proposal:
    drafts: Tensor  # (gamma,) long
    q: Tensor  # (gamma, V) fp32, q[k] is the distribution drafts[k] was drawn from


class Drafter(Protocol):
    name: str
    prefix_len: int  # hidden states of the last committed positions `begin` needs (0: none)

    def begin(self, ctx: DraftContext) -> None:
        """Start a sequence (reset per-sequence memory)."""

    def propose(self, state: InferenceState, anchor: int, gamma: int) -> Proposal:
        """Draft gamma tokens after `anchor`, whose absolute position is state.seqlen."""

    def observe(self, tokens: list[int], hidden: Tensor) -> None:
        """Committed tokens of the last round (anchor + accepted drafts), with their hidden
        states (len(tokens), layers, D) from the verification pass."""


def draw_on_alphabet(logits: Tensor, alphabet: Tensor, sampler, u: Tensor, vocab: int
                     ) -> tuple[int, Tensor]:
    """Apply the sampler transform to logits over a sorted alphabet and draw one token.

    Equal to transforming the full-vocabulary logits with -inf outside the alphabet (the sampler
    keeps the same tokens and breaks ties by the same, increasing, order), but on a 4-vector.
    Returns (token id, q over the full vocabulary).
    """
    from ..sampling import sample_from_probs, sampler_probs

    q_small = sampler_probs(logits, sampler)
    i = int(sample_from_probs(q_small, u))
    q = torch.zeros(vocab, dtype=q_small.dtype, device=q_small.device)
    q[alphabet] = q_small
    return int(alphabet[i]), q


def draw(probs: Tensor, u: Tensor) -> int:
    """One inverse-CDF draw (ints only; the zero-mass guard lives in sampling.sample_from_probs)."""
    from ..sampling import sample_from_probs

    return int(sample_from_probs(probs, u))

