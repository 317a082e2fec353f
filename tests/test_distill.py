"""Distillation: the teacher cache, drafter training, export and the `evspark distill` command.

* the cache holds the target's own hidden states (within the fp32-scale codec bound), its
  sampler distribution on the alphabet plus the mass elsewhere (summing to 1), natural windows
  cut from the corpus and on-policy windows the target wrote itself;
* training lowers the loss, resumes to exactly the uninterrupted run, and exports a folder
  `load_drafter` accepts, stamped with the target's weights hash;
* `evspark distill` end to end on tiny sizes, then `evspark generate --drafter` with its folder.
* shapes that cannot be built, a window longer than every record, a cache of another target or
  a resume with another shape are one error line, and leave no half-built cache.
"""
from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import (  # noqa: E402
    PHIX,
    one_line_error,
    phix_genome,
    random_tiny_dir,
    run_cli,
    trained_tiny_dir,
)

from evspark_cli.decode.drafters.base import RngKey  # noqa: E402
from evspark_cli.decode.native import decode_native  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig, sampler_probs  # noqa: E402
from evspark_cli.errors import SettingError  # noqa: E402
from evspark_cli.model.checkpoint import load_model, weights_hash  # noqa: E402
from evspark_cli.train.codec import BF16_ABS_ERROR, ShardReader  # noqa: E402
from evspark_cli.train.distill import (  # noqa: E402
    CacheConfig,
    DistillConfig,
    DistillTrainer,
    TeacherData,
    build_cache,
    distill_loss,
    prepare_cache,
)

DNA = [65, 67, 71, 84]
NATURAL, ONPOLICY, WINDOW, PROMPT = 68, 4, 128, 48  # 72 windows: two shards of <= 64 rows


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return trained_tiny_dir(tmp_path_factory.mktemp("target"), steps=20)


@pytest.fixture(scope="module")
def genome() -> str:
    return phix_genome()


@pytest.fixture(scope="module")
def cache(target_dir, tmp_path_factory) -> CacheConfig:
    cfg = CacheConfig(target=str(target_dir), out_dir=str(tmp_path_factory.mktemp("c") / "cache"),
                      train=[str(PHIX)], natural_windows=NATURAL, onpolicy_windows=ONPOLICY,
                      window=WINDOW, onpolicy_prompt=PROMPT, batch=8, seed=3)
    msgs: list[str] = []
    build_cache(cfg, log=msgs.append)
    assert msgs and msgs[-1].startswith(f"cache: {NATURAL + ONPOLICY}/{NATURAL + ONPOLICY} windows")
    return cfg


@pytest.fixture(scope="module")
def data(cache) -> TeacherData:
    return TeacherData(cache.out_dir)


def small(cache: CacheConfig, out: Path, **kw) -> DistillConfig:
    base = dict(cache=cache.out_dir, out_dir=str(out), steps=30, batch=8, gamma=4, gamma_max=8,
                width=32, layers=1, heads=2, prefix_len=16, lr=3e-3, warmup=3, log_every=1,
                ckpt_every=1000, seed=0)
    base.update(kw)
    return DistillConfig(**base)


def log_rows(folder: Path) -> list[dict]:
    return [json.loads(ln) for ln in (folder / "log.jsonl").read_text().splitlines()]


def revcomp(s: str) -> str:
    return s[::-1].translate(str.maketrans("ACGT", "TGCA"))


# ------------------------------------------------------------------------------ teacher cache


def test_cache_holds_the_targets_hidden_states_and_distributions(cache, target_dir):
    r = ShardReader(cache.out_dir)
    assert r.num_shards == 2 and len(r) == NATURAL + ONPOLICY
    meta = r.metadata
    assert meta["target_hash"] == weights_hash(target_dir)
    assert meta["hidden_size"] == 32 and meta["target_hidden_layers"] == [1, 3]
    assert meta["alphabet"] == DNA and r.tensors["hidden"]["kind"] == "bf16"
    rows = {k: torch.cat([s[k] for s in r.iter_shards()]) for k in r.tensors}
    assert rows["tokens"].shape == (NATURAL + ONPOLICY, WINDOW)
    assert rows["onpolicy"].tolist() == [False] * NATURAL + [True] * ONPOLICY

    model = load_model(target_dir)
    with torch.no_grad():
        logits, hidden = model(rows["tokens"].long(), return_hidden=True)
    assert rows["hidden"].shape == hidden.shape == (NATURAL + ONPOLICY, WINDOW, 2, 32)
    absmax = hidden.abs().amax(-1, keepdim=True)
    err = (rows["hidden"] - hidden).abs()
    assert bool((err <= (BF16_ABS_ERROR + 1e-5) * absmax).all()), float((err / absmax).max())
    assert float(absmax.min()) > 0  # real hidden states, not zeros

    sampler = SamplerConfig(cache.temperature, cache.top_k, cache.top_p)
    p = sampler_probs(logits, sampler)
    torch.testing.assert_close(rows["p_alpha"], p[..., DNA], rtol=0, atol=2e-5)
    torch.testing.assert_close(rows["p_other"], 1 - p[..., DNA].sum(-1), rtol=0, atol=2e-5)
    total = rows["p_alpha"].sum(-1) + rows["p_other"]
    assert float((total - 1).abs().max()) < 1e-5
    assert bool((rows["p_other"] >= 0).all())

    # training reads exactly these rows back
    d = TeacherData(cache.out_dir)
    w, pos = torch.tensor([0, 40, 71]), torch.tensor([5, 100, 127])
    assert torch.equal(d.hidden(w, pos), rows["hidden"][w, pos])
    assert torch.equal(d.tokens, rows["tokens"].long())


def test_natural_windows_are_corpus_and_onpolicy_windows_are_target_generations(cache, target_dir,
                                                                                 genome):
    strands = genome + "|" + revcomp(genome)
    tokens = ShardReader(cache.out_dir).rows(range(NATURAL + ONPOLICY))["tokens"]
    text = ["".join(map(chr, t.tolist())) for t in tokens]
    for t in text[:NATURAL]:
        assert t in strands
    model = load_model(target_dir)
    sampler = SamplerConfig(cache.temperature, cache.top_k, cache.top_p)
    for i, t in enumerate(text[NATURAL:]):
        prompt, written = t[:PROMPT], t[PROMPT:]
        assert prompt in strands  # a natural prompt ...
        assert written not in strands and written[:24] not in strands  # ... then not the corpus
        # ... but exactly what native sampling from the target writes after that prompt
        nat = decode_native(model, list(prompt.encode()), WINDOW - PROMPT, sampler,
                            RngKey(cache.seed, 10_000 + i, 0))
        assert "".join(map(chr, nat.tokens)) == written


def test_onpolicy_prompt_longer_than_the_window_falls_back(target_dir, tmp_path):
    """The CLI's default on-policy prompt (512) with --window 128 must still give 128-token
    windows that end in target-written tokens."""
    cfg = CacheConfig(target=str(target_dir), out_dir=str(tmp_path / "c"), train=[str(PHIX)],
                      natural_windows=2, onpolicy_windows=2, window=WINDOW, batch=2)
    assert cfg.onpolicy_prompt >= WINDOW
    build_cache(cfg, log=lambda m: None)
    r = ShardReader(tmp_path / "c")
    rows = r.rows(range(4))
    assert rows["tokens"].shape == (4, WINDOW)
    assert rows["onpolicy"].tolist() == [False, False, True, True]
    assert r.metadata["onpolicy_prompt"] == WINDOW // 2


def test_greedy_windows_are_the_targets_greedy_continuations(target_dir, tmp_path, genome):
    """--greedy-windows: natural prompts the target continues greedily, after the natural and
    sampled windows; their p̃ is still the deployment sampler's (what the drafter learns)."""
    cfg = CacheConfig(target=str(target_dir), out_dir=str(tmp_path / "c"), train=[str(PHIX)],
                      natural_windows=1, onpolicy_windows=1, greedy_windows=2, window=WINDOW,
                      onpolicy_prompt=PROMPT, batch=2, seed=3)
    msgs: list[str] = []
    build_cache(cfg, log=msgs.append)
    assert msgs[-1].startswith("cache: 4/4 windows")
    rows = ShardReader(tmp_path / "c").rows(range(4))
    assert rows["onpolicy"].tolist() == [False, True, True, True]
    model = load_model(target_dir)
    strands = genome + "|" + revcomp(genome)
    greedy = SamplerConfig(1.0, 1, 1.0)
    for t in rows["tokens"][2:].tolist():
        assert "".join(map(chr, t[:PROMPT])) in strands
        nat = decode_native(model, t[:PROMPT], WINDOW - PROMPT, greedy, RngKey(0, 0, 0))
        assert nat.tokens == t[PROMPT:]
    with torch.no_grad():
        logits = model(rows["tokens"].long())
    p = sampler_probs(logits, SamplerConfig(cfg.temperature, cfg.top_k, cfg.top_p))
    torch.testing.assert_close(rows["p_alpha"], p[..., DNA], rtol=0, atol=2e-5)


def test_a_reused_cache_of_other_settings_is_named_in_a_warning(cache):
    """An existing cache is reused as built; asking for another composition says so."""
    from dataclasses import replace

    warned: list[str] = []
    assert prepare_cache(cache, log=warned.append) == Path(cache.out_dir)
    assert warned == []  # the settings it was built with
    asked = replace(cache, greedy_windows=5, natural_windows=NATURAL + 1, train=[])
    assert prepare_cache(asked, log=lambda m: None, warn=warned.append) == Path(cache.out_dir)
    assert len(warned) == 1 and "reused as built" in warned[0]
    assert f"natural_windows {NATURAL} (asked {NATURAL + 1})" in warned[0]
    assert "greedy_windows 0 (asked 5)" in warned[0] and "onpolicy" not in warned[0]


def test_teacher_batches_line_up(data):
    gamma, P = 4, 16
    b = data.batch(64, gamma, P, torch.Generator().manual_seed(0))
    assert b["ctx"].shape == (64, P, 2, 32) and b["p_alpha"].shape == (64, gamma, 4)
    assert b["prev"].shape == (64, gamma, 1)  # order 1: the one token before each slot
    assert torch.equal(b["prev"][:, 1:, 0], b["target"][:, :-1])
    assert torch.equal(b["prev"][:, 0, 0], b["anchor"])
    # find the anchors back: ctx are the hidden states of the P positions before the anchor, the
    # teacher rows are p̃ predicting each target token
    runs = data.tokens.unfold(1, gamma + 1, 1)  # (windows, starts, gamma + 1)
    pa = data.p_alpha.unfold(1, gamma, 1).permute(0, 1, 3, 2)  # (windows, starts, gamma, 4)
    for j in range(16):
        want = torch.cat([b["anchor"][j: j + 1], b["target"][j]])
        same_p = (pa[:, : runs.shape[1]] == b["p_alpha"][j]).all(-1).all(-1)
        match = (runs == want).all(-1)[:, : pa.shape[1]] & same_p
        hits = match.nonzero().tolist()
        assert hits, j
        w, a = hits[0]
        for i in range(P):
            pos = a - P + i
            assert bool(b["valid"][j, i]) == (pos >= 0)
            if pos >= 0:
                assert torch.equal(b["ctx"][j, i],
                                   data.hidden(torch.tensor([w]), torch.tensor([pos]))[0])
            else:
                assert bool((b["ctx"][j, i] == 0).all())


# ----------------------------------------------------------------------------------- training


def test_draft_slots_follow_the_supervised_gamma(tmp_path):
    """--gamma above 16 gives the drafter that many slots; an explicit smaller cap is refused."""
    cfg = DistillConfig(cache=str(tmp_path / "c"), out_dir=str(tmp_path / "d"), gamma=32)
    assert cfg.gamma_max == 32
    assert DistillConfig(cache="c", out_dir="d", gamma=8).gamma_max == 16
    with pytest.raises(SettingError, match="gamma"):
        DistillConfig(cache="c", out_dir="d", gamma=12, gamma_max=8)


def test_distillation_lowers_the_loss(cache, data, tmp_path):
    tr = DistillTrainer(small(cache, tmp_path / "run", steps=40), data)
    held = data.batch(128, 4, 16, torch.Generator().manual_seed(99), tr.cfg.markov_order)
    with torch.no_grad():
        before = float(distill_loss(tr.net.eval(), held, tr.cfg)[0])
    tr.run()
    with torch.no_grad():
        after = float(distill_loss(tr.net.eval(), held, tr.cfg)[0])
    log = log_rows(tmp_path / "run")
    assert [r["step"] for r in log] == list(range(1, 41))
    assert log[-1]["loss"] < 0.8 * log[0]["loss"], (log[0], log[-1])
    assert log[-1]["accept1"] > log[0]["accept1"]
    assert after < 0.8 * before
    assert log[-1]["supervised_positions"] == 40 * 8 * 4
    assert (tmp_path / "run" / "ckpt.pt").is_file()


def test_a_trunk_markov_drafter_trains_exports_and_loads(cache, data, tmp_path):
    """--trunk-markov: the trunk's table is learned (it moves from zero), the exported folder
    says so in its config and training record, and it loads into an equal net."""
    from evspark_cli.decode.drafters.dspark import load_drafter

    tr = DistillTrainer(small(cache, tmp_path / "run", steps=20, trunk_markov=True), data)
    assert tr.net.pair is not None and not bool(tr.net.pair.weight.any())
    tr.run()
    assert bool(tr.net.pair.weight.any())
    folder = tr.export(tmp_path / "d")
    raw = json.loads((folder / "config.json").read_text())
    assert raw["trunk_markov"] is True and raw["training"]["trunk_markov"] is True
    back = load_drafter(folder).net
    assert torch.equal(back.pair.weight, tr.net.pair.weight)


def test_resume_continues_exactly_like_an_uninterrupted_run(cache, data, tmp_path):
    kw = dict(steps=12, ckpt_every=5)
    a = DistillTrainer(small(cache, tmp_path / "a", **kw), data)
    a.run()

    class Stop(Exception):
        pass

    def interrupt(step, total, loss):
        if step == 7:
            raise Stop

    b = DistillTrainer(small(cache, tmp_path / "b", **kw), data)
    with pytest.raises(Stop):
        b.run(interrupt)  # dies after step 7; the last checkpoint is step 5
    c = DistillTrainer(small(cache, tmp_path / "b", **kw), data)
    assert c.resume() and c.step == 5
    nxt = c.train_step()  # the next loss equals the uninterrupted step 6
    la = {r["step"]: r for r in log_rows(tmp_path / "a")}
    assert round(nxt["loss"], 5) == la[6]["loss"] and round(nxt["accept1"], 5) == la[6]["accept1"]
    c.run()
    lb = log_rows(tmp_path / "b")
    # rows 6-7 of the interrupted run were dropped at resume (the checkpoint is step 5); step 6
    # ran above through train_step, which does not log
    assert [r["step"] for r in lb] == [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 12]
    assert lb[-1]["loss"] == la[12]["loss"]
    sa, sc = a.net.state_dict(), c.net.state_dict()
    assert all(torch.equal(sa[k], sc[k]) for k in sa)
    # not a tautology: a different seed gives a different run
    d = DistillTrainer(small(cache, tmp_path / "d", steps=12, seed=1), data)
    d.run()
    assert log_rows(tmp_path / "d")[-1]["loss"] != la[12]["loss"]


def test_export_is_a_loadable_drafter_stamped_with_the_target(cache, data, target_dir, tmp_path):
    from evspark_cli.decode.drafters.dspark import DSparkDrafter, load_drafter

    tr = DistillTrainer(small(cache, tmp_path / "run", steps=6), data)
    tr.run()
    folder = tr.export(tmp_path / "drafter")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["kind"] == "dspark" and cfg["target_hash"] == weights_hash(target_dir)
    assert cfg["target_hidden"] == 32 and cfg["target_layers"] == 2 and cfg["prefix_len"] == 16
    assert cfg["training"]["steps"] == 6 and cfg["training"]["supervised_positions"] == 6 * 8 * 4
    assert cfg["training"]["cache_windows"] == (f"{NATURAL} natural, {ONPOLICY} sampled, "
                                                f"0 greedy x {WINDOW} tokens")
    d = load_drafter(folder, load_model(target_dir))
    assert isinstance(d, DSparkDrafter)
    mine, theirs = tr.net.state_dict(), d.net.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


# ----------------------------------------------------------------------------------------- CLI


def fasta_seqs(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    rid = None
    for ln in text.splitlines():
        if ln.startswith(">"):
            rid = ln[1:].split()[0]
            out[rid] = ""
        elif rid is not None:
            out[rid] += ln.strip()
    return out


def test_distill_cli_end_to_end_then_generate(target_dir, genome, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(target_dir, model)
    out = tmp_path / "drafter"
    args = ["distill", "--model", model, "--train", PHIX, "--steps", 20, "--batch", 8,
            "--natural-windows", 8, "--onpolicy-windows", 4, "--window", 128, "--width", 32,
            "--prefix", 16, "--gamma", 4, "-o", out, "--threads", 1, "-q"]
    code, stdout, err = run_cli(args)
    assert code == 0, err
    assert "wrote drafter" in err and f"{20 * 8 * 4:,} supervised positions" in err
    assert re.match(r"evspark: distill: steps 0 to 20 of 20 in \d+\.\d s, last loss \d+\.\d{4}, "
                    r"1 thread \(--threads\)$", err.splitlines()[-1]), err
    assert (model / "teacher_cache" / "index.json").is_file()  # default cache place
    assert len(ShardReader(model / "teacher_cache")) == 12
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["target_hash"] == weights_hash(model) and cfg["prefix_len"] == 16
    assert cfg["width"] == 32 and cfg["training"]["steps"] == 20
    run = Path(f"{out}.run")
    assert (run / "ckpt.pt").is_file() and log_rows(run)[-1]["step"] == 20

    prompts = tmp_path / "p.fa"
    prompts.write_text(f">x\n{genome[10:70]}\n>y\n{genome[2000:2003]}\n")
    gen = ["generate", prompts, "--model", model, "-n", 20, "--threads", 1, "-q", "--seed", 4]
    code, spec, err = run_cli(gen + ["--drafter", out, "--stats", tmp_path / "s.tsv"])
    assert code == 0, err
    assert set(fasta_seqs(spec)) == {"x.cont", "y.cont"} and "drafter=dspark" in spec
    stats = (tmp_path / "s.tsv").read_text().splitlines()
    head = stats[0].split("\t")
    assert all(dict(zip(head, ln.split("\t")))["drafter"] == "dspark" for ln in stats[1:])
    # lossless: greedy through the drafter equals native greedy
    code, g_spec, err = run_cli(gen + ["--greedy", "--drafter", out])
    assert code == 0, err
    code, g_nat, err = run_cli(gen + ["--greedy", "--drafter", "none"])
    assert code == 0, err
    assert fasta_seqs(g_spec) == fasta_seqs(g_nat)

    # a second run reuses the cache and resumes the finished training instead of redoing it
    code, _, err = run_cli(args)
    assert code == 0, err
    assert "resumed drafter training at step 20" in err


# ------------------------------------------ `evspark distill` on inputs it cannot distill from


Q = ["-q"]


@pytest.mark.parametrize("opt", [["--width", "30"], ["--width", "0"], ["--layers", "0"],
                                 ["--prefix", "-1"],
                                 ["--natural-windows", "0", "--onpolicy-windows", "0"]])
def test_distill_shapes_that_cannot_be_built(tmp_path, opt):
    r = run_cli(["distill", "--model", tmp_path / "none", "--train", PHIX, "--cache",
                 tmp_path / "c", "-o", tmp_path / "d", *opt, *Q])
    one_line_error(r, 2)
    assert not (tmp_path / "c").exists()


def test_distill_refuses_a_cache_of_another_target_and_leaves_no_half_cache(tmp_path):
    a = random_tiny_dir(tmp_path / "a", seed=0)
    b = random_tiny_dir(tmp_path / "b", seed=1)
    small = ["--natural-windows", "2", "--onpolicy-windows", "0", "--window", "64", "--steps", "1",
             "--batch", "2", "--gamma", "2", "--width", "16", "--layers", "1", "--prefix", "8",
             "--threads", "1", *Q]
    # a window longer than every record: one line, and no half-built cache folder
    r = run_cli(["distill", "--model", a, "--train", PHIX, "--cache", tmp_path / "c0",
                 "-o", tmp_path / "d0", *small, "--window", "100000"])
    one_line_error(r, 2)
    assert not (tmp_path / "c0").exists()
    r = run_cli(["distill", "--model", a, "--train", PHIX, "--cache", tmp_path / "c",
                 "-o", tmp_path / "da", *small])
    assert r.code == 0, r.err
    r = run_cli(["distill", "--model", b, "--cache", tmp_path / "c", "-o", tmp_path / "db", *small])
    one_line_error(r, 2)
    assert not (tmp_path / "db").exists()
    # resuming with another drafter shape
    r = run_cli(["distill", "--model", a, "--cache", tmp_path / "c", "-o", tmp_path / "da",
                 *small, "--width", "32", "--steps", "2"])
    one_line_error(r, 3)
    # a resumed distill replays the log rows past its checkpoint instead of duplicating them
    log = tmp_path / "da.run" / "log.jsonl"
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1]
    with open(log, "a") as f:
        f.write(json.dumps({"step": 2, "loss": 9.0}) + "\n" + '{"step": 3, "lo')
    r = run_cli(["distill", "--model", a, "--cache", tmp_path / "c", "-o", tmp_path / "da",
                 *small, "--steps", "2"])
    assert r.code == 0, r.err
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2] and rows[1]["loss"] != 9.0
