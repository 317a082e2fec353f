"""The k-mer drafter: next-base counts of orders 1..k from the prompt and the output so far.

No training. Each order's counts are interpolated with the next lower order (Witten-Bell style
weights), so an unseen long context falls back smoothly. Its logits go through the same sampler
transform as the target's, which makes q well defined for greedy and sampled decoding alike.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ...model.state import InferenceState
from ..sampling import Purpose
from .base import DraftContext, Proposal, draw_on_alphabet

BASES = (65, 67, 71, 84)  # A C G T
_INDEX = {b: i for i, b in enumerate(BASES)}


class KmerDrafter:
    name = "kmer"
    prefix_len = 0

    def __init__(self, order: int = 8, vocab: int = 512) -> None:
        self.order = order
        self.vocab = vocab
        self.base_ids = torch.tensor(BASES)

    def begin(self, ctx: DraftContext) -> None:
        self.ctx = ctx
        self.counts: list[dict[tuple[int, ...], list[int]]] = [dict() for _ in range(self.order + 1)]
        self.history: list[int] = []
        for t in ctx.prompt[:-1]:  # the last prompt token is the first anchor, fed later
            self._push(t)

    def _push(self, tok: int) -> None:
        """Count tok after every context of length 0..order that ends at the current history."""
        b = _INDEX.get(tok)
        if b is not None:
            h = self.history
            for o in range(0, min(self.order, len(h)) + 1):
                ctx = tuple(h[len(h) - o:]) if o else ()
                row = self.counts[o].get(ctx)
                if row is None:
                    row = self.counts[o][ctx] = [0, 0, 0, 0]
                row[b] += 1
        self.history.append(tok)

    def probs(self, history: list[int]) -> list[float]:
        """Interpolated next-base probabilities over A, C, G, T."""
        p = [0.25, 0.25, 0.25, 0.25]
        for o in range(0, min(self.order, len(history)) + 1):
            ctx = tuple(history[len(history) - o:]) if o else ()
            row = self.counts[o].get(ctx)
            if row is None:
                break
            n = sum(row)
            distinct = sum(1 for c in row if c)
            lam = n / (n + distinct)
            p = [lam * c / n + (1 - lam) * pp for c, pp in zip(row, p)]
        return p

    def logits(self, history: list[int]) -> Tensor:
        """Log-probabilities over A, C, G, T (the drafter never proposes other tokens)."""
        return torch.tensor([math.log(max(x, 1e-12)) for x in self.probs(history)])

    def propose(self, state: InferenceState, anchor: int, gamma: int) -> Proposal:
        cfg, rng = self.ctx.sampler, self.ctx.rng
        hist = self.history + [anchor]
        drafts, qs = [], []
        u = rng.u(range(state.seqlen + 1, state.seqlen + gamma + 1), Purpose.DRAFT)
        for k in range(gamma):
            tok, q = draw_on_alphabet(self.logits(hist), self.base_ids, cfg, u[k], self.vocab)
            drafts.append(tok)
            qs.append(q)
            hist.append(tok)
        return Proposal(torch.tensor(drafts, dtype=torch.long), torch.stack(qs))

    def observe(self, tokens: list[int], hidden: Tensor) -> None:
        for t in tokens:
            self._push(t)
