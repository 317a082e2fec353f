"""Engine-level losslessness statistics (in the spirit of vLLM's rejection-sampler tests).

Thousands of short sampled continuations are drawn through the public decoders
(`decode_native`, `decode_speculative`) and their joint k-mer counts are compared with a
chi-square test against the *exact* joint distribution of the target's sampler, enumerated from
the model (4 kept tokens per position under top-k 4, so 16 or 64 cells), and two-sample against
native decoding. The correct rule must not be rejected at p = 0.001; a deliberately broken rule
(the correction drawn from p̃ instead of the residual) must be rejected at
p < 0.001 on the same sample size and seeds. Everything is seeded, so the test is deterministic.

scipy is not a dependency: the chi-square survival function is the regularized upper incomplete
gamma function, `torch.special.gammaincc(df/2, x/2)`.
"""
from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig, sampler_probs
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.model.checkpoint import load_model

ALPHA = 1e-3
PROMPT = list(b"ACGTTGCAGCTTAC")  # the k-mer drafter's q is neither uniform nor one-hot here
SAMPLER = SamplerConfig(temperature=1.0, top_k=4, top_p=1.0)  # Evo 2's defaults
N_NATIVE = 1200
N_SPEC = 1500


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from tiny import shared_trained_tiny

    return load_model(shared_trained_tiny(tmp_path_factory))


@pytest.fixture(scope="module")
def random_model(tmp_path_factory):
    from tiny import random_tiny_dir

    return load_model(random_tiny_dir(tmp_path_factory.mktemp("stats_random")))


@pytest.fixture(scope="module")
def cache() -> dict:
    """Samples and exact distributions shared by the tests of this module."""
    return {}


# ----------------------------------------------------------------------------- statistics


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2)."""
    if df <= 0:
        return 1.0
    if math.isinf(x):
        return 0.0
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(x / 2.0, dtype=torch.float64)))


def pool_cells(expected: dict, min_expected: float = 5.0) -> list[list]:
    """Group cells so every group has an expected count >= min_expected.

    Cells below the threshold go into one pool; if the pool itself is still too small, the
    smallest remaining cells join it.
    """
    order = sorted(expected, key=lambda k: expected[k])
    big = [k for k in order if expected[k] >= min_expected]
    pool = [k for k in order if expected[k] < min_expected]
    while pool and sum(expected[k] for k in pool) < min_expected and big:
        pool.append(big.pop(0))
    groups = [[k] for k in big]
    if pool:
        groups.append(pool)
    return groups


def gof_test(counts: Counter, probs: dict, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Chi-square goodness of fit of `counts` to the exact distribution `probs`: (p, x, df).

    An observation in a cell of probability 0 (outside the sampler's support) gives p = 0.
    """
    n = sum(counts.values())
    if any(c and probs.get(k, 0.0) <= 0.0 for k, c in counts.items()):
        return 0.0, math.inf, 0
    expected = {k: n * p for k, p in probs.items() if p > 0.0}
    groups = pool_cells(expected, min_expected)
    x = 0.0
    for g in groups:
        o = sum(counts.get(k, 0) for k in g)
        e = sum(expected[k] for k in g)
        x += (o - e) ** 2 / e
    df = len(groups) - 1
    return chi2_sf(x, df), x, df


def two_sample_test(a: Counter, b: Counter, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Chi-square test of homogeneity of two count tables (2 x C, cells pooled): (p, x, df)."""
    na, nb = sum(a.values()), sum(b.values())
    total = na + nb
    cells = set(a) | set(b)
    pooled = {k: (a.get(k, 0) + b.get(k, 0)) / total for k in cells}
    # the smaller expected count of a cell is min(na, nb) * its pooled frequency
    groups = pool_cells({k: min(na, nb) * f for k, f in pooled.items()}, min_expected)
    x = 0.0
    for g in groups:
        col = sum(a.get(k, 0) + b.get(k, 0) for k in g)
        for n_row, table in ((na, a), (nb, b)):
            e = n_row * col / total
            o = sum(table.get(k, 0) for k in g)
            x += (o - e) ** 2 / e
    df = len(groups) - 1
    return chi2_sf(x, df), x, df


@torch.inference_mode()
def exact_joint(model, prompt: list[int], n: int, cfg: SamplerConfig) -> dict[tuple, float]:
    """The exact distribution of the first n sampled tokens, enumerated over the sampler's support
    with stateless forward passes (an independent path from the decoders' extend/commit)."""
    dist: dict[tuple, float] = {(): 1.0}
    for _ in range(n):
        keys = list(dist)
        ids = torch.tensor([prompt + list(k) for k in keys], device=model.device)
        p = sampler_probs(model(ids)[:, -1].double(), cfg)
        new = {}
        for i, k in enumerate(keys):
            for t in torch.nonzero(p[i]).flatten().tolist():
                new[k + (t,)] = dist[k] * float(p[i, t])
        dist = new
    return dist


def draw_native(model, prompt, n_keep, count, seed, cfg=SAMPLER) -> Counter:
    c: Counter = Counter()
    for i in range(count):
        r = decode_native(model, prompt, n_keep, cfg, RngKey(seed, 0, i))
        c[tuple(r.tokens)] += 1
    return c


def draw_spec(model, prompt, n_keep, count, seed, drafter_cls, gamma, cfg=SAMPLER
              ) -> tuple[Counter, Counter]:
    """Generate gamma + 1 tokens (so the first round drafts a full gamma) and tabulate the first
    n_keep; also count rounds by the number of drafts accepted."""
    c: Counter = Counter()
    acc: Counter = Counter()
    for i in range(count):
        r = decode_speculative(model, prompt, gamma + 1, cfg, drafter_cls(), gamma,
                               RngKey(seed, 0, i))
        assert len(r.tokens) == gamma + 1
        c[tuple(r.tokens[:n_keep])] += 1
        acc.update(r.accepted)
    return c, acc


def exact_cached(cache, key, model, n):
    if key not in cache:
        cache[key] = exact_joint(model, PROMPT, n, SAMPLER)
    return cache[key]


def native_sample(cache, model):
    if "native" not in cache:
        cache["native"] = draw_native(model, PROMPT, 3, N_NATIVE, seed=101)
    return cache["native"]


# --------------------------------------------------------------------------------- tests


def test_chi2_helpers_are_calibrated():
    # textbook quantiles: chi2(1) 95 %, chi2(3) 99 %, chi2(10) 99.9 %, chi2(63) 95 %
    assert chi2_sf(3.841458820694124, 1) == pytest.approx(0.05, rel=1e-9)
    assert chi2_sf(11.344866730144373, 3) == pytest.approx(0.01, rel=1e-9)
    assert chi2_sf(29.58829844507442, 10) == pytest.approx(0.001, rel=1e-9)
    assert chi2_sf(82.52872654147181, 63) == pytest.approx(0.05, rel=1e-6)
    assert chi2_sf(0.0, 4) == 1.0
    probs = {("A",): 0.5, ("C",): 0.3, ("G",): 0.2}
    p, x, df = gof_test(Counter({("A",): 500, ("C",): 300, ("G",): 200}), probs)
    assert (p, x, df) == (1.0, 0.0, 2)
    p, _, _ = gof_test(Counter({("A",): 420, ("C",): 330, ("G",): 250}), probs)
    assert p < 1e-4
    # one observation outside the support is a certain rejection
    assert gof_test(Counter({("A",): 500, ("C",): 300, ("G",): 199, ("T",): 1}), probs)[0] == 0.0
    # pooling: tiny cells are merged until the pool reaches the threshold
    groups = pool_cells({"a": 1.0, "b": 2.0, "c": 3.0, "d": 50.0, "e": 100.0})
    assert sorted(map(sorted, groups)) == [["a", "b", "c"], ["d"], ["e"]]
    assert two_sample_test(Counter("AACG" * 300), Counter("AACG" * 200))[0] == pytest.approx(1.0)
    assert two_sample_test(Counter("AACG" * 300), Counter("ACGG" * 300))[0] < 1e-6


def test_exact_distribution_is_a_distribution(trained, cache):
    for n in (2, 3):
        d = exact_cached(cache, ("trained", n), trained, n)
        assert sum(d.values()) == pytest.approx(1.0, abs=1e-9)
        assert len(d) == 4**n  # top-k 4 keeps exactly 4 tokens per position


@pytest.mark.slow
def test_native_sampling_matches_exact_distribution(trained, cache):
    """Control for the harness itself: native decoding against the enumerated distribution."""
    counts = native_sample(cache, trained)
    p, x, df = gof_test(counts, exact_cached(cache, ("trained", 3), trained, 3))
    assert df >= 20, "too much pooling: the test would have no power"
    assert p > ALPHA, f"native vs exact: chi2={x:.1f} df={df} p={p:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("drafter_name,gamma,n_keep,count,seed", [
    ("kmer", 1, 2, N_SPEC, 201),
    ("kmer", 3, 3, N_SPEC, 203),
    ("identity", 1, 2, 500, 301),
    ("identity", 3, 3, 600, 303),
])
def test_speculative_sampling_matches_target(trained, cache, drafter_name, gamma, n_keep, count,
                                             seed):
    cls = {"kmer": KmerDrafter, "identity": IdentityDrafter}[drafter_name]
    counts, accepted = draw_spec(trained, PROMPT, n_keep, count, seed, cls, gamma)
    cache[(drafter_name, gamma)] = counts
    p, x, df = gof_test(counts, exact_cached(cache, ("trained", n_keep), trained, n_keep))
    assert p > ALPHA, f"{drafter_name} γ={gamma} vs exact: chi2={x:.1f} df={df} p={p:.2e}"
    if drafter_name == "kmer":
        # both branches of the rule were exercised: full acceptance and rejection + correction
        assert accepted[0] > count // 10 and accepted[gamma] > count // 50, accepted
    else:
        assert set(accepted) == {gamma}, accepted  # q = p̃: nothing is ever rejected


def test_kmer_speculative_vs_native_two_sample(trained, cache):
    if ("kmer", 3) not in cache:
        cache[("kmer", 3)] = draw_spec(trained, PROMPT, 3, N_SPEC, 203, KmerDrafter, 3)[0]
    p, x, df = two_sample_test(native_sample(cache, trained), cache[("kmer", 3)])
    assert df >= 20
    assert p > ALPHA, f"kmer γ=3 vs native: chi2={x:.1f} df={df} p={p:.2e}"


@pytest.mark.slow
def test_broken_residual_is_rejected(trained, cache, monkeypatch):
    """The same test, same N and seeds, must reject a rule whose correction ignores q."""
    import evspark_cli.decode.acceptance as acceptance

    monkeypatch.setattr(acceptance, "residual", lambda p, q: p.to(torch.float64))
    counts, accepted = draw_spec(trained, PROMPT, 3, N_SPEC, 203, KmerDrafter, 3)
    assert accepted[0] > N_SPEC // 10  # the correction path (where the bug lives) ran often
    p, x, df = gof_test(counts, exact_cached(cache, ("trained", 3), trained, 3))
    assert p < ALPHA, f"broken rule not detected: chi2={x:.1f} df={df} p={p:.2e}"
    p2, x2, df2 = two_sample_test(native_sample(cache, trained), counts)
    assert p2 < ALPHA, f"broken rule not detected two-sample: chi2={x2:.1f} df={df2} p={p2:.2e}"


@pytest.mark.slow
def test_random_model_top_k4(random_model, cache):
    """A random model whose top-4 mixes the echoed DNA base with non-DNA tokens: k-mer drafts are
    sometimes accepted, often rejected with p̃(d) = 0; the output must still be exactly p̃."""
    n = 1000
    exact = exact_joint(random_model, PROMPT, 3, SAMPLER)
    assert any(t >= 128 for k in exact for t in k)  # the target writes non-DNA tokens
    counts, accepted = draw_spec(random_model, PROMPT, 3, n, 401, KmerDrafter, 3)
    p, x, df = gof_test(counts, exact)
    assert p > ALPHA, f"random model kmer γ=3 vs exact: chi2={x:.1f} df={df} p={p:.2e}"
    some = sum(v for k, v in accepted.items() if k > 0)
    assert accepted[0] > n // 10 and some > n // 20, accepted
