"""The DSpark drafter (parallel trunk + V x V Markov head) as the decoders and users see it.

* q is exactly the law the drafts are drawn from (empirical chi-square on d_1 and (d_1, d_2));
* the Markov head makes q_k depend on the previous token, and training teacher-forces it with
  the true previous tokens;
* a saved folder loads back to the same q; a folder distilled from another target, or a corrupt
  one, is refused (ModelError, exit 3 from the CLI) unless --force-drafter;
* greedy speculative decoding with it equals native decoding (short prompts included), its
  hidden-state prefix holds the target's own hidden states, and acceptance stays lossless when
  the target puts mass outside the drafter's alphabet;
* a --gamma beyond the drafter's slots is refused before any record.
"""
from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import FAST  # noqa: E402
from tiny import (  # noqa: E402
    PHIX,
    one_line_error,
    phix_genome,
    random_tiny_dir,
    run_cli,
    tiny_config,
    trained_tiny_dir,
)

from evspark_cli.decode.batch import BatchDecoder  # noqa: E402
from evspark_cli.decode.drafters import dspark  # noqa: E402
from evspark_cli.decode.drafters.base import DraftContext, Proposal, RngKey  # noqa: E402
from evspark_cli.decode.drafters.dspark import (  # noqa: E402
    DSparkConfig,
    DSparkDrafter,
    DSparkNet,
    load_drafter,
    save_drafter,
)
from evspark_cli.decode.jobs import Job  # noqa: E402
from evspark_cli.decode.native import decode_native  # noqa: E402
from evspark_cli.decode.prefill import start  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig, coupled_draw, sampler_probs  # noqa: E402
from evspark_cli.decode.speculative import decode_speculative  # noqa: E402
from evspark_cli.errors import ModelError  # noqa: E402
from evspark_cli.model.checkpoint import load_model, weights_hash  # noqa: E402

DNA = [65, 67, 71, 84]
N_ID = 78
GREEDY = SamplerConfig(1.0, 1, 1.0)
P = 16  # hidden-state prefix of the test drafters


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return trained_tiny_dir(tmp_path_factory.mktemp("target"), steps=20)


@pytest.fixture(scope="module")
def target(target_dir):
    return load_model(target_dir)


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory) -> Path:
    """Another target of the very same shape (hidden 32, conditioning layers [1, 3])."""
    return random_tiny_dir(tmp_path_factory.mktemp("other"), seed=5)


@pytest.fixture(scope="module")
def genome() -> str:
    return phix_genome()


@pytest.fixture(scope="module")
def distilled(target_dir, tmp_path_factory) -> DSparkDrafter:
    """A drafter briefly distilled from the tiny target (high acceptance)."""
    from evspark_cli.train.distill import CacheConfig, DistillConfig, DistillTrainer, build_cache

    tmp = tmp_path_factory.mktemp("distilled")
    build_cache(CacheConfig(target=str(target_dir), out_dir=str(tmp / "cache"), train=[str(PHIX)],
                            natural_windows=8, onpolicy_windows=4, window=128, onpolicy_prompt=64,
                            batch=4), log=lambda m: None)
    tr = DistillTrainer(DistillConfig(cache=str(tmp / "cache"), out_dir=str(tmp / "run"), steps=30,
                                      batch=8, gamma=4, gamma_max=8, width=32, layers=1, heads=2,
                                      prefix_len=P, warmup=3, log_every=10, ckpt_every=1000))
    tr.run()
    return load_drafter(tr.export(tmp / "drafter"), load_model(target_dir))


def random_net(seed: int, target_hash: str = "", gamma_max: int = 8, order: int = 1,
               trunk_markov: bool = False) -> DSparkNet:
    """An untrained drafter with a strong random Markov table and head: q far from uniform
    (and, with `trunk_markov`, a strong random trunk table)."""
    torch.manual_seed(seed)
    net = DSparkNet(DSparkConfig(target_hidden=32, target_layers=2, width=32, layers=1, heads=2,
                                 prefix_len=P, gamma_max=gamma_max, target_hash=target_hash,
                                 target_name="tiny", markov_order=order,
                                 trunk_markov=trunk_markov))
    g = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        net.markov.copy_(1.5 * torch.randn(net.markov.shape, generator=g))
        net.head.weight.copy_(2.0 * torch.randn(net.head.weight.shape, generator=g) / math.sqrt(32))
        net.head.bias.copy_(torch.randn(net.head.bias.shape, generator=g))
        if net.pair is not None:
            net.pair.weight.copy_(2.0 * torch.randn(net.pair.weight.shape, generator=g)
                                  / math.sqrt(32))
    return net.eval()


def ids(s: str) -> list[int]:
    return list(s.encode())


class OneRow:
    """A drafter's memory of one row (a batch of one), with single-row calls for the tests."""

    def __init__(self, drafter: DSparkDrafter, ctx: DraftContext) -> None:
        self.rows = drafter.rows([ctx])
        self.ctx = ctx

    def propose(self, state, anchor: int, gamma: int):
        prop = self.rows.propose(state, [anchor], [gamma])
        return Proposal(prop.drafts[:1, :gamma], prop.q[:1, :gamma])

    @property
    def prefix(self):
        """The conditioned hidden-state prefix (1, P, width)."""
        return self.rows.ctx

    @property
    def valid(self):
        return self.rows.valid


def begin(drafter: DSparkDrafter, model, prompt: list[int], sampler: SamplerConfig, rng: RngKey):
    """Prefill like the decoders do and start the drafter; returns (row memory, state, anchor)."""
    state, anchor, hidden = start(model, prompt, reserve=64, keep_hidden=drafter.prefix_len)
    return OneRow(drafter, DraftContext(model, list(prompt), sampler, rng, hidden)), state, anchor


def restarter(drafter: DSparkDrafter, model, prompt: list[int], sampler: SamplerConfig):
    """Prefill once; restart(rng) starts the drafter's row on that prefill with another RNG key."""
    state, anchor, hidden = start(model, prompt, reserve=64, keep_hidden=drafter.prefix_len)

    def restart(rng: RngKey):
        row = OneRow(drafter, DraftContext(model, list(prompt), sampler, rng, hidden))
        return row, state, anchor

    return restart


def chi2_pvalue(observed: list[float], expected: list[float]) -> float:
    """Pearson chi-square upper tail; cells expected below 5 are pooled into one."""
    obs, exp, pool_o, pool_e = [], [], 0.0, 0.0
    for o, e in zip(observed, expected):
        if e < 5:
            pool_o, pool_e = pool_o + o, pool_e + e
        else:
            obs.append(o)
            exp.append(e)
    if pool_e > 0:
        obs.append(pool_o)
        exp.append(pool_e)
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp))
    df = len(obs) - 1
    assert df >= 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


# ------------------------------------------------------------------------ CLI in this process


@pytest.fixture(scope="module")
def fasta(tmp_path_factory, genome) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "p.fa"
    p.write_text(f">a\n{genome[100:160]}\n>b\n{genome[900:931]}\n")
    return p


# ---------------------------------------------------------------------- (1) q is the draw law


@pytest.mark.slow
@pytest.mark.parametrize("sampler", [SamplerConfig(1.0, 0, 1.0), SamplerConfig(0.8, 3, 0.95)],
                         ids=["T1-all", "T0.8-top3-p0.95"])
def test_q_is_the_law_the_drafts_are_drawn_from(target, genome, sampler):
    d = DSparkDrafter(random_net(1))
    prompt = ids(genome[200:240])
    n = 2500
    q1_ref = None
    q2_of: dict[int, torch.Tensor] = {}
    first: Counter = Counter()
    pairs: Counter = Counter()
    restart = restarter(d, target, prompt, sampler)
    for s in range(n):
        row, state, anchor = restart(RngKey(s, 11, 0))
        prop = row.propose(state, anchor, 2)
        prop = Proposal(prop.drafts[0], prop.q[0])
        assert prop.q.shape == (2, target.config.vocab_size) and prop.q.dtype == torch.float32
        d1, d2 = (int(x) for x in prop.drafts)
        # (6) no mass outside the alphabet, rows are distributions, drafts have positive q
        outside = torch.ones(prop.q.shape[-1], dtype=torch.bool)
        outside[DNA] = False
        assert bool((prop.q[:, outside] == 0).all())
        assert torch.allclose(prop.q.sum(-1), torch.ones(2), atol=1e-6)
        assert prop.q[0, d1] > 0 and prop.q[1, d2] > 0
        if q1_ref is None:
            q1_ref = prop.q[0].clone()
        assert torch.equal(prop.q[0], q1_ref), "q_1 must not depend on the random numbers"
        if d1 in q2_of:
            assert torch.equal(prop.q[1], q2_of[d1]), "q_2 must depend on d_1 only"
        else:
            q2_of[d1] = prop.q[1].clone()
        first[d1] += 1
        pairs[(d1, d2)] += 1
    assert q1_ref is not None
    q1 = q1_ref.double()
    # the test has power: q_1 is far from uniform and the Markov head moves q_2 with d_1
    support = [t for t in DNA if q1[t] > 0]
    assert 0.5 * sum(abs(float(q1[t]) - 1 / len(support)) for t in support) > 0.1
    assert len(q2_of) >= 2
    rows = list(q2_of.values())
    assert max(0.5 * float((a - b).abs().sum()) for a in rows for b in rows) > 0.1
    assert set(first) <= set(support), "a draft was drawn where q_1 has no mass"
    p1 = chi2_pvalue([first[t] for t in support], [n * float(q1[t]) for t in support])
    assert p1 > 1e-4, f"d_1 frequencies disagree with q_1 (p={p1:.2e})"
    cells = [(a, b) for a in q2_of for b in DNA if q2_of[a][b] > 0]
    assert set(pairs) <= set(cells), "a draft was drawn where q_2 has no mass"
    exp = [n * float(q1[a]) * float(q2_of[a][b]) for a, b in cells]
    unseen = sum(n * float(q1[a]) for a in support if a not in q2_of)
    assert unseen < 5, "a likely d_1 was never drawn"
    p2 = chi2_pvalue([pairs[c] for c in cells], exp)
    assert p2 > 1e-4, f"(d_1, d_2) frequencies disagree with q_1(d_1) q_2(d_2|d_1) (p={p2:.2e})"


@pytest.mark.slow
def test_chi_square_check_detects_a_wrong_q(target, genome):
    """Guard on the check above: the drafts are not distributed as the base logits alone say."""
    d = DSparkDrafter(random_net(1))
    sampler = SamplerConfig(1.0, 0, 1.0)
    prompt = ids(genome[200:240])
    row, state, anchor = begin(d, target, prompt, sampler, RngKey(0, 11, 0))
    net = d.net
    with torch.no_grad():
        U = net.base_logits(row.prefix, row.valid, torch.tensor([anchor]), 2)[0]
    wrong = torch.softmax(U[1].double(), -1)  # q_2 without the Markov correction
    pairs: Counter = Counter()
    n = 1500
    restart = restarter(d, target, prompt, sampler)
    for s in range(n):
        row, state, anchor = restart(RngKey(s, 11, 0))
        prop = row.propose(state, anchor, 2)
        pairs[DNA.index(int(prop.drafts[0, 1]))] += 1
    # the true marginal of d_2 is sum_a q_1(a) q_2(.|a); the uncorrected one must be rejected
    assert chi2_pvalue([pairs[i] for i in range(4)], [n * float(w) for w in wrong]) < 1e-4


# ------------------------------------------------------------------------- (2) the Markov head


def test_markov_head_moves_q_with_the_previous_token():
    net = random_net(2)
    g = torch.Generator().manual_seed(0)
    ctx = net.condition(torch.randn(1, P, 2, 32, generator=g))
    valid = torch.ones(1, P, dtype=torch.bool)
    anchor = torch.tensor([67])
    with torch.no_grad():
        base = net.base_logits(ctx, valid, anchor, 3)
        zs = {b: net.logits(ctx, valid, anchor, torch.tensor([[67, b, 65]])) for b in DNA + [N_ID]}
    for b, z in zs.items():
        # same base logits; slot 0 and 2 do not see b; slot 1 gets exactly row B_1[b]
        assert torch.equal(z[0, 0], zs[65][0, 0]) and torch.equal(z[0, 2], zs[65][0, 2])
        row = DNA.index(b) if b in DNA else 4  # N shares the "other" row
        torch.testing.assert_close(z[0, 1], base[0, 1] + net.markov[1, row], rtol=0, atol=1e-6)
    q2 = {b: torch.softmax(z[0, 1], -1) for b, z in zs.items()}
    for a in DNA:
        for b in DNA:
            if a < b:
                assert float((q2[a] - q2[b]).abs().sum()) > 0.05


def test_a_trunk_markov_table_depends_on_the_context_and_the_previous_token():
    """With `trunk_markov`, slot k's correction for previous token b is B_k[b] plus the trunk's
    own table for the slot: it differs between contexts (the static table alone cannot), and
    teacher-forced logits pick the row of b from every conditional."""
    net = random_net(2, trunk_markov=True)
    g = torch.Generator().manual_seed(0)
    ctx = net.condition(torch.randn(2, P, 2, 32, generator=g))
    valid = torch.ones(2, P, dtype=torch.bool)
    anchor = torch.tensor([67, 67])
    with torch.no_grad():
        base = net.base_logits(ctx, valid, anchor, 3)
        Z = net.conditionals(ctx, valid, anchor, 3)  # (2, 3, classes, A)
        corr = Z - base[:, :, None, :] - net.markov[:3]
        assert float((corr[0] - corr[1]).abs().max()) > 0.1  # context-dependent tables
        for b in DNA + [N_ID]:
            z = net.logits(ctx, valid, anchor, torch.tensor([[67, b, 65]] * 2))
            row = DNA.index(b) if b in DNA else 4
            torch.testing.assert_close(z[:, 1], Z[:, 1, row], rtol=0, atol=0)
    assert net.cfg.parameter_count() == sum(p.numel() for p in net.parameters())


def phix_teacher(target_dir, tmp_path):
    """A small teacher cache of phiX windows, loaded for training batches."""
    from evspark_cli.train.distill import CacheConfig, TeacherData, build_cache

    build_cache(CacheConfig(target=str(target_dir), out_dir=str(tmp_path / "c"), train=[str(PHIX)],
                            natural_windows=4, onpolicy_windows=0, window=128, batch=4),
                log=lambda m: None)
    return TeacherData(tmp_path / "c")


def test_a_higher_order_head_is_teacher_forced_with_the_true_tokens_before_each_slot(
        target_dir, tmp_path):
    """Order 3: slot k reads the three true tokens before it (newest first), the anchor and the
    tokens before it included, and each slot's Markov row is the class of exactly those."""
    from evspark_cli.train.distill import DistillConfig, distill_loss

    data = phix_teacher(target_dir, tmp_path)
    b = data.batch(64, 5, P, torch.Generator().manual_seed(2), order=3)
    prev, tgt = b["prev"], b["target"]
    assert prev.shape == (64, 5, 3)
    assert torch.equal(prev[:, 0, 0], b["anchor"])
    assert torch.equal(prev[:, 1:, 0], tgt[:, :-1])
    assert torch.equal(prev[:, 1:, 1:], prev[:, :-1, :-1])  # the context slides by one token
    net = random_net(3, order=3)
    net.train()
    loss, _ = distill_loss(net, b, DistillConfig(cache="", out_dir="", markov_order=3))
    loss.backward()
    used = torch.zeros(net.markov.shape[:2], dtype=torch.bool)
    cls = net.context_class(prev)
    lut = net.lut
    want = lut[prev[..., 0]] + 5 * lut[prev[..., 1]] + 25 * lut[prev[..., 2]]
    assert torch.equal(cls, want)
    for k in range(5):
        used[k, cls[:, k]] = True
    grad_norm = net.markov.grad.abs().sum(-1)
    assert bool((grad_norm[~used] == 0).all()) and bool((grad_norm[used] > 0).all())
    with pytest.raises(ValueError, match="order"):
        net.logits(net.condition(b["ctx"]), b["valid"], b["anchor"], prev[..., :1])


def test_training_teacher_forces_the_markov_head_with_true_previous_tokens(target_dir, tmp_path):
    from evspark_cli.train.distill import DistillConfig, distill_loss

    data = phix_teacher(target_dir, tmp_path)
    gamma = 5
    b = data.batch(32, gamma, P, torch.Generator().manual_seed(1))
    assert torch.equal(b["prev"][:, 0, 0], b["anchor"])
    assert torch.equal(b["prev"][:, 1:, 0], b["target"][:, :-1])  # teacher forcing: true tokens
    net = random_net(3)
    net.train()
    loss, _ = distill_loss(net, b, DistillConfig(cache="", out_dir=""))
    loss.backward()
    used = torch.zeros(net.markov.shape[:2], dtype=torch.bool)
    rows = net.context_class(b["prev"])
    for k in range(gamma):
        used[k, rows[:, k]] = True
    grad_norm = net.markov.grad.abs().sum(-1)
    assert bool((grad_norm[~used] == 0).all()), "a Markov row the batch never selects got gradient"
    assert bool((grad_norm[used] > 0).all()), "a Markov row chosen by a prev token got no gradient"
    # a different previous token changes the loss (the head is really in the loss)
    b2 = dict(b)
    b2["prev"] = b["prev"].clone()
    b2["prev"][:, 1:, 0] = torch.tensor(DNA)[(net.lut[b["prev"][:, 1:, 0]].clamp(max=3) + 1) % 4]
    with torch.no_grad():
        assert abs(float(distill_loss(net, b2, DistillConfig(cache="", out_dir=""))[0])
                   - float(loss)) > 1e-4


# ---------------------------------------------------------------------- (3) save/load round trip


@pytest.mark.parametrize("trunk_markov", [False, True])
def test_save_load_round_trip_gives_identical_q(tmp_path, target, genome, trunk_markov):
    net = random_net(4, target_hash="", trunk_markov=trunk_markov)
    folder = save_drafter(net, tmp_path / "d")
    assert json.loads((folder / "config.json").read_text())["kind"] == "dspark"
    back = load_drafter(folder, target)
    assert back.cfg == net.cfg
    own, other = net.state_dict(), back.net.state_dict()
    assert own.keys() == other.keys() and all(torch.equal(own[k], other[k]) for k in own)
    sampler = SamplerConfig(1.0, 4, 1.0)
    a, b = DSparkDrafter(net), back
    for prompt in (ids(genome[10:50]), ids(genome[3:4])):
        for s in range(3):
            ra, sa, xa = begin(a, target, prompt, sampler, RngKey(s, 2, 0))
            rb, sb, xb = begin(b, target, prompt, sampler, RngKey(s, 2, 0))
            pa, pb = ra.propose(sa, xa, 6), rb.propose(sb, xb, 6)
            assert torch.equal(pa.drafts, pb.drafts) and torch.equal(pa.q, pb.q)


def test_a_drafter_folder_is_loaded_once_per_model_until_its_files_change(tmp_path, target_dir,
                                                                          monkeypatch):
    """A loop of `evs.generate` calls does not reload (and re-hash the target for) its drafter;
    a rewritten folder, another model or another folder is loaded anew."""
    import os

    import evspark_cli.decode.drafters.dspark as dspark_module
    from evspark_cli.decode.drafters.registry import resolve_drafter

    folder = save_drafter(random_net(6, target_hash=weights_hash(target_dir)), tmp_path / "d")
    loads = []
    real = dspark_module.load_drafter
    monkeypatch.setattr(dspark_module, "load_drafter",
                        lambda *a, **k: loads.append(a[0]) or real(*a, **k))
    model = load_model(target_dir)
    first = resolve_drafter(model, str(folder))
    assert resolve_drafter(model, folder) is first and len(loads) == 1
    assert resolve_drafter(load_model(target_dir), folder) is not first and len(loads) == 2
    weights = folder / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    again = resolve_drafter(model, folder)
    assert again is not first and len(loads) == 3
    out = evspark_generate(model, folder)
    assert len(loads) == 3 and out == evspark_generate(model, folder)
    with pytest.raises(ModelError, match="another target"):  # checks still run on a first load
        resolve_drafter(load_model(random_tiny_dir(tmp_path / "o", seed=7)), folder)


def evspark_generate(model, drafter) -> list[int]:
    import evspark_cli as evs

    return evs.generate(model, "ACGTTGCA", max_new_tokens=6, drafter=drafter, gamma=3).tokens


# ------------------------------------------------------------- (4) wrong target, corrupt folders


def test_drafter_of_another_target_is_refused_unless_forced(tmp_path, target_dir, other_dir, target,
                                                           fasta):
    from evspark_cli.decode.drafters.registry import resolve_drafter

    folder = save_drafter(random_net(5, target_hash=weights_hash(target_dir)), tmp_path / "d")
    other = load_model(other_dir)
    assert load_drafter(folder, target).cfg.target_hash == weights_hash(target_dir)
    with pytest.raises(ModelError, match="another target"):
        load_drafter(folder, other)
    with pytest.raises(ModelError, match="another target"):
        resolve_drafter(other, str(folder))
    assert isinstance(load_drafter(folder, other, force=True), DSparkDrafter)

    base = ["generate", fasta, "-n", 8, "--threads", 1, "-q", "--drafter", folder]
    code, out, err = run_cli(base + ["--model", other_dir])
    assert code == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evspark: error:")
    assert "another target" in lines[0]
    assert "--force-drafter" in lines[0] and out == ""
    code, out, err = run_cli(base + ["--model", other_dir, "--force-drafter"])
    assert code == 0, err
    assert [ln[1:].split()[0] for ln in out.splitlines() if ln.startswith(">")] == [
        "a.cont", "b.cont"]
    assert "drafter=dspark" in out
    code, out, err = run_cli(base + ["--model", target_dir])
    assert code == 0, err


def test_drafter_for_another_shape_is_refused_even_when_forced(tmp_path):
    from evspark_cli.model.model import StripedHyena

    folder = save_drafter(random_net(6), tmp_path / "d")
    wide = StripedHyena(tiny_config(hidden_size=48))
    with pytest.raises(ModelError, match="hidden 32"):
        load_drafter(folder, wide, force=True)
    fewer = StripedHyena(tiny_config(hidden_layers=[3]))
    with pytest.raises(ModelError, match="conditioning layers"):
        load_drafter(folder, fewer, force=True)


def _edit_config(folder: Path, **kw) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(kw)
    (folder / "config.json").write_text(json.dumps(cfg))


def _resave(folder: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(str(folder / "model.safetensors"))
    fn(t)
    save_file(t, str(folder / "model.safetensors"))


def _truncate(folder: Path) -> None:
    w = folder / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])


CORRUPTIONS = {
    "no-weights": lambda f: (f / "model.safetensors").unlink(),
    "no-config": lambda f: (f / "config.json").unlink(),
    "truncated-weights": _truncate,
    "garbage-weights": lambda f: (f / "model.safetensors").write_bytes(b"not safetensors at all"),
    "bad-json": lambda f: (f / "config.json").write_text('{"kind": "dspark", '),
    "json-list": lambda f: (f / "config.json").write_text("[1, 2]"),
    "wrong-kind": lambda f: _edit_config(f, kind="kmer"),
    "unknown-field": lambda f: _edit_config(f, colour="blue"),
    "bad-field-type": lambda f: _edit_config(f, width="wide"),
    "shape-mismatch": lambda f: _edit_config(f, width=48),
    "missing-tensor": lambda f: _resave(f, lambda t: t.pop("markov")),
    "nan-tensor": lambda f: _resave(f, lambda t: t["markov"].fill_(float("nan"))),
}


@pytest.mark.parametrize("how", list(CORRUPTIONS))
def test_corrupt_drafter_folder_is_refused(tmp_path, how, target, target_dir, fasta):
    folder = save_drafter(random_net(7, target_hash=weights_hash(target_dir)), tmp_path / "d")
    load_drafter(folder, target)  # intact: fine
    CORRUPTIONS[how](folder)
    with pytest.raises(ModelError):
        load_drafter(folder, target)
    with pytest.raises(ModelError):
        load_drafter(folder, target, force=True)
    code, out, err = run_cli(["generate", fasta, "--model", target_dir, "--drafter", folder,
                              "-n", 4, "--threads", 1, "-q"])
    lines = err.strip().splitlines()
    assert code == 3 and len(lines) == 1 and lines[0].startswith("evspark: error:"), err
    assert "internal error" not in err and out == ""


# ----------------------------------------------------------- (5) greedy speculative == native


@pytest.mark.slow
def test_greedy_speculative_decoding_equals_native(target, distilled, genome):
    drafters = {"distilled": distilled, "random": DSparkDrafter(random_net(8))}
    prompts = [genome[:1], genome[7:9], genome[50:53], genome[100:117], genome[500:560]]
    accepted = rejected = 0
    for text in prompts:
        prompt = ids(text)
        nat = decode_native(target, prompt, 24, GREEDY, RngKey(0))
        for name, d in drafters.items():
            for gamma in (1, 3, 8):
                for rollback in (("slice", "replay") if gamma == 3 else ("slice",)):
                    spec = decode_speculative(target, prompt, 24, GREEDY, d, gamma, RngKey(0),
                                              rollback)
                    assert spec.tokens == nat.tokens, (name, len(text), gamma, rollback)
                    accepted += sum(spec.accepted)
                    rejected += sum(g - a for a, g in zip(spec.accepted, spec.proposed))
        # short prompts: the drafter starts with only len - 1 valid prefix rows
        row, state, anchor = begin(drafters["random"], target, prompt, GREEDY, RngKey(0))
        assert int(row.valid.sum()) == min(P, len(prompt) - 1)
    assert accepted > 0 and rejected > 0  # both the accept and the rollback paths ran


WALKS = {"coupled-T1-top4": SamplerConfig(1.0, 4, 1.0, "coupled"),
         "coupled-T0.7-p0.9": SamplerConfig(0.7, 0, 0.9, "coupled"),
         "residual-T1-all": SamplerConfig(1.0, 0, 1.0),
         "residual-T0.8-top3-p0.95": SamplerConfig(0.8, 3, 0.95)}


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, nan where the other is nan (a padding row's gap)."""
    return a.shape == b.shape and bool(((a == b) | (a.isnan() & b.isnan())).all())


@pytest.mark.parametrize("sampler", list(WALKS.values()), ids=list(WALKS))
def test_one_stream_walks_its_draws_as_a_batch_does(target, genome, sampler, monkeypatch):
    """A row walked on host ints (at most SCALAR_WALK rows) drafts what the array walk drafts:
    the same drafts, q and path scores, and under the coupled rule the same confidence, which
    is `coupled_draw`'s gap for each draft's q at its position (what the schedule read before)."""
    d = DSparkDrafter(random_net(3, gamma_max=8, order=2, trunk_markov=True))
    walked = 0
    for n, at in ((3, 10), (40, 600), (120, 2000)):
        prompt = ids(genome[at:at + n])
        for seed in range(4):
            rng = RngKey(seed, 7, 1)
            row, state, anchor = begin(d, target, prompt, sampler, rng)
            for gamma in (1, 5, 8):
                one = row.rows.propose(state, [anchor], [gamma])
                monkeypatch.setattr(dspark, "SCALAR_WALK", 0)
                arr = row.rows.propose(state, [anchor], [gamma])
                monkeypatch.undo()
                assert torch.equal(one.drafts, arr.drafts) and torch.equal(one.q, arr.q)
                assert one.paths is not None and arr.paths is not None
                assert torch.equal(one.paths.scores, arr.paths.scores)
                walked += gamma
                if not sampler.coupled:
                    assert one.confidence is None and arr.confidence is None
                    continue
                assert one.confidence is not None and arr.confidence is not None
                assert _same(one.confidence, arr.confidence)
                pos = torch.arange(gamma) + state.lengths[0] + 1
                keys = torch.full((gamma,), rng.coupled, dtype=torch.long)
                _, gap = coupled_draw(one.q[0], keys, pos, sampler)
                assert _same(one.confidence[0], gap), (one.confidence, gap)
    assert walked == 3 * 4 * 14


@pytest.mark.parametrize("sampler", [WALKS["residual-T1-all"], WALKS["coupled-T1-top4"]],
                         ids=["residual", "coupled"])
def test_rows_of_different_draft_lengths_score_their_paths_as_alone(target, genome, sampler):
    """A round whose rows draft different lengths drafts each group on its own: each row's
    drafts, path scores (what token trees branch from) and confidence are those it has alone,
    its path scores -inf past its drafts."""
    d = DSparkDrafter(random_net(4, gamma_max=8, order=2, trunk_markov=True))
    prompt = ids(genome[300:340])
    state, anchor, hidden = start(target, prompt, reserve=64, keep_hidden=d.prefix_len)
    ctxs = [DraftContext(target, list(prompt), sampler, RngKey(5, i, 0), hidden)
            for i in range(3)]
    gammas = [5, 3, 5]
    with torch.inference_mode():
        both = d.rows(ctxs).propose(state.select([0, 0, 0]), [anchor] * 3, gammas)
        for b, (c, g) in enumerate(zip(ctxs, gammas)):
            alone = d.rows([c]).propose(state, [anchor], [g])
            assert torch.equal(both.drafts[b, :g], alone.drafts[0])
            assert torch.equal(both.paths.scores[b, :g], alone.paths.scores[0])
            assert bool((both.paths.scores[b, g:] == -math.inf).all())
            if sampler.coupled:
                assert _same(both.confidence[b, :g], alone.confidence[0])


@pytest.mark.parametrize("sampler", [WALKS["residual-T1-all"], WALKS["coupled-T1-top4"]],
                         ids=["residual", "coupled"])
def test_rows_walk_the_same_on_host_ints_and_arrays_in_a_batch(target, genome, sampler,
                                                                monkeypatch):
    """Residual tokens depend on every draft: a batch whose rows walk on host ints (and whose
    last rounds draft fewer tokens in some rows) emits what the array walk emits."""
    d = DSparkDrafter(random_net(5, gamma_max=8, order=3, trunk_markov=True))
    jobs = [Job(i, tuple(ids(genome[100 * i: 100 * i + 20 + 7 * i])), 25 + 6 * i,
                RngKey(2, i, 0)) for i in range(3)]

    def run(scalar: int) -> list[list[int]]:
        monkeypatch.setattr(dspark, "SCALAR_WALK", scalar)
        out = BatchDecoder(target, sampler, d, 6, batch_size=3).run(list(jobs))
        return [o.result.tokens for o in sorted(out, key=lambda o: o.job.rng.record)]

    assert run(0) == run(3) == run(2)


@pytest.mark.parametrize("sampler", [GREEDY, SamplerConfig(1.0, 4, 1.0)], ids=["greedy", "sampled"])
def test_prefix_holds_the_targets_hidden_states_of_committed_positions(target, distilled, genome,
                                                                      sampler):
    """After a run the drafter's prefix = teacher-forced hidden states of the last P committed
    positions (prompt + emitted tokens, the final anchor excluded), taken from verification."""
    for text in (genome[300:302], genome[300:340]):
        prompt = ids(text)
        decoder = BatchDecoder(target, sampler, distilled, 5)
        # the outcome comes out of the last round before its row leaves the batch
        spec = next(iter(decoder.run([Job(0, tuple(prompt), 30, RngKey(3))]))).result
        committed = prompt + spec.tokens[:-1]
        with torch.no_grad():
            _, hidden = target(torch.tensor([committed]), return_hidden=True)
        want = distilled.net.condition(hidden[:, -P:])[0]
        assert decoder.draft is not None and bool(decoder.draft.valid.all())
        torch.testing.assert_close(decoder.draft.ctx[0], want, rtol=1e-4, atol=1e-4)


# ------------------------------------------------- (6) lossless with target mass outside DNA


@pytest.mark.slow
def test_acceptance_is_lossless_when_the_target_puts_mass_on_n(target_dir, genome):
    """Make the target's N logit equal its A logit (so p̃(N) = p̃(A) > 0, where q is always 0):
    the first emitted token of speculative decoding must still follow p̃, N included."""
    model = load_model(target_dir)
    with torch.no_grad():
        model.embedding_layer.weight[N_ID] = model.embedding_layer.weight[65]
    sampler = SamplerConfig(1.0, 5, 1.0)
    prompt = ids(genome[1200:1240])
    with torch.no_grad():
        p = sampler_probs(model(torch.tensor([prompt]))[0, -1], sampler).double()
    support = [t for t in range(p.shape[0]) if p[t] > 0]
    assert N_ID in support and p[N_ID] > 0.05
    d = DSparkDrafter(random_net(9))
    n = 1200
    first: Counter = Counter()
    accepted = 0
    for s in range(n):
        res = decode_speculative(model, prompt, 2, sampler, d, 1, RngKey(s, 5, 0))
        first[res.tokens[0]] += 1
        accepted += res.accepted[0]
    assert set(first) <= set(support)
    assert first[N_ID] > 0 and 0 < accepted < n  # N came from corrections; drafts were accepted too
    pv = chi2_pvalue([first[t] for t in support], [n * float(p[t]) for t in support])
    assert pv > 1e-4, f"first-token frequencies disagree with the target's p̃ (p={pv:.2e})"


@pytest.mark.parametrize("sampler", [SamplerConfig(1.0, 4, 1.0), SamplerConfig(0.7, 3, 0.9),
                                     SamplerConfig(1.0, 1, 1.0), SamplerConfig(1.3, 0, 0.8),
                                     SamplerConfig(1.0, 4, 1.0, "coupled"),
                                     SamplerConfig(0.7, 0, 0.9, "coupled")],
                         ids=["evo2", "t0.7-k3-p0.9", "greedy", "t1.3-p0.8", "coupled-evo2",
                              "coupled-t0.7-p0.9"])
@pytest.mark.parametrize("order,trunk_markov", [(1, False), (3, False), (1, True), (2, True)],
                         ids=["order1", "order3", "trunk-order1", "trunk-order2"])
def test_batched_draws_equal_the_left_to_right_reference(target, sampler, order, trunk_markov):
    """propose() transforms every Markov conditional in one batch and walks the draws for all
    rows at once on the host (inverse-CDF on host floats, or every conditional's Gumbel-max
    winner, coupled); it must give exactly the drafts and q of the plain left-to-right loop (one
    sampler call and one draw per position, the Markov row read from the last `order` tokens),
    anchors outside the alphabet and prompts shorter than the head's context included."""
    from evspark_cli.decode.drafters.base import draw_on_alphabet

    def reference(d: OneRow, state, anchor: int, gamma: int):
        net = d.rows.net
        U = net.base_logits(d.prefix, d.valid, torch.tensor([anchor]), gamma)[0].float()
        trunk_table = torch.zeros_like(net.markov[:gamma])
        if net.pair is not None:  # the trunk's own table, from the same trunk output
            h = net._trunk(d.prefix, d.valid, torch.tensor([anchor]), gamma)[0]
            trunk_table = net.pair(h).view(gamma, net.cfg.classes, -1)
        seen = [0] * order + d.ctx.prompt[:-1] + [anchor]  # id 0: "other", before the start
        drafts, qs = [], []
        for k in range(gamma):
            cls = sum(int(net.lut[seen[-1 - j]]) * 5 ** j for j in range(order))
            z = U[k] + net.markov[k, cls].float()
            if net.pair is not None:
                z = z + trunk_table[k, cls]
            tok, q = draw_on_alphabet(z, d.rows.alpha,
                                      d.ctx.sampler, d.ctx.rng, state.seqlen + 1 + k,
                                      d.rows.cfg.vocab_size)
            drafts.append(tok)
            qs.append(q)
            seen.append(tok)
        return torch.tensor(drafts), torch.stack(qs)

    drafter = DSparkDrafter(random_net(5, order=order, trunk_markov=trunk_markov))
    with torch.inference_mode():
        prompts = ["ACGTTGCAAGGCTTAGCCATGAC" * (seed + 1) for seed in range(3)] + ["GA"]
        for seed, text in enumerate(prompts):
            row, state, anchor = begin(drafter, target, ids(text), sampler, RngKey(seed, 4, 1))
            for a in (anchor, N_ID, 65):
                for g in (1, 5, 8):
                    got = row.propose(state, a, g)
                    want_d, want_q = reference(row, state, a, g)
                    assert torch.equal(got.drafts[0], want_d), (seed, a, g)
                    assert torch.equal(got.q[0], want_q), (seed, a, g)


def test_the_heads_history_follows_committed_tokens_and_rows():
    """An order-3 head's history is the two committed tokens before each row's anchor: the
    prompt's at first, then the anchor and accepted drafts of each round, per row (rows that
    commit different counts, rows that join, leave or are replaced)."""
    from evspark_cli.decode.drafters.dspark import DSparkRows

    net = random_net(1, order=3)
    drafter = DSparkDrafter(net)

    class _Model:  # what DSparkRows reads of a context's model
        device = torch.device("cpu")

    def ctx(text: str) -> DraftContext:
        return DraftContext(_Model(), ids(text), SamplerConfig(1.0, 4, 1.0), RngKey(0, 0, 0))

    rows = DSparkRows(drafter, [ctx("ACGTA"), ctx("T"), ctx("GC")])
    assert rows.hist.tolist() == [ids("GT"), [0, 0], [0, ids("G")[0]]]
    fed = torch.tensor([ids("ACGT"), ids("TTTT"), ids("CAAA")])
    hidden = torch.zeros(3, 4, 2, 32)
    rows.observe(fed, hidden, [3, 1, 2])  # row 0: anchor A + drafts C G; row 1: anchor T only
    assert rows.hist.tolist() == [ids("CG"), [0, ids("T")[0]], ids("CA")]
    rows.append(DSparkRows(drafter, [ctx("TTGCA")]))
    rows.remove(1)  # the last row takes its place
    assert rows.hist.tolist() == [ids("CG"), ids("GC"), ids("CA")]
    rows.place([0], DSparkRows(drafter, [ctx("AAC")]))
    assert rows.hist.tolist() == [ids("AA"), ids("GC"), ids("CA")]


# ------------------------------------------------------ (7) --gamma beyond the drafter's slots


def test_gamma_beyond_the_drafters_slots_is_refused_up_front(tmp_path):
    """The bundled dspark drafter has 16 slots: gamma 17 is a usage error before any record
    (it used to fail every record and leave a .partial that --resume could not finish)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "o.fa"
    for cmd in (["generate", "-o", out], ["verify"]):
        r = run_cli([cmd[0], root / "examples" / "prompts.fa", "-n", 32, "--gamma", 17,
                     "--drafter", "dspark", *cmd[1:], *FAST])
        assert "at most 16" in one_line_error(r, 2)
    assert list(tmp_path.iterdir()) == []
    ok = run_cli(["generate", root / "examples" / "prompts.fa", "-n", 8, "--gamma", 17,
                  "--drafter", "dspark", *FAST])  # a round of 8 new tokens drafts at most 7
    assert ok.code == 0, ok.err
    r = run_cli(["bench", "-n", 32, "--n-prompts", 1, "-g", 17, "-o", tmp_path / "b", *FAST])
    assert "at most 16" in one_line_error(r, 2)
    assert list(tmp_path.iterdir()) == []
