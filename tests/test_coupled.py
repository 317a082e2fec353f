"""The coupled rule: speculative sampling that reproduces native sampling of the same seed.

- the Gumbel-max theorem the rule rests on, by fp64 quadrature: argmax(log p + G) has law p;
- exact enumeration: for every draft sequence (any drafter) and many noise keys, a coupled round
  emits exactly native sampling's tokens; a deliberately broken coupling is caught;
- the real noise stream: native coupled sampling fits the target's exact joint (chi-square);
- the decoders: coupled speculative decoding equals coupled native decoding token for token for
  every drafter, gamma, sampler and batch size; greedy is the zero-noise case;
- the command line: `verify --rule coupled` checks sampled runs, residual sampled runs are
  refused there, and headers record the rule so `--resume` never mixes rules.
"""
from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import pytest
import torch
from test_batch_decode import jobs_for
from test_lossless_stats import ALPHA, PROMPT, exact_joint, gof_test, trained  # noqa: F401
from tiny import phix_genome

from evspark_cli.decode.acceptance import accepted_matches
from evspark_cli.decode.batch import BatchDecoder
from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.jobs import Job
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import (
    SamplerConfig,
    coupled_draw,
    coupled_key,
    coupled_noise,
    coupled_scores,
)
from evspark_cli.eval.compare import compare_greedy

F64 = torch.float64
COUPLED = SamplerConfig(1.0, 4, 1.0, "coupled")
SAMPLERS = {"evo2": COUPLED, "t0.7-p0.9": SamplerConfig(0.7, 0, 0.9, "coupled"),
            "t1.3-k3": SamplerConfig(1.3, 3, 1.0, "coupled")}


# ------------------------------------------------------------------------------ the theorem


@pytest.mark.parametrize("p", [[0.1, 0.2, 0.3, 0.4], [0.97, 0.01, 0.01, 0.01],
                               [0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
def test_gumbel_max_has_the_law_of_p_by_quadrature(p):
    """P(argmax_v log p_v + G_v = v) = ∫ f(x - log p_v) Π_{w≠v} F(x - log p_w) dx, with F the
    Gumbel CDF and f its density, integrated in fp64: it equals p_v to 1e-9."""
    x = torch.linspace(-12.0, 45.0, 400_001, dtype=F64)
    logp = torch.log(torch.tensor(p, dtype=F64))

    def cdf(z):
        return torch.exp(-torch.exp(-z))

    for v, pv in enumerate(p):
        if pv == 0:
            continue
        z = x - logp[v]
        dens = torch.exp(-z) * cdf(z)
        for w, pw in enumerate(p):
            if w != v and pw > 0:
                dens = dens * cdf(x - logp[w])
        assert abs(float(torch.trapezoid(dens, x)) - pv) < 1e-9, (v, p)


# ------------------------------------------------------------------------------ exact enumeration


def _conditionals(seed: int, vocab: int = 4):
    """A target whose next-token law depends on the whole prefix (zeros included, as top-k)."""
    cache: dict[tuple, torch.Tensor] = {}

    def cond(prefix: tuple[int, ...]) -> torch.Tensor:
        if prefix not in cache:
            g = torch.Generator().manual_seed(hash((seed,) + prefix) & ((1 << 62) - 1))
            logits = torch.randn(vocab, generator=g, dtype=F64) * 1.5
            if len(prefix) % 2:  # every other position: two tokens of zero probability
                logits[torch.argsort(logits)[:2]] = -math.inf
            cache[prefix] = torch.softmax(logits, -1)
        return cache[prefix]

    return cond


def _round(cond, noise: torch.Tensor, drafts: list[int], accept) -> list[int]:
    """One verification round over `drafts` (positions 1..γ), the target's scores taken along
    the draft path as the block pass computes them: the tokens the round emits."""
    gamma = len(drafts)
    scores = torch.stack([torch.log(cond(tuple(drafts[:k]))) + noise[k] for k in range(gamma + 1)])
    y = scores.argmax(dim=-1)
    m = accept(y, drafts, scores)
    return drafts[:m] + [int(y[m])]


def _coupled_accept(y, drafts, scores) -> int:
    return accepted_matches(y[None], torch.tensor([drafts]), [len(drafts)])[0]


def _native(cond, noise: torch.Tensor, n: int) -> list[int]:
    out: list[int] = []
    for k in range(n):
        out.append(int((torch.log(cond(tuple(out))) + noise[k]).argmax()))
    return out


def _native_round(key: int, gamma: int, record: int, sample: int):
    """A round's conditionals, its noise over the 4 letters at positions 1..gamma+1 and native
    sampling's tokens there."""
    cond = _conditionals(key)
    tokens = torch.arange(4)[None].expand(gamma + 1, -1)
    noise = coupled_noise(torch.full((gamma + 1,), coupled_key(key, record, sample)),
                          torch.arange(1, gamma + 2), tokens)
    return cond, noise, _native(cond, noise, gamma + 1)


def test_every_draft_sequence_gives_natives_tokens_exactly():
    """γ = 4 over a 4-letter vocabulary: all 256 draft sequences (every drafter there can be),
    40 noise keys each, and the round emits exactly native sampling's first m + 1 tokens; the
    leading accepted drafts are exactly the ones equal to native's tokens."""
    gamma = 4
    for key in range(40):
        cond, noise, native = _native_round(key, gamma, 3, 1)
        for drafts in itertools.product(range(4), repeat=gamma):
            got = _round(cond, noise, list(drafts), _coupled_accept)
            lead = next((i for i, (d, t) in enumerate(zip(drafts, native)) if d != t), gamma)
            assert got == native[: lead + 1], (key, drafts)


def test_a_broken_coupling_is_caught():
    """The same enumeration rejects a coupling that accepts a draft the target could have drawn
    (positive probability) instead of the one it did draw."""
    gamma = 3

    def plausible(y, drafts, scores):
        m = 0
        while m < len(drafts) and math.isfinite(float(scores[m, drafts[m]])):
            m += 1
        return m

    wrong = 0
    for key in range(10):
        cond, noise, native = _native_round(key, gamma, 0, 0)
        for drafts in itertools.product(range(4), repeat=gamma):
            got = _round(cond, noise, list(drafts), plausible)
            wrong += got != native[: len(got)]
    assert wrong > 100


# ------------------------------------------------------------------------------ the noise stream


def test_noise_depends_only_on_its_key():
    """The same (seed, record, sample, position, token) gives the same number in any batch
    layout; changing any one of them changes it; U is uniform (Kolmogorov-Smirnov)."""
    k = coupled_key(5, 2, 1)
    toks = torch.tensor([[65, 67, 71, 84]])
    one = coupled_noise(torch.tensor([k]), torch.tensor([9]), toks)
    many = coupled_noise(torch.tensor([coupled_key(0, 0, 0), k, k]), torch.tensor([9, 9, 10]),
                         toks.expand(3, -1))
    assert torch.equal(one[0], many[1])
    assert not torch.equal(many[1], many[2])  # another position
    assert not torch.equal(many[0], many[1])  # another key
    assert len(set(one[0].tolist())) == 4  # another token
    for other in (coupled_key(6, 2, 1), coupled_key(5, 3, 1), coupled_key(5, 2, 2)):
        assert not torch.equal(coupled_noise(torch.tensor([other]), torch.tensor([9]), toks), one)
    g = coupled_noise(torch.full((50_000,), k), torch.arange(50_000), toks.expand(50_000, -1))
    u = torch.exp(-torch.exp(-g.flatten())).sort().values  # back to U via the Gumbel CDF
    ecdf = torch.arange(1, u.numel() + 1, dtype=F64) / u.numel()
    assert float((ecdf - u).abs().max()) < 1.63 / math.sqrt(u.numel())  # KS at alpha = 0.01
    assert torch.isfinite(g).all()


def test_noise_is_splitmix64_of_its_keys_bit_for_bit():
    """The noise's U is fmix64(fmix64(key + (pos+1)φ) + (token+1)φ), top 53 bits + 1/2, on
    Python ints (so sampled outputs of a seed never change with how the hash is computed),
    for keys of both signs as int64 and the extremes of positions and tokens."""
    from evspark_cli.decode.sampling import _GOLDEN, _MASK64, _fmix_int

    keys = [coupled_key(0, 0, 0), coupled_key(7, 123456, 3), -1, -(1 << 63), (1 << 63) - 1, 0]
    positions = [0, 1, 2**31, 2**62, 17, 5]
    tokens = torch.tensor([[0, 65, 511], [84, 1, 2], [3, 4, 5], [0, 0, 1], [255, 256, 511],
                           [7, 8, 9]])
    g = coupled_noise(torch.tensor(keys), torch.tensor(positions), tokens)
    for i, (key, pos) in enumerate(zip(keys, positions)):
        h = _fmix_int(key + (pos + 1) * _GOLDEN)
        for j, tok in enumerate(tokens[i].tolist()):
            mixed = _fmix_int(h + (tok + 1) * _GOLDEN) & _MASK64
            u = ((mixed >> 11) + 0.5) * 2.0**-53
            want = -torch.log(-torch.log(torch.tensor(u, dtype=F64)))
            assert g[i, j].item() == want.item(), (i, j)
    with pytest.raises(ValueError, match="positions"):
        coupled_noise(torch.tensor([1]), torch.tensor([-1]), tokens[:1])


def test_candidates_give_the_full_vocabularys_winner():
    """Scoring only the top-k tokens is exact when the rest have zero probability."""
    torch.manual_seed(0)
    logits = torch.randn(300, 512) * 3
    for cfg in (COUPLED, SamplerConfig(0.6, 7, 0.8, "coupled")):
        from evspark_cli.decode.sampling import sampler_probs

        p = sampler_probs(logits, cfg)
        keys = torch.full((300,), coupled_key(1, 2, 3))
        pos = torch.arange(300)
        full, tok_full = coupled_scores(p, keys, pos, 0)
        want = tok_full.gather(-1, full.argmax(-1, keepdim=True)).squeeze(-1)
        got, margin = coupled_draw(p, keys, pos, cfg)
        assert torch.equal(got, want)
        best = full.topk(2, dim=-1).values
        assert torch.allclose(margin, (best[:, 0] - best[:, 1]) * cfg.temperature)


@pytest.mark.parametrize("cfg", [COUPLED, SamplerConfig(0.7, 3, 0.9, "coupled"),
                                 SamplerConfig(1.3, 2, 1.0, "coupled")])
def test_a_few_rows_draw_the_array_paths_numbers(cfg, monkeypatch):
    """A decode step's few rows are drawn on host scalars (`SCALAR_DRAW`): the same tokens and
    the same margins, bit for bit, as the array path, for keys of both signs, far positions and
    rows whose top-p cut leaves candidates of zero probability."""
    from evspark_cli.decode import sampling

    torch.manual_seed(3)
    for n in (1, 2, 5, 16):
        logits = torch.randn(n, 512) * torch.linspace(0.5, 9.0, n)[:, None]
        p = sampling.sampler_probs(logits, cfg)
        keys = torch.tensor([coupled_key(i, 7, 1) for i in range(n - 1)] + [-(1 << 63)])
        pos = torch.tensor([(1 << 40) + 3 * i for i in range(n)])
        assert n * cfg.top_k <= sampling.SCALAR_DRAW
        few = coupled_draw(p, keys, pos, cfg)
        monkeypatch.setattr(sampling, "SCALAR_DRAW", 0)
        many = coupled_draw(p, keys, pos, cfg)
        monkeypatch.undo()
        assert torch.equal(few[0], many[0]) and torch.equal(few[1], many[1])
        assert few[0].dtype == many[0].dtype and few[1].dtype == torch.float64
    with pytest.raises(ValueError, match="positions"):
        coupled_draw(p[:1], keys[:1], torch.tensor([-1]), cfg)


def test_native_coupled_sampling_has_the_targets_distribution(trained):  # noqa: F811
    """1,500 native coupled samples of a prompt (one key each), 3 tokens: the joint fits the
    exact target distribution, so the hashed Gumbel noise is as good as independent noise."""
    exact = exact_joint(trained, PROMPT, 3, SamplerConfig(1.0, 4, 1.0))
    jobs = [Job(s, tuple(PROMPT), 3, RngKey(7, 3, s)) for s in range(1500)]
    dec = BatchDecoder(trained, COUPLED, None, 0, batch_size=32)
    counts = Counter(tuple(o.result.tokens) for o in dec.run(jobs))
    p, x, df = gof_test(counts, exact)
    assert p > ALPHA, f"coupled samples disagree with the target (p={p:.2e}, x={x:.1f}, df={df})"


# ------------------------------------------------------------------------------ the decoders


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = phix_genome()
    return [list(g[a: a + n].encode()) for a, n in ((100, 1), (900, 5), (2000, 30), (3100, 77))]


def _jobs(prompts, samples: int, lengths: list[int], seed: int = 3) -> list[Job]:
    return jobs_for(prompts, samples, lengths, seed)


def _run(model, jobs, sampler, drafter, gamma, batch) -> dict[int, list[int]]:
    dec = BatchDecoder(model, sampler, drafter, gamma, batch_size=batch)
    out = {}
    for o in dec.run(jobs):
        assert o.error is None, o.error
        out[o.job.index] = o.result.tokens
    return out


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_coupled_speculative_equals_native_sampling(trained, prompts, name):  # noqa: F811
    """Every drafter, gamma and batch size writes native coupled sampling's tokens, job by job
    (rows joining and leaving a batch smaller than the job list)."""
    sampler = SAMPLERS[name]
    jobs = _jobs(prompts, 2, [23, 40, 9])
    want = {j.index: decode_native(trained, list(j.prompt), j.max_new_tokens, sampler,
                                   j.rng).tokens for j in jobs}
    assert _run(trained, jobs, sampler, None, 0, 3) == want  # native in a batch: the same
    for drafter, gamma, batch in ((KmerDrafter(), 1, 1), (KmerDrafter(), 5, 3),
                                  (KmerDrafter(), 12, 8), (IdentityDrafter(), 4, 2)):
        assert _run(trained, jobs, sampler, drafter, gamma, batch) == want, (drafter, gamma)


def test_the_drafter_only_changes_speed(trained, prompts):  # noqa: F811
    """Coupled tokens do not depend on the drafter; residual tokens do (lossless only in law)."""
    jobs = _jobs(prompts, 2, [40])
    residual = SamplerConfig(1.0, 4, 1.0)
    a = _run(trained, jobs, COUPLED, KmerDrafter(order=2), 6, 4)
    b = _run(trained, jobs, COUPLED, KmerDrafter(order=8), 3, 4)
    assert a == b
    ra = _run(trained, jobs, residual, KmerDrafter(order=2), 6, 4)
    rb = _run(trained, jobs, residual, KmerDrafter(order=8), 3, 4)
    assert ra != rb


def test_greedy_is_the_zero_noise_case(trained, prompts):  # noqa: F811
    jobs = _jobs(prompts, 1, [30])
    greedy = SamplerConfig(1.0, 1, 1.0)
    coupled_greedy = SamplerConfig(1.0, 1, 1.0, "coupled")
    assert _run(trained, jobs, coupled_greedy, KmerDrafter(), 5, 2) == \
        _run(trained, jobs, greedy, None, 0, 1)


def test_coupled_margins_classify_ties(trained, prompts):  # noqa: F811
    """Native coupled runs record the perturbed-score gap (in logit units) of every token; a
    divergence there is a tie below the tolerance and a failure above it."""
    nat = decode_native(trained, prompts[2], 20, COUPLED, RngKey(1, 2, 3), track_margins=True)
    assert len(nat.margins) == 20 and all(m > 0 for m in nat.margins)
    i = 7
    other = list(nat.tokens)
    other[i] = (other[i] + 1) % 256
    from evspark_cli.decode.jobs import DecodeResult

    spec = DecodeResult(other, 1.0, "speculative", rounds=1, accepted=[0], proposed=[1])
    assert compare_greedy("r", nat, spec, nat.margins[i] * 2)["tie"]
    assert not compare_greedy("r", nat, spec, nat.margins[i] / 2)["tie"]


# ------------------------------------------------------------------------------ the command line


def test_verify_checks_sampled_runs_under_the_coupled_rule(tmp_path):
    from typer.testing import CliRunner

    from evspark_cli.cli.app import app

    runner = CliRunner()
    refused = runner.invoke(app, ["verify", "-n", "8", "--top-k", "4", "-q"])
    assert refused.exit_code == 2
    assert "--rule coupled" in refused.output and "Traceback" not in refused.output
    report = tmp_path / "v.json"
    ok = runner.invoke(app, ["verify", "-n", "24", "--top-k", "4", "--rule", "coupled", "--seed",
                             "5", "--drafter", "kmer", "-b", "3", "-q", "--report", str(report)])
    assert ok.exit_code == 0, ok.output
    rep = json.loads(report.read_text())
    assert rep["rule"] == "coupled" and rep["top_k"] == 4 and not rep["greedy"]
    assert all(r["divergence"] is None for r in rep["rows"])
    assert "rule=coupled" in ok.output


def test_headers_record_the_rule_and_resume_refuses_another(tmp_path):
    from typer.testing import CliRunner

    from evspark_cli.cli.app import app

    runner = CliRunner()
    out = tmp_path / "o.fa"
    args = ["generate", "--prompt", "ACGTACGTTGCA", "-n", "6", "--drafter", "kmer", "-q",
            "-o", str(out)]
    r = runner.invoke(app, args + ["--rule", "coupled"])
    assert r.exit_code == 0, r.output
    assert out.read_text().splitlines()[0].endswith(" rule=coupled")
    partial = tmp_path / "o.fa.partial"
    partial.write_text(out.read_text())
    out.unlink()
    r = runner.invoke(app, args + ["--resume"])  # the default rule is residual
    assert r.exit_code == 2 and "rule=coupled" in r.output and "rule=residual" in r.output
    bad = runner.invoke(app, args + ["--rule", "gumbel"])
    assert bad.exit_code == 2 and "--rule" in bad.output
