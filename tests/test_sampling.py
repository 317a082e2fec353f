"""Sampler transform, counter-based uniforms and inverse-CDF draws.

The sampler is checked against a pure-Python float64 reference written from the spec (scrub →
top-k on raw logits, lowest index on ties → /T → top-p in the kept set → softmax), and the
uniforms bit-for-bit against a pure-Python splitmix64 reference.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from evspark_cli.decode.sampling import (
    Purpose,
    SamplerConfig,
    _to_unit,
    argmax_lowest,
    sample_from_probs,
    sampler_probs,
    uniform,
)
from evspark_cli.errors import InputError

FP32_MAX = 3.4028234663852886e38
NAN, INF = float("nan"), float("inf")
LAST_U = 1.0 - 2.0**-53  # the largest value `uniform` can return


# --------------------------------------------------------------------------- pure-Python sampler


def ref_sampler(row: list[float], cfg: SamplerConfig) -> list[float]:
    """The spec, one row, float64, no torch."""
    x = [0.0 if math.isnan(v) else max(-FP32_MAX, min(FP32_MAX, v)) for v in row]
    n = len(x)
    if cfg.greedy:
        best = min(range(n), key=lambda i: (-x[i], i))
        return [1.0 if i == best else 0.0 for i in range(n)]
    kept = sorted(range(n), key=lambda i: (-x[i], i))
    if 0 < cfg.top_k < n:
        kept = kept[: cfg.top_k]
    z = {i: x[i] / cfg.temperature for i in kept}

    def softmax(ids: list[int]) -> dict[int, float]:
        top = max(z[i] for i in ids)
        e = {i: math.exp(z[i] - top) for i in ids}
        s = sum(e.values())
        return {i: v / s for i, v in e.items()}

    if cfg.top_p < 1.0:
        probs = softmax(kept)
        order = sorted(kept, key=lambda i: (-probs[i], i))
        chosen, mass = [], 0.0
        for i in order:
            if mass >= cfg.top_p:
                break
            chosen.append(i)
            mass += probs[i]
        kept = chosen
    final = softmax(kept)
    return [final.get(i, 0.0) for i in range(n)]


def support(probs: torch.Tensor) -> set[int]:
    return set(torch.nonzero(probs > 0).flatten().tolist())


# --------------------------------------------------------------------------- config


def test_defaults_are_evo2s() -> None:
    cfg = SamplerConfig()
    assert (cfg.temperature, cfg.top_k, cfg.top_p) == (1.0, 4, 1.0)
    assert not cfg.greedy
    assert SamplerConfig(top_k=1).greedy and SamplerConfig(temperature=0.0).greedy


@pytest.mark.parametrize(
    "cfg",
    [
        SamplerConfig(temperature=-0.1),
        SamplerConfig(temperature=NAN),
        SamplerConfig(temperature=INF),
        SamplerConfig(top_k=-1),
        SamplerConfig(top_p=0.0),
        SamplerConfig(top_p=1.5),
        SamplerConfig(top_p=NAN),
    ],
)
def test_validate_rejects_bad_settings(cfg: SamplerConfig) -> None:
    with pytest.raises(InputError) as info:
        cfg.validate()
    assert "\n" not in str(info.value) and str(info.value)
    with pytest.raises(InputError):
        sampler_probs(torch.zeros(4), cfg)


def test_validate_accepts_edges() -> None:
    for cfg in (SamplerConfig(top_p=1.0), SamplerConfig(top_p=1e-9), SamplerConfig(top_k=0),
                SamplerConfig(temperature=0.0)):
        cfg.validate()


# --------------------------------------------------------------------------- sampler transform


def test_top_k_keeps_exactly_k_lowest_index_on_ties() -> None:
    logits = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0, 3.0])
    probs = sampler_probs(logits, SamplerConfig(top_k=2))
    assert support(probs) == {1, 2}
    assert torch.allclose(probs[[1, 2]], torch.tensor([0.5, 0.5]))
    probs = sampler_probs(logits, SamplerConfig(top_k=5))
    assert support(probs) == {0, 1, 2, 3, 5}


def test_top_k_rows_with_and_without_a_tie_at_the_cut() -> None:
    logits = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0],    # no tie across the cut
                           [1.0, 3.0, 3.0, 0.0, 3.0]])   # three tied for two places
    probs = sampler_probs(logits, SamplerConfig(top_k=2))
    assert support(probs[0]) == {0, 1} and support(probs[1]) == {1, 2}


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=2, max_size=12),
    st.integers(0, 14),
)
def test_top_k_matches_stable_sort(values: list[int], k: int) -> None:
    logits = torch.tensor(values, dtype=torch.float32)
    probs = sampler_probs(logits, SamplerConfig(top_k=k, temperature=1.3))
    expected = sorted(range(len(values)), key=lambda i: (-values[i], i))
    if 0 < k < len(values):
        expected = expected[:k]
    assert support(probs) == set(expected)
    assert abs(float(probs.sum()) - 1.0) < 1e-6


def test_temperature_is_applied_before_top_p() -> None:
    # At T=1 the top two tokens hold 0.91 > 0.8 and the top one only 0.67; at T=0.5 the top
    # token alone holds 0.87. Top-p before temperature would keep two tokens.
    logits = torch.tensor([2.0, 1.0, 0.0])
    probs = sampler_probs(logits, SamplerConfig(temperature=0.5, top_k=0, top_p=0.8))
    assert support(probs) == {0}
    probs = sampler_probs(logits, SamplerConfig(temperature=1.0, top_k=0, top_p=0.8))
    assert support(probs) == {0, 1}


def test_top_p_works_inside_the_top_k_set() -> None:
    # Within the top-2 set token 0 holds 0.73 ≥ 0.7; over all 10 tokens it holds only 0.46.
    logits = torch.tensor([2.0, 1.0] + [0.0] * 8)
    probs = sampler_probs(logits, SamplerConfig(top_k=2, top_p=0.7))
    assert support(probs) == {0}
    assert float(probs[0]) == 1.0


def test_top_k_on_raw_logits_with_ties_at_the_cut() -> None:
    logits = torch.tensor([0.0, 5.0, 2.0, 2.0, 2.0])
    probs = sampler_probs(logits, SamplerConfig(top_k=3, temperature=0.7))
    assert support(probs) == {1, 2, 3}


def test_top_p_cut() -> None:
    logits = torch.tensor([0.5, 0.3, 0.2, 0.0]).log()
    assert support(sampler_probs(logits, SamplerConfig(top_k=0, top_p=0.75))) == {0, 1}
    assert support(sampler_probs(logits, SamplerConfig(top_k=0, top_p=0.4))) == {0}
    assert support(sampler_probs(logits, SamplerConfig(top_k=0, top_p=1e-9))) == {0}
    full = sampler_probs(logits, SamplerConfig(top_k=0, top_p=1.0))
    assert support(full) == {0, 1, 2}
    assert torch.allclose(full[:3], torch.tensor([0.5, 0.3, 0.2]))
    # exact boundary: the first two of four equal tokens hold exactly 0.5 ≥ top_p = 0.5;
    # among equal probabilities the lowest indices come first
    even = sampler_probs(torch.ones(6, dtype=torch.float64), SamplerConfig(top_k=4, top_p=0.5))
    assert even.tolist() == [0.5, 0.5, 0.0, 0.0, 0.0, 0.0]


def test_nan_and_inf_are_scrubbed() -> None:
    cfg = SamplerConfig(top_k=0)
    nan_row = sampler_probs(torch.tensor([NAN, 1.0, -1.0]), cfg)
    assert torch.equal(nan_row, sampler_probs(torch.tensor([0.0, 1.0, -1.0]), cfg))
    probs = sampler_probs(torch.tensor([NAN, -INF, 1.0, INF]), cfg)
    assert torch.isfinite(probs).all()
    assert support(probs) == {3}
    for temperature in (1.0, 0.5, 0.01):
        two = sampler_probs(torch.tensor([INF, 0.0, INF, -INF]),
                            SamplerConfig(top_k=0, temperature=temperature))
        assert torch.equal(two, torch.tensor([0.5, 0.0, 0.5, 0.0])), temperature
    flat = sampler_probs(torch.full((6,), NAN), SamplerConfig())
    assert torch.equal(flat, torch.tensor([0.25] * 4 + [0.0] * 2))


def test_greedy_is_one_hot_at_lowest_argmax() -> None:
    logits = torch.tensor([[1.0, 4.0, 4.0, 0.0], [NAN, 2.0, INF, INF], [NAN, -1.0, -2.0, -3.0]])
    for cfg in (SamplerConfig(top_k=1), SamplerConfig(temperature=0.0, top_k=0, top_p=0.3)):
        probs = sampler_probs(logits, cfg)
        assert probs.dtype == torch.float32
        assert torch.equal(probs.argmax(-1), torch.tensor([1, 2, 0]))
        assert torch.equal(probs.sum(-1), torch.ones(3))
        assert set(probs.unique().tolist()) == {0.0, 1.0}
    assert argmax_lowest(logits).tolist() == [1, 2, 0]
    assert argmax_lowest(torch.zeros(7)).item() == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_low_precision_input_is_computed_in_fp32(dtype: torch.dtype) -> None:
    logits = (torch.randn(3, 16, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    cfg = SamplerConfig(temperature=0.7, top_k=6, top_p=0.9)
    probs = sampler_probs(logits, cfg)
    assert probs.dtype == torch.float32
    assert torch.equal(probs, sampler_probs(logits.float(), cfg))


def test_fp64_in_fp64_out_and_matches_reference() -> None:
    gen = torch.Generator().manual_seed(7)
    configs = [
        SamplerConfig(),
        SamplerConfig(temperature=0.6, top_k=0, top_p=0.85),
        SamplerConfig(temperature=1.7, top_k=7, top_p=0.5),
        SamplerConfig(temperature=0.3, top_k=3, top_p=0.99),
        SamplerConfig(temperature=2.0, top_k=20, top_p=1.0),
    ]
    for _ in range(40):
        row = (torch.randn(20, generator=gen, dtype=torch.float64) * 2).tolist()
        for cfg in configs:
            got = sampler_probs(torch.tensor(row, dtype=torch.float64), cfg)
            assert got.dtype == torch.float64
            expected = torch.tensor(ref_sampler(row, cfg), dtype=torch.float64)
            assert support(got) == support(expected), cfg
            assert torch.allclose(got, expected, rtol=0, atol=1e-12), cfg


def test_vectorised_over_leading_dims() -> None:
    logits = torch.randn(2, 3, 9, generator=torch.Generator().manual_seed(3))
    logits[0, 1, 2] = logits[0, 1, 5]  # a tie
    cfg = SamplerConfig(temperature=0.8, top_k=4, top_p=0.8)
    batched = sampler_probs(logits, cfg)
    for i in range(2):
        for j in range(3):
            assert torch.equal(batched[i, j], sampler_probs(logits[i, j], cfg))



@pytest.mark.parametrize("shape", [(4,), (3, 4), (5, 12, 125, 4), (2, 7, 8), (33, 6)])
def test_narrow_last_dims_equal_the_row_alone(shape: tuple[int, ...]) -> None:
    """A 4-letter drafter's conditionals, (rows, slots, classes, 4), are softmaxed behind a unit
    dim (`softmax_last`): every row must still get its probabilities bit for bit as alone (the
    left-to-right reference, a batch of one), whatever shape holds it, and torch's softmax to
    fp32 rounding, -inf entries (top-k) exactly zero."""
    from evspark_cli.decode.sampling import softmax_last

    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 6
    x.view(-1, shape[-1])[::3, 1] = -math.inf
    got = softmax_last(x)
    assert torch.allclose(got, torch.softmax(x, dim=-1), rtol=0, atol=1e-6)
    assert bool((got.view(-1, shape[-1])[::3, 1] == 0).all())
    rows = x.view(-1, shape[-1])
    for i in range(0, rows.shape[0], max(1, rows.shape[0] // 40)):
        assert torch.equal(got.view(-1, shape[-1])[i], softmax_last(rows[i]))
        assert torch.equal(got.view(-1, shape[-1])[i], softmax_last(rows[i: i + 2])[0])
    cfg = SamplerConfig(1.0, 4, 1.0)
    assert torch.equal(sampler_probs(x, cfg)[(0,) * (len(shape) - 1)],
                       sampler_probs(x[(0,) * (len(shape) - 1)], cfg))


# --------------------------------------------------------------------------- uniforms

_M = (1 << 64) - 1
_G = 0x9E3779B97F4A7C15


def ref_splitmix_output(state: int) -> int:
    """splitmix64's output for a state that has already been advanced by φ."""
    z = state & _M
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M
    return z ^ (z >> 31)


def ref_uniform(seed: int, record: int, sample: int, position: int, purpose: int) -> float:
    """Each key k moves the hash h to output k+1 of a splitmix64 generator seeded with h."""
    h = 0
    for key in (seed, record, sample, purpose, position):
        h = ref_splitmix_output(h + (key + 1) * _G)
    return (h >> 11) / 2.0**53


def test_reference_is_splitmix64() -> None:
    # Published first outputs of splitmix64 seeded with 0 and with 1234567.
    assert ref_splitmix_output(_G) == 0xE220A8397B1DCDAF
    assert ref_splitmix_output(1234567 + _G) == 0x599ED017FB08FC85


def test_uniform_is_bit_exact_with_reference() -> None:
    rng = torch.Generator().manual_seed(11)
    big = (1 << 63) - 1
    keys = [(0, 0, 0, 0), (1, 2, 3, 1), (big, big, big, 3), (123456789, 0, big, 2)]
    keys += [tuple(int(v) for v in torch.randint(0, 2**62, (4,), generator=rng)) for _ in range(6)]
    positions = torch.tensor([[0, 1, 2, 3], [2**31, 2**40 + 5, 2**62, big]], dtype=torch.int64)
    for seed, record, sample, purpose in keys:
        got = uniform(seed, record, sample, positions, purpose)
        assert got.dtype == torch.float64 and got.shape == positions.shape
        expected = [[ref_uniform(seed, record, sample, int(pos), purpose) for pos in row]
                    for row in positions.tolist()]
        assert got.tolist() == expected


def test_uniform_is_deterministic_and_batch_independent() -> None:
    pos = torch.arange(100, 164)
    a = uniform(5, 1, 0, pos, Purpose.ACCEPT)
    assert torch.equal(a, uniform(5, 1, 0, pos.clone(), Purpose.ACCEPT))
    single = uniform(5, 1, 0, 130, Purpose.ACCEPT)
    assert single.shape == () and single.dtype == torch.float64
    assert float(single) == float(a[30])
    assert torch.equal(uniform(5, 1, 0, pos.view(8, 8), Purpose.ACCEPT).flatten(), a)
    assert torch.equal(uniform(5, 1, 0, pos.to(torch.int32), Purpose.ACCEPT), a)
    # a range (a round's positions) is hashed on the host, bit-identically
    assert torch.equal(uniform(5, 1, 0, range(100, 164), Purpose.ACCEPT), a)
    assert uniform(5, 1, 0, range(7, 7), Purpose.ACCEPT).shape == (0,)
    with pytest.raises(ValueError, match="position"):
        uniform(5, 1, 0, range(-2, 3), Purpose.ACCEPT)


def test_each_key_changes_the_stream() -> None:
    pos = torch.arange(1000)
    base = uniform(3, 4, 5, pos, Purpose.DRAFT)
    variants = [
        uniform(4, 4, 5, pos, Purpose.DRAFT),
        uniform(3, 5, 5, pos, Purpose.DRAFT),
        uniform(3, 4, 6, pos, Purpose.DRAFT),
        uniform(3, 4, 5, pos, Purpose.ACCEPT),
        uniform(3, 4, 5, pos + 1, Purpose.DRAFT),
        uniform(4, 3, 5, pos, Purpose.DRAFT),  # swapped keys are not the same stream
    ]
    for other in variants:
        assert int((other == base).sum()) == 0
        assert abs(float(torch.corrcoef(torch.stack([base, other]))[0, 1])) < 0.15


def test_purposes_are_distinct() -> None:
    purposes = (Purpose.SAMPLE, Purpose.DRAFT, Purpose.ACCEPT, Purpose.RESIDUAL)
    assert [int(p) for p in purposes] == [0, 1, 2, 3]


def test_uniform_looks_uniform() -> None:
    u = uniform(2024, 7, 0, torch.arange(100_000), Purpose.SAMPLE)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(u.var()) - 1 / 12) < 0.002
    counts = torch.bincount((u * 50).long(), minlength=50).double()
    chi2 = float(((counts - 2000) ** 2 / 2000).sum())
    assert chi2 < 110  # 49 dof: mean 49, p ≈ 1e-6 at 110
    lag = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]
    assert abs(float(lag)) < 0.02
    # across records at a fixed position
    across = torch.stack([uniform(2024, r, 0, 17, Purpose.SAMPLE) for r in range(2000)])
    assert abs(float(across.mean()) - 0.5) < 0.035


def test_uniform_never_reaches_one() -> None:
    all_ones = torch.tensor([-1, (1 << 63) - 1, -(1 << 63), 0], dtype=torch.int64)
    top = _to_unit(all_ones)
    assert top.tolist() == [LAST_U, 0.5 - 2.0**-53, 0.5, 0.0]
    assert float(top.max()) < 1.0


@pytest.mark.parametrize("bad", [-1, 1 << 63, 1.5, True])
def test_uniform_rejects_bad_keys(bad: object) -> None:
    with pytest.raises(ValueError):
        uniform(bad, 0, 0, 0, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        uniform(0, 0, 0, bad, 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        uniform(0, 0, 0, torch.tensor([0.5]), 0)


@pytest.mark.parametrize("bad", [True, 1.0])
def test_cached_key_hash_still_rejects_lookalikes(bad: object) -> None:
    """The scalar keys' hash is cached; True and 1.0 hash like 1 but must not hit its entry."""
    for purpose in (0, 1):
        good = uniform(1, 1, 1, 5, purpose)
        with pytest.raises(ValueError):
            uniform(bad, 1, 1, 5, purpose)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            uniform(1, 1, 1, 5, bad)  # type: ignore[arg-type]
        assert float(uniform(1, 1, 1, 5, purpose)) == float(good)


# --------------------------------------------------------------------------- inverse-CDF draws


def test_inverse_cdf_intervals() -> None:
    probs = torch.tensor([0.25, 0.0, 0.5, 0.25, 0.0], dtype=torch.float64)
    cases = {0.0: 0, 0.2499: 0, 0.25: 2, 0.7499: 2, 0.75: 3, 0.9: 3, LAST_U: 3}
    for u, expected in cases.items():
        assert int(sample_from_probs(probs, u)) == expected, u


def test_rounding_past_the_end_clamps_to_last_positive() -> None:
    probs = torch.tensor([0.5, 0.5, 0.0, 0.0])
    assert int(sample_from_probs(probs, LAST_U)) == 1
    # unnormalised rows are drawn from their normalisation
    assert int(sample_from_probs(torch.tensor([0.3, 0.3, 0.0]), 0.99)) == 1
    assert int(sample_from_probs(torch.tensor([0.0, 0.0, 2.0]), 0.0)) == 2
    # the float32 sum of ten 0.1's is not 1; u near 1 must still land on a real token
    tenths = torch.full((10,), 0.1, dtype=torch.float32)
    tenths = torch.cat([tenths, torch.zeros(3)])
    assert int(sample_from_probs(tenths, LAST_U)) == 9


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(st.just(0.0), st.floats(1e-30, 1.0), st.floats(1e-3, 1.0)),
             min_size=1, max_size=24).filter(lambda xs: any(x > 0 for x in xs)),
    st.one_of(st.just(0.0), st.just(LAST_U), st.floats(0.0, 1.0, exclude_max=True)),
    st.sampled_from([torch.float32, torch.float64]),
)
def test_sample_never_returns_zero_probability(values: list[float], u: float,
                                               dtype: torch.dtype) -> None:
    probs = torch.tensor(values, dtype=dtype)
    if not bool((probs > 0).any()):  # float32 underflow
        return
    token = int(sample_from_probs(probs, u))
    assert 0 <= token < len(values) and float(probs[token]) > 0


def test_sample_matches_probabilities_empirically() -> None:
    probs = torch.tensor([0.1, 0.0, 0.2, 0.3, 0.4, 0.0])
    n = 200_000
    u = uniform(9, 0, 0, torch.arange(n), Purpose.SAMPLE)
    tokens = sample_from_probs(probs.expand(n, -1), u)
    freq = torch.bincount(tokens, minlength=6).double() / n
    assert freq[1] == 0 and freq[5] == 0
    assert torch.allclose(freq, probs.double(), atol=0.004)  # ≈ 4 standard errors


def test_sample_is_vectorised() -> None:
    gen = torch.Generator().manual_seed(5)
    probs = torch.softmax(torch.randn(2, 3, 7, generator=gen), -1)
    u = torch.rand(2, 3, generator=gen, dtype=torch.float64)
    tokens = sample_from_probs(probs, u)
    assert tokens.shape == (2, 3) and tokens.dtype == torch.int64
    for i in range(2):
        for j in range(3):
            assert int(tokens[i, j]) == int(sample_from_probs(probs[i, j], u[i, j]))
