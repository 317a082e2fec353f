"""`evspark score`'s totals, per-base track (bedGraph), compact logits and `evs.score`."""
from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file
from tiny import PHIX, one_line_error, phix_genome, run_cli

FAST = ["--threads", "1", "-q"]


@pytest.fixture(scope="module")
def genome() -> str:
    return phix_genome()


def rows_of(path) -> dict[str, dict[str, str]]:
    lines = path.read_text().splitlines()
    head = lines[0].split("\t")
    return {ln.split("\t")[0]: dict(zip(head, ln.split("\t"))) for ln in lines[1:]}


def test_total_ll_track_and_compact_logits_agree(tmp_path, phix_model, genome):
    tsv, bg, lg = tmp_path / "s.tsv", tmp_path / "s.bedgraph", tmp_path / "l.safetensors"
    regions = ["NC_001422.1:101-400", "NC_001422.1:1001-1200"]
    r = run_cli(["score", PHIX, "--model", phix_model, *FAST, "--region", regions[0],
                 "--region", regions[1], "--context", 64, "--window", 64, "-o", tsv,
                 "--bedgraph", bg, "--logits", lg, "--logits-columns", "acgt",
                 "--logits-dtype", "float16"])
    assert r.code == 0, r.err
    rows = rows_of(tsv)
    assert list(rows) == regions
    for rid, row in rows.items():
        n = int(row["length"])
        assert int(row["scored"]) == n - 1
        # total_ll (nats) and bits per nucleotide are one figure
        assert float(row["total_ll"]) == pytest.approx(
            -float(row["bits_per_nt"]) * (n - 1) * math.log(2), rel=1e-3)
    lines = bg.read_text().splitlines()
    assert lines[0].startswith("track type=bedGraph")
    track = [ln.split("\t") for ln in lines[1:]]
    first = [t for t in track if int(t[1]) < 1000]
    # on the input's coordinates: region 101-400 scores bases 102..400, 0-based 101..399
    assert [int(t[1]) for t in first] == list(range(101, 400))
    assert all(t[0] == "NC_001422.1" and int(t[2]) == int(t[1]) + 1 for t in track)
    assert sum(float(t[3]) for t in first) * math.log(2) == pytest.approx(
        -float(rows[regions[0]]["total_ll"]), rel=1e-3)
    tensors = load_file(str(lg))
    t = tensors[regions[0]]
    assert t.dtype == torch.float16 and tuple(t.shape) == (299, 4)


def test_a_reverse_strand_region_is_tracked_on_the_forward_coordinates(tmp_path, phix_model):
    bed = tmp_path / "r.bed"
    bed.write_text("NC_001422.1\t100\t160\tr\t0\t-\n")
    bg = tmp_path / "s.bedgraph"
    r = run_cli(["score", PHIX, "--model", phix_model, *FAST, "--regions", bed, "--context", 16,
                 "--window", 16, "--bedgraph", bg])
    assert r.code == 0, r.err
    starts = [int(ln.split("\t")[1]) for ln in bg.read_text().splitlines()[1:]]
    # reverse complement of 101-160: its first base (160) has no context; 101..159 are scored
    assert starts == list(range(100, 159))


def test_the_api_scores_as_the_command_does(tmp_path, phix_model, genome):
    import evspark_cli as evs

    model = evs.load_model(phix_model, device="cpu")
    seq = genome[2000:2300]
    src = tmp_path / "in.fa"
    src.write_text(f">x\n{seq}\n")
    tsv = tmp_path / "s.tsv"
    assert run_cli(["score", src, "--model", phix_model, *FAST, "--context", 64, "--window", 64,
                    "-o", tsv]).code == 0
    got = evs.score(model, seq, context=64, window=64, per_base=True)
    row = rows_of(tsv)["x"]
    assert round(got.bits_per_nt, 4) == float(row["bits_per_nt"])
    assert got.scored == 299 and got.per_base.shape == (299,)
    assert float(got.per_base.sum()) == pytest.approx(got.total_ll, rel=1e-6)


@pytest.mark.parametrize("opt,needle", [(["--logits-columns", "iupac"], "--logits-columns"),
                                        (["--logits-dtype", "int8"], "--logits-dtype")])
def test_bad_logits_settings_are_refused_before_the_model_loads(tmp_path, opt, needle):
    r = run_cli(["score", PHIX, "--model", tmp_path / "none", *FAST, *opt])
    assert needle in one_line_error(r, 2)
