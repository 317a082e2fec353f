"""The identity drafter: the target drafts for itself from a fork of its own state (q = p̃).

Every draft is accepted, so a round costs gamma target steps plus one verification block for
gamma+1 tokens: the measured overhead over native decoding is the price of the speculative
machinery alone. Drafts use the SAMPLE stream at their absolute positions, so a run with this
drafter reproduces native decoding token for token, sampled runs included. The steps run on the
whole batch at once; their KV rows are scratch that the verification block overwrites. Under
the coupled rule the drafts are the target's own Gumbel-max draws, under the residual rule its
inverse-CDF draws: native decoding's tokens either way.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from ...model.state import InferenceState
from ..sampling import sampler_probs
from .base import DraftContext, ListRows, Proposal, draw


class IdentityDrafter:
    name = "identity"
    prefix_len = 0
    gamma_limit: int | None = None
    scores_paths = False  # its drafts do not come from a per-slot table (no token trees)

    def rows(self, contexts: Sequence[DraftContext]) -> "IdentityRows":
        return IdentityRows(list(contexts))


class IdentityRows(ListRows[DraftContext]):
    def propose(self, state: InferenceState, anchors: Sequence[int], gammas: Sequence[int]
                ) -> Proposal:
        ctx = self.items[0]
        model, sampler = ctx.model, ctx.sampler
        G, B = max(gammas), len(anchors)
        drafts = torch.zeros(B, G, dtype=torch.long)
        q = torch.zeros(B, G, model.config.vocab_size, dtype=torch.float32, device=model.device)
        tok = torch.tensor(anchors, dtype=torch.long, device=model.device)[:, None]
        for k in range(G):
            logits, _, block = model.extend(state, tok)
            state = block.commit(1)
            qk = sampler_probs(logits[:, -1], sampler)
            tok = draw(qk, [c.rng for c in self.items], state.lengths, sampler)
            drafts[:, k] = tok.cpu()
            q[:, k] = qk
            tok = tok[:, None]
        return Proposal(drafts, q)

    def observe(self, fed: Tensor, hidden: Tensor, counts: Sequence[int]) -> None:
        pass
