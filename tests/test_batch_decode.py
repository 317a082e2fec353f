"""The batched decoder: lossless per row, whatever the batch size and whoever shares the batch.

- greedy batched speculative decoding equals single-stream native decoding, for many prompts,
  gammas and drafters, with rows of different lengths and jobs of different lengths swapped in
  and out of a batch smaller than the job list (continuous batching);
- sampled output does not depend on the batch size (same seed, same tokens);
- sampled batched speculative decoding has the target's exact distribution (chi-square against
  the enumerated joint of the first tokens), and a broken batched rule is rejected;
- a row that fails (NaN logits) ends its own job only.
"""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from test_lossless_stats import ALPHA, PROMPT, SAMPLER, exact_joint, gof_test, trained  # noqa: F401
from tiny import phix_genome

from evspark_cli.decode.batch import BatchDecoder
from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.jobs import Job
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.prefill import PromptCache, prefill_prompt
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.errors import RunError

GREEDY = SamplerConfig(1.0, 1, 1.0)


def jobs_for(prompts: list[list[int]], samples: int, lengths: list[int], seed: int = 0
             ) -> list[Job]:
    """Jobs in input order: each prompt's samples; job lengths cycle through `lengths`."""
    out = []
    for r, p in enumerate(prompts):
        for s in range(samples):
            out.append(Job(len(out), tuple(p), lengths[len(out) % len(lengths)],
                           RngKey(seed, 1000 + r, s), f"r{r}"))
    return out


def run_all(model, jobs: list[Job], sampler, drafter, gamma: int, batch: int, **kw) -> dict:
    dec = BatchDecoder(model, sampler, drafter, gamma, batch_size=batch, **kw)
    outs = {}
    for o in dec.run(jobs):
        assert o.error is None, o.error
        outs[o.job.index] = o.result
    assert sorted(outs) == [j.index for j in jobs]
    return outs


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    g = phix_genome()
    return [list(g[a: a + n].encode()) for a, n in ((100, 1), (900, 5), (2000, 30), (3100, 77),
                                                     (4000, 12))]


@pytest.mark.parametrize("drafter", ["kmer", "identity", "none"])
def test_batched_greedy_equals_single_stream_native(trained, prompts, drafter):  # noqa: F811
    """Jobs of different prompt and output lengths through batches of 1-4 rows (rows join and
    leave as jobs finish) give exactly native decoding's tokens, each job on its own."""
    jobs = jobs_for(prompts, 2, [9, 24, 17])
    want = {j.index: decode_native(trained, list(j.prompt), j.max_new_tokens, GREEDY, j.rng).tokens
            for j in jobs}
    d = {"kmer": KmerDrafter(), "identity": IdentityDrafter(), "none": None}[drafter]
    for gamma, batch in ((1, 3), (4, 4), (8, 2)):
        got = run_all(trained, jobs, GREEDY, d, gamma, batch)
        for j in jobs:
            assert got[j.index].tokens == want[j.index], (drafter, gamma, batch, j)


def test_batch_size_does_not_change_sampled_tokens(trained, prompts):  # noqa: F811
    """The random numbers are keyed by (seed, record, sample, position, purpose), so a sampled
    run writes the same tokens with 1, 3 or 10 rows per batch (native and speculative)."""
    jobs = jobs_for(prompts, 3, [20, 33])
    for d, gamma in ((KmerDrafter(), 6), (None, 0)):
        ref = run_all(trained, jobs, SAMPLER, d, gamma, 1)
        for batch in (3, 10):
            got = run_all(trained, jobs, SAMPLER, d, gamma, batch)
            for j in jobs:
                assert got[j.index].tokens == ref[j.index].tokens, (batch, j)
                if d is not None:
                    assert got[j.index].accepted == ref[j.index].accepted


def test_replay_rollback_in_a_batch_equals_slicing(trained, prompts):  # noqa: F811
    jobs = jobs_for(prompts, 2, [15, 22])
    a = run_all(trained, jobs, SAMPLER, KmerDrafter(), 5, 4)
    b = run_all(trained, jobs, SAMPLER, KmerDrafter(), 5, 4, rollback="replay")
    assert all(a[i].tokens == b[i].tokens for i in a)


def _joint_counts(model, drafter, n_samples: int, batch: int, tokens: int = 3) -> Counter:
    jobs = [Job(s, tuple(PROMPT), tokens, RngKey(7, 3, s)) for s in range(n_samples)]
    outs = run_all(model, jobs, SAMPLER, drafter, 2, batch)
    return Counter(tuple(r.tokens) for r in outs.values())


def test_batched_sampled_speculative_has_the_targets_distribution(trained):  # noqa: F811
    """1,500 samples of a prompt (one prefill, forked into 16 rows at a time), 3 tokens each
    with the k-mer drafter: the joint of the 3 tokens fits the exact target distribution."""
    exact = exact_joint(trained, PROMPT, 3, SAMPLER)
    counts = _joint_counts(trained, KmerDrafter(), 1500, 16)
    p, x, df = gof_test(counts, exact)
    assert p > ALPHA, f"batched samples disagree with the target (p={p:.2e}, x={x:.1f}, df={df})"


def test_broken_batched_rule_is_rejected(trained, monkeypatch):  # noqa: F811
    """The same check rejects a rule that accepts every draft: it has the power to see a bug."""
    import evspark_cli.decode.batch as batch

    def accept_all(p, q, drafts, u, gammas):
        g = torch.tensor(gammas)
        return g, p[torch.arange(len(gammas)), g].to(torch.float64)

    monkeypatch.setattr(batch, "decide_rows", accept_all)
    exact = exact_joint(trained, PROMPT, 3, SAMPLER)
    p, _, _ = gof_test(_joint_counts(trained, KmerDrafter(), 1500, 16), exact)
    assert p < ALPHA


def test_a_failing_row_ends_its_own_job_only(trained, prompts, monkeypatch):  # noqa: F811
    """A row whose logits turn NaN (here: any row fed the marker token 5) fails with one error;
    the rows that shared its batch, and the jobs that take its slot afterwards, decode exactly as
    without it."""
    extend = trained.extend

    def failing(state, ids):
        logits, hidden, block = extend(state, ids)
        logits[ids[:, 0] == 5] = float("nan")
        return logits, hidden, block

    bad = prompts[2] + [5]
    jobs = jobs_for([prompts[0], bad, prompts[3], prompts[4]], 2, [12, 20])
    healthy = run_all(trained, [j for j in jobs if j.prompt != tuple(bad)], SAMPLER, KmerDrafter(),
                      4, 3)
    monkeypatch.setattr(trained, "extend", failing)
    dec = BatchDecoder(trained, SAMPLER, KmerDrafter(), 4, batch_size=3)
    outs = {o.job.index: o for o in dec.run(jobs)}
    assert sorted(outs) == [j.index for j in jobs]
    for j in jobs:
        o = outs[j.index]
        if j.prompt == tuple(bad):
            assert isinstance(o.error, RunError) and o.result is None
            assert f"position {len(bad)}: the model produced NaN" in str(o.error)
        else:
            assert o.error is None and o.result is not None
            assert o.result.tokens == healthy[j.index].tokens


def test_a_prompt_cache_changes_no_token_and_prefills_a_prompt_once(trained, prompts):  # noqa: F811
    """Records that repeat a prompt (a server's requests, one sample each) take its prefill
    from the cache across records and decoders, and decode exactly as fresh prefills do."""
    sampler = SamplerConfig(1.0, 4, 1.0)
    jobs = [Job(i, tuple(prompts[i % 2 + 2]), 20, RngKey(3, 50 + i, 0), f"r{i}")
            for i in range(6)]
    fresh = run_all(trained, jobs, sampler, KmerDrafter(4), 5, 2)
    cache = PromptCache(64 << 20)
    first = run_all(trained, jobs[:3], sampler, KmerDrafter(4), 5, 2, prompt_cache=cache)
    rest = run_all(trained, jobs[3:], sampler, KmerDrafter(4), 5, 2, prompt_cache=cache)
    got = {**first, **rest}
    assert {i: r.tokens for i, r in got.items()} == {i: r.tokens for i, r in fresh.items()}
    assert (cache.misses, cache.hits, len(cache)) == (2, 4, 2)
    assert sum(r.prefill_s > 0 for r in got.values()) == 2


def test_the_prompt_cache_keeps_what_fits_least_recently_used_out(trained, prompts):  # noqa: F811
    pres = [prefill_prompt(trained, prompts[i], reserve=64) for i in (2, 3, 4)]
    sizes = [p.nbytes() for p in pres]
    assert min(sizes) > 0
    cache = PromptCache(sum(sizes) - 1)  # not all three: one has to go
    for i, p in enumerate(pres[:2]):
        cache.put((tuple(prompts[i + 2]), 64, 0), p)
    assert cache.get((tuple(prompts[2]), 64, 0)) is pres[0]  # now the most recently used
    assert cache.get((tuple(prompts[2]), 65, 0)) is None  # another reserve: another state
    cache.put((tuple(prompts[4]), 64, 0), pres[2])
    assert cache.get((tuple(prompts[3]), 64, 0)) is None  # the least recently used went
    assert cache.get((tuple(prompts[2]), 64, 0)) is pres[0]
    assert cache.bytes <= cache.max_bytes
    tiny = PromptCache(sizes[1] - 1)
    tiny.put((tuple(prompts[3]), 64, 0), pres[1])  # larger than the whole budget: not kept
    assert len(tiny) == 0 and tiny.bytes == 0
    with pytest.raises(ValueError):
        PromptCache(-1)
