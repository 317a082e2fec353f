"""The lossless rule: exact enumeration in fp64, a deliberately broken rule, Monte Carlo, greedy.

Exact enumeration drives the real `decide` (accept tests + residual): for every draft path with
positive q-probability and every accept/reject cell of the uniforms (first rejection at m, cell
length = acceptance probability), it calls `decide` with a u inside that cell and takes the
next-token distribution it returns. The round's tokens are completed with target samples to
γ+1 tokens; the resulting joint must equal the target's product of conditionals to 1e-12.
"""
from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Callable
from functools import lru_cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rule_reference import Verdict, accept_greedy, accept_sampled

from evspark_cli.decode.acceptance import decide, residual
from evspark_cli.decode.sampling import SamplerConfig, sample_from_probs, sampler_probs

F64 = torch.float64
LAST_U = 1.0 - 2.0**-53
NUCLEOTIDES = (65, 67, 71, 84)  # A C G T byte ids in the 512-id vocabulary

Prefix = tuple[int, ...]
Cond = Callable[[Prefix], torch.Tensor]  # prefix -> fp64 [V] conditional
Rule = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                tuple[torch.Tensor, torch.Tensor]]


# -------------------------------------------------------------------------- prefix-dependent tables


def _generator(*keys: int) -> torch.Generator:
    return torch.Generator().manual_seed(hash(keys) & ((1 << 62) - 1))


def _embed(small: torch.Tensor, vocab: int) -> torch.Tensor:
    """Place a 4-entry row on the nucleotide ids when the vocabulary is 512."""
    if vocab == 4:
        return small
    row = torch.zeros(vocab, dtype=F64)
    row[list(NUCLEOTIDES)] = small
    return row


def _small_target(kind: str, gen: torch.Generator) -> torch.Tensor:
    logits = torch.randn(4, generator=gen, dtype=F64) * 1.5
    if kind == "dense":
        return torch.softmax(logits, -1)
    if kind == "topk":  # Evo 2-style truncation: zeros in p̃
        return sampler_probs(logits, SamplerConfig(temperature=0.8, top_k=2))
    if kind == "topp":
        return sampler_probs(logits, SamplerConfig(temperature=1.5, top_k=3, top_p=0.9))
    if kind == "onehot":  # the greedy sampler
        return sampler_probs(logits, SamplerConfig(top_k=1))
    raise ValueError(kind)


def _small_draft(kind: str, p: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    if kind == "dense":
        return torch.softmax(torch.randn(4, generator=gen, dtype=F64) * 1.5, -1)
    if kind == "sparse":  # zeros where p may be > 0
        w = torch.rand(4, generator=gen, dtype=F64)
        w[torch.randperm(4, generator=gen)[:2]] = 0.0
        return w / w.sum()
    if kind == "equal":
        return p.clone()
    if kind == "onehot":  # a deterministic drafter
        return torch.nn.functional.one_hot(torch.randint(4, (), generator=gen), 4).to(F64)
    if kind == "near":  # p and q differ by 1e-9 on two entries
        q = p.clone()
        i, j = torch.randperm(4, generator=gen)[:2].tolist()
        eps = min(1e-9, float(q[j]))
        q[i] += eps
        q[j] -= eps
        return q
    raise ValueError(kind)


_MIXED_TARGET = ("dense", "topk", "topp", "onehot")
_MIXED_DRAFT = ("dense", "sparse", "equal", "onehot", "near")


def make_tables(target_kind: str, draft_kind: str, vocab: int, seed: int) -> tuple[Cond, Cond]:
    """Target p̃(·|prefix) and drafter q(·|prefix), both depending on the whole prefix."""

    @lru_cache(maxsize=None)
    def target(prefix: Prefix) -> torch.Tensor:
        gen = _generator(seed, 1, *prefix)
        kind = target_kind
        if kind == "mixed":
            kind = _MIXED_TARGET[int(torch.randint(4, (), generator=gen))]
        return _embed(_small_target(kind, gen), vocab)

    @lru_cache(maxsize=None)
    def draft(prefix: Prefix) -> torch.Tensor:
        gen = _generator(seed, 2, *prefix)
        kind = draft_kind
        if kind == "mixed":
            kind = _MIXED_DRAFT[int(torch.randint(5, (), generator=gen))]
        p_small = target(prefix)[list(NUCLEOTIDES)] if vocab == 512 else target(prefix)
        return _embed(_small_draft(kind, p_small, gen), vocab)

    return target, draft


def _nonzero(row: torch.Tensor) -> list[tuple[int, float]]:
    return [(i, float(row[i])) for i in torch.nonzero(row > 0).flatten().tolist()]


# --------------------------------------------------------------------------- exact enumeration


def draft_paths(draft: Cond, prefix: Prefix, gamma: int) -> list[tuple[Prefix, float]]:
    """Every draft block with positive probability under q, with that probability."""
    paths: list[tuple[Prefix, float]] = [((), 1.0)]
    for _ in range(gamma):
        paths = [(path + (d, ), w * qd) for path, w in paths
                 for d, qd in _nonzero(draft(prefix + path))]
    return paths


def round_distribution(target: Cond, draft: Cond, prefix: Prefix, gamma: int,
                       rule: Rule = decide) -> dict[Prefix, float]:
    """Exact distribution of the tokens one round emits, by driving `rule` through every cell."""
    out: dict[Prefix, float] = defaultdict(float)
    for path, weight in draft_paths(draft, prefix, gamma):
        p = torch.stack([target(prefix + path[:k]) for k in range(gamma + 1)])
        q = torch.stack([draft(prefix + path[:k]) for k in range(gamma)]) if gamma else \
            torch.zeros(0, p.shape[-1], dtype=F64)
        alpha = [min(1.0, float(p[k, d]) / float(q[k, d])) for k, d in enumerate(path)]
        for m in range(gamma + 1):
            cell = weight * math.prod(alpha[:m]) * (1.0 - alpha[m] if m < gamma else 1.0)
            if cell == 0.0:
                continue
            u = [a / 2 for a in alpha[:m]] + [(1 + a) / 2 for a in alpha[m:m + 1]]
            u += [0.5] * (gamma - len(u))
            n, dist = rule(p, q, torch.tensor(path, dtype=torch.int64), torch.tensor(u, dtype=F64))
            assert int(n) == m, "the accept test disagrees with u·q < p"
            assert dist.dtype == F64 and abs(float(dist.sum()) - 1.0) < 1e-12
            for y, py in _nonzero(dist):
                out[path[:m] + (y,)] += cell * py
    return out


def complete_with_target(target: Cond, prefix: Prefix, head: dict[Prefix, float],
                         length: int) -> dict[Prefix, float]:
    """Extend each emitted head with target draws up to `length` tokens (later rounds)."""
    joint: dict[Prefix, float] = defaultdict(float)
    stack = list(head.items())
    while stack:
        seq, w = stack.pop()
        if len(seq) >= length:
            joint[seq[:length]] += w
            continue
        stack += [(seq + (y,), w * py) for y, py in _nonzero(target(prefix + seq))]
    return joint


def target_joint(target: Cond, prefix: Prefix, length: int) -> dict[Prefix, float]:
    return complete_with_target(target, prefix, {(): 1.0}, length)


def max_error(a: dict[Prefix, float], b: dict[Prefix, float]) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def speculative_joint(target: Cond, draft: Cond, prefix: Prefix, gamma: int,
                      rule: Rule = decide) -> dict[Prefix, float]:
    head = round_distribution(target, draft, prefix, gamma, rule)
    return complete_with_target(target, prefix, head, gamma + 1)


def resample_from_p(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor,
                    u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A broken rule: after a rejection, draw from p̃ instead of the residual."""
    n, dist = decide(p, q, drafts, u)
    if int(n) < drafts.shape[0]:
        dist = p[int(n)].to(F64)
    return n, dist


SCENARIOS = [
    ("dense", "dense"),
    ("topk", "dense"),    # q proposes tokens p̃ gave zero
    ("dense", "sparse"),  # q has zeros where p̃ > 0
    ("dense", "equal"),   # identity drafter
    ("onehot", "dense"),  # greedy target, stochastic drafter
    ("dense", "near"),    # near-ties: |p − q| = 1e-9
    ("topp", "onehot"),   # deterministic drafter against a truncated target
    ("mixed", "mixed"),   # every kind, varying along the prefix
]


def _start(vocab: int) -> Prefix:
    return (NUCLEOTIDES[2] if vocab == 512 else 2,)


@pytest.mark.parametrize("vocab", [4, 512])
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("kinds", SCENARIOS, ids=["-".join(k) for k in SCENARIOS])
def test_exact_joint_equals_target(kinds: tuple[str, str], gamma: int, vocab: int) -> None:
    for seed in range(3):
        target, draft = make_tables(*kinds, vocab=vocab, seed=seed)
        expected = target_joint(target, _start(vocab), gamma + 1)
        got = speculative_joint(target, draft, _start(vocab), gamma)
        assert abs(sum(got.values()) - 1.0) < 1e-12
        assert set(got) <= set(expected), "emitted a sequence the target cannot produce"
        assert max_error(got, expected) < 1e-12, seed


# how far resampling from p̃ after a rejection is off: (lower bound, upper bound) of the error
BROKEN_ERROR = {
    ("dense", "dense"): (1e-3, 1.0),
    ("topk", "dense"): (1e-3, 1.0),
    ("dense", "sparse"): (1e-3, 1.0),
    ("topp", "onehot"): (1e-3, 1.0),
    ("dense", "near"): (1e-11, 1e-8),  # a 1e-9 perturbation is still far above the 1e-12 bar
    ("dense", "equal"): (0.0, 1e-12),  # q = p̃ never rejects
    ("onehot", "dense"): (0.0, 1e-12),  # greedy target: the residual is p̃ itself
}


@pytest.mark.parametrize("vocab", [4, 512])
@pytest.mark.parametrize("gamma", [1, 2, 3])
def test_broken_rule_fails_the_same_check(gamma: int, vocab: int) -> None:
    for kinds, (low, high) in BROKEN_ERROR.items():
        target, draft = make_tables(*kinds, vocab=vocab, seed=gamma)
        expected = target_joint(target, _start(vocab), gamma + 1)
        broken = speculative_joint(target, draft, _start(vocab), gamma, rule=resample_from_p)
        error = max_error(broken, expected)
        assert low <= error < high, (kinds, error)


def test_enumeration_sees_the_expected_acceptance_rate() -> None:
    # One position: P(accept) must be Σ min(p̃, q) = 1 − TV (also checks the cell weights).
    target, draft = make_tables("dense", "dense", vocab=4, seed=9)
    p, q = target((1,)), draft((1,))
    head = round_distribution(target, draft, (1,), 1)
    accepted = sum(w for seq, w in head.items() if len(seq) == 2)
    assert abs(accepted - float(torch.minimum(p, q).sum())) < 1e-14


# --------------------------------------------------------------------------- Monte Carlo


def _chi2_limit(dof: int, z: float = 4.26) -> float:
    """Wilson–Hilferty upper quantile of χ²(dof); z = 4.26 is p ≈ 1e-5."""
    c = 2.0 / (9.0 * dof)
    return dof * (1.0 - c + z * math.sqrt(c)) ** 3


def _chi2(counts: dict[Prefix, int], probs: dict[Prefix, float], n: int) -> tuple[float, int]:
    stat, cells = 0.0, 0
    for cell, prob in probs.items():
        if prob > 0:
            stat += (counts.get(cell, 0) - n * prob) ** 2 / (n * prob)
            cells += 1
    return stat, cells - 1


@pytest.mark.slow
def test_monte_carlo_accept_sampled() -> None:
    """The real accept_sampled, fp32 p̃ and q as the engine passes them, torch-generator uniforms."""
    gamma, rounds, prefix = 2, 20_000, (1,)
    target64, draft64 = make_tables("mixed", "dense", vocab=4, seed=31)

    def target(s: Prefix) -> torch.Tensor:
        return target64(s).float()

    def draft(s: Prefix) -> torch.Tensor:
        return draft64(s).float()

    @lru_cache(maxsize=None)
    def cumulative(row: tuple[float, ...]) -> list[float]:
        return list(itertools.accumulate(row))

    def draw(row: torch.Tensor, u: float) -> int:
        """Inverse CDF in Python (fast); sample_from_probs is tested on its own."""
        cdf = cumulative(tuple(row.tolist()))
        return min(bisect.bisect_right(cdf, u * cdf[-1]), len(cdf) - 1)

    blocks: dict[Prefix, tuple[torch.Tensor, torch.Tensor]] = {}
    gen = torch.Generator().manual_seed(2026)
    uniforms = torch.rand(rounds, 3 * gamma + 1, generator=gen, dtype=F64).tolist()
    counts: dict[Prefix, int] = defaultdict(int)
    for us in uniforms:
        path: Prefix = ()
        for k in range(gamma):
            path += (draw(draft(prefix + path), us[k]),)
        if path not in blocks:
            blocks[path] = (
                torch.stack([target(prefix + path[:k]) for k in range(gamma + 1)]),
                torch.stack([draft(prefix + path[:k]) for k in range(gamma)]),
            )
        p, q = blocks[path]
        verdict = accept_sampled(p, q, torch.tensor(path), torch.tensor(us[gamma:2 * gamma]),
                                 us[2 * gamma])
        seq = tuple(verdict.tokens(list(path)))
        extra = iter(us[2 * gamma + 1:])
        while len(seq) < gamma + 1:  # later rounds, which are native draws by the exact tests
            seq += (draw(target(prefix + seq), next(extra)),)
        counts[seq] += 1

    exact = target_joint(lambda s: target(s).double(), prefix, gamma + 1)
    assert set(counts) <= {k for k, v in exact.items() if v > 0}
    stat, dof = _chi2(counts, exact, rounds)
    assert stat < _chi2_limit(dof), (stat, dof)
    tvd = 0.5 * sum(abs(counts.get(k, 0) / rounds - v) for k, v in exact.items())
    assert tvd < 0.03, tvd

    # The same sample size would catch the resample-from-p̃ bug.
    broken = speculative_joint(target64, draft64, prefix, gamma, rule=resample_from_p)
    broken_stat, broken_dof = _chi2(counts, broken, rounds)
    assert broken_stat > 3 * _chi2_limit(broken_dof), broken_stat


# --------------------------------------------------------------------------- decision details


def test_accept_test_is_strict() -> None:
    p = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=F64)
    q = torch.tensor([[0.5, 0.5]], dtype=F64)
    drafts = torch.tensor([0])
    # u·q == p̃ exactly: rejected, and the correction comes from the residual (only token 1).
    at_edge = accept_sampled(p, q, drafts, torch.tensor([0.5], dtype=F64), 0.0)
    assert (at_edge.n_accepted, at_edge.next_token) == (0, 1)
    below = accept_sampled(p, q, drafts, torch.tensor([math.nextafter(0.5, 0.0)], dtype=F64), 0.0)
    assert below.n_accepted == 1 and below.accepted_mask == [True]


def test_zero_target_probability_is_rejected_even_at_u_zero() -> None:
    p = torch.tensor([[0.0, 1.0], [0.5, 0.5]])
    q = torch.tensor([[1.0, 0.0]])
    verdict = accept_sampled(p, q, torch.tensor([0]), torch.zeros(1), 0.3)
    assert (verdict.n_accepted, verdict.next_token) == (0, 1)


def test_identity_drafter_always_accepts() -> None:
    gen = torch.Generator().manual_seed(4)
    for _ in range(50):
        p = sampler_probs(torch.randn(5, 512, generator=gen), SamplerConfig(top_k=4))
        drafts = torch.stack([sample_from_probs(row, float(u)) for row, u in
                              zip(p[:4], torch.rand(4, generator=gen))])
        verdict = accept_sampled(p, p[:4], drafts, torch.full((4,), LAST_U, dtype=F64), 0.5)
        assert verdict.n_accepted == 4
        assert verdict.next_token == int(sample_from_probs(p[4], 0.5))  # the native draw


def test_residual_values_and_fallback() -> None:
    p = torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=F64)
    q = torch.tensor([0.2, 0.5, 0.1, 0.2], dtype=F64)
    assert torch.allclose(residual(p, q), torch.tensor([0.75, 0.0, 0.25, 0.0], dtype=F64),
                          rtol=0, atol=1e-15)
    assert torch.equal(residual(p, p), p)
    # q(0) = inf only removes token 0; a non-finite residual mass falls back to p̃
    assert torch.allclose(residual(p, torch.tensor([float("inf"), 0, 0, 0])),
                          torch.tensor([0.0, 0.6, 0.4, 0.0], dtype=F64), rtol=0, atol=1e-15)
    assert torch.equal(residual(p, torch.tensor([-float("inf"), 0, 0, 0])), p)
    assert torch.equal(residual(p, torch.tensor([float("nan"), 0, 0, 0])), p)
    batched = residual(torch.stack([p, p]), torch.stack([q, p]))
    assert torch.equal(batched[1], p) and torch.allclose(batched[0], residual(p, q))
    assert residual(p.float(), q.float()).dtype == F64


def test_rejection_draws_from_the_residual_with_u_next() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.25] * 4], dtype=F64)
    q = torch.tensor([[0.2, 0.5, 0.1, 0.2]], dtype=F64)
    reject = torch.tensor([0.9], dtype=F64)  # 0.9·0.5 ≥ 0.3
    for u_next, token in [(0.0, 0), (0.74, 0), (0.76, 2), (LAST_U, 2)]:
        verdict = accept_sampled(p, q, torch.tensor([1]), reject, u_next)
        assert (verdict.n_accepted, verdict.next_token) == (0, token), u_next
        assert accept_sampled(p, q, torch.tensor([1]), reject, torch.tensor(u_next)) == verdict


def test_bonus_token_and_empty_block() -> None:
    p = torch.tensor([[0.0, 1.0, 0.0], [0.1, 0.2, 0.7]])
    q = torch.tensor([[0.0, 1.0, 0.0]])
    verdict = accept_sampled(p, q, torch.tensor([1]), torch.tensor([0.99]), 0.5)
    assert verdict == Verdict(1, 2, [True])
    assert verdict.tokens([1]) == [1, 2]
    empty = accept_sampled(p[1:], torch.zeros(0, 3), torch.zeros(0, dtype=torch.int64),
                           torch.zeros(0), 0.05)
    assert empty == Verdict(0, 0, [])


def test_stops_at_first_rejection_even_if_later_drafts_would_pass() -> None:
    p = torch.tensor([[0.5, 0.5], [0.0, 1.0], [1.0, 0.0], [0.5, 0.5]], dtype=F64)
    q = torch.tensor([[0.5, 0.5], [1.0, 0.0], [1.0, 0.0]], dtype=F64)
    verdict = accept_sampled(p, q, torch.tensor([0, 0, 0]), torch.tensor([0.1, 0.1, 0.1]), 0.0)
    assert verdict == Verdict(1, 1, [True, False, False])


def test_shape_errors() -> None:
    p, q = torch.full((3, 4), 0.25), torch.full((2, 4), 0.25)
    with pytest.raises(ValueError):
        accept_sampled(p, q[:1], torch.tensor([0, 1]), torch.zeros(2), 0.0)
    with pytest.raises(ValueError):
        accept_sampled(p[:2], q, torch.tensor([0, 1]), torch.zeros(2), 0.0)
    with pytest.raises(ValueError):
        accept_sampled(p, q, torch.tensor([0, 1]), torch.zeros(3), 0.0)
    with pytest.raises(ValueError):
        accept_sampled(p, q, torch.tensor([0.0, 1.0]), torch.zeros(2), 0.0)
    with pytest.raises(ValueError):
        accept_greedy(p, torch.tensor([0]))


# --------------------------------------------------------------------------- greedy


def test_accept_greedy_examples() -> None:
    nan = float("nan")
    logits = torch.tensor([[0.0, 2.0, 2.0, 1.0],   # argmax 1 (tie with 2)
                           [nan, 0.0, -1.0, 3.0],  # argmax 3 (NaN scrubbed to 0)
                           [5.0, 5.0, 5.0, 5.0]])  # argmax 0
    assert accept_greedy(logits, torch.tensor([1, 3])) == Verdict(2, 0, [True, True])
    assert accept_greedy(logits, torch.tensor([2, 3])) == Verdict(0, 1, [False, False])
    assert accept_greedy(logits, torch.tensor([1, 0])) == Verdict(1, 3, [True, False])
    assert accept_greedy(logits[:1], torch.zeros(0, dtype=torch.int64)) == Verdict(0, 1, [])


_rows = st.lists(st.integers(-2, 2), min_size=4, max_size=4)


@settings(max_examples=250, deadline=None)
@given(
    st.integers(1, 5),
    st.data(),
    st.sampled_from(["dense", "sparse", "onehot", "onehot_argmax", "equal"]),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_greedy_is_the_limit_of_sampling(gamma: int, data: st.DataObject, q_kind: str,
                                         dtype: torch.dtype) -> None:
    logits = torch.tensor(data.draw(st.lists(_rows, min_size=gamma + 1, max_size=gamma + 1)),
                          dtype=dtype)
    p = sampler_probs(logits, SamplerConfig(temperature=0.0))
    best = p.argmax(-1)
    # drafts: mostly the argmax, so long accepted prefixes happen, sometimes anything
    drafts = torch.tensor([
        data.draw(st.one_of(st.just(int(best[k])), st.integers(0, 3))) for k in range(gamma)
    ])
    seed = data.draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    if q_kind == "dense":
        q = torch.softmax(torch.randn(gamma, 4, generator=gen), -1)
    elif q_kind == "sparse":
        q = torch.rand(gamma, 4, generator=gen) * (torch.rand(gamma, 4, generator=gen) > 0.5)
        q[:, 0] += 1e-3
        q = q / q.sum(-1, keepdim=True)
    elif q_kind == "onehot":
        q = torch.nn.functional.one_hot(drafts, 4).float()
    elif q_kind == "onehot_argmax":  # q(argmax) = 1: the residual is empty, fallback to p̃
        q = torch.nn.functional.one_hot(best[:gamma], 4).float()
    else:
        q = p[:gamma].clone()
    q = q.to(dtype)
    u_choice = st.one_of(st.just(0.0), st.just(LAST_U), st.floats(0.0, 1.0, exclude_max=True))
    u_accept = torch.tensor([data.draw(u_choice) for _ in range(gamma)], dtype=F64)
    u_next = data.draw(u_choice)
    sampled = accept_sampled(p, q, drafts, u_accept, u_next)
    assert sampled == accept_greedy(logits, drafts)
    assert sampled == accept_greedy(p, drafts)


def test_accept_sampled_is_decide_then_draw() -> None:
    gen = torch.Generator().manual_seed(8)
    for _ in range(30):
        p = torch.softmax(torch.randn(4, 6, generator=gen), -1)
        q = torch.softmax(torch.randn(3, 6, generator=gen), -1)
        drafts = torch.randint(6, (3,), generator=gen)
        u = torch.rand(3, generator=gen, dtype=F64)
        u_next = float(torch.rand((), generator=gen))
        n, dist = decide(p, q, drafts, u)
        verdict = accept_sampled(p, q, drafts, u, u_next)
        assert verdict.n_accepted == int(n)
        assert verdict.next_token == int(sample_from_probs(dist, u_next))
        assert verdict.accepted_mask == [k < int(n) for k in range(3)]
