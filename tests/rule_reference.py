"""The round's rule as textbooks state it, for the tests: a verdict per round from the engine's
`decide` plus one draw (sampled), and the plain greedy rule written independently (argmax
matching), which sampling's greedy limit must reproduce."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from evspark_cli.decode.acceptance import decide
from evspark_cli.decode.sampling import argmax_lowest, sample_from_probs


@dataclass
class Verdict:
    """A round's outcome: drafts[:n_accepted] are committed, then next_token.

    accepted_mask[k] is True for the committed drafts (a prefix: k < n_accepted); next_token is
    the correction at the first rejection or the bonus token when all drafts were accepted.
    """

    n_accepted: int
    next_token: int
    accepted_mask: list[bool]

    def tokens(self, drafts: Tensor | list[int]) -> list[int]:
        """The tokens this round emits, in order (n_accepted + 1 of them)."""
        head = drafts[: self.n_accepted]
        return [int(t) for t in head] + [self.next_token]


def _leading_true(flags: Tensor) -> Tensor:
    """Number of leading True values of a 1-d bool tensor (0-d long, stays on device)."""
    return flags.to(torch.int64).cumprod(dim=0).sum()


def _row(x: Tensor, index: Tensor) -> Tensor:
    """x[index] for a 0-d index tensor, without a device→host sync."""
    return x.index_select(0, index.reshape(1)).squeeze(0)


def _verdict(n: Tensor, token: Tensor, gamma: int) -> Verdict:
    n_accepted, next_token = torch.stack([n, token.to(torch.int64)]).tolist()
    return Verdict(n_accepted, next_token, [k < n_accepted for k in range(gamma)])


def accept_sampled(
    p: Tensor, q: Tensor, drafts: Tensor, u_accept: Tensor, u_next: float | Tensor
) -> Verdict:
    """Verify a sampled draft block losslessly.

    p: [γ+1, V] target sampler probabilities (p̃ at each draft position plus one more);
    q: [γ, V] the exact distributions the drafts were drawn from; u_accept: [γ] uniforms for the
    accept tests; u_next: the uniform for the correction or bonus draw.
    """
    n, dist = decide(p, q, drafts, u_accept)
    return _verdict(n, sample_from_probs(dist, u_next), drafts.shape[0])


def accept_greedy(target: Tensor, drafts: Tensor) -> Verdict:
    """Verify a block under greedy decoding: accept while d_k = argmax of target row k.

    target: [γ+1, V] logits or greedy probabilities (same argmax, lowest index on ties). The next
    token is the argmax at the first mismatch, or at row γ (bonus) when all drafts match.
    """
    if drafts.dim() != 1 or drafts.is_floating_point():
        raise ValueError("drafts must be a 1-d integer tensor")
    gamma = drafts.shape[0]
    if target.dim() != 2 or target.shape[0] != gamma + 1:
        raise ValueError(f"target must have shape [γ+1, V] = [{gamma + 1}, V], "
                         f"got {tuple(target.shape)}")
    best = argmax_lowest(target)
    n = _leading_true(drafts.to(torch.int64) == best[:gamma])
    return _verdict(n, _row(best, n), gamma)
