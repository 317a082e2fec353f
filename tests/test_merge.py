"""`--shard I/N` over (record, sample) jobs and `evspark merge` (io/shard.py, io/merge.py): every
job in exactly one shard, and the merged shards byte-identical to the unsharded run."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
from battery import FAST
from hypothesis import given
from hypothesis import strategies as st
from tiny import one_line_error, run_cli

from evspark_cli.io.shard import in_shard, job_in_shard

TIMING = {"wall_s", "tokens_per_s", "native_wall_s", "native_tokens_per_s", "speedup",
          "decode_s", "prefill_s", "batch", "verified_positions", "efficiency"}
"""Stats columns that depend on the batch a job shared (timings, and the padding it verified)."""


@given(records=st.integers(1, 12), samples=st.integers(1, 7), shards=st.integers(1, 9))
def test_every_job_is_in_exactly_one_shard(records, samples, shards):
    for r in range(records):
        for s in range(samples):
            owners = [i for i in range(1, shards + 1)
                      if job_in_shard(r, s, (i, shards), samples)]
            assert len(owners) == 1
            assert in_shard(r, (owners[0], shards), samples)  # its record is read by its shard
    for i in range(1, shards + 1):  # and a shard reads only records it has a job of
        for r in range(records):
            assert in_shard(r, (i, shards), samples) == any(
                job_in_shard(r, s, (i, shards), samples) for s in range(samples))


def stats_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if k not in TIMING}
                for row in csv.DictReader(f, delimiter="\t")]


def generate(model, src, out: Path, *extra) -> None:
    r = run_cli(["generate", src, "--model", model, "-n", 12, *FAST, "-o", out,
                 "--stats", out.with_suffix(".tsv"), *extra])
    assert r.code == 0, r.err


@pytest.mark.parametrize("records,samples,shards", [(1, 6, 3), (3, 2, 4), (2, 1, 3)])
def test_merged_shards_are_the_unsharded_run(tmp_path, phix_model, records, samples, shards):
    src = tmp_path / "in.fa"
    seqs = ["ACGTTGCAAGGCTTAAGC", "GGATCCATTAGCAT", "TTTGACCAGTA"][:records]
    src.write_text("".join(f">r{i}\n{s}\n" for i, s in enumerate(seqs)) + ">empty\n\n")
    common = ["--samples", samples, "--seed", 3]
    generate(phix_model, src, tmp_path / "all.fa", *common)
    parts = [tmp_path / f"part{i}.fa" for i in range(1, shards + 1)]
    for i, part in enumerate(parts, 1):
        generate(phix_model, src, part, *common, "--shard", f"{i}/{shards}")
    jobs = [ln for p in parts for ln in p.read_text().splitlines() if ln.startswith(">")]
    assert len(jobs) == records * samples  # every job once
    assert all("shard=" in ln and " job=" in ln for ln in jobs)
    r = run_cli(["merge", *reversed(parts), "-o", tmp_path / "merged.fa", "-q"])
    assert r.code == 0, r.err
    assert (tmp_path / "merged.fa").read_bytes() == (tmp_path / "all.fa").read_bytes()
    r = run_cli(["merge", *(p.with_suffix(".tsv") for p in parts), "-o", tmp_path / "m.tsv"])
    assert r.code == 0, r.err
    assert stats_rows(tmp_path / "m.tsv") == stats_rows(tmp_path / "all.tsv")


def test_merge_refuses_shards_of_another_run(tmp_path, phix_model):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTTGCAAGGCTTAAGC\n")
    for i in (1, 2):
        generate(phix_model, src, tmp_path / f"p{i}.fa", "--samples", 4, "--shard", f"{i}/2")
    generate(phix_model, src, tmp_path / "seed9.fa", "--samples", 4, "--shard", "2/2",
             "--seed", 9)
    generate(phix_model, src, tmp_path / "three.fa", "--samples", 4, "--shard", "2/3")
    generate(phix_model, src, tmp_path / "whole.fa", "--samples", 4)

    def refused(paths, needle):
        r = run_cli(["merge", *paths, "-o", tmp_path / "out.fa"])
        assert needle in one_line_error(r, 2)
        assert not (tmp_path / "out.fa").exists()

    p1, p2 = tmp_path / "p1.fa", tmp_path / "p2.fa"
    refused([p1], "shard 2/2 is missing")
    refused([p1, tmp_path / "seed9.fa"], "seed=9")
    refused([p1, tmp_path / "three.fa"], "split 3 ways")
    refused([p1, p1, p2], "also in another shard output")
    refused([p1, tmp_path / "whole.fa"], "is not from a shard")
    refused([p1, tmp_path / "missing.fa"], "missing.fa")
    refused([p1, p2, tmp_path / "p1.tsv"], "not a FASTA file")
    r = run_cli(["merge", p1, p2, "-o", p1])  # the output is an input
    assert "also an input" in one_line_error(r, 2)


def test_a_shard_partial_is_not_resumed_as_another_shard(tmp_path, phix_model):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTTGCAAGGCTTAAGC\n>b\nGGATCCATTAGCAT\n")
    out = tmp_path / "o.fa"
    Path(f"{out}.partial").write_text(
        run_cli(["generate", src, "--model", phix_model, "-n", 12, *FAST, "--samples", 2,
                 "--shard", "1/2"]).out)
    r = run_cli(["generate", src, "--model", phix_model, "-n", 12, *FAST, "--samples", 2,
                 "--shard", "2/2", "-o", out, "--resume"])
    assert "shard=1/2" in one_line_error(r, 2)
