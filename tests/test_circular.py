"""`--circular`: a region may run across the origin of a circular record (a plasmid, a phage,
an organelle): `ID:START-END` with START > END, or a BED end past the record's end."""
from __future__ import annotations

import pytest
from Bio.Seq import reverse_complement
from tiny import PHIX, one_line_error, phix_genome, run_cli

from evspark_cli.errors import InputError
from evspark_cli.io.fasta import read_prompts

L = 5386  # phiX174


@pytest.fixture(scope="module")
def genome() -> str:
    return phix_genome()


def test_a_region_across_the_origin_is_the_end_then_the_start(genome, tmp_path):
    got = read_prompts([str(PHIX)], ["NC_001422.1:5300-100"], circular=True,
                       index_dir=str(tmp_path))
    assert got[0].seq == genome[5299:] + genome[:100]
    assert got[0].id == "NC_001422.1:5300-100" and got[0].span == ("NC_001422.1", 5300, 100)
    # its tail may or may not cross the origin
    tail = read_prompts([str(PHIX)], ["NC_001422.1:5300-100"], prompt_tail=150, circular=True,
                        index_dir=str(tmp_path))[0]
    assert tail.seq == genome[-50:] + genome[:100] and tail.span == ("NC_001422.1", 5337, 100)
    short = read_prompts([str(PHIX)], ["NC_001422.1:5300-100"], prompt_tail=40, circular=True,
                         index_dir=str(tmp_path))[0]
    assert short.seq == genome[60:100] and short.span == ("NC_001422.1", 61, 100)


def test_without_circular_such_a_region_is_refused_with_the_hint(tmp_path):
    for region, needle in (("NC_001422.1:5300-100", "start 5300 is after end 100"),
                           ("NC_001422.1:5300-5500", "past the end")):
        with pytest.raises(InputError, match=needle) as e:
            read_prompts([str(PHIX)], [region], index_dir=str(tmp_path))
        assert "--circular" in str(e.value)
    with pytest.raises(InputError, match="longer than the circular record"):
        read_prompts([str(PHIX)], ["NC_001422.1:100-5500"], circular=True,
                     index_dir=str(tmp_path))


def test_a_bed_line_past_the_end_wraps_on_either_strand(genome, tmp_path, phix_model):
    bed = tmp_path / "r.bed"
    bed.write_text("NC_001422.1\t5350\t5420\tori_plus\t0\t+\n"
                   "NC_001422.1\t5350\t5420\tori_minus\t0\t-\n")
    r = run_cli(["generate", PHIX, "--regions", bed, "--circular", "--model", phix_model,
                 "-n", 1, "--include-prompt", "--line-width", 0, "-t", 1, "-q", "--greedy"])
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    wrapped = genome[5350:] + genome[:34]
    assert lines[1][:-1] == wrapped and lines[3][:-1] == reverse_complement(wrapped)
    assert "prompt=NC_001422.1:5351-34 " in lines[0] and "prompt=NC_001422.1:5351-34(-)" in lines[2]
    r = run_cli(["generate", PHIX, "--regions", bed, "--model", phix_model, "-n", 1, "-q"])
    assert "--circular" in one_line_error(r, 2)


def test_a_wrapped_region_is_tracked_on_the_record_coordinates(tmp_path, phix_model):
    bg = tmp_path / "t.bedgraph"
    r = run_cli(["score", PHIX, "--region", "NC_001422.1:5381-10", "--circular", "--model",
                 phix_model, "--context", 8, "--window", 8, "-t", 1, "-q", "--bedgraph", bg])
    assert r.code == 0, r.err
    starts = [int(ln.split("\t")[1]) for ln in bg.read_text().splitlines()[1:]]
    # 5381..5386 then 1..10; the first base (5381) has no context; sorted by position
    assert starts == list(range(0, 10)) + list(range(5381, 5386))
