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
native step, which is how the tail of a generation ends.
"""
from __future__ import annotations

import time

import torch

from ..model.model import StripedHyena
from .acceptance import decide
from .drafters.base import DraftContext, Drafter, RngKey
from .native import DecodeResult, Prefilled, all_finite, check_finite, start
from .sampling import Purpose, SamplerConfig, sample_from_probs, sampler_probs

ROLLBACKS = ("slice", "replay")


@torch.inference_mode()
def decode_speculative(model: StripedHyena, prompt: list[int], max_new_tokens: int,
                       sampler: SamplerConfig, drafter: Drafter, gamma: int,
                       rng: RngKey | None = None, rollback: str = "slice", label: str = "",
                       hidden_prefix: int = 0, prefilled: Prefilled | None = None) -> DecodeResult:
    """Generate `max_new_tokens` tokens with `drafter`; the output has the target's distribution."""
    if rollback not in ROLLBACKS:
        raise ValueError(f"rollback must be one of {ROLLBACKS}")
    rng = rng or RngKey()
    t_start = time.perf_counter()
    if prefilled is not None:
        state, anchor, prefill_hidden = prefilled.begin(hidden_prefix)
    else:
        state, anchor, prefill_hidden = start(model, prompt, reserve=max_new_tokens + gamma + 16,
                                              keep_hidden=hidden_prefix)
    prefill_s = time.perf_counter() - t_start
    drafter.begin(DraftContext(model, list(prompt), sampler, rng, prefill_hidden))
    res = DecodeResult([], 0.0, "speculative", position_accepts=[0] * gamma,
                       position_trials=[0] * gamma, prefill_s=prefill_s)
    out = res.tokens
    dev = model.device
    while len(out) < max_new_tokens:
        g = min(gamma, max_new_tokens - len(out) - 1)
        t0 = time.perf_counter()
        prop = drafter.propose(state, anchor, g) if g > 0 else None
        t1 = time.perf_counter()
        drafts = prop.drafts if prop is not None else torch.zeros(0, dtype=torch.long)
        ids = torch.cat([torch.tensor([anchor]), drafts.cpu()]).to(dev)  # drafts: any device
        snapshot = state.clone() if rollback == "replay" else None
        logits, hidden, block = model.extend(state, ids[None])
        p = sampler_probs(logits[0], sampler)
        a = state.seqlen  # absolute position of the anchor; d_k sits at a + k
        if g > 0:
            assert prop is not None
            u_acc = rng.u(range(a + 1, a + g + 1), Purpose.ACCEPT)
            n, dist = decide(p, prop.q.to(p.device), drafts.to(p.device), u_acc)
            m = int(n)
        else:
            m, dist = 0, p[0]
        used = logits[0, : m + 1]  # rows after the first rejection never matter, as in native decoding
        if not all_finite(used):
            bad = int((~torch.isfinite(used).all(dim=-1)).nonzero()[0])
            check_finite(used[bad], a + 1 + bad, label)
        # the bonus token is a plain draw from p̃ (SAMPLE stream); a correction has its own stream
        u_next = rng.u(a + m + 1, Purpose.SAMPLE if m == g else Purpose.RESIDUAL)
        next_token = int(sample_from_probs(dist, u_next))
        if snapshot is None:
            state = block.commit(m + 1)
        else:
            _, _, replay = model.extend(snapshot, ids[None, : m + 1])
            state = replay.commit(m + 1)
        t2 = time.perf_counter()
        drafter.observe(ids[: m + 1].tolist(), hidden[0, : m + 1])
        out.extend(drafts[:m].tolist())
        out.append(next_token)
        anchor = next_token
        res.rounds += 1
        res.accepted.append(m)
        res.proposed.append(g)
        for k in range(g):
            res.position_trials[k] += k <= m
            res.position_accepts[k] += k < m
        res.draft_s += t1 - t0
        res.verify_s += t2 - t1
        res.progress.append((len(out), time.perf_counter() - t_start))
    res.wall_s = time.perf_counter() - t_start
    return res

