"""The mixed prompt lengths workload of `evspark bench` and benchmarks/throughput_bar.py."""
from __future__ import annotations

from evspark_cli.eval.throughput import mixed_lengths, mixed_workload, record_slices
from evspark_cli.generation.options import DecodeOptions


def test_lengths_spread_over_the_range_unsorted():
    got = mixed_lengths(16, (64, 16384), seed=3)
    assert sorted(got)[0] == 64 and sorted(got)[-1] == 16384 and len(set(got)) == 16
    assert got != sorted(got) and got != sorted(got, reverse=True)
    ratios = [b / a for a, b in zip(sorted(got), sorted(got)[1:])]
    assert max(ratios) / min(ratios) < 1.05  # evenly spaced on a log scale


def test_mixed_and_equal_workloads_have_the_same_jobs_and_tokens():
    opts = DecodeOptions(7, 4)
    source = ["ACGT" * 50, "GGCCA" * 30]  # shorter than the longest prompt: repeated
    mixed = mixed_workload(source, 6, opts, 512, (64, 2048), seed=1)
    equal = mixed_workload(source, 6, opts, 512, seed=1, equal_length=1000)
    assert [j.index for j in mixed] == list(range(len(mixed)))
    assert sorted({len(j.prompt) for j in mixed}) == sorted(mixed_lengths(6, (64, 2048), 1))
    assert {len(j.prompt) for j in equal} == {1000}
    per_record = [sum(1 for j in mixed if j.rng.record == r)
                  for r in dict.fromkeys(j.rng.record for j in mixed)]
    assert all(1 <= n <= 4 for n in per_record) and len(per_record) == 6
    assert len(mixed) == len(equal) and all(j.max_new_tokens == 7 for j in mixed + equal)
    parts = record_slices(mixed, 4)
    assert [j for p in parts for j in p] == mixed
    for p in parts:  # a record's samples are never split between slices
        assert not set(j.rng.record for j in p) & {j.rng.record for q in parts if q is not p
                                                   for j in q}

