"""Token trees on idle rows (decode/tree.py): branch rows verify alternative drafts in the same
pass and every row of a job takes the longest matching branch's tokens.

- the rollback protocol: `Block.commit(j, source)` gives each row the state of its source row's
  first j tokens, equal to extending those tokens alone, in both KV layouts; a commit that
  forgets the source's keys and values is caught;
- the planner: distinct branches, best first, continued as the drafter would;
- the decoders: with trees, greedy and coupled output equal native decoding token for token,
  with jobs joining and leaving, whatever the branches are (even arbitrary ones);
- settings: trees only where the output cannot change (greedy, coupled; slicing rollback).
"""
from __future__ import annotations

import pytest
import torch
from test_batch_decode import jobs_for
from test_lossless_stats import trained  # noqa: F401
from tiny import phix_genome

from evspark_cli.decode.batch import BatchDecoder
from evspark_cli.decode.drafters.dspark import load_drafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.tree import DraftPaths, TreeSizer, share_rows
from evspark_cli.errors import SettingError
from evspark_cli.generation.options import DecodeOptions
from evspark_cli.model.kvcache import KVCache

GREEDY = SamplerConfig(1.0, 1, 1.0)
COUPLED = SamplerConfig(1.0, 4, 1.0, "coupled")
COUPLED_T07 = SamplerConfig(0.7, 0, 0.9, "coupled")


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = phix_genome()
    return [list(g[a: a + n].encode()) for a, n in ((100, 1), (900, 5), (2000, 30), (3100, 77))]


@pytest.fixture(scope="module")
def drafter(trained, tmp_path_factory):  # noqa: F811
    """A random dspark drafter for the trained tiny target: poor drafts, so branches often win."""
    from evspark_cli.decode.drafters.dspark import DSparkConfig, DSparkNet, save_drafter

    torch.manual_seed(1)
    cfg = DSparkConfig(target_hidden=trained.config.hidden_size,
                       target_layers=len(trained.config.drafter_layers), width=32, layers=1,
                       heads=2, prefix_len=8, vocab_size=trained.config.vocab_size)
    return load_drafter(save_drafter(DSparkNet(cfg), tmp_path_factory.mktemp("tree") / "d"))


def _run(model, jobs, sampler, drafter, gamma, batch, tree_rows=0):
    dec = BatchDecoder(model, sampler, drafter, gamma, batch_size=batch, tree_rows=tree_rows)
    out = {}
    for o in dec.run(jobs):
        assert o.error is None, o.error
        out[o.job.index] = o.result
    return out


def _native(model, jobs, sampler):
    return {j.index: decode_native(model, list(j.prompt), j.max_new_tokens, sampler,
                                   j.rng).tokens for j in jobs}


# ------------------------------------------------------------------------------ the protocol


@pytest.mark.parametrize("dense", [False, True])
def test_commit_from_source_rows_equals_extending_their_tokens(trained, dense):  # noqa: F811
    """Three forks of one prefilled prompt extend different tokens; committing every row from
    row 2's first j tokens gives, in every row, the state of extending those tokens alone: the
    same tensors, and the same logits for the next block."""
    prompt = torch.tensor([list(phix_genome()[500:540].encode())])
    _, _, base = trained.prefill(prompt, reserve=64)
    state = base.select([0, 0, 0])
    if dense:
        for c in state.caches():
            c.reserve(128)
    block_ids = torch.tensor([[65, 67, 71, 84, 65], [84, 84, 84, 84, 84], [71, 65, 67, 67, 84]])
    _, _, block = trained.extend(state, block_ids)
    j = 4
    tree = block.commit([j, j, j], [2, 2, 2])
    _, _, alone = trained.extend(base.select([0]), block_ids[2:, :j])
    want = alone.commit(j)
    nxt = torch.tensor([[67, 65, 84]])
    want_logits = trained.extend(want, nxt)[0]
    got_logits = trained.extend(tree, nxt.expand(3, -1))[0]
    for b in range(3):
        torch.testing.assert_close(got_logits[b], want_logits[0], rtol=1e-5, atol=1e-5)
    assert tree.lengths == (40 + j,) * 3
    got, ref = tree.tensors(), want.tensors()
    for name, t in ref.items():
        for b in range(3):
            torch.testing.assert_close(got[name][b], t[0], rtol=1e-6, atol=1e-6, msg=name)


def test_commit_from_source_refuses_rows_that_disagree(trained):  # noqa: F811
    _, _, base = trained.prefill(torch.tensor([[65, 67, 71, 84]]), reserve=32)
    _, _, block = trained.extend(base.select([0, 0]), torch.tensor([[65, 67], [71, 84]]))
    with pytest.raises(ValueError):
        block.commit([1, 2], [1, 1])  # row 0 would take 1 token of a row that keeps 2


# ------------------------------------------------------------------------------ the planner


def _paths() -> DraftPaths:
    """Slot scores after each of 5 classes over 4 letters (ids 10..13); the drafter's letter is
    0 everywhere but after letter 2, where it is 3; its first two slots are sure, the third is
    not."""
    g, C, A = 4, 5, 4
    s = torch.zeros(1, g, C, A, dtype=torch.float64)
    s[..., 0] = 2.0
    s[..., 1] = 1.0  # the likeliest alternative everywhere
    s[:, :, 2, 3] = 3.0
    s[0, :2, [0, 1, 3, 4], 0] = 6.0  # slots 0 and 1 are sure
    s[0, 2, :, 1] = 1.9  # slot 2 is the least sure
    return DraftPaths(s, torch.tensor([10, 11, 12, 13]), [4], 1.0)


def test_branches_are_distinct_best_first_and_continued_as_drafted():
    paths = _paths()
    main = [10, 10, 10, 10]
    out = paths.branches(0, main, 6)
    assert len(out) == 6 and len({tuple(b) for b in out}) == 6 and main not in out
    assert out[0] == [10, 10, 11, 10]  # the least sure slot first, with its runner-up
    for i, b in enumerate(out):  # each leaves an earlier chain at one slot, then is drafted on
        assert len(b) == 4

        def grows_from(parent):
            k = next((j for j, (x, y) in enumerate(zip(b, parent)) if x != y), None)
            return k is not None and all(b[j] == (13 if b[j - 1] == 12 else 10)
                                         for j in range(k + 1, 4))

        assert any(grows_from(p) for p in [main] + out[:i]), b
    assert paths.branches(0, main, 0) == []
    assert len(paths.branches(0, main, 10_000)) == 4 ** 4 - 1  # every other path, once


def test_branches_of_a_higher_order_head_follow_their_context_class():
    """Order 2 (25 classes: the last two tokens, newest as the low digit): a branch's
    continuation is the drafter's letter in the class of the branch's own last two letters,
    and every path scores along its own classes (so all 4**3 - 1 others come out once)."""
    g, C, A = 3, 25, 4
    gen = torch.Generator().manual_seed(3)
    s = torch.randn(1, g, C, A, generator=gen, dtype=torch.float64)
    start = 4 + 5 * 2  # anchor "other", the token before it letter 2
    paths = DraftPaths(s, torch.tensor([10, 11, 12, 13]), [start], 1.0)

    def drafted(prefix: list[int], cls: int) -> list[int]:
        out = []
        for k in range(g):
            a = prefix[k] if k < len(prefix) else int(s[0, k, cls].argmax())
            out.append(a)
            cls = (cls * 5) % C + a
        return out

    main = drafted([], start)
    out = paths.branches(0, [10 + a for a in main], 200)
    assert len(out) == 4 ** 3 - 1 and len({tuple(b) for b in out}) == len(out)
    first = [b - 10 for b in out[0]]
    k = next(j for j in range(g) if first[j] != main[j])
    assert first == drafted(first[: k + 1], start)  # drafted on from the branch point


def test_share_rows():
    assert share_rows(7, 3) == [3, 2, 2]
    assert share_rows(0, 3) == [0, 0, 0]
    assert share_rows(2, 4) == [1, 1, 0, 0]


# ------------------------------------------------------------------------------ the decoders


@pytest.mark.parametrize("sampler", [GREEDY, COUPLED, COUPLED_T07], ids=["greedy", "coupled",
                                                                         "coupled-t0.7-p0.9"])
def test_trees_keep_natives_tokens(trained, drafter, prompts, sampler):  # noqa: F811
    """One job alone with branch rows, and six jobs through four rows (branches appear once the
    queue is empty and rows free up, and leave when jobs do): native decoding's tokens."""
    jobs = jobs_for(prompts, 2, [133, 20, 47], seed=5)[:6]
    want = _native(trained, jobs, sampler)
    one = _run(trained, jobs[:1], sampler, drafter, 8, 4, tree_rows=3)
    assert one[0].tokens == want[0]
    assert one[0].branch_rows > 0  # the branches took part (and, sampled, won rounds: a
    assert one[0].branch_wins > 0 or sampler.greedy  # greedy tiny target repeats one letter)
    many = _run(trained, jobs, sampler, drafter, 6, 4, tree_rows=2)
    assert {i: r.tokens for i, r in many.items()} == want
    assert sum(r.branch_rows for r in many.values()) > 0


def test_any_branches_keep_natives_tokens(trained, drafter, prompts, monkeypatch):  # noqa: F811
    """Losslessness does not rest on the planner: arbitrary branches change nothing."""
    gen = torch.Generator().manual_seed(0)

    def arbitrary(self, row, main, n):
        letters = self.alphabet.tolist()
        return [[letters[i] for i in torch.randint(0, 4, (len(main),), generator=gen)]
                for _ in range(n)]

    monkeypatch.setattr(DraftPaths, "branches", arbitrary)
    jobs = jobs_for(prompts, 1, [40], seed=2)
    got = _run(trained, jobs, COUPLED, drafter, 7, 8, tree_rows=2)
    assert {i: r.tokens for i, r in got.items()} == _native(trained, jobs, COUPLED)


def test_a_commit_that_forgets_the_sources_keys_is_caught(trained, monkeypatch):  # noqa: F811
    """Rows that took their source's windows but kept their own keys and values would attend
    to drafts that were never accepted: the protocol's comparison sees it."""
    monkeypatch.setattr(KVCache, "copy_block",
                        lambda self, source, t0, n: self.note_write((1 << 62,) * self.batch))
    with pytest.raises(AssertionError):
        test_commit_from_source_rows_equals_extending_their_tokens(trained, False)


def test_trees_count_their_rows(trained, drafter, prompts):  # noqa: F811
    jobs = jobs_for(prompts, 1, [150], seed=1)[1:2]
    plain = _run(trained, jobs, COUPLED, drafter, 6, 1)[jobs[0].index]
    tree = _run(trained, jobs, COUPLED, drafter, 6, 3, tree_rows=2)[jobs[0].index]
    assert plain.branch_rows == plain.branch_wins == 0
    assert 0 < tree.branch_wins <= tree.rounds and 0 < tree.branch_rows <= 2 * tree.rounds
    assert tree.verified > plain.verified  # branch positions are verified positions too


def _sizer(row_cost: float, gains: list[float], plain_s: float, trial_s: float) -> TreeSizer:
    """A sizer that timed one live row without branches and with 3, in turn: blocks cost
    1 + row_cost per row, branch i added gains[i] tokens per round."""
    z = TreeSizer(lambda rows, block: 1.0 + row_cost * rows, cap=3)
    for phase, n in enumerate(z.phases):
        for _ in range(n):
            assert z.width == (0 if phase % 2 == 0 else 3)
            if phase % 2 == 0:
                z.observe([[4]], 13, plain_s)
                continue
            m, row = 4, [4]
            for g in gains:
                m += g
                row.append(m)
            z.observe([row], 13, trial_s)
    return z


def test_the_sizer_keeps_the_branches_that_pay():
    # cheap rows, every branch adds a token: all three
    assert _sizer(0.01, [1, 1, 1], 1.0, 1.03).width == 3
    # rows as dear as the block itself, small gains: none
    assert _sizer(1.0, [0.2, 0.1, 0.1], 1.0, 2.5).width == 0
    # the first branch pays, the rest add nothing
    assert _sizer(0.05, [2, 0, 0], 1.0, 1.15).width == 1
    # a round with branches while it times plain ones is not counted (they leave next step)
    z = TreeSizer(lambda rows, block: float(rows), cap=2)
    z.observe([[3, 4, 5]], 13, 1.0)
    assert z.width == 0 and not z.trial_s


def test_no_trees_without_a_drafter_that_scores_paths(trained, prompts):  # noqa: F811
    jobs = jobs_for(prompts, 1, [20], seed=1)[:1]
    res = _run(trained, jobs, COUPLED, KmerDrafter(), 6, 4, tree_rows=3)[0]
    assert res.branch_rows == 0 and res.tokens == _native(trained, jobs, COUPLED)[0]


# ------------------------------------------------------------------------------ settings


def test_tree_rows_only_where_output_cannot_change():
    DecodeOptions(tree_rows=4, rule="coupled")
    DecodeOptions(tree_rows=4, top_k=1)
    with pytest.raises(SettingError, match="tree_rows"):
        DecodeOptions(tree_rows=4)  # residual sampling
    with pytest.raises(SettingError, match="tree_rows"):
        DecodeOptions(tree_rows=4, rule="coupled", rollback="replay")
    with pytest.raises(SettingError, match="tree_rows"):
        DecodeOptions(tree_rows=-1, rule="coupled")


def test_generate_with_tree_rows_writes_the_same_bytes(tmp_path, phix_model, phix_drafter):
    from typer.testing import CliRunner

    from evspark_cli.cli.app import app

    fa = tmp_path / "p.fa"
    fa.write_text(">a\n" + phix_genome()[:300] + "\n>b\n" + phix_genome()[800:900] + "\n")
    runner = CliRunner()
    outs = []
    for extra in ([], ["--tree-rows", "3"]):
        out = tmp_path / f"o{len(outs)}.fa"
        r = runner.invoke(app, ["generate", str(fa), "--model", str(phix_model), "--drafter",
                                str(phix_drafter), "-n", "40", "--rule", "coupled", "-q",
                                "-o", str(out), "--samples", "2", *extra])
        assert r.exit_code == 0, r.output
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    r = runner.invoke(app, ["generate", str(fa), "--model", str(phix_model), "-n", "5",
                            "--tree-rows", "2", "-q", "-o", str(tmp_path / "x.fa")])
    assert r.exit_code == 2 and "--tree-rows" in r.output and "--rule" in r.output
    assert not (tmp_path / "x.fa").exists()
