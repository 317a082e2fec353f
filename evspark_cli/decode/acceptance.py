"""The lossless acceptance rules: residual (Leviathan et al. 2023; Chen et al. 2023) and coupled.

Coupled (`accepted_matches`): the target realizes its token y_k at every verified position by
Gumbel-max with the position's noise (decode/sampling.py); a draft is accepted iff it equals y_k,
and the round emits y_m at the first mismatch m (y_{γ+1} when all match). Every emitted token is
native sampling's token at that position, so the output is native's, token for token, for any
drafts; greedy is its zero-noise case.

Residual:
One round verifies drafts d_1..d_γ against target sampler distributions p̃_1..p̃_{γ+1}:
accept d_k iff u_k·q_k(d_k) < p̃_k(d_k) (strict, in fp64), stop at the first rejection m and emit a
draw from normalize(max(p̃_m − q_m, 0)) (p̃_m when that has no mass), or, if all γ are accepted,
emit a bonus draw from p̃_{γ+1}. The emitted tokens are then distributed exactly as native
sampling from p̃ (equal in distribution, not sample by sample).

Greedy is sampling's limit: with one-hot p̃ (the greedy sampler) and any q with q(d) ≤ 1, the
rule is the plain greedy one (accept while the draft is the argmax). A draft at the argmax has
p̃(d) = 1 > u·q(d); any other draft has p̃(d) = 0, which no u·q(d) ≥ 0 is below; and the residual
max(onehot − q, 0) is one-hot at the argmax (or empty, falling back to p̃, the same one-hot).
tests/rule_reference.py holds that greedy rule, and the tests hold `decide` to it.
"""
from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["residual", "decide", "decide_rows", "accepted_matches"]


def accepted_matches(targets: Tensor, drafts: Tensor, gammas: list[int]) -> list[int]:
    """The coupled rule's accepted count per row: the leading drafts that equal the target's
    realized tokens. targets (B, ≥G), drafts (B, G); row b drafted gammas[b] tokens (entries
    past them are padding, never accepted)."""
    B, G = drafts.shape
    same = drafts == targets[:, :G].to(drafts.device)
    if gammas.count(G) != B:
        lengths = torch.tensor(gammas, device=drafts.device)[:, None]
        same &= torch.arange(G, device=drafts.device) < lengths
    return same.to(torch.int64).cumprod(dim=-1).sum(dim=-1).tolist()


def residual(p: Tensor, q: Tensor) -> Tensor:
    """normalize(max(p − q, 0)) over the last dim in fp64; p itself where that has no mass.

    The fallback only triggers when rounding produces a rejection although p ≤ q everywhere;
    p (not uniform) keeps such a rare event harmless.
    """
    p64 = p.to(torch.float64)
    r = (p64 - q.to(torch.float64)).clamp(min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    ok = (mass > 0) & torch.isfinite(mass)
    return torch.where(ok, r / torch.where(ok, mass, 1.0), p64)


def _check_block(p: Tensor, q: Tensor, drafts: Tensor, u_accept: Tensor) -> int:
    """γ from the shapes, refusing blocks whose shapes disagree."""
    if drafts.dim() != 1 or drafts.is_floating_point():
        raise ValueError("drafts must be a 1-d integer tensor")
    gamma = drafts.shape[0]
    if p.dim() != 2 or p.shape[0] != gamma + 1:
        raise ValueError(f"p must have shape [γ+1, V] = [{gamma + 1}, V], got {tuple(p.shape)}")
    vocab = p.shape[-1]
    if tuple(q.shape) != (gamma, vocab):
        raise ValueError(f"q must have shape [γ, V] = [{gamma}, {vocab}], got {tuple(q.shape)}")
    if tuple(u_accept.shape) != (gamma,):
        raise ValueError(f"u_accept must have shape [{gamma}], got {tuple(u_accept.shape)}")
    return gamma


def decide(p: Tensor, q: Tensor, drafts: Tensor, u_accept: Tensor) -> tuple[Tensor, Tensor]:
    """The rule without its final draw, for one row: (number accepted m, distribution of the
    next token).

    The distribution is the fp64 residual at the first rejection, or p̃_{γ+1} itself (unmodified,
    so the bonus draw is the native draw) when all γ drafts are accepted. Exposed so tests can
    enumerate the rule exactly; it is `decide_rows` on a batch of one.
    """
    gamma = _check_block(p, q, drafts, u_accept)
    q, drafts, u_accept = q.to(p.device), drafts.to(p.device), u_accept.to(p.device)
    if gamma == 0:
        return torch.zeros((), dtype=torch.int64, device=p.device), p[0].to(torch.float64)
    n, dist = decide_rows(p[None], q[None], drafts[None], u_accept[None], [gamma])
    return n[0], dist[0]


def decide_rows(p: Tensor, q: Tensor, drafts: Tensor, u_accept: Tensor, gammas: list[int]
                ) -> tuple[Tensor, Tensor]:
    """The rule for a batch: row b verified gammas[b] drafts (entries past them are padding).

    p (B, G+1, V) target sampler probabilities, q (B, G, V) the drafts' distributions, drafts
    (B, G), u_accept (B, G) the accept-test uniforms. Returns (m (B,), next-token distributions
    (B, V) fp64): per row exactly what the single-row rule gives for its own block, since every
    quantity is computed per row from that row's entries alone.
    """
    B, G = drafts.shape
    dev = p.device
    q, drafts, u_accept = q.to(dev), drafts.to(dev), u_accept.to(dev)
    g = torch.tensor(gammas, dtype=torch.int64, device=dev)
    rows = torch.arange(B, device=dev)
    # only the drafted entries and one row per batch row are read, so only they are widened to
    # fp64 (the same values as widening all of p and q first)
    idx = drafts.to(torch.int64).unsqueeze(-1)
    p_d = p[:, :G].gather(-1, idx).squeeze(-1).to(torch.float64)
    q_d = q.gather(-1, idx).squeeze(-1).to(torch.float64)
    ok = u_accept.to(torch.float64) * q_d < p_d
    full = gammas.count(G) == B  # every row drafted G tokens: no padding to mask
    if not full:
        ok &= torch.arange(G, device=dev) < g[:, None]
    n = ok.to(torch.int64).cumprod(dim=-1).sum(dim=-1)  # leading accepts, at most gammas[b]
    bonus = (p[:, G] if full else p[rows, g]).to(torch.float64)  # p̃ after a row's drafts
    if dev.type == "cpu" and bool((n == g).all()):  # a free host read: skip the unused residual
        return n, bonus
    m = torch.minimum(n, (g - 1).clamp(min=0))
    qm = q[rows, m] if G else torch.zeros_like(bonus)
    return n, torch.where((n == g)[:, None], bonus, residual(p[rows, m], qm))
