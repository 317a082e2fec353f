"""The identity drafter: the target drafts for itself from a fork of its own state (q = p̃).

Every draft is accepted, so a round costs gamma target steps plus one verification block for
gamma+1 tokens: the measured overhead over native decoding is the price of the speculative
machinery alone. Drafts use the SAMPLE stream at their absolute positions, so a run with this
drafter reproduces native decoding token for token, sampled runs included.
"""
from __future__ import annotations

import torch

from ...model.state import InferenceState
from ..sampling import Purpose, sampler_probs
from .base import DraftContext, Proposal, draw


class IdentityDrafter:
    name = "identity"
    prefix_len = 0

    def begin(self, ctx: DraftContext) -> None:
        self.ctx = ctx

    def propose(self, state: InferenceState, anchor: int, gamma: int) -> Proposal:
        model, cfg, rng = self.ctx.model, self.ctx.sampler, self.ctx.rng
        tok = anchor
        drafts, qs = [], []
        for k in range(gamma):
            logits, _, block = model.extend(state, torch.tensor([[tok]], device=model.device))
            state = block.commit(1)
            q = sampler_probs(logits[0, -1], cfg)
            tok = draw(q, rng.u(state.seqlen, Purpose.SAMPLE))
            drafts.append(tok)
            qs.append(q)
        return Proposal(torch.tensor(drafts, dtype=torch.long), torch.stack(qs))

    def observe(self, tokens: list[int], hidden: torch.Tensor) -> None:
        pass
