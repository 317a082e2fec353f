"""Outputs by extension (io/compressed.py): `.gz`/`.bgz` FASTA and stats written as BGZF, and the
`.fai`/`.gzi` indexes of `--index`, equal to those pyfaidx (and samtools) build for the file."""
from __future__ import annotations

import gzip
import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from battery import FAST
from tiny import one_line_error, run_cli

from evspark_cli.io.fasta import read_prompts
from evspark_cli.io.writers import FastaOutput, StatsOutput


def records(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    out = [(f"r{i}", "".join(rng.choice("ACGT") for _ in range(rng.randint(1, 90_000))))
           for i in range(n)]
    return out + [("empty", "")]


def write(path: Path, recs, **kw) -> None:
    with FastaOutput(str(path), line_width=70, **kw) as f:
        for rid, seq in recs:
            f.write(rid, "evspark test", seq)
        f.finish()


def pyfaidx_index(path: Path, tmp: Path) -> tuple[str, bytes]:
    """The .fai and .gzi pyfaidx builds for `path` (into `tmp`)."""
    from pyfaidx import Faidx

    Faidx(str(path), indexname=str(tmp / "p.fai"), gzi_indexname=str(tmp / "p.gzi"),
          build_index=True).close()
    gzi = (tmp / "p.gzi").read_bytes() if (tmp / "p.gzi").exists() else b""
    return (tmp / "p.fai").read_text(), gzi


@pytest.mark.parametrize("name", ["out.fa.gz", "out.fa.bgz", "out.fa"])
def test_a_fasta_output_is_bgzf_by_extension_with_the_index_pyfaidx_builds(tmp_path, name):
    recs = records(5)
    write(tmp_path / "plain.fa", recs)
    out = tmp_path / name
    write(out, recs, index=True)
    data = out.read_bytes()
    compressed = name != "out.fa"
    assert (data[:2] == b"\x1f\x8b") == compressed
    assert (gzip.decompress(data) if compressed else data) == (tmp_path / "plain.fa").read_bytes()
    fai, gzi = pyfaidx_index(out, tmp_path)
    assert (tmp_path / f"{name}.fai").read_text() == fai
    assert (tmp_path / f"{name}.gzi").exists() == compressed
    if compressed:
        assert (tmp_path / f"{name}.gzi").read_bytes() == gzi
        assert len(gzi) > 8  # several blocks: the offsets matter
    assert not list(tmp_path.glob("*.partial"))
    # regions read back through the index written beside it
    got = read_prompts([str(out)], regions=["r1:100-200", "r4"], index_dir=str(tmp_path / "i"))
    by_id = dict(recs)
    assert [p.seq for p in got] == [by_id["r1"][99:200], by_id["r4"]]


def test_a_compressed_output_resumes_from_its_plain_partial(tmp_path):
    recs = records(3, seed=1)
    write(tmp_path / "whole.fa.gz", recs, index=True)
    out = tmp_path / "out.fa.gz"
    f = FastaOutput(str(out), line_width=70, index=True)
    for rid, seq in recs[:2]:
        f.write(rid, "evspark test", seq)
    f.close()  # interrupted: the partial is plain text, readable as it is
    assert not out.exists() and Path(f"{out}.partial").read_bytes().startswith(b">r0 ")
    g = FastaOutput(str(out), line_width=70, index=True, resume=True)
    assert g.done_ids == {"r0", "r1"}
    for rid, seq in recs[2:]:
        g.write(rid, "evspark test", seq)
    g.finish([rid for rid, _ in recs])
    assert out.read_bytes() == (tmp_path / "whole.fa.gz").read_bytes()
    assert Path(f"{out}.fai").read_text() == (tmp_path / "whole.fa.gz.fai").read_text()


@pytest.mark.parametrize("name", ["s.tsv.gz", "s.jsonl.gz", "s.tsv.bgz"])
def test_stats_are_compressed_by_extension(tmp_path, name):
    out = tmp_path / name
    with StatsOutput(str(out), ["record_id", "tau"]) as rows:
        rows.write({"record_id": "a", "tau": 1.5})
        rows.finish()
    text = gzip.decompress(out.read_bytes()).decode()
    if ".jsonl" in name:
        assert json.loads(text) == {"record_id": "a", "tau": 1.5}
    else:
        assert text == "record_id\ttau\na\t1.5\n"


def test_an_index_of_standard_output_is_refused_before_the_model_loads(tmp_path):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGT\n")
    r = run_cli(["generate", src, "--model", tmp_path / "no-model", "--index", *FAST])
    assert "--index" in one_line_error(r, 2) and "standard output" in r.err


def test_generate_writes_an_indexed_bgzf_fasta(tmp_path, phix_model):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTTGCAAGGCTTAAGC\n>b\nGGATCCATTAGCAT\n")
    common = ["generate", src, "--model", phix_model, "-n", 300, "--samples", 2, *FAST]
    assert run_cli([*common, "-o", tmp_path / "plain.fa"]).code == 0
    r = run_cli([*common, "-o", tmp_path / "out.fa.gz", "--index", "--stats",
                 tmp_path / "s.tsv.gz"])
    assert r.code == 0, r.err
    out = tmp_path / "out.fa.gz"
    assert gzip.decompress(out.read_bytes()) == (tmp_path / "plain.fa").read_bytes()
    assert (tmp_path / "out.fa.gz.fai").read_text() == pyfaidx_index(out, tmp_path)[0]
    assert gzip.decompress((tmp_path / "s.tsv.gz").read_bytes()).startswith(b"record_id\t")
    if shutil.which("samtools"):  # the bar: samtools reads it with the index written
        got = subprocess.run(["samtools", "faidx", str(out), "a.cont_s1:11-70"],
                             capture_output=True, text=True, check=True).stdout
        plain = read_prompts([str(tmp_path / "plain.fa")], regions=["a.cont_s1:11-70"],
                             index_dir=str(tmp_path / "i"))
        assert "".join(got.splitlines()[1:]) == plain[0].seq
