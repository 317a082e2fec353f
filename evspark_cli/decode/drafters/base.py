"""The drafter interface: propose tokens for every row of a batch, with the exact distributions
they came from.

A drafter sees, per row, the committed sequence (prompt + emitted tokens), the target's hidden
states of committed positions (taken from the verification pass, no extra target work) and the
target's committed inference state. `propose` must return q = the distribution each draft was
drawn from, in fp32 over the full vocabulary: the acceptance rule is only lossless with the true
q. A drafter's per-row memory (`DraftRows`) follows the rows of the batch as they come and go:
`place` and `remove` mirror `InferenceState.place` and `InferenceState.remove`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Generic, Protocol, Sequence, TypeVar

import torch
from torch import Tensor

from ...model.model import StripedHyena
from ...model.state import InferenceState
from ..sampling import (
    Purpose,
    SamplerConfig,
    coupled_draw,
    coupled_key,
    coupled_noise,
    sample_from_probs,
    sampler_probs,
    uniform,
    uniform_float,
    uniform_floats,
)
from ..tree import DraftPaths


@dataclass(frozen=True)
class RngKey:
    """(seed, record, sample): with a position and a purpose, it keys every random number."""

    seed: int = 0
    record: int = 0
    sample: int = 0

    def u(self, position: int | range | Tensor, purpose: Purpose) -> Tensor:
        return uniform(self.seed, self.record, self.sample, position, int(purpose))

    def float(self, position: int, purpose: Purpose) -> float:
        """The number `u` gives for one position, as a host float."""
        return uniform_float(self.seed, self.record, self.sample, position, int(purpose))

    def floats(self, positions: range | list[int], purpose: Purpose) -> list[float]:
        """The same numbers as `u` for a few positions, as host floats."""
        return uniform_floats(self.seed, self.record, self.sample, positions, int(purpose))

    @property
    def coupled(self) -> int:
        """This key's coupled-noise hash (`sampling.coupled_noise`)."""
        return coupled_key(self.seed, self.record, self.sample)


@dataclass
class DraftContext:
    """What a drafter is told about one row when it joins a batch."""

    model: StripedHyena
    prompt: list[int]
    sampler: SamplerConfig
    rng: RngKey
    prefill_hidden: Tensor | None = None  # (n, layers, D) hidden states of prompt[:-1] (tail)


@dataclass
class Proposal:
    """Drafts for a batch: row b drafted gammas[b] tokens; entries past them are padding (never
    accepted: the round gives them no accept test)."""

    drafts: Tensor  # (B, G) long, on the host
    q: Tensor  # (B, G, V) fp32: q[b, k] is the distribution drafts[b, k] was drawn from
    paths: DraftPaths | None = None  # every path the drafter could have drafted (token trees);
    #                                  None: a drafter that cannot say (no trees)
    confidence: Tensor | None = None  # (B, G) fp64: under the coupled rule, each draft's
    #   perturbed-score gap (best minus second best, times T), as `sampling.coupled_draw` gives
    #   it for q[b, k] at the draft's position; None: the decoder draws it from q (one more draw)


class DraftRows(Protocol):
    """A drafter's memory of each row of a live batch, in the batch's row order."""

    def propose(self, state: InferenceState, anchors: Sequence[int], gammas: Sequence[int]
                ) -> Proposal:
        """Row b drafts gammas[b] tokens after anchors[b], whose position is state.lengths[b]."""

    def observe(self, fed: Tensor, hidden: Tensor, counts: Sequence[int]) -> None:
        """The round committed the first counts[b] tokens of fed[b] (anchor + accepted drafts);
        hidden (B, k, layers, D) are the target's hidden states from the verification pass."""

    def place(self, slots: Sequence[int], new: "DraftRows") -> None:
        """Rows `slots` now hold `new`'s rows (new sequences joining the batch)."""

    def append(self, new: "DraftRows") -> None:
        """`new`'s rows join after the last row (a batch that had free slots)."""

    def remove(self, row: int) -> None:
        """Row `row` leaves; the last row takes its place (as `InferenceState.remove`)."""


class Drafter(Protocol):
    """A drafter: weights or settings shared by every run, and `rows` for a batch's memory."""

    @property
    def name(self) -> str:
        """The drafter's kind, as run statistics and FASTA headers name it ("kmer", ...)."""

    @property
    def prefix_len(self) -> int:
        """Hidden states of the last prompt positions a row needs when it joins."""

    @property
    def gamma_limit(self) -> int | None:
        """The most drafts one row can propose per round; None when there is no limit."""

    @property
    def scores_paths(self) -> bool:
        """Whether its proposals carry `DraftPaths` (every path it could draft), which token
        trees need (decode/tree.py)."""

    def rows(self, contexts: Sequence[DraftContext]) -> DraftRows:
        """Memory for new rows, one per context (a sequence each)."""


_R = TypeVar("_R")


class ListRows(Generic[_R]):
    """Per-row Python objects kept in batch order (drafters whose memory is not a tensor)."""

    def __init__(self, items: list[_R]) -> None:
        self.items = items

    def place(self, slots: Sequence[int], new: "ListRows[_R]") -> None:  # type: ignore[override]
        for slot, item in zip(slots, new.items):
            self.items[slot] = item

    def append(self, new: "ListRows[_R]") -> None:  # type: ignore[override]
        self.items += new.items

    def remove(self, row: int) -> None:
        last = self.items.pop()
        if row < len(self.items):
            self.items[row] = last


def pad_proposal(rows: list[tuple[list[int], list[Tensor]]], vocab: int, device
                 ) -> Proposal:
    """Per-row drafts and q rows as one padded (B, G) / (B, G, V) proposal."""
    G = max((len(d) for d, _ in rows), default=0)
    drafts = torch.zeros(len(rows), G, dtype=torch.long)
    q = torch.zeros(len(rows), G, vocab, dtype=torch.float32, device=device)
    for b, (d, qs) in enumerate(rows):
        if d:
            drafts[b, : len(d)] = torch.tensor(d, dtype=torch.long)
            q[b, : len(d)] = torch.stack(qs)
    return Proposal(drafts, q)


def alphabet_scores(q: Tensor, alphabet: Tensor, rngs: Sequence[RngKey],
                    positions: Sequence[int]) -> Tensor:
    """The coupled rule's perturbed scores log q + g of drafts over a sorted alphabet: q (N, A)
    holds row i's distribution over the alphabet at positions[i], and g is the noise of the
    alphabet's token ids there (the same numbers the target's draw uses)."""
    keys = torch.tensor([r.coupled for r in rngs], dtype=torch.int64)
    pos = torch.tensor(list(positions), dtype=torch.int64)
    g = coupled_noise(keys, pos, alphabet.to(torch.int64).expand(len(pos), -1)).to(q.device)
    q64 = q.to(torch.float64)
    return torch.where(q64 > 0, torch.log(q64) + g, -math.inf)


def draw_on_alphabet(logits: Tensor, alphabet: Tensor, sampler: SamplerConfig, rng: RngKey,
                     position: int, vocab: int) -> tuple[int, Tensor]:
    """Apply the sampler transform to logits over a sorted alphabet and draw the draft token of
    `position` under the sampler's rule (a DRAFT uniform, or the coupled noise of the alphabet's
    tokens there).

    Equal to transforming the full-vocabulary logits with -inf outside the alphabet (the sampler
    keeps the same tokens and breaks ties by the same, increasing, order), but on a 4-vector.
    Returns (token id, q over the full vocabulary).
    """
    q_small = sampler_probs(logits, sampler)
    if sampler.coupled and not sampler.greedy:
        i = int(torch.argmax(alphabet_scores(q_small[None], alphabet, [rng], [position])[0]))
    else:
        i = int(sample_from_probs(q_small, rng.u(position, Purpose.DRAFT)))
    q = torch.zeros(vocab, dtype=q_small.dtype, device=q_small.device)
    q[alphabet] = q_small
    return int(alphabet[i]), q


def draw(probs: Tensor, rngs: Sequence[RngKey], positions: Sequence[int], sampler: SamplerConfig
         ) -> Tensor:
    """One token per row of p̃ (N, V), row i at positions[i] of rngs[i], as native decoding
    draws it under the sampler's rule: a SAMPLE uniform (residual) or Gumbel-max (coupled)."""
    if sampler.coupled:
        keys = torch.tensor([r.coupled for r in rngs], dtype=torch.int64)
        pos = torch.tensor(list(positions), dtype=torch.int64)
        return coupled_draw(probs, keys, pos, sampler)[0].to(probs.device)
    u = [r.float(n, Purpose.SAMPLE) for r, n in zip(rngs, positions)]
    return sample_from_probs(probs, torch.tensor(u, dtype=torch.float64, device=probs.device))
