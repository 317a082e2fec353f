"""`--alphabet acgt` (decode/sampling.py): sampling draws only A, C, G and T, the same on the
native and the speculative path, so speculative output still equals native output."""
from __future__ import annotations

import pytest
import torch
from tiny import one_line_error, run_cli

from evspark_cli.decode.sampling import SamplerConfig, sampler_probs

ACGT = list(b"ACGT")


@pytest.mark.parametrize("top_k,temperature,top_p", [(4, 1.0, 1.0), (0, 0.7, 0.9), (1, 1.0, 1.0),
                                                     (8, 1.3, 1.0)])
def test_only_the_four_bases_have_mass(top_k, temperature, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 512, generator=g) * 3
    logits[:, ord("N")] += 20  # the model's favourite token is not a base
    p = sampler_probs(logits, SamplerConfig(temperature, top_k, top_p, alphabet="acgt"))
    outside = torch.ones(512, dtype=torch.bool)
    outside[ACGT] = False
    assert torch.all(p[:, outside] == 0) and torch.allclose(p.sum(-1), torch.ones(64))
    if top_k == 1:  # greedy: the best of the four
        assert torch.equal(p.argmax(-1), torch.tensor(ACGT)[logits[:, ACGT].argmax(-1)])
    full = sampler_probs(logits, SamplerConfig(temperature, top_k, top_p))
    assert full[:, ord("N")].min() > 0.5  # without it, N is what is drawn


def test_a_bad_alphabet_is_refused_before_the_model_loads(tmp_path):
    r = run_cli(["generate", "--prompt", "ACGT", "--alphabet", "iupac", "--model",
                 tmp_path / "none", "-q"])
    assert "--alphabet must be all or acgt" in one_line_error(r, 2)


@pytest.mark.parametrize("rule", ["residual", "coupled"])
def test_generate_draws_bases_only_and_records_it(tmp_path, random_model, rule):
    """A random model writes any byte; with --alphabet acgt every letter is a base, the header
    says so, and a --resume without it is refused."""
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTTGCA\n>b\nGGATCC\n")
    out = tmp_path / "o.fa"
    args = ["generate", src, "--model", random_model, "-n", 40, "-t", 1, "-q", "--drafter",
            "kmer", "--rule", rule, "--samples", 2]
    plain = run_cli([*args]).out
    assert set("".join(ln for ln in plain.splitlines() if not ln.startswith(">"))) - set("ACGT")
    r = run_cli([*args, "--alphabet", "acgt", "-o", out])
    assert r.code == 0, r.err
    text = out.read_text()
    assert set("".join(ln for ln in text.splitlines() if not ln.startswith(">"))) <= set("ACGT")
    assert all("alphabet=acgt" in ln for ln in text.splitlines() if ln.startswith(">"))
    Path = type(out)
    Path(f"{out}.partial").write_text(text.split(">b.cont_s0")[0])
    r = run_cli([*args, "-o", out, "--resume"])
    assert "alphabet" in one_line_error(r, 2)


def test_verify_holds_under_the_restricted_alphabet(tmp_path, random_model):
    """Greedy and coupled sampling with --alphabet acgt: speculative equals native, token for
    token (the restriction is applied identically on both paths)."""
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTTGCAGG\n>b\nGGATCCAT\n")
    for extra in ([], ["--rule", "coupled", "--top-k", "4", "--seed", "5"]):
        r = run_cli(["verify", src, "--model", random_model, "-n", 48, "-t", 1, "-q",
                     "--drafter", "kmer", "--alphabet", "acgt", *extra])
        assert r.code == 0, r.out + r.err
        assert "non_tie_divergences=0" in r.out
