"""Regions the samtools way, BED files, literal prompts, and output ids that index cleanly.

The region grammar (io/regions.py) against samtools' rules; BED coordinates converted exactly;
warnings for inputs that look wrong but are legal; empty records skipped or refused (--strict);
generated FASTA that pyfaidx (samtools faidx's index format) reads back record by record, with
ids that say what each record is and random numbers keyed by the prompt, not the output id;
and the bad-region cases of tests/RELIABILITY.md through `evspark generate`.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import battery  # noqa: E402
from battery import Case, Models, case_ids, check_bad_input  # noqa: E402
from tiny import one_line_error, run_cli, trained_tiny_dir  # noqa: E402

from evspark_cli.errors import InputError  # noqa: E402
from evspark_cli.io.prompts import load_prompts  # noqa: E402
from evspark_cli.io.regions import read_bed, resolve_region  # noqa: E402

GENOME = {"chr1": "ACGTACGTAC" * 5, "chr1:5": "TTTTGGGGCC", "chrM": "GATTACAGATTACA"}


def fasta(path: Path, records: dict[str, str]) -> Path:
    path.write_text("".join(f">{k}\n{v}\n" for k, v in records.items()))
    return path


def region(text: str, names=GENOME) -> tuple[str, int | None, int | None]:
    r = resolve_region(text, names.__contains__)
    return r.name, r.start, r.end


# ---------------------------------------------------------------------------------- grammar


@pytest.mark.parametrize("text,want", [
    ("chrM", ("chrM", None, None)),
    ("chrM:2-5", ("chrM", 2, 5)),
    ("chrM:1,0-1,2", ("chrM", 10, 12)),  # commas ignored, as samtools does
    ("chrM:3", ("chrM", 3, None)),  # to the end of the record
    ("chrM:3-", ("chrM", 3, None)),
    ("chrM:-4", ("chrM", 1, 4)),
    ("{chr1:5}", ("chr1:5", None, None)),  # the record whose name looks like a range
    ("{chr1}:5", ("chr1", 5, None)),  # the range
    ("{chr1:5}:2-3", ("chr1:5", 2, 3)),
])
def test_samtools_region_grammar(text, want):
    assert region(text) == want


def test_ambiguous_region_is_an_error_naming_both_readings():
    with pytest.raises(InputError) as e:
        region("chr1:5")
    assert str(e.value) == ("region 'chr1:5' is ambiguous: it names record 'chr1:5' and a range "
                            "of record 'chr1'; use {chr1:5} for the record or {chr1}:5 for the "
                            "range")
    # not ambiguous when only one reading exists
    assert region("chr1:5", {"chr1": ""}) == ("chr1", 5, None)
    assert region("chr1:5", {"chr1:5": ""}) == ("chr1:5", None, None)


@pytest.mark.parametrize("text", ["chrM:a-b", "chrM:5-2", "chrM:0-3", "{chrM", "{}", "{chrM}x",
                                  "chr M", ""])
def test_malformed_regions(text):
    with pytest.raises(InputError):
        region(text)


# --------------------------------------------------------------------------------------- BED


def test_bed_is_converted_exactly(tmp_path):
    g = fasta(tmp_path / "g.fa", GENOME)
    bed = tmp_path / "r.bed"
    bed.write_text("track name=test\nbrowser position chr1:1-10\n# a comment\n\n"
                   "chrM\t0\t4\tfirst4\nchr1\t9\t20\nchrM\t10\t14\t.\t0\t+\textra\n")
    regs = read_bed(str(bed))
    assert [(b.canonical, b.name) for b in regs] == [
        ("chrM:1-4", "first4"), ("chr1:10-20", None), ("chrM:11-14", None)]
    got = load_prompts([str(g)], bed=str(bed), index_dir=str(tmp_path / "i")).prompts
    assert [(p.id, p.seq, p.random_key, p.coordinates) for p in got] == [
        ("first4", "GATT", "chrM:1-4", "chrM:1-4"),
        ("chr1:10-20", GENOME["chr1"][9:20], "chr1:10-20", "chr1:10-20"),
        ("chrM:11-14", "TACA", "chrM:11-14", "chrM:11-14")]
    # the same regions through --region: the same ids (unnamed) and random keys
    same = load_prompts([str(g)], ["chrM:1-4", "chr1:10-20"], index_dir=str(tmp_path / "i"))
    assert [(p.random_key, p.seq) for p in same.prompts] == [(got[0].random_key, got[0].seq),
                                                             (got[1].random_key, got[1].seq)]


def test_a_reverse_strand_bed_line_is_the_reverse_complement(tmp_path):
    """Column 6 `-`: the region's reverse complement (as `bedtools getfasta -s` and `samtools
    faidx -i` give it), id `chrom:START-END(-)`, beside the same region's forward strand; a
    --prompt-tail keeps the last bases of the reverse complement (the region's first ones)."""
    from Bio.Seq import reverse_complement

    g = fasta(tmp_path / "g.fa", GENOME)
    bed = tmp_path / "s.bed"
    bed.write_text("chr1\t9\t20\t.\t0\t-\nchr1\t9\t20\t.\t0\t+\nchrM\t0\t14\tmr\t0\t-\n")
    got = load_prompts([str(g)], bed=str(bed), index_dir=str(tmp_path / "i")).prompts
    fwd = GENOME["chr1"][9:20]
    assert [(p.id, p.seq, p.random_key, p.coordinates) for p in got] == [
        ("chr1:10-20(-)", reverse_complement(fwd), "chr1:10-20(-)", "chr1:10-20(-)"),
        ("chr1:10-20", fwd, "chr1:10-20", "chr1:10-20"),
        ("mr", reverse_complement(GENOME["chrM"]), "chrM:1-14(-)", "chrM:1-14(-)")]
    tail = load_prompts([str(g)], bed=str(bed), prompt_tail=4,
                        index_dir=str(tmp_path / "i")).prompts
    assert tail[0].seq == reverse_complement(fwd)[-4:] and tail[0].id == "chr1:10-20(-)"
    assert tail[0].coordinates == "chr1:10-13(-)"  # the bases it holds
    assert tail[1].seq == fwd[-4:]


@pytest.mark.parametrize("line,needle", [
    ("chrM\t5\n", "needs at least 3 columns"),
    ("chrM\tfive\t9\n", "must be integers"),
    ("chrM\t9\t9\n", "do not make a region"),
    ("chrM\t-1\t4\n", "do not make a region"),
    ("chrM\t0\t4\tx\nchrM\t4\t8\tx\n", "name 'x' is also used"),
    ("# nothing\n", "no regions"),
    # int() takes all of these; a BED coordinate is digits only
    ("chrM\t1_0\t12\n", r"bad\.bed line 1: start and end must be integers \(digits only\), "
                        r"got '1_0' and '12'"),
    ("chrM\t+5\t9\n", "must be integers"),
    ("chrM\t 5\t9\n", "must be integers"),
    ("chrM\t0\t1e1\n", "must be integers"),
    ("chrM\t0\t1,0\n", "must be integers"),
    ("chrM\t0\t\uff15\n", "must be integers"),  # a full-width digit
    # errors found while reading the regions name the BED line, not an internal region form
    ("chrM\t0\t4\nchrX\t0\t4\n", r"^\S*bad\.bed line 2: no record 'chrX' in \S*g\.fa$"),
    ("chrM\t0\t40\n", r"^\S*bad\.bed line 1: position 40 is past the end of record 'chrM' "
                      r"\(14 bp\)"),
    ("chrM\t0\t4\nchrM\t0\t4\n", r"bad\.bed line 2: region 'chrM:1-4' is given more than once"),
    ("chrM\t0\t4\tx\nchrM\t4\t8\tx\n", r"bad\.bed line 2: name 'x' is also used at "
                                       r"\S*bad\.bed line 1"),
    ("chrM\t0\t4\tx\t0\tminus\n", r"bad\.bed line 1: strand \(column 6\) must be \+, - or \., "
                                    r"got 'minus'"),
    ("chrM\t0\t4\t.\t0\t-\nchrM\t0\t4\t.\t0\t-\n", r"bad\.bed line 2: region 'chrM:1-4' is "
                                                 r"given more than once"),
])
def test_bad_bed_lines(tmp_path, line, needle):
    bed = tmp_path / "bad.bed"
    bed.write_text(line)
    g = fasta(tmp_path / "g.fa", GENOME)
    with pytest.raises(InputError, match=needle) as e:
        load_prompts([str(g)], bed=str(bed), index_dir=str(tmp_path / "i"))
    assert "{" not in str(e.value)


def test_bed_headers_are_whole_words(tmp_path):
    """Only `#...` lines and lines whose first word is exactly `track` or `browser` are
    headers: contigs named `track1` or `browser_x` are regions; trailing blanks end a line."""
    g = fasta(tmp_path / "g.fa", {"track1": "ACGTACGT", "browser_x": "GGGGCCCC", "chrM": "GATT"})
    bed = tmp_path / "r.bed"
    bed.write_text("track\tname=x\nbrowser hide all\n#track1\t0\t2\n"
                   "track1\t0\t4\nbrowser_x 2 6\nchrM\t0\t004 \t\n")
    assert [(b.canonical, b.name) for b in read_bed(str(bed))] == [
        ("track1:1-4", None), ("browser_x:3-6", None), ("chrM:1-4", None)]
    got = load_prompts([str(g)], bed=str(bed), index_dir=str(tmp_path / "i")).prompts
    assert [(p.id, p.seq) for p in got] == [
        ("track1:1-4", "ACGT"), ("browser_x:3-6", "GGCC"), ("chrM:1-4", "GATT")]


# ----------------------------------------------------------------- warnings and empty records


def test_warnings_for_legal_but_suspicious_prompts(tmp_path):
    g = fasta(tmp_path / "g.fa", {"masked": "ACGTacgtAC", "unknown": "NNNNNNNN", "ok": "ACGT"})
    got = load_prompts([str(g)])
    assert [p.id for p in got.prompts] == ["masked", "unknown", "ok"]
    assert got.prompts[0].seq == "ACGTACGTAC"
    assert got.warnings == [
        "1 prompt made only of N (unknown bases): unknown; the model continues them anyway",
        "1 prompt had lower-case (soft-masked) bases, read as upper case: masked"]


def test_empty_records_are_skipped_or_refused(tmp_path):
    g = tmp_path / "g.fa"
    g.write_text(">a\nACGT\n>gap\n>b\nGGCC\n>gap2\n\n")
    got = load_prompts([str(g)])
    assert [p.id for p in got.prompts] == ["a", "b"] and got.skipped == ["gap", "gap2"]
    assert got.warnings == ["skipped 2 empty records (gap, gap2); --strict makes this an error"]
    with pytest.raises(InputError, match=r"record 'gap' in \S+g\.fa is empty \(no sequence\) "
                                         r"\(and 1 more\); strict refuses empty records"):
        load_prompts([str(g)], strict=True)
    # shards are assigned before empty records are dropped: the split does not depend on it
    assert [p.id for p in load_prompts([str(g)], shard="2/2").prompts] == []
    assert [p.id for p in load_prompts([str(g)], shard="1/2").prompts] == ["a", "b"]


def test_literal_prompt(tmp_path):
    got = load_prompts(None, literal="acgtNNACGT", prompt_tail=6)
    (p,) = got.prompts
    assert (p.id, p.seq, p.coordinates) == ("prompt", "NNACGT", "prompt:5-10")
    assert got.warnings == ["1 prompt had lower-case (soft-masked) bases, read as upper case: "
                            "prompt"]
    with pytest.raises(InputError, match="literal takes the place of INPUT, regions and bed"):
        load_prompts(["x.fa"], literal="ACGT")  # the library names its settings
    with pytest.raises(InputError, match="invalid character 'J'"):
        load_prompts(None, literal="ACJT")
    # what a repeated option gives: one is the sequence, two are refused (none dropped)
    assert load_prompts(None, literal=["ACGT"]).prompts[0].seq == "ACGT"
    with pytest.raises(InputError, match=r"^literal is given 2 times; it takes one sequence"):
        load_prompts(None, literal=["ACGT", "GGCC"])


# ------------------------------------------------------------------ the command and its ids


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return trained_tiny_dir(tmp_path_factory.mktemp("regions_model"), steps=10)


def gen(model: Path, *args) -> list:
    return ["generate", "--model", model, "-t", "1", "-q", "-n", 6, "--seed", 2, *args]


def test_ambiguous_region_exits_2(tmp_path, model):
    g = fasta(tmp_path / "g.fa", GENOME)
    r = run_cli(gen(model, g, "--region", "chr1:5"))
    assert "is ambiguous" in one_line_error(r, 2) and "{chr1:5}" in r.err
    whole = run_cli(gen(model, g, "--region", "{chr1:5}"))
    ranged = run_cli(gen(model, g, "--region", "{chr1}:5"))
    assert whole.code == ranged.code == 0
    assert whole.out.startswith(">chr1:5.cont ") and " prompt=chr1:5 " in whole.out
    assert ranged.out.startswith(">chr1:5-50.cont ") and " prompt=chr1:5-50 " in ranged.out


def test_named_bed_region_continues_like_the_same_region(tmp_path, model):
    g = fasta(tmp_path / "g.fa", GENOME)
    bed = tmp_path / "r.bed"
    bed.write_text("chr1\t4\t30\tpromoterA\n")
    named = run_cli(gen(model, g, "--regions", bed))
    plain = run_cli(gen(model, g, "--region", "chr1:5-30"))
    assert named.code == plain.code == 0
    assert named.out.splitlines()[0].startswith(">promoterA.cont evspark ")
    assert " prompt=chr1:5-30 " in named.out.splitlines()[0]
    assert named.out.split("\n", 1)[1] == plain.out.split("\n", 1)[1]  # the same continuation


def test_literal_prompt_on_the_command_line(model):
    r = run_cli(gen(model, "--prompt", "ACGTACGTTAGC"))
    assert r.code == 0, r.err
    assert r.out.startswith(">prompt.cont evspark ") and " prompt=prompt " in r.out
    r = run_cli(["generate", "--model", model, "-t", "1", "-q"])
    assert "or --prompt SEQUENCE" in one_line_error(r, 2)
    r = run_cli(gen(model, "--prompt", "ACGT", "x.fa"))  # the command line names its options
    assert "--prompt takes the place of INPUT, --region and --regions" in one_line_error(r, 2)


def test_repeated_prompt_is_refused(model):
    """A second `--prompt` used to replace the first silently."""
    r = run_cli(gen(model, "--prompt", "ACGTACGT", "--prompt", "GGGGCCCC"))
    assert one_line_error(r, 2) == ("evspark: error: --prompt is given 2 times; it takes one "
                                    "sequence (put several prompts in a FASTA file)")
    assert r.out == ""


def test_outputs_index_with_pyfaidx_and_read_back(tmp_path, model):
    """Outputs of every naming case (regions with colons, samples, a named BED line, the prompt
    included) are indexed like `samtools faidx` does and read back record by record."""
    pyfaidx = pytest.importorskip("pyfaidx")
    g = fasta(tmp_path / "g.fa", GENOME)
    bed = tmp_path / "r.bed"
    bed.write_text("chrM\t2\t12\tgeneX\n")
    for extra, suffix in (([], ".cont"), (["--include-prompt"], ".ext")):
        out = tmp_path / f"out{suffix}.fa"
        r = run_cli(gen(model, g, "--region", "{chr1:5}", "--region", "chr1:1,1-4,0",
                        "--regions", bed, "--samples", 2, "--line-width", 5, "-o", out, *extra))
        assert r.code == 0, r.err
        ids = [ln[1:].split()[0] for ln in out.read_text().splitlines() if ln.startswith(">")]
        assert ids == [f"{b}{suffix}_s{i}" for b in ("chr1:5", "chr1:11-40", "geneX")
                       for i in (0, 1)]
        fa = pyfaidx.Fasta(str(out), build_index=True, rebuild=True)
        assert list(fa.keys()) == ids
        text = out.read_text()
        for rid in ids:
            block = text.split(f">{rid} ", 1)[1].split(">", 1)[0]
            seq = "".join(block.splitlines()[1:])
            assert str(fa[rid][:]) == seq and len(fa[rid]) == len(seq)
            if suffix == ".ext":  # the prompt comes first
                prompt = {"chr1:5": GENOME["chr1:5"], "chr1:11-40": GENOME["chr1"][10:40],
                          "geneX": GENOME["chrM"][2:12]}[rid.split(".ext")[0]]
                assert seq.startswith(prompt) and len(seq) == len(prompt) + 6
        fa.close()
        if shutil.which("samtools"):  # samtools takes every id as a whole name, not a range
            for rid in ids:
                got = subprocess.run(["samtools", "faidx", str(out), rid], capture_output=True,
                                     text=True)
                assert got.returncode == 0 and not got.stderr, got.stderr
                assert "".join(got.stdout.splitlines()[1:]) == str(
                    pyfaidx.Fasta(str(out))[rid][:])
        assert re.search(r"^>geneX" + re.escape(suffix)
                         + r"_s0 .* prompt=chrM:3-12 rule=residual$", text, re.M)


def test_resume_refuses_a_partial_of_another_naming(tmp_path, model):
    g = fasta(tmp_path / "g.fa", {"a": "ACGTACGTAC", "b": "GGCCTTAAGG"})
    out = tmp_path / "o.fa"
    # a partial left by a run with --include-prompt: a plain --resume would mix .ext and .cont
    Path(f"{out}.partial").write_text(">a.ext evspark\nACGT\n")
    r = run_cli(gen(model, g, "-o", out, "--resume"))
    msg = one_line_error(r, 2)
    assert "has record 'a.ext', which this run does not write" in msg
    assert Path(f"{out}.partial").exists() and not out.exists()


# ------------------------------------------------ the command line on bad regions (battery)


BAD_INPUT_CASES: list[Case] = [
    Case("region on a missing record", battery.gen("--region", "chr9:1-5"), 2,
         r"region 'chr9:1-5': no record 'chr9'"),
    Case("region out of range", battery.gen("--region", "r1:5-50"), 2,
         r"region 'r1:5-50': position 50 is past the end of record 'r1' \(18 bp\)"),
    Case("region start > end", battery.gen("--region", "r1:8-3"), 2,
         r"region 'r1:8-3': start 8 is after end 3"),
    Case("malformed region syntax", battery.gen("--region", "r1:a-b"), 2,
         r"malformed region 'r1:a-b'"),
    Case("region start 0", battery.gen("--region", "r1:0-5"), 2, r"start must be >= 1"),
]


@pytest.mark.parametrize("case", BAD_INPUT_CASES, ids=case_ids(BAD_INPUT_CASES))
def test_bad_input(case: Case, battery_models: Models, tmp_path):
    """`evspark generate --region` with each bad region: the exit code, one error line, nothing
    written."""
    check_bad_input(case, battery_models, tmp_path)
