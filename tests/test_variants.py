"""Variant effect scores (eval/variants.py, io/vcf.py): Evo 2's windows, shared-prefix scoring
equal to scoring every window from scratch, and VCFs read by pysam with every unscorable allele
skipped or refused by policy."""
from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from tiny import tiny_config

from evspark_cli.errors import InputError, SettingError
from evspark_cli.eval.variants import (
    check_variant_settings,
    consecutive_sites,
    mutagenesis_window,
    score_mutagenesis,
    score_site,
    score_variants,
    site_chunks,
    variant_window,
    window_ll,
)
from evspark_cli.io.fasta import open_reference
from evspark_cli.io.indexed import MemorySource
from evspark_cli.io.types import Variant
from evspark_cli.io.vcf import read_variants

FIXTURES = Path(__file__).parent / "fixtures"


def _contig(n: int, seed: int = 0) -> str:
    rnd = random.Random(seed)
    return "".join(rnd.choice("ACGT") for _ in range(n))


def _ref(contig: str) -> MemorySource:
    return MemorySource("memory", [("c", contig)])


def test_windows_follow_evo2_recipe():
    contig = _contig(2000)
    ref = _ref(contig)
    snv = Variant("c", 1001, ".", contig[1000], "A" if contig[1000] != "A" else "C")
    w = variant_window(ref, snv, 512)
    assert (w.start, w.offset, len(w.ref)) == (1000 - 256, 256, 512)
    assert w.ref == contig[744:1256] and w.alt[:256] == w.ref[:256]
    assert w.alt[256] == snv.alt and w.alt[257:] == w.ref[257:]
    near = variant_window(ref, Variant("c", 10, ".", contig[9], "T"), 512)
    assert (near.start, near.offset, len(near.ref)) == (0, 9, 9 + 256)  # clipped at the start
    ins = variant_window(ref, Variant("c", 1001, ".", contig[1000], contig[1000] + "GG"), 512)
    dele = variant_window(ref, Variant("c", 1001, ".", contig[1000:1004], contig[1000]), 512)
    assert len(ins.alt) == 514 and len(dele.alt) == 509
    long_ref = variant_window(ref, Variant("c", 1001, ".", contig[1000:1400], "A"), 512)
    assert long_ref.ref[256:] == contig[1000:1400]  # widened so the whole REF is inside
    with pytest.raises(SettingError):
        check_variant_settings(1, "mean")
    with pytest.raises(SettingError):
        check_variant_settings(512, "max")


@pytest.mark.parametrize("reduce, rc, rows", [("mean", False, 8), ("sum", False, 1),
                                              ("mean", True, 64)])
def test_shared_prefix_scores_equal_scoring_each_window_from_scratch(phix_model, phix, reduce,
                                                                     rc, rows):
    """SNVs, an MNV, insertions, deletions, a multi-allelic site, sites near both contig ends
    (windows clipped) and at the first bases, on real DNA with a trained model: every score
    within 1e-4 nats of the naive one, whether each site has its own pass (rows=1) or sites
    share passes (a pass's sites at one offset batched as rows, others in passes of their
    own)."""
    from evspark_cli.model.checkpoint import load_model

    model = load_model(phix_model)
    contig = phix.fetch("NC_001422.1", 2001, 3500).upper()
    alt = {"A": "C", "C": "G", "G": "T", "T": "A"}
    variants = [Variant("c", p, f"v{p}", contig[p - 1], alt[contig[p - 1]])
                for p in (1, 2, 3, 40, 700, 1499, 1500)]
    mnv = "".join(alt[b] for b in contig[700:703])
    variants += [Variant("c", 701, "mnv", contig[700:703], mnv),
                 Variant("c", 702, "ins", contig[701], contig[701] + "TTAG"),
                 Variant("c", 705, "del", contig[704:712], contig[704]),
                 Variant("c", 800, "m1", contig[799], alt[contig[799]]),
                 Variant("c", 800, "m2", contig[799], alt[alt[contig[799]]]),
                 Variant("c", 1480, "del_end", contig[1479:1500], contig[1479])]
    contigs = _ref(contig)
    shared = score_variants(model, contigs, variants, window=300, reduce=reduce, rc=rc,
                            rows=rows)
    naive = score_variants(model, contigs, variants, window=300, reduce=reduce, naive=True,
                           rc=rc)
    assert [s.variant for s in shared] == variants  # input order
    for s, n in zip(shared, naive):
        assert s.ref_ll == pytest.approx(n.ref_ll, abs=1e-4)
        assert s.alt_ll == pytest.approx(n.alt_ll, abs=1e-4)
        assert abs(s.delta - n.delta) <= 1e-4
    assert any(abs(s.delta) > 1e-3 for s in shared)  # the alleles do change the scores
    same = Variant("c", 700, "same", contig[699], contig[699])
    assert score_variants(model, contigs, [same], window=300)[0].delta == pytest.approx(0,
                                                                                         abs=1e-5)


@pytest.mark.parametrize("start, end", [(601, 620), (1, 6), (1490, 1500)])
def test_saturation_mutagenesis_from_one_reference_pass_equals_scoring_each_window(
        phix_model, phix, start, end):
    """Every base to the three others in one window holding the region: the block-commit path
    equals scoring every variant's window from scratch, to 1e-4 nats, also at the contig's
    first base (nothing to share) and its end (the window shifted inside)."""
    from evspark_cli.model.checkpoint import load_model

    model = load_model(phix_model)
    ref = _ref(phix.fetch("NC_001422.1", 2001, 3500).upper())
    fast = score_mutagenesis(model, ref, "c", start, end, window=256)
    slow = score_mutagenesis(model, ref, "c", start, end, window=256, naive=True)
    assert len(fast) == 3 * (end - start + 1)
    assert [s.variant for s in fast] == [s.variant for s in slow]
    assert [s.variant.pos for s in fast[:3]] == [start] * 3
    for f, n in zip(fast, slow):
        assert f.ref_ll == pytest.approx(n.ref_ll, abs=1e-4)
        assert f.delta == pytest.approx(n.delta, abs=1e-4)
    assert mutagenesis_window(1500, 1490, 1500, 256) == (1500 - 256, 1500)
    assert mutagenesis_window(1500, 601, 620, 256) == (610 - 128, 610 + 128)
    with pytest.raises(SettingError, match="does not fit"):
        mutagenesis_window(1500, 1, 300, 256)


def test_sites_share_a_pass_up_to_the_row_budget(make_model):
    """A pass holds whole sites (reference + ALTs) up to `rows` windows; a larger site alone."""
    def snv(pos: int, alt: str = "A") -> Variant:
        return Variant("c", pos, ".", "C", alt)

    sites = consecutive_sites([snv(1), snv(1, "G"), snv(5), snv(9), snv(9, "G"), snv(9, "T")])
    assert [len(c) for c in site_chunks(sites, 5)] == [3, 3]  # 3 + 2 windows, then 4
    assert [len(c) for c in site_chunks(sites, 1)] == [2, 1, 3]
    assert [len(c) for c in site_chunks(sites, 64)] == [6]
    contig = _contig(300, 2)
    with pytest.raises(SettingError, match="rows"):
        score_variants(make_model(tiny_config()), _ref(contig),
                       [Variant("c", 100, ".", contig[99], "A")], 100, rows=0)


def test_rc_averages_each_window_with_its_reverse_complement(make_model):
    from Bio.Seq import reverse_complement

    model = make_model(tiny_config())
    contig = _contig(400, 5)
    v = Variant("c", 200, "x", contig[199:202], "T")
    w = variant_window(_ref(contig), v, 100)
    got = score_variants(model, _ref(contig), [v], 100, rc=True)[0]
    want = [(window_ll(model, x) + window_ll(model, reverse_complement(x))) / 2
            for x in (w.ref, w.alt)]
    assert (got.ref_ll, got.alt_ll) == pytest.approx(want, abs=1e-5)


def test_naive_window_score_is_the_mean_token_log_likelihood(make_model):
    model = make_model(tiny_config())
    seq = _contig(50, 3)
    ids = torch.tensor([list(seq.encode())])
    with torch.no_grad():
        ll = torch.log_softmax(model(ids)[0, :-1].float(), -1).gather(-1, ids[0, 1:, None]).sum()
    assert window_ll(model, seq, "sum") == pytest.approx(float(ll), abs=1e-4)
    assert window_ll(model, seq, "mean") == pytest.approx(float(ll) / 49, abs=1e-5)
    with pytest.raises(ValueError):
        score_site(model, 10, [seq, "G" + seq[1:]])  # they do not share their first 10 bases


VCF_HEADER = """##fileformat=VCFv4.2
##contig=<ID=NC_001422.1,length=5386>
##contig=<ID=nowhere,length=100>
#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO
"""


def _vcf(tmp_path: Path, body: str, name: str = "v.vcf", bgzip: bool = False) -> str:
    import pysam

    path = tmp_path / name
    path.write_text(VCF_HEADER + body)
    if bgzip:
        pysam.tabix_compress(str(path), str(path) + ".gz", force=True)
        return str(path) + ".gz"
    return str(path)


@pytest.fixture(scope="module")
def phix():
    """The phiX174 fixture through pyfaidx (BGZF, its .fai and .gzi beside it)."""
    src = open_reference(str(FIXTURES / "phiX174.fa.gz"))
    yield src
    src.close()


@pytest.mark.parametrize("bgzip", [False, True])
def test_a_vcf_is_read_with_every_unscorable_allele_skipped_by_reason(tmp_path, phix, bgzip):
    seq = phix.fetch("NC_001422.1", 1, phix.length("NC_001422.1"))
    body = "".join(f"NC_001422.1\t{p}\t{i}\t{r}\t{a}\t.\t.\t.\n" for p, i, r, a in [
        (100, "snv", seq[99], "A,C,G"),  # multi-allelic: one Variant per ALT
        (200, "del", seq[199:203], seq[199]),
        (300, "sym", seq[299], "<DEL>"),
        (301, "star", seq[300], "*"),
        (302, "noalt", seq[301], "."),
        (400, "bad_ref", "A" if seq[399] != "A" else "C", "G"),
        (5386, "off_end", seq[5385] + "A", "A"),
        (500, "iupac", seq[499], "R"),
    ]) + "nowhere\t5\tabsent\tA\tC\t.\t.\t.\n"
    warned: list[str] = []
    got = read_variants(_vcf(tmp_path, body, bgzip=bgzip), phix, warn=warned.append)
    assert [(v.id, v.alt) for v in got.variants] == [("snv", "A"), ("snv", "C"), ("snv", "G"),
                                                      ("del", seq[199])]
    assert len(got.skipped) == 7 and len(warned) == 7
    assert any("symbolic" in w for w in warned) and any("absent" in w for w in warned)
    with pytest.raises(InputError, match="does not match the reference"):
        read_variants(_vcf(tmp_path, f"NC_001422.1\t400\tx\t"
                                     f"{'A' if seq[399] != 'A' else 'C'}\tG\t.\t.\t.\n",
                           "s.vcf"), phix, strict=True)


def test_a_file_that_is_not_a_vcf_is_one_clear_error(tmp_path, phix):
    bad = tmp_path / "bad.vcf"
    bad.write_text("this is not a VCF\n")
    with pytest.raises(InputError, match="bad.vcf"):
        read_variants(str(bad), phix)
    with pytest.raises(InputError):
        read_variants(str(tmp_path / "missing.vcf"), phix)


def _phix_vcf(tmp_path: Path, phix) -> tuple[str, list[tuple[int, str, str]]]:
    seq = phix.fetch("NC_001422.1", 1, phix.length("NC_001422.1"))
    alleles = [(150, seq[149], "T" if seq[149] != "T" else "A"),
               (1200, seq[1199:1203], seq[1199]),
               (3000, seq[2999], seq[2999] + "GATC"),
               (4000, seq[3999], "<DEL>")]
    body = "".join(f"NC_001422.1\t{p}\tv{p}\t{r}\t{a}\t.\t.\t.\n" for p, r, a in alleles)
    return _vcf(tmp_path, body, bgzip=True), alleles


def test_score_variants_on_the_command_line_and_in_the_api(tmp_path, phix_model, phix):
    """`evspark score --variants`: one row per scorable allele, equal to the naive computation
    and to `evs.score_variants`; a resumed partial keeps its rows; bad combinations refused."""
    from tiny import run_cli

    import evspark_cli as evs
    from evspark_cli.model.checkpoint import load_model

    vcf, alleles = _phix_vcf(tmp_path, phix)
    ref = str(FIXTURES / "phiX174.fa.gz")
    out = tmp_path / "scores.tsv"
    args = ["score", "--variants", vcf, "--reference", ref, "--model", phix_model,
            "--window", 512, "-o", out, "-q"]
    r = run_cli(args)
    assert r.code == 0, r.err
    assert "1 allele skipped: a symbolic ALT" in r.err
    lines = out.read_text().splitlines()
    assert lines[0].split("\t") == ["chrom", "pos", "id", "ref", "alt", "ref_ll", "alt_ll",
                                    "delta"]
    rows = [dict(zip(lines[0].split("\t"), ln.split("\t"))) for ln in lines[1:]]
    assert [int(x["pos"]) for x in rows] == [150, 1200, 3000]
    model = load_model(phix_model)
    with pytest.warns(UserWarning, match="skipped: a symbolic ALT"):
        api = evs.score_variants(model, vcf, ref, window=512)
    naive = score_variants(model, phix, [s.variant for s in api], 512, naive=True)
    for row, a, n in zip(rows, api, naive):
        assert float(row["delta"]) == pytest.approx(a.delta, abs=1e-5)
        assert a.delta == pytest.approx(n.delta, abs=1e-4)
    # a run stopped after two rows: --resume scores only the rest, same file
    partial = Path(str(out) + ".partial")
    partial.write_text("\n".join(lines[:3]) + "\n")
    out.unlink()
    annotated = tmp_path / "annotated.bcf"
    r = run_cli(args + ["--resume", "--vcf-out", annotated])
    assert r.code == 0, r.err
    assert "(1 this run)" in r.err
    assert out.read_text().splitlines() == lines
    # --vcf-out: the input's every record, each scored ALT's scores (resumed rows too) as INFO
    import pysam

    with pysam.VariantFile(str(annotated)) as got:
        assert got.header.info["EVSPARK_DELTA"].number == "A"
        recs = list(got)
    assert [(r.pos, r.ref, r.alts) for r in recs] == [(p, ref_, (alt,))
                                                      for p, ref_, alt in alleles]
    for rec, row in zip(recs, rows):
        for field, col in (("EVSPARK_REF_LL", "ref_ll"), ("EVSPARK_DELTA", "delta")):
            assert rec.info[field][0] == pytest.approx(float(row[col]), abs=1e-5)
    assert "EVSPARK_DELTA" not in recs[-1].info  # the symbolic ALT: not scored
    assert not Path(str(annotated) + ".partial").exists()
    # --shard I/N: whole sites, site i in shard i mod N + 1; the shards' rows are the run's
    shards = []
    for i in (1, 2):
        part = tmp_path / f"shard{i}.tsv"
        r = run_cli([*args[:-3], "-o", part, "-q", "--shard", f"{i}/2"])
        assert r.code == 0, r.err
        shards.append(part.read_text().splitlines())
    assert shards[0][0] == lines[0] and shards[1][0] == lines[0]
    assert shards[0][1:] == [lines[1], lines[3]] and shards[1][1:] == [lines[2]]
    for bad, pattern in ((["--variants", vcf], "--reference"),
                         ([ref, "--variants", vcf, "--reference", ref], "give no INPUT"),
                         (["--variants", vcf, "--reference", ref, "--reduce", "max"], "--reduce"),
                         (["--variants", str(tmp_path / "none.vcf"), "--reference", ref],
                          "none.vcf"),
                         (["--variants", vcf, "--reference", ref, "--vcf-out",
                           str(tmp_path / "a.vcf"), "--shard", "1/2"], "--shard"),
                         ([ref, "--vcf-out", str(tmp_path / "a.vcf")], "--variants"),
                         (["--mutagenesis", "NC_001422.1:10-12", "--reference", ref,
                           "--vcf-out", str(tmp_path / "a.vcf")], "--variants"),
                         (["--variants", vcf, "--reference", ref, "--vcf-out", vcf],
                          "input")):
        r = run_cli(["score", *bad, "--model", phix_model, "-q"])
        assert r.code == 2, (bad, r.err)
        assert re.search(pattern, r.err.strip().splitlines()[-1]), r.err


def test_mutagenesis_on_the_command_line(tmp_path, phix_model, phix):
    from tiny import run_cli

    from evspark_cli.model.checkpoint import load_model

    ref = str(FIXTURES / "phiX174.fa.gz")
    out = tmp_path / "sat.tsv"
    r = run_cli(["score", "--mutagenesis", "NC_001422.1:101-104", "--reference", ref,
                 "--model", phix_model, "--window", 256, "-o", out, "-q"])
    assert r.code == 0, r.err
    lines = out.read_text().splitlines()[1:]
    assert len(lines) == 12
    slow = score_mutagenesis(load_model(phix_model), phix, "NC_001422.1", 101, 104, 256,
                             naive=True)
    for line, n in zip(lines, slow):
        chrom, pos, _id, refb, alt, _r, _a, delta = line.split("\t")
        assert (chrom, int(pos), refb, alt) == (n.variant.chrom, n.variant.pos, n.variant.ref,
                                                n.variant.alt)
        assert float(delta) == pytest.approx(n.delta, abs=1e-4)
    # a shard scores whole positions (their three alternatives), from the same reference pass
    part = tmp_path / "sat2.tsv"
    r = run_cli(["score", "--mutagenesis", "NC_001422.1:101-104", "--reference", ref,
                 "--model", phix_model, "--window", 256, "-o", part, "-q", "--shard", "2/3"])
    assert r.code == 0, r.err
    assert part.read_text().splitlines()[1:] == lines[3:6]
    vcf = _vcf(tmp_path, "NC_001422.1\t5\t.\tA\tC\t.\t.\t.\n")
    for bad, pattern in ((["--mutagenesis", "NC_001422.1:1-4", "--rc"], "--rc"),
                         (["--mutagenesis", "NC_001422.1"], "ID:START-END"),
                         (["--mutagenesis", "NC_001422.1:5000-5400"], "past the end"),
                         (["--mutagenesis", "chrZ:1-4"], "no record 'chrZ'"),
                         (["--mutagenesis", "NC_001422.1:1-400"], "does not fit"),
                         (["--mutagenesis", "NC_001422.1:1-4", "--variants", vcf], "give one"),
                         (["--mutagenesis", "NC_001422.1:1-4", "--shard", "3/2"], "--shard")):
        r = run_cli(["score", *bad, "--reference", ref, "--model", phix_model, "--window", 256,
                     "-q"])
        assert r.code == 2, (bad, r.err)
        assert re.search(pattern, r.err.strip().splitlines()[-1]), r.err


def test_hostile_variant_inputs_are_one_line_and_exit_2(tmp_path, phix_model, phix):
    """The reliability battery's rows for `score --variants` and `--mutagenesis`."""
    from battery import refused

    seq = phix.fetch("NC_001422.1", 1, 20)
    wrong = "A" if seq[9] != "A" else "C"
    ref = FIXTURES / "phiX174.fa.gz"
    notvcf = tmp_path / "notes.vcf"
    notvcf.write_text("sample sheet, not a VCF\n")
    mismatch = _vcf(tmp_path, f"NC_001422.1\t10\tm\t{wrong}\tG\t.\t.\t.\n", "mismatch.vcf")
    absent = _vcf(tmp_path, "nowhere\t5\ta\tA\tC\t.\t.\t.\n", "absent.vcf")
    base = ["score", "--model", phix_model, "--window", 256, "-q"]
    cases = [
        ("VCF that does not exist", ["--variants", tmp_path / "none.vcf", "--reference", ref],
         "none.vcf"),
        ("VCF that is not a VCF", ["--variants", notvcf, "--reference", ref], "notes.vcf"),
        ("--variants without --reference", ["--variants", mismatch], "--reference"),
        ("REF not the reference's, --strict", ["--variants", mismatch, "--reference", ref,
                                               "--strict"], "does not match the reference"),
        ("contig absent from the reference, --strict",
         ["--variants", absent, "--reference", ref, "--strict"], "absent from the reference"),
        ("--mutagenesis without coordinates", ["--mutagenesis", "NC_001422.1", "--reference",
                                               ref], "ID:START-END"),
        ("--mutagenesis region longer than --window",
         ["--mutagenesis", "NC_001422.1:1-400", "--reference", ref], "does not fit"),
    ]
    for case, args, pattern in cases:
        refused(f"score: {case}", [*base, *args], 2, re.escape(pattern), tmp_path,
                MODEL=phix_model, REF=ref.parent)


HTSLIB = FIXTURES / "htslib"  # from Debian's htslib-test package (README.md there)


def _htslib_reference(path: Path) -> tuple[MemorySource, list]:
    """Random contigs as long as the VCF's positions need, each record's REF written in place,
    and the records as pysam reads them (chrom, pos, ref, alts)."""
    import pysam

    with pysam.VariantFile(str(path)) as f:
        recs = [(r.chrom, r.pos, r.ref, r.alts) for r in f]
    rnd = random.Random(1)
    contigs = {c: list(rnd.choices("ACGT", k=max(p + len(r) for cc, p, r, _ in recs if cc == c)
                                   + 500)) for c in dict.fromkeys(c for c, _, _, _ in recs)}
    for c, p, r, _ in sorted(recs, key=lambda x: -len(x[2])):
        contigs[c][p - 1:p - 1 + len(r)] = list(r)
    return MemorySource("htslib", [(c, "".join(s)) for c, s in contigs.items()]), recs


def test_a_real_vcf_and_bcf_from_htslib_score_as_the_naive_computation(phix_model):
    """htslib's own test VCF (and its BCF): SNVs, insertions, deletions, multi-allelic records
    up to 300 ALTs, a missing ALT, on four contigs; VCF and BCF read alike, every allele pysam
    lists scored or skipped for its reason, and the scores equal the naive computation."""
    from evspark_cli.model.checkpoint import load_model

    ref, recs = _htslib_reference(HTSLIB / "vcf_file.vcf")
    seen: list[str] = []
    vcf = read_variants(str(HTSLIB / "vcf_file.vcf"), ref, warn=seen.append)
    bcf = read_variants(str(HTSLIB / "vcf_file.bcf"), ref)
    assert vcf.variants == bcf.variants and vcf.skipped == bcf.skipped
    listed = [(c, p, r, a) for c, p, r, alts in recs for a in (alts or ())]
    assert [(v.chrom, v.pos, v.ref, v.alt) for v in vcf.variants] == listed
    assert vcf.skipped == {"no ALT allele": 1} and len(seen) == 1
    kinds = {("snv" if len(v.ref) == len(v.alt) == 1 else "ins" if len(v.alt) > len(v.ref)
              else "del" if len(v.alt) < len(v.ref) else "mnv") for v in vcf.variants}
    assert kinds >= {"snv", "ins", "del"}
    model = load_model(phix_model)
    shared = score_variants(model, ref, vcf.variants, 96)
    naive = score_variants(model, ref, vcf.variants, 96, naive=True)
    assert len(shared) == len(listed) > 300
    assert max(abs(s.delta - n.delta) for s, n in zip(shared, naive)) < 1e-4
    # a REF the reference disagrees with is skipped, never scored against the wrong bases
    c, p, r, _ = recs[0]
    wrong = "A" if r[0] != "A" else "C"
    bad = MemorySource("htslib", [(cc, ref.fetch(cc, 1, ref.length(cc)) if cc != c else
                                   ref.fetch(cc, 1, p - 1) + wrong + ref.fetch(cc, p + 1,
                                                                               ref.length(cc)))
                                  for cc in ref.ids()])
    got = read_variants(str(HTSLIB / "vcf_file.vcf"), bad)
    assert sum(n for why, n in got.skipped.items() if "does not match" in why) == 1
    assert len(got.variants) == len(listed) - 1


def test_annotated_vcf_keeps_every_record_and_replaces_earlier_scores(tmp_path):
    """write_annotated: INFO tags a record uses undeclared survive (htslib would otherwise end
    the process), a second annotation replaces the first, '.' where an ALT has no score, and a
    same-named field of another type is refused before anything is written."""
    import pysam

    from evspark_cli.io.vcf import write_annotated

    src = _vcf(tmp_path, "NC_001422.1\t5\trs1\tA\tC,G\t.\tPASS\t.\n"
                         "NC_001422.1\t9\t.\tT\t<DEL>\t.\t.\tDP=3\n")
    first = str(tmp_path / "a.vcf.gz")
    assert write_annotated(src, first, {("NC_001422.1", 5, "A", "C"): (-1.0, -1.5, -0.5)}) == 2
    again = str(tmp_path / "b.vcf")
    write_annotated(first, again, {("NC_001422.1", 5, "A", "G"): (-1.0, -1.25, -0.25)})
    with pysam.VariantFile(again) as got:
        recs = list(got)
    assert recs[0].info["EVSPARK_DELTA"] == (None, -0.25)
    assert "EVSPARK_DELTA" not in recs[1].info and recs[1].info["DP"] == "3"
    clash = _vcf(tmp_path, "NC_001422.1\t5\t.\tA\tC\t.\t.\tEVSPARK_DELTA=x\n", name="c.vcf")
    text = Path(clash).read_text().replace(
        "#CHROM", '##INFO=<ID=EVSPARK_DELTA,Number=1,Type=String,Description="x">\n#CHROM')
    Path(clash).write_text(text)
    with pytest.raises(InputError, match="EVSPARK_DELTA"):
        write_annotated(clash, str(tmp_path / "d.vcf"), {})
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("d.")) == []
