"""The k-mer drafter: next-base counts of orders 1..k from the prompt and the output so far.

No training. Each order's counts are interpolated with the next lower order (Witten-Bell style
weights), so an unseen long context falls back smoothly. Its logits go through the same sampler
transform as the target's, which makes q well defined for greedy and sampled decoding alike.
Each row keeps its own counts (a Python table; drafting is per row).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

from ...alphabet import BASE_IDS
from ...model.state import InferenceState
from .base import DraftContext, ListRows, Proposal, draw_on_alphabet, pad_proposal

_INDEX = {b: i for i, b in enumerate(BASE_IDS)}


class KmerDrafter:
    name = "kmer"
    prefix_len = 0
    gamma_limit: int | None = None
    scores_paths = False  # its drafts do not come from a per-slot table (no token trees)

    def __init__(self, order: int = 8, vocab: int = 512) -> None:
        self.order = order
        self.vocab = vocab

    def rows(self, contexts: Sequence[DraftContext]) -> "KmerRows":
        return KmerRows([KmerTable(c, self.order) for c in contexts], self.vocab)


class KmerTable:
    """One row's counts: next base after every context of length 0..order seen so far."""

    def __init__(self, ctx: DraftContext, order: int) -> None:
        self.ctx = ctx
        self.order = order
        self.counts: list[dict[tuple[int, ...], list[int]]] = [dict() for _ in range(order + 1)]
        self.history: list[int] = []
        for t in ctx.prompt[:-1]:  # the last prompt token is the first anchor, fed later
            self.push(t)

    def push(self, tok: int) -> None:
        """Count tok after every context of length 0..order that ends at the current history."""
        b = _INDEX.get(tok)
        if b is not None:
            h = self.history
            for o in range(0, min(self.order, len(h)) + 1):
                key = tuple(h[len(h) - o:]) if o else ()
                row = self.counts[o].get(key)
                if row is None:
                    row = self.counts[o][key] = [0, 0, 0, 0]
                row[b] += 1
        self.history.append(tok)

    def probs(self, history: list[int]) -> list[float]:
        """Interpolated next-base probabilities over A, C, G, T."""
        p = [0.25, 0.25, 0.25, 0.25]
        for o in range(0, min(self.order, len(history)) + 1):
            key = tuple(history[len(history) - o:]) if o else ()
            row = self.counts[o].get(key)
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

    def draft(self, anchor: int, position: int, gamma: int, vocab: int, alphabet: Tensor
              ) -> tuple[list[int], list[Tensor]]:
        hist = self.history + [anchor]
        drafts, qs = [], []
        for k in range(gamma):
            tok, q = draw_on_alphabet(self.logits(hist), alphabet, self.ctx.sampler, self.ctx.rng,
                                      position + 1 + k, vocab)
            drafts.append(tok)
            qs.append(q)
            hist.append(tok)
        return drafts, qs


class KmerRows(ListRows[KmerTable]):
    def __init__(self, items: list[KmerTable], vocab: int) -> None:
        super().__init__(items)
        self.vocab = vocab
        self.alphabet = torch.tensor(BASE_IDS)

    def propose(self, state: InferenceState, anchors: Sequence[int], gammas: Sequence[int]
                ) -> Proposal:
        rows = [t.draft(a, n, g, self.vocab, self.alphabet)
                for t, a, n, g in zip(self.items, anchors, state.lengths, gammas)]
        return pad_proposal(rows, self.vocab, "cpu")

    def observe(self, fed: Tensor, hidden: Tensor, counts: Sequence[int]) -> None:
        for t, row, n in zip(self.items, fed.tolist(), counts):
            for tok in row[:n]:
                t.push(tok)
