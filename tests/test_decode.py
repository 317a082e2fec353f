"""Decoding: greedy speculative == native token for token, sampled identity == native, the
clipped last round, seeding, slice vs replay, `evspark verify` (pass and planted failure),
tie classification, the NaN guard and DecodeResult statistics; through `evspark generate`,
greedy output that no --gamma or drafter changes, and the k-mer drafter on another vocabulary.

Models: the phiX-trained tiny target (writes DNA, so the k-mer drafter is often accepted), the
`random_tiny_dir` model (its top tokens echo the last input and add non-DNA ids) and a fully
randomized model (writes non-DNA ids: the k-mer drafter is almost never accepted).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from battery import FAST, OK_FASTA, Models, w
from tiny import random_tiny_dir, run_cli, shared_trained_tiny  # noqa: E402

from evspark_cli.api import generate
from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.jobs import DecodeResult
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.errors import RunError
from evspark_cli.eval.compare import compare_greedy, first_divergence
from evspark_cli.model.checkpoint import load_model, save_model

GREEDY = SamplerConfig(1.0, 1, 1.0)  # what `evspark verify` uses
GAMMAS = (1, 2, 3, 5, 8, 12)
DNA = ("GAGTTTTATCGCTTCCATGACGCAGAAGTTAACACTTTCGGATATTTCTGATGAGTCGAAAAATTATCTTGATAAAGCAGGAATT"
       "ACTACTGCTTGTTTACGAATTAAATCGAAGTGGACTGCTGGCGGAAAATGAGAAAATTCGACCTATCCTTGCGCAGCTCGAG")
PROMPT_LENGTHS = (1, 2, 3, 5, 8, 13, 21, 40)
PROMPTS = [list(DNA[7 * i: 7 * i + n].encode()) for i, n in enumerate(PROMPT_LENGTHS)]
DRAFTERS = {"identity": IdentityDrafter, "kmer": KmerDrafter}


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory) -> Path:
    """The phiX-trained tiny model, trained once per test run."""
    return shared_trained_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def model_dirs(trained_dir, tmp_path_factory) -> dict[str, Path]:
    from conftest import randomize_model
    from tiny import random_tiny_dir, tiny_config

    from evspark_cli.model.model import StripedHyena

    torch.manual_seed(3)
    scrambled = randomize_model(StripedHyena(tiny_config()), 3)
    return {
        "trained": trained_dir,
        "echo": random_tiny_dir(tmp_path_factory.mktemp("echo")),
        "random": save_model(scrambled, tmp_path_factory.mktemp("scrambled")),
    }


@pytest.fixture(scope="module")
def models(model_dirs) -> dict:
    return {k: load_model(v) for k, v in model_dirs.items()}


@pytest.fixture(scope="module")
def native_greedy(models) -> dict:
    """Native greedy continuations (20 tokens) per model and prompt, computed once."""
    return {name: [decode_native(m, p, 20, GREEDY, track_margins=True) for p in PROMPTS]
            for name, m in models.items()}


def _spec(model, prompt, n, sampler, drafter, gamma, rng=None, rollback="slice"):
    return decode_speculative(model, prompt, n, sampler, DRAFTERS[drafter](), gamma, rng, rollback)


def _full_rounds(n: int, gamma: int) -> list[int]:
    """Drafts proposed per round when every draft is accepted: gamma per round of gamma + 1
    tokens, then the clipped last round."""
    q, r = divmod(n, gamma + 1)
    return [gamma] * q + ([r - 1] if r else [])


# ---------------------------------------------------------------------- the test models


def test_test_models_behave_as_described(models, native_greedy):
    dna = set(b"ACGT")
    trained = [t for r in native_greedy["trained"] for t in r.tokens]
    assert set(trained) <= dna
    rand = [t for r in native_greedy["random"] for t in r.tokens]
    assert sum(t not in dna for t in rand) > len(rand) // 2  # mostly non-DNA ids


# ------------------------------------------------------------------------- greedy equality


@pytest.mark.parametrize("rollback", ["slice", pytest.param("replay", marks=pytest.mark.slow)])
@pytest.mark.parametrize("drafter", ["identity", "kmer"])
@pytest.mark.parametrize("model_name", ["trained", "echo", "random"])
def test_greedy_speculative_equals_native(models, native_greedy, model_name, drafter, rollback):
    model = models[model_name]
    accepted = proposed = 0
    for gamma in GAMMAS:
        for prompt, nat in zip(PROMPTS, native_greedy[model_name]):
            spec = _spec(model, prompt, 20, GREEDY, drafter, gamma, rollback=rollback)
            assert spec.tokens == nat.tokens, (
                f"γ={gamma} prompt_len={len(prompt)}: first divergence at "
                f"{first_divergence(nat.tokens, spec.tokens)}")
            accepted += sum(spec.accepted)
            proposed += sum(spec.proposed)
    rate = accepted / proposed
    if drafter == "identity":
        assert rate == 1.0
    elif model_name == "trained":
        assert rate > 0.1  # the k-mer drafter does get accepted on DNA
    elif model_name == "random":
        assert rate < 0.1  # non-DNA output: k-mer drafts are (almost) always rejected


def test_greedy_temperature_zero_is_greedy(models, native_greedy):
    """T = 0 is greedy too (any top-k): same tokens as top_k = 1, natively and speculatively."""
    model = models["trained"]
    cfg = SamplerConfig(0.0, 4, 0.9)
    for prompt, nat in list(zip(PROMPTS, native_greedy["trained"]))[::3]:
        assert decode_native(model, prompt, 20, cfg).tokens == nat.tokens
        assert _spec(model, prompt, 20, cfg, "kmer", 5).tokens == nat.tokens


# --------------------------------------------------------------- sampled identity == native


@pytest.mark.parametrize("sampler", [SamplerConfig(1.0, 4, 1.0), SamplerConfig(0.7, 0, 0.9)],
                         ids=["T1-top4", "T0.7-topp0.9"])
@pytest.mark.parametrize("model_name", ["trained", "random"])
def test_identity_drafter_reproduces_native_sampling(models, model_name, sampler):
    model = models[model_name]
    n = 17
    for i, (gamma, prompt) in enumerate(zip((1, 3, 5, 8), PROMPTS[1::2])):
        rng = RngKey(seed=11 + i, record=i, sample=2 * i)
        nat = decode_native(model, prompt, n, sampler, rng)
        for rollback in ("slice", "replay"):
            spec = _spec(model, prompt, n, sampler, "identity", gamma, rng, rollback)
            assert spec.tokens == nat.tokens, f"γ={gamma} {rollback}"
            assert spec.accepted == spec.proposed == _full_rounds(n, gamma)
            full = [(a + 1) for a in spec.accepted]
            assert all(t == gamma + 1 for t in full[:-1]) and full[-1] == n - (gamma + 1) * (
                len(full) - 1)
            assert spec.tau == pytest.approx(n / spec.rounds)
    # the sampled runs are not greedy in disguise
    greedy = decode_native(model, PROMPTS[3], n, GREEDY).tokens
    sampled = [decode_native(model, PROMPTS[3], n, sampler, RngKey(1, 0, s)).tokens
               for s in range(3)]
    assert any(s != greedy for s in sampled)


# ---------------------------------------------------------------------- clipped last round


@pytest.mark.parametrize("drafter", ["identity", "kmer"])
def test_clipped_last_round(models, drafter):
    model = models["trained"]
    gamma = 4
    sampler = SamplerConfig()
    for n in range(1, 16):
        rng = RngKey(5, 0, n)
        res = _spec(model, PROMPTS[4], n, sampler, drafter, gamma, rng)
        assert len(res.tokens) == n
        assert sum(res.accepted) + res.rounds == n
        emitted = 0
        for m, g in zip(res.accepted, res.proposed):
            assert g == min(gamma, n - emitted - 1)  # never drafts past max_new_tokens
            assert 0 <= m <= g
            emitted += m + 1
        if drafter == "identity":
            assert res.proposed == _full_rounds(n, gamma)
            assert res.tokens == decode_native(model, PROMPTS[4], n, sampler, rng).tokens
    one = _spec(model, PROMPTS[4], 1, sampler, drafter, gamma)
    assert (one.rounds, one.proposed, one.tau, one.acceptance_rate) == (1, [0], 1.0, None)


# --------------------------------------------------------------------------------- seeding


def test_same_seed_same_output_different_key_different_output(models):
    model = models["trained"]
    prompt, n, cfg = PROMPTS[5], 30, SamplerConfig()
    for run in (
        lambda k: decode_native(model, prompt, n, cfg, k).tokens,
        lambda k: _spec(model, prompt, n, cfg, "kmer", 5, k).tokens,
        lambda k: _spec(model, prompt, n, cfg, "kmer", 3, k, "replay").tokens,
        lambda k: generate(model, prompt, n, drafter="kmer", gamma=4, seed=k.seed,
                           record=k.record, sample=k.sample).tokens,
    ):
        base = run(RngKey(7, 3, 0))
        assert run(RngKey(7, 3, 0)) == base
        others = [run(RngKey(7, 3, 1)), run(RngKey(8, 3, 0)), run(RngKey(7, 4, 0))]
        assert all(o != base for o in others)
        assert len({tuple(o) for o in others}) == 3


@pytest.mark.parametrize("drafter", ["identity", "kmer"])
@pytest.mark.parametrize("model_name", ["trained", "echo"])
def test_slice_and_replay_agree_when_sampled(models, model_name, drafter):
    model = models[model_name]
    cfg = SamplerConfig()
    for i, gamma in enumerate((1, 3, 6)):
        for s in range(2):
            rng = RngKey(21, i, s)
            prompt = PROMPTS[2 + 2 * i + s]
            a = _spec(model, prompt, 16, cfg, drafter, gamma, rng, "slice")
            b = _spec(model, prompt, 16, cfg, drafter, gamma, rng, "replay")
            assert a.tokens == b.tokens
            assert a.accepted == b.accepted and a.proposed == b.proposed


# ------------------------------------------------------------------------------- verify CLI


def _write_fasta(path: Path) -> Path:
    path.write_text("".join(f">rec{i}\n{DNA[25 * i: 25 * i + 20 + 3 * i]}\n" for i in range(4)))
    return path


def _run_verify(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    from evspark_cli import cli

    monkeypatch.setattr(sys, "argv", ["evspark", "verify", *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    code = exc.value.code
    return (0 if code is None else int(code)), capsys.readouterr().out


def _verify_args(trained_dir, tmp_path, rollback="slice"):
    return [str(_write_fasta(tmp_path / "p.fa")), "--model", str(trained_dir), "--drafter", "kmer",
            "--gamma", "4", "-n", "24", "--device", "cpu", "--quiet", "--rollback", rollback,
            "--report", str(tmp_path / "report.json")]


@pytest.mark.parametrize("rollback", ["slice", "replay"])
def test_verify_cli_passes(trained_dir, tmp_path, monkeypatch, capsys, rollback):
    code, out = _run_verify(_verify_args(trained_dir, tmp_path, rollback), monkeypatch, capsys)
    assert code == 0, out
    assert "non_tie_divergences=0" in out and "identical=4" in out
    rows = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert [r["divergence"] for r in rows] == [None] * 4
    assert all(r["tau"] > 1.0 for r in rows)  # the drafter was accepted: rounds were checked


def _plant_commit_one_too_many(monkeypatch):
    from evspark_cli.model.state import Block, as_lengths

    orig = Block.commit

    def commit(self, j):
        js = as_lengths(j, len(self.lengths0))
        return orig(self, [x + 1 if x < self.k else x for x in js])

    monkeypatch.setattr(Block, "commit", commit)


def _plant_accept_everything(monkeypatch):
    import evspark_cli.decode.batch as batch

    orig = batch.decide_rows

    def accept_all(p, q, drafts, u, gammas):
        orig(p, q, drafts, u, gammas)
        g = torch.tensor(gammas)
        return g, p[torch.arange(len(gammas)), g].to(torch.float64)

    monkeypatch.setattr(batch, "decide_rows", accept_all)


@pytest.mark.parametrize("plant", [_plant_commit_one_too_many, _plant_accept_everything],
                         ids=["commit-one-too-many", "accept-every-draft"])
def test_verify_cli_fails_on_planted_divergence(trained_dir, tmp_path, monkeypatch, capsys, plant):
    plant(monkeypatch)
    code, out = _run_verify(_verify_args(trained_dir, tmp_path), monkeypatch, capsys)
    assert code == 1, out
    summary = [ln for ln in out.splitlines() if "non_tie_divergences=" in ln]
    assert len(summary) == 1 and int(summary[0].rsplit("=", 1)[1]) >= 1, out
    assert " NO " in out
    rows = json.loads((tmp_path / "report.json").read_text())["rows"]
    assert any(r["divergence"] is not None and not r["tie"] for r in rows)


def test_compare_greedy_classifies_ties(models):
    nat = decode_native(models["trained"], PROMPTS[6], 20, GREEDY, track_margins=True)
    assert len(nat.margins) == 20 and min(nat.margins) >= 0
    i = min(range(20), key=lambda k: nat.margins[k])
    flipped = list(nat.tokens)
    flipped[i] = 65 if flipped[i] != 65 else 67
    spec = DecodeResult(flipped, 1.0, "speculative", rounds=5, accepted=[3] * 5, proposed=[4] * 5)
    m = nat.margins[i]
    above = compare_greedy("r", nat, spec, tie_tolerance=m * 2 + 1e-6)
    assert (above["divergence"], above["tie"], above["compared"]) == (i, True, i + 1)
    assert above["native_margin"] == m
    below = compare_greedy("r", nat, spec, tie_tolerance=m / 2)
    assert below["tie"] is False
    same = compare_greedy("r", nat, DecodeResult(list(nat.tokens), 1.0, "speculative", rounds=1,
                                                 accepted=[19], proposed=[19]), 1e-3)
    got = (same["divergence"], same["tie"], same["compared"], same["tau"])
    assert got == (None, False, 20, 20.0)
    # hand-made margins: a tiny native gap at the divergence is a tie, a large one is not
    hand = DecodeResult([1, 2, 3], 1.0, "native", margins=[5.0, 1e-6, 3.0])
    assert compare_greedy("h", hand, DecodeResult([1, 9, 3], 1.0, "speculative"), 1e-3)["tie"]
    assert not compare_greedy("h", hand, DecodeResult([1, 2, 9], 1.0, "speculative"), 1e-3)["tie"]
    assert first_divergence([1, 2, 3], [1, 2]) == 2 and first_divergence([1], [1]) is None


# -------------------------------------------------------------------------------- NaN guard


def _nan_model(model_dir: Path, token: int = 0):
    """Row `token` of the (tied) embedding is NaN: every logits row has a NaN in column `token`."""
    m = load_model(model_dir)
    with torch.no_grad():
        m.embedding_layer.weight[token] = float("nan")
    return m


@pytest.mark.parametrize("drafter", ["none", "identity", "kmer"])
def test_nan_logits_raise_run_error_naming_record_and_position(model_dirs, drafter):
    m = _nan_model(model_dirs["trained"])
    prompt = "ACGTAC"  # prefill 5 tokens; the first generated token sits at position 6
    with pytest.raises(RunError, match=r"record 'chrNaN:1-6', position 6\b"):
        generate(m, prompt, 8, drafter=drafter, gamma=3, record_id="chrNaN:1-6")


def test_nan_guard_in_decoders_directly(model_dirs):
    m = _nan_model(model_dirs["random"], token=300)
    p = list(b"GATTACA")
    with pytest.raises(RunError, match=r"record 'r7', position 7\b"):
        decode_native(m, p, 4, SamplerConfig(), label="r7")
    for rollback in ("slice", "replay"):
        with pytest.raises(RunError, match=r"record 'r7', position 7\b"):
            decode_speculative(m, p, 4, SamplerConfig(), KmerDrafter(), 2, rollback=rollback,
                               label="r7")
    with pytest.raises(RunError, match=r"^position 1\b"):  # no label, a one-token prompt
        decode_native(m, [65], 2, GREEDY)


def _nan_from(model, first_bad: int):
    """Wrap model.extend: logits rows predicting absolute positions >= first_bad become NaN
    (row i of an extend from a state of length t0 predicts position t0 + i + 1)."""
    orig = model.extend

    def extend(state, ids):
        logits, hidden, block = orig(state, ids)
        pos = state.seqlen + 1 + torch.arange(logits.shape[1])
        return logits.masked_fill((pos >= first_bad)[None, :, None], float("nan")), hidden, block

    model.extend = extend
    return model


def test_nan_mid_generation_reported_at_its_position_natively(model_dirs):
    prompt = list(b"ACGTTGCAGC")
    for bad in (11, 13, 17):
        m = _nan_from(load_model(model_dirs["trained"]), bad)
        with pytest.raises(RunError, match=rf"position {bad}\b"):
            decode_native(m, prompt, 12, SamplerConfig(), label="x")


@pytest.mark.parametrize("drafter", ["identity", "kmer"])
def test_nan_mid_generation_reported_at_its_position_speculatively(model_dirs, drafter):
    """Non-finite logits mid-generation are reported at the position whose logits are
    non-finite, the same position native decoding reports, not at the first position of the
    speculative verification block that holds them."""
    prompt = list(b"ACGTTGCAGC")
    for bad in (13, 17):
        m = _nan_from(load_model(model_dirs["trained"]), bad)
        with pytest.raises(RunError, match=rf"position {bad}\b"):
            decode_speculative(m, prompt, 12, SamplerConfig(), DRAFTERS[drafter](), 8, label="x")


def test_speculative_ignores_non_finite_logits_it_discards(model_dirs):
    """Non-finite logits that only exist after a *rejected* draft (a context native decoding
    never computes) do not abort a speculative run: it gives native decoding's tokens. Here the
    target's logits are NaN right after any G is fed; greedy native decoding never emits G, while
    the k-mer drafter proposes G after a G-rich prompt."""
    m = load_model(model_dirs["trained"])
    orig = m.extend

    def extend(state, ids):
        logits, hidden, block = orig(state, ids)
        return logits.masked_fill((ids == ord("G"))[..., None], float("nan")), hidden, block

    m.extend = extend
    prompt = list(b"GGAGGAGGAGGAGGAGGAGGAGGAT")
    nat = decode_native(m, prompt, 16, GREEDY)
    assert ord("G") not in nat.tokens
    spec = decode_speculative(m, prompt, 16, GREEDY, KmerDrafter(), 4)
    assert spec.tokens == nat.tokens


# ------------------------------------------------------------------------ result statistics


@pytest.mark.parametrize("drafter,model_name", [("kmer", "trained"), ("kmer", "echo"),
                                                ("identity", "trained")])
def test_decode_result_statistics(models, drafter, model_name):
    model = models[model_name]
    gamma, n = 5, 40
    res = _spec(model, PROMPTS[7], n, SamplerConfig(), drafter, gamma, RngKey(3))
    assert res.mode == "speculative" and res.rounds == len(res.accepted) == len(res.proposed)
    assert res.tau == pytest.approx((sum(res.accepted) + res.rounds) / res.rounds)
    assert res.tau == pytest.approx(n / res.rounds)
    assert 0.0 <= res.acceptance_rate <= 1.0
    assert res.acceptance_rate == pytest.approx(sum(res.accepted) / sum(res.proposed))
    assert len(res.position_trials) == len(res.position_accepts) == gamma
    for k in range(gamma):
        trials = sum(1 for m, g in zip(res.accepted, res.proposed) if k < g and k <= m)
        accepts = sum(1 for m in res.accepted if m > k)
        assert (res.position_trials[k], res.position_accepts[k]) == (trials, accepts)
        assert res.position_accepts[k] <= res.position_trials[k]
        if k + 1 < gamma:  # reaching slot k+1 requires accepting slot k
            assert res.position_trials[k + 1] <= res.position_accepts[k]
    assert sum(res.position_accepts) == sum(res.accepted)
    assert res.position_trials[0] == sum(1 for g in res.proposed if g > 0)
    if drafter == "identity":
        assert res.acceptance_rate == 1.0 and res.position_accepts == res.position_trials
    else:
        assert 0 < sum(res.accepted) < sum(res.proposed)  # both outcomes occur
    assert res.wall_s >= res.draft_s + res.verify_s - 1e-6 and res.draft_s > 0 and res.verify_s > 0
    nat = decode_native(model, PROMPTS[7], n, SamplerConfig(), RngKey(3))
    assert (nat.mode, nat.rounds, nat.tau, nat.acceptance_rate) == ("native", 0, None, None)
    out = generate(model, PROMPTS[7], n, drafter=drafter, gamma=gamma, seed=3, compare_native=True)
    assert out.stats["tau"] == pytest.approx(out.result.tau, abs=1e-4)
    assert out.stats["new_tokens"] == n and out.stats["rounds"] == out.result.rounds
    assert out.native is not None and len(out.native.tokens) == n


def test_prefilled_prompt_is_reusable_and_equals_a_fresh_start(model_dirs):
    """Benchmarks prefill once and decode several times from clones: same tokens as decoding from
    scratch, and the shared prefill is never modified."""
    from evspark_cli.decode.prefill import prefill_prompt

    model = load_model(model_dirs["trained"])
    prompt = list(DNA[:90].encode())
    sampler = SamplerConfig(1.0, 4, 1.0)
    pf = prefill_prompt(model, prompt, reserve=64, keep_hidden=16)
    before = {k: v.clone() for k, v in pf.state.tensors().items()}
    assert pf.seconds > 0 and pf.hidden is not None and pf.hidden.shape[0] == 16
    for seed in (0, 1):
        key = RngKey(seed, 0, 0)
        fresh = decode_native(model, prompt, 24, sampler, key)
        assert decode_native(model, prompt, 24, sampler, key, prefilled=pf).tokens == fresh.tokens
        for name, cls in DRAFTERS.items():
            spec = decode_speculative(model, prompt, 24, sampler, cls(), 5, key, prefilled=pf)
            spec2 = decode_speculative(model, prompt, 24, sampler, cls(), 5, key)
            assert spec.tokens == spec2.tokens
            assert spec.prefill_s < fresh.wall_s  # no prefill inside: a clone of the state
    after = pf.state.tensors()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match="fewer hidden states"):
        pf.begin(keep_hidden=32)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), None])
def test_all_finite_sees_every_non_finite_and_only_them(bad):
    """The guard's one-sum check: a NaN or inf anywhere is caught; finite logits whose sum
    overflows (3e38 twice) are rechecked entry by entry and pass."""
    from evspark_cli.decode.batch import all_finite

    x = torch.zeros(13, 512)
    x[0, 0] = x[0, 1] = 3e38  # the sum overflows to inf although every entry is finite
    if bad is not None:
        x[7, 300] = bad
    assert all_finite(x) is (bad is None)
    assert all_finite(x[1:]) is (bad is None)


# ------------------------------------------------ `evspark generate`: greedy and vocabularies


def test_greedy_does_not_depend_on_gamma_or_drafter(battery_models: Models, tmp_path: Path):
    src = w(tmp_path, "in.fa", OK_FASTA + ">r3\nTTTAGGCATTACGGACTA\n")
    seqs = {}
    for drafter, gamma in (("none", 1), ("kmer", 1), ("kmer", 4), ("kmer", 12), ("identity", 3),
                           ("identity", 12)):
        r = run_cli(["generate", src, "--model", battery_models.good, *FAST, "-n", 40, "--greedy",
                     "--drafter", drafter, "--gamma", gamma, "--seed", gamma])
        assert r.code == 0, r.err
        seqs[(drafter, gamma)] = re.sub(r"(?m)^>.*$", "", r.out)
    assert len(set(seqs.values())) == 1, seqs
    # --top-k 1 is the same as --greedy, and sampling does differ from it
    same = run_cli(["generate", src, "--model", battery_models.good, *FAST, "-n", 40, "--top-k", 1])
    assert re.sub(r"(?m)^>.*$", "", same.out) == seqs[("none", 1)]
    sampled = run_cli(["generate", src, "--model", battery_models.good, *FAST, "-n", 40])
    assert re.sub(r"(?m)^>.*$", "", sampled.out) != seqs[("none", 1)]


def test_kmer_drafter_follows_the_model_vocabulary(tmp_path, masked_fa):
    m = random_tiny_dir(tmp_path / "v256", vocab_size=256)
    for drafter in ("kmer", "auto"):
        r = run_cli(["verify", masked_fa, "--model", m, "--drafter", drafter, "-n", 12, "-g", 4,
                     *FAST])
        assert r.code == 0, r.err
        assert "non_tie_divergences=0" in r.out
