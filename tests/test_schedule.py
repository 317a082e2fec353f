"""Draft length by confidence (decode/schedule.py): the cost table, its cache, the choice of a
block length, and the promise that matters: under greedy decoding and the coupled rule the
schedule changes how many drafts a round verifies, never a token."""
from __future__ import annotations

import json

import pytest
import torch
from test_coupled import COUPLED, _jobs, prompts  # noqa: F401
from test_lossless_stats import trained  # noqa: F401
from tiny import one_line_error, run_cli

from evspark_cli.decode import schedule
from evspark_cli.decode.batch import BatchDecoder
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.schedule import BlockCosts, DraftSchedule
from evspark_cli.errors import SettingError
from evspark_cli.generation.options import DecodeOptions


def test_costs_interpolate_between_measured_points():
    c = BlockCosts([1, 4], [1, 3], [[1.0, 3.0], [4.0, 12.0]])
    assert c(1, 1) == 1.0 and c(4, 3) == 12.0
    assert c(1, 2) == pytest.approx(2.0) and c(2, 1) == pytest.approx(2.0)
    assert c(2, 2) == pytest.approx((1 - 1 / 3) * 2.0 + (1 / 3) * 8.0)
    assert c(8, 1) == pytest.approx(8.0)  # past the grid: the last segment, extended


def test_costs_are_measured_once_then_read_from_the_cache(trained, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(schedule, "_MEMO", {})
    costs = schedule.block_costs(trained, 3, 5)
    assert costs.rows == [1, 2, 3] and costs.blocks == [1, 2, 3, 4, 5]
    assert all(s > 0 for line in costs.seconds for s in line)
    files = list((tmp_path / "evspark" / "block-costs").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["seconds"] == costs.seconds
    monkeypatch.setattr(schedule, "_MEMO", {})

    def never(*a, **k):
        raise AssertionError("measured again although cached")

    monkeypatch.setattr(schedule, "measure_block_costs", never)
    assert schedule.block_costs(trained, 3, 5).seconds == costs.seconds
    files[0].write_text("{not json")  # a damaged cache file is measured again, not trusted
    monkeypatch.setattr(schedule, "_MEMO", {})
    with pytest.raises(AssertionError, match="measured again"):
        schedule.block_costs(trained, 3, 5)


def _flat(G: int) -> BlockCosts:
    return BlockCosts([1, 64], list(range(1, G + 2)), [[1.0] * (G + 1)] * 2)


def _steep(G: int) -> BlockCosts:
    return BlockCosts([1, 64], list(range(1, G + 2)), [[4.0 + k for k in range(1, G + 2)]] * 2)


def test_choice_follows_cost_and_confidence():
    G = 8
    sure = torch.full((2, G), 5.0)  # perturbed-score gaps far past the last bin edge
    unsure = torch.full((2, G), 0.0)
    s = DraftSchedule(_flat(G), G, coupled=True)
    assert s.choose(unsure, [G, G]) == G  # a free block: verify every draft
    s = DraftSchedule(_steep(G), G, coupled=True)
    s.hits[-1], s.trials[-1] = 999.0, 1000.0  # drafts of a wide gap are nearly always kept
    s.hits[0], s.trials[0] = 1.0, 100.0  # drafts of no gap nearly never
    assert s.choose(sure, [G, G]) == G
    assert s.choose(unsure, [G, G]) == 0
    assert s.choose(sure, [3, 2]) == 3  # never past the longest draft


def test_observe_counts_reached_and_kept_drafts():
    s = DraftSchedule(_flat(4), 4, coupled=False)  # greedy: one bin per draft slot
    before = (list(s.hits), list(s.trials))
    s.choose(None, [4, 4])
    s.observe([4, 4], [1, 4])  # row 0 kept 1 (reached 2), row 1 kept all 4
    assert [t - b for t, b in zip(s.trials, before[1])] == [2, 2, 1, 1]
    assert [h - b for h, b in zip(s.hits, before[0])] == [2, 1, 1, 1]


def _run(model, jobs, sampler, drafter, gamma, batch, adaptive):
    dec = BatchDecoder(model, sampler, drafter, gamma, batch_size=batch, adaptive=adaptive)
    out, verified = {}, 0
    for o in dec.run(jobs):
        assert o.error is None, o.error
        out[o.job.index] = o.result.tokens
        verified += o.result.verified
    return out, verified, dec


@pytest.mark.parametrize("sampler", [COUPLED, SamplerConfig(0.7, 0, 0.9, "coupled"),
                                     SamplerConfig(1.0, 1, 1.0)], ids=["coupled", "nucleus",
                                                                       "greedy"])
def test_the_schedule_never_changes_a_token(trained, prompts, sampler):  # noqa: F811
    jobs = _jobs(prompts, 2, [31, 12])
    want = {j.index: decode_native(trained, list(j.prompt), j.max_new_tokens, sampler,
                                   j.rng).tokens for j in jobs}
    for drafter, gamma, batch in ((KmerDrafter(), 6, 1), (KmerDrafter(), 10, 4),
                                  (IdentityDrafter(), 4, 3)):
        got, _, dec = _run(trained, jobs, sampler, drafter, gamma, batch, True)
        assert dec.schedule is not None
        assert got == want, (drafter, gamma, batch)


def test_the_schedule_shortens_blocks_of_unsure_drafts(trained, prompts, monkeypatch):  # noqa: F811
    """With a block cost that grows with its length, rounds verify fewer positions than a fixed
    gamma, and the tokens stay native sampling's."""
    from evspark_cli.decode import batch

    G = 10
    # the decoder's own reference to the table (batch.py imports the name): a table timed on
    # this machine instead would make the choice depend on the machine's load
    monkeypatch.setattr(batch, "block_costs", lambda m, rows, block: _steep(block))
    jobs = _jobs(prompts, 2, [40])
    fixed, v_fixed, _ = _run(trained, jobs, COUPLED, KmerDrafter(), G, 4, False)
    adaptive, v_adaptive, dec = _run(trained, jobs, COUPLED, KmerDrafter(), G, 4, True)
    assert dec.schedule is not None and dec.schedule.costs.seconds == _steep(G + 1).seconds
    assert adaptive == fixed and v_adaptive < v_fixed


def test_residual_sampling_keeps_its_fixed_gamma(trained):  # noqa: F811
    residual = SamplerConfig(1.0, 4, 1.0)
    assert BatchDecoder(trained, residual, KmerDrafter(), 5, adaptive=True).schedule is None
    with pytest.raises(SettingError) as e:
        DecodeOptions(draft_length="confidence")
    assert e.value.settings == ("draft_length", "rule")
    with pytest.raises(SettingError):
        DecodeOptions(draft_length="short")
    assert DecodeOptions(draft_length="confidence", top_k=1).adaptive


def test_draft_length_on_the_command_line(phix_model, tmp_path):
    fa = tmp_path / "p.fa"
    fa.write_text(">a\nACGTTGCAACGTAGGCTTAGCAT\n>b\nTTGACCA\n")
    base = ["generate", fa, "--model", phix_model, "-n", 24, "--drafter", "kmer", "-t", 1, "-q",
            "--rule", "coupled", "--seed", 5]
    fixed = run_cli(base)
    conf = run_cli(base + ["--draft-length", "confidence", "--samples", 1])
    assert fixed.code == conf.code == 0, conf.err
    assert fixed.out == conf.out
    r = run_cli(["generate", fa, "--model", phix_model, "-n", 4, "--draft-length", "confidence",
                 "-q"])
    msg = one_line_error(r, 2)
    assert "--draft-length" in msg and "--rule" in msg
