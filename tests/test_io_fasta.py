"""FASTA input (evspark_cli.io.fasta): every bad input is one InputError line, good inputs agree.

The reader in the library and through `evspark generate` (the bad-input cases of
tests/RELIABILITY.md: one error line, the exit code, nothing written), odd inputs (a BOM, RNA and
IUPAC codes, control characters in ids, a non-UTF-8 stdin, endless or very long records read in
bounded memory), and one fuzzer of the reader.
"""
from __future__ import annotations

import csv
import gzip
import io
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from Bio import bgzf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evspark_cli.errors import InputError
from evspark_cli.io.fasta import read_prompts
from evspark_cli.io.regions import parse_region
from evspark_cli.io.sequences import IUPAC
from evspark_cli.io.types import Prompt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import (  # noqa: E402
    FAST,
    FASTA,
    OK_FASTA,
    Case,
    Models,
    bounded,
    case_ids,
    check_bad_input,
    child_env,
    fasta_file,
    gen_on,
    ok_fa,
    only_error_line,
    record,
    refused,
    show,
    w,
    worked,
)
from tiny import PHIX, SHARED, needs_shared, run_cli  # noqa: E402

DATA = SHARED / "data"

TEXT = ">rec1 first record\nacgtACGTNN\nACGTRY\n\n>rec2\nGGGG CCCC\nTTTT\n>rec3 third\nA\n"
EXPECTED = {"rec1": "ACGTACGTNNACGTRY", "rec2": "GGGGCCCCTTTT", "rec3": "A"}
# Fixed-width version (pyfaidx indexes it in place, no fallback).
WIDE = ">rec1 first\nACGTACGTAC\nGTACGTACGT\nACG\n>rec2\nGGGGCCCCTT\nTT\n>rec3\nA\n"
WIDE_SEQ = {"rec1": "ACGTACGTACGTACGTACGTACG", "rec2": "GGGGCCCCTTTT", "rec3": "A"}


def write_bgzf(path: Path, text: str) -> Path:
    with bgzf.BgzfWriter(str(path), "wb") as w:
        w.write(text.encode())
    return path


def seqs(prompts: list[Prompt]) -> dict[str, str]:
    return {p.id: p.seq for p in prompts}


@pytest.fixture
def idx(tmp_path: Path) -> str:
    return str(tmp_path / "idx")


# --------------------------------------------------------------------------- bad inputs

def _file(content: bytes | str, name: str = "x.fa") -> Callable[[Path], list[str]]:
    def make(tmp: Path) -> list[str]:
        p = tmp / name
        p.write_bytes(content.encode() if isinstance(content, str) else content)
        return [str(p)]
    return make


def _truncated_gz(tmp: Path) -> list[str]:
    data = gzip.compress((">a\n" + "ACGT" * 5000 + "\n").encode())
    p = tmp / "cut.fa.gz"
    p.write_bytes(data[: len(data) // 2])
    return [str(p)]


def _corrupt_gz(tmp: Path) -> list[str]:
    data = bytearray(gzip.compress((">a\n" + "ACGTTGCA" * 3000 + "\n").encode()))
    data[len(data) // 2] ^= 0xFF
    data[len(data) // 2 + 1] ^= 0x5A
    p = tmp / "bad.fa.gz"
    p.write_bytes(bytes(data))
    return [str(p)]


def _truncated_bgzf(tmp: Path) -> list[str]:
    p = write_bgzf(tmp / "full.fa.gz", ">a\n" + "ACGTTGCA" * 20000 + "\n")
    data = p.read_bytes()
    q = tmp / "cut.fa.gz"
    q.write_bytes(data[: len(data) // 2])
    return [str(q)]


def _two_files_same_id(tmp: Path) -> list[str]:
    (tmp / "a.fa").write_text(">dup\nACGT\n")
    (tmp / "b.fa").write_text(">other\nAC\n>dup\nGG\n")
    return [str(tmp / "a.fa"), str(tmp / "b.fa")]


BAD_INPUTS = [
    ("missing file", lambda t: [str(t / "nope.fa")], {}, "no such file"),
    ("directory", lambda t: [str(t)], {}, "is a directory"),
    ("empty file", _file(""), {}, "is empty"),
    ("blank lines only", _file("\n \n\n"), {}, "no FASTA records"),
    ("not FASTA", _file("hello world\nACGT\n"), {}, "not FASTA: line 1 should start with '>'"),
    ("not FASTA after blanks", _file("\n\nACGT\n>a\nAC\n"), {}, "line 3 should start with '>'"),
    ("header without sequence", _file(">a desc\n>b\nACGT\n"), {}, "record 'a' in"),
    ("header without sequence at end", _file(">a\nACGT\n>b\n"), {}, "record 'b'"),
    ("whitespace-only record", _file(">a\n   \n\t\n>b\nAC\n"), {}, "record 'a'"),
    ("empty header", _file(">\nACGT\n"), {}, "empty header"),
    ("invalid letter", _file(">chr1 x\nACGTACGTAC\nACGTACZ\n"), {},
     "record 'chr1' in {0}: invalid character 'Z' at position 17"),
    ("gap", _file(">g\nAC-GT\n"), {}, "invalid character '-' at position 3"),
    ("stop", _file(">p\nMKV*\n"), {}, "invalid character"),
    ("tab-free unicode", _file(">u\nACGÄ\n"), {}, "invalid character 'Ä' at position 4"),
    ("NUL byte in sequence", _file(b">a\nAC\x00GT\n"), {}, "NUL byte"),
    ("NUL byte in header", _file(b">a\x00b\nACGT\n"), {}, "NUL byte"),
    ("binary", _file(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"), {}, "x.fa"),
    ("non-UTF-8", _file(b">a\nAC\xffGT\n"), {}, "not UTF-8"),
    ("truncated gzip", _truncated_gz, {}, "truncated or corrupt gzip"),
    ("corrupt gzip", _corrupt_gz, {}, "gzip"),
    ("truncated bgzf", _truncated_bgzf, {}, "truncated or corrupt gzip"),
    ("xz", _file(b"\xfd7zXZ\x00\x00rest"), {}, "xz-compressed"),
    ("duplicate ids in a file", _file(">a\nAC\n>b\nGG\n>a\nTT\n"), {},
     "duplicate record id 'a' (twice in"),
    ("duplicate ids across files", _two_files_same_id, {}, "duplicate record id 'dup' (in"),
    ("prompt_tail 0", _file(">a\nACGT\n"), {"prompt_tail": 0},
     "prompt_tail must be an integer >= 1"),
    ("prompt_tail negative", _file(">a\nACGT\n"), {"prompt_tail": -3}, "prompt_tail"),
    ("stdin twice", lambda t: ["-", "-"], {}, "only once"),
    ("no inputs", lambda t: [], {}, "no input"),
    # regions
    ("region on missing record", _file(WIDE), {"regions": ["nope:1-3"]}, "no record 'nope' in"),
    ("region out of range", _file(WIDE), {"regions": ["rec2:5-13"]},
     "past the end of record 'rec2' (12 bp)"),
    ("region start past end", _file(WIDE), {"regions": ["rec2:13"]}, "past the end"),
    ("region start > end", _file(WIDE), {"regions": ["rec1:9-3"]}, "start 9 is after end 3"),
    ("region start 0", _file(WIDE), {"regions": ["rec1:0-3"]}, "start must be >= 1"),
    ("region malformed", _file(WIDE), {"regions": ["rec1:x-y"]}, "malformed region 'rec1:x-y'"),
    # found by hypothesis: the index counts the blank line as one base
    ("region on a whitespace-only record", _file(">a\n \n"), {"regions": ["a"]},
     "record 'a' in {0} is empty (no sequence)"),
    ("region inside a whitespace-only record", _file(">a\n \n>b\nAC\n"), {"regions": ["a:1-1"]},
     "record 'a' in"),
    ("region malformed dashes", _file(WIDE), {"regions": ["rec1:1-2-3"]}, "malformed region"),
    ("region negative", _file(WIDE), {"regions": ["rec1:-5-10"]}, "malformed region"),
    ("region with space", _file(WIDE), {"regions": ["rec1 :1-3"]}, "malformed region"),
    ("region empty", _file(WIDE), {"regions": [""]}, "malformed region"),
    ("region given twice", _file(WIDE), {"regions": ["rec1:1-3", "rec1:1-3"]}, "more than once"),
    ("region on missing file", lambda t: [str(t / "no.fa")], {"regions": ["a"]}, "no such file"),
    ("region invalid letter", _file(">r\nACGTACGTAC\nACGTACZ\n"), {"regions": ["r:12-17"]},
     "record 'r' in {0} (region r:12-17): invalid character 'Z' at position 17"),
    ("region empty record", _file(">e\n>r\nACGT\n"), {"regions": ["e"]}, "record 'e'"),
    ("region duplicate ids", _file(">a\nAC\n>a\nGG\n"), {"regions": ["a"]},
     "duplicate record id 'a'"),
    ("region duplicate across files", _two_files_same_id, {"regions": ["other"]},
     "duplicate record id 'dup'"),
    ("region not FASTA", _file("nope\n"), {"regions": ["a"]}, "not FASTA"),
    ("region empty file", _file(""), {"regions": ["a"]}, "is empty"),
    ("region truncated gzip", _truncated_gz, {"regions": ["a:1-4"]}, "truncated or corrupt gzip"),
    ("region truncated bgzf", _truncated_bgzf, {"regions": ["a:1-4"]}, "truncated or corrupt gzip"),
    ("region non-UTF-8", _file(b">a\nAC\xffGT\n"), {"regions": ["a"]}, "not UTF-8"),
    ("region index_dir is a file", _file(WIDE), {"regions": ["rec1"], "index_dir": "__FILE__"},
     "index directory"),
]


@pytest.mark.parametrize("make,kwargs,needle", [c[1:] for c in BAD_INPUTS],
                         ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs(tmp_path: Path, make: Callable[[Path], list[str]], kwargs: dict, needle: str,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    inputs = make(tmp_path)
    kwargs = dict(kwargs)
    if kwargs.get("index_dir") == "__FILE__":
        (tmp_path / "afile").write_text("x")
        kwargs["index_dir"] = str(tmp_path / "afile" / "sub")
    else:
        kwargs.setdefault("index_dir", str(tmp_path / "idx"))
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(InputError) as ei:
        read_prompts(inputs, **kwargs)
    msg = str(ei.value)
    assert needle.format(*inputs) in msg
    assert "\n" not in msg and msg.strip() == msg
    assert ei.value.exit_code == 2


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unreadable_file(tmp_path: Path) -> None:
    p = tmp_path / "secret.fa"
    p.write_text(">a\nACGT\n")
    p.chmod(0)
    with pytest.raises(InputError, match="permission denied"):
        read_prompts([str(p)])


def test_permission_denied_is_translated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    import evspark_cli.io.streams as streams_mod

    p = tmp_path / "locked.fa"
    p.write_text(">a\nACGT\n")

    def fake_open(file, *a, **k):  # root ignores chmod, so simulate EACCES
        if str(file) == str(p):
            raise PermissionError(13, "Permission denied", str(file))
        return builtins.open(file, *a, **k)

    monkeypatch.setattr(streams_mod, "open", fake_open, raising=False)
    for regions in (None, ["a"]):
        with pytest.raises(InputError, match=r"locked\.fa: permission denied"):
            read_prompts([str(p)], regions=regions, index_dir=str(tmp_path / "i"))


def test_default_index_dir_falls_back_to_temp(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from evspark_cli.io.indexed import default_index_dir

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))  # cannot create a folder in a file
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    d = default_index_dir()
    assert d is not None and d.startswith(str(tmp_path / "tmp")) and os.path.isdir(d)


def test_stdin_bad(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO("not fasta\n"))
    with pytest.raises(InputError, match=r"^-: not FASTA"):
        read_prompts(["-"])
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    with pytest.raises(InputError, match="is empty"):
        read_prompts(["-"])


# --------------------------------------------------------------------------- good inputs

def test_plain_gzip_bgzf_stdin_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = tmp_path / "a.fa"
    plain.write_text(TEXT)
    gz = tmp_path / "a.fa.gz"
    gz.write_bytes(gzip.compress(TEXT.encode()))
    bg = write_bgzf(tmp_path / "b.fa.bgz", TEXT)
    bg_no_ext = tmp_path / "bgzf_without_extension.fa"
    bg_no_ext.write_bytes(bg.read_bytes())
    gz_named_plain = tmp_path / "gz_named.txt"
    gz_named_plain.write_bytes(gz.read_bytes())
    results = [read_prompts([str(p)]) for p in (plain, gz, bg, bg_no_ext, gz_named_plain)]
    monkeypatch.setattr(sys, "stdin", io.StringIO(TEXT))
    results.append(read_prompts(["-"]))
    # gzip on a binary stdin is sniffed too
    fake = io.TextIOWrapper(io.BufferedReader(io.BytesIO(gz.read_bytes())), encoding="utf-8")
    monkeypatch.setattr(sys, "stdin", fake)
    results.append(read_prompts(["-"]))
    for r in results:
        assert seqs(r) == EXPECTED
        assert [p.id for p in r] == ["rec1", "rec2", "rec3"]
        assert [p.description for p in r] == ["first record", "", "third"]
    assert results[0][0].source == str(plain)
    assert results[5][0].source == "-"


def test_several_files_keep_order(tmp_path: Path) -> None:
    (tmp_path / "1.fa").write_text(">z\nAC\n>y\nGG\n")
    write_bgzf(tmp_path / "2.fa.gz", ">x\nTT\n")
    out = read_prompts([str(tmp_path / "1.fa"), str(tmp_path / "2.fa.gz")])
    assert [(p.id, p.seq) for p in out] == [("z", "AC"), ("y", "GG"), ("x", "TT")]
    assert out[2].source.endswith("2.fa.gz")


def test_case_whitespace_crlf_bom_iupac(tmp_path: Path) -> None:
    p = tmp_path / "w.fa"
    alphabet = "".join(sorted(IUPAC))
    text = "\ufeff\n\n>a  spaced   desc \r\nac gt\tn\r\n" + alphabet.lower() + "\r\n"
    p.write_bytes(text.encode())
    (out,) = read_prompts([str(p)])
    assert out.id == "a" and out.description == "spaced   desc"
    assert out.seq == "ACGTN" + alphabet.replace("U", "T")  # U is RNA's T


def test_prompt_tail(tmp_path: Path) -> None:
    p = tmp_path / "t.fa"
    p.write_text(WIDE)
    out = read_prompts([str(p)], prompt_tail=5)
    assert seqs(out) == {k: v[-5:] for k, v in WIDE_SEQ.items()}
    out = read_prompts([str(p)], regions=["rec1:1-10"], prompt_tail=3,
                       index_dir=str(tmp_path / "i"))
    assert out[0].seq == "TAC" and out[0].id == "rec1:1-10"


@pytest.mark.parametrize("text", [WIDE, TEXT.replace("GGGG CCCC", "GGGGCCCC")],
                         ids=["fixed-width", "ragged"])
def test_regions_all_formats_agree(tmp_path: Path, text: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    whole = seqs(read_prompts([_write(tmp_path / "w.fa", text)]))
    regions = ["rec2:3-10", "rec1", "rec1:1-1", "rec1:2", "rec3:1-1", "rec2:1,0-1,2"]
    want = [whole["rec2"][2:10], whole["rec1"], whole["rec1"][0], whole["rec1"][1:], "A",
            whole["rec2"][9:12]]
    ids = ["rec2:3-10", "rec1", "rec1:1-1", f"rec1:2-{len(whole['rec1'])}", "rec3:1-1",
           "rec2:10-12"]
    paths = [
        _write(tmp_path / "p.fa", text),
        str(write_bgzf(tmp_path / "b.fa.gz", text)),
        _write(tmp_path / "g.fa.gz", gzip.compress(text.encode())),
        _write(tmp_path / "bgzf_named.fa", (tmp_path / "b.fa.gz").read_bytes()),
        _write(tmp_path / "plain_named.fa.gz", text),
    ]
    for path in paths:
        out = read_prompts([path], regions=regions, index_dir=str(tmp_path / "idx"))
        assert [p.seq for p in out] == want, path
        assert [p.id for p in out] == ids
        assert out[0].source == f"{path}:rec2:3-10"
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    assert [p.seq for p in read_prompts(["-"], regions=regions)] == want


def _write(path: Path, content: str | bytes) -> str:
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return str(path)


def test_regions_across_inputs_in_given_order(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.fa", ">one\nAAAACCCC\n")
    b = str(write_bgzf(tmp_path / "b.fa.gz", ">two\nGGGGTTTT\n"))
    out = read_prompts([a, b], regions=["two:2-3", "one:7-8", "two"], index_dir=str(tmp_path / "i"))
    assert [(p.id, p.seq) for p in out] == [("two:2-3", "GG"), ("one:7-8", "CC"),
                                            ("two", "GGGGTTTT")]


def test_region_id_with_colon_and_lowercase(tmp_path: Path) -> None:
    f = _write(tmp_path / "c.fa", ">chr1:100-200 odd id\nacgtacgt\n>HLA:1\nggcc\n")
    out = read_prompts([f], regions=["chr1:100-200", "chr1:100-200:2-3", "HLA:1"],
                       index_dir=str(tmp_path / "i"))
    assert [(p.id, p.seq) for p in out] == [("chr1:100-200", "ACGTACGT"),
                                            ("chr1:100-200:2-3", "CG"), ("HLA:1", "GGCC")]


def test_regions_use_cache_not_user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user = tmp_path / "user"
    user.mkdir()
    f = _write(user / "genome.fa.gz", b"")
    write_bgzf(Path(f), WIDE)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    out = read_prompts([f], regions=["rec1:2-4"])
    assert out[0].seq == "CGT"
    assert sorted(os.listdir(user)) == ["genome.fa.gz"]  # nothing written next to the input
    cache = tmp_path / "xdg" / "evspark" / "faidx"
    made = sorted(os.listdir(cache))
    assert any(n.endswith(".fai") for n in made) and any(n.endswith(".gzi") for n in made)
    stamps = {n: os.stat(cache / n).st_mtime_ns for n in made}
    read_prompts([f], regions=["rec2:1-2"])  # second run: reuses the cached index
    assert {n: os.stat(cache / n).st_mtime_ns for n in os.listdir(cache)} == stamps
    # same size, new content: the cache key changes, the old index is not trusted
    write_bgzf(Path(f), WIDE.replace("GGGGCCCCTT", "TTTTAAAAGG"))
    assert read_prompts([f], regions=["rec2:1-4"])[0].seq == "TTTT"


def test_existing_neighbour_index_is_used_read_only(tmp_path: Path) -> None:
    import pyfaidx

    f = _write(tmp_path / "n.fa", WIDE)
    pyfaidx.Faidx(f).close()  # creates n.fa.fai next to the file
    cache = tmp_path / "cache"
    out = read_prompts([f], regions=["rec1:11-13"], index_dir=str(cache))
    assert out[0].seq == "GTA"
    assert not cache.exists() or not any(n.endswith(".fai") for n in os.listdir(cache))


def test_stale_neighbour_index_is_not_trusted(tmp_path: Path) -> None:
    import pyfaidx

    f = _write(tmp_path / "s.fa", WIDE)
    pyfaidx.Faidx(f).close()
    stale_fai = (tmp_path / "s.fa.fai").read_text()
    _write(tmp_path / "s.fa", ">rec1\nTTTT\n")  # newer than its .fai
    os.utime(tmp_path / "s.fa.fai", ns=(1, 1))
    out = read_prompts([f], regions=["rec1:1-4"], index_dir=str(tmp_path / "c"))
    assert out[0].seq == "TTTT"
    assert (tmp_path / "s.fa.fai").read_text() == stale_fai  # left alone, not rebuilt in place


def test_regions_whitespace_inside_lines_fall_back(tmp_path: Path) -> None:
    f = _write(tmp_path / "ws.fa", ">r\nAC GT\nAC GT\nAC\n")
    out = read_prompts([f], regions=["r:3-6"], index_dir=str(tmp_path / "i"))
    assert out[0].seq == "GTAC"


@needs_shared("data", "valid", "phiX174.fa.gz")
def test_shared_phix_index_cache(tmp_path: Path) -> None:
    cache, phix = tmp_path / "cache", DATA / "valid" / "phiX174.fa.gz"
    before = sorted(os.listdir(phix.parent))
    whole = read_prompts([str(phix)])
    assert len(whole) == 1 and len(whole[0].seq) == 5386 and set(whole[0].seq) <= set("ACGT")
    out = read_prompts([str(phix)], regions=["NC_001422.1:1-60", "NC_001422.1:5,327-5,386"],
                       index_dir=str(cache))
    assert [p.seq for p in out] == [whole[0].seq[:60], whole[0].seq[-60:]]
    assert sorted(os.listdir(phix.parent)) == before  # read-only shared folder untouched
    assert any(n.endswith(".gzi") for n in os.listdir(cache))


@needs_shared("data", "prompts.tsv")
def test_shared_prompts_match_tsv(tmp_path: Path) -> None:
    with open(DATA / "prompts.tsv", newline="") as fh:
        rows = list(csv.DictReader(fh, delimiter="\t"))
    prompts = read_prompts([str(DATA / "prompts.fa")])
    assert [p.id for p in prompts] == [r["prompt_id"] for r in rows]
    assert all(p.seq == r["sequence"] for p, r in zip(prompts, rows))
    # pyfaidx region extraction vs the `sequence` column, for small valid/ files on '+'
    small = {"valid/phiX174.fa.gz", "valid/ssonnei_53G_plasmids.fa.gz"}
    picked = [r for r in rows if r["source_file"] in small and r["strand"] == "+"]
    picked = [r for r in picked if r["source_file"].endswith("phiX174.fa.gz")] + \
        [r for r in picked if "ssonnei" in r["source_file"]][:3]
    assert len(picked) >= 5
    for src, group in itertools.groupby(picked, key=lambda r: r["source_file"]):
        group = list(group)
        out = read_prompts([str(DATA / src)], regions=[r["region"] for r in group],
                           index_dir=str(tmp_path))
        assert [p.seq for p in out] == [r["sequence"] for r in group]
        assert [p.id for p in out] == [r["region"] for r in group]


# --------------------------------------------------------------------------- the fuzzer

@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


_counter = itertools.count()


def _only_input_errors(fuzz_dir: Path, content: bytes, regions: list[str] | None = None) -> None:
    """`content`, as a FASTA file, is read or refused with one InputError line; what is read is
    records with distinct ids, non-empty and without whitespace, and non-empty IUPAC sequences."""
    p = fuzz_dir / f"f{next(_counter)}.fa"
    p.write_bytes(content)
    try:
        out = read_prompts([str(p)], regions=regions, index_dir=str(fuzz_dir / "idx"))
    except InputError as e:
        assert "\n" not in str(e) and str(e)
        return
    assert out and all(isinstance(x, Prompt) and x.seq and set(x.seq) <= IUPAC for x in out)
    assert all(x.id and not any(c.isspace() for c in x.id) for x in out)
    assert len({x.id for x in out}) == len(out)


_line_soup = st.lists(
    st.one_of(
        st.sampled_from([">a", ">b desc", ">", "> x", ">a:1-2", "", " ", "\t", "ACGT", "acgtn",
                         "NNNN",
                         "AC GT", "Z", "-", "\x00", "\r", "é", ";comment", "RYKM"]),
        st.text(alphabet="ACGTacgtN>\n\r \t-Z:\x00", max_size=12),
    ),
    max_size=12,
).map("\n".join)
_good_line = st.sampled_from(["ACGT", "acgtn", "ACGTACGTAC", "AC", "GGCC"])
_record = st.tuples(
    st.sampled_from(["a", "b", "c", "d desc", "e:1-2", "", " a", "a"]),
    st.lists(st.one_of(_good_line, _good_line, _good_line, st.sampled_from(["", " ", "\r"]),
                       st.text(alphabet="ACGTNacgt -Z\r", max_size=12)), min_size=1, max_size=4),
)
_records = st.tuples(
    st.sampled_from(["", "", "", "\n", "\n \n", "junk\n"]),
    st.lists(_record, min_size=1, max_size=4)
).map(lambda pr: pr[0] + "".join(">" + h + "\n" + "".join(line + "\n" for line in lines)
                                 for h, lines in pr[1]))
_tokens = st.lists(st.sampled_from([">", ">r1", ">r2 d", ">r1:1-5", "ACGT", "acgtn", "NNRY", "X",
                                    "-", "*", " ", "\t", "\n", "\r\n", "\x00", "é", ";", ">\n",
                                    "U", "\ufeff"]),
                   max_size=40).map("".join)
near_fasta = st.one_of(_line_soup, _records, _records, _tokens)
_content = st.one_of(
    st.binary(max_size=400),  # random bytes
    st.binary(max_size=400).map(lambda b: b">r\n" + b),  # a header, then random bytes
    near_fasta.map(lambda text: text.encode("utf-8", "surrogatepass")),
    near_fasta.map(lambda text: text.encode("utf-8", "surrogatepass")),
)
region_text = st.one_of(
    st.sampled_from(["a", "b", "a:1-2", "a:1", "a:2-1", "a:0-1", "b:1,0-2,0", "a:1-999", "zz",
                     "a:x", ":1-2", "a:"]),
    st.text(alphabet="ab:-,0123456789 ", max_size=10),
)
_regions = st.one_of(
    st.none(), st.none(),
    st.sampled_from([["r1"], ["r1:2-3"], ["r2:1"], ["r1:1-5", "r2"]]),
    st.lists(region_text, min_size=1, max_size=3),
)
_WIDE_AB = WIDE.replace("rec", "").replace("1", "a").replace("2", "b").encode()


def _packed(raw: bytes, how: str) -> bytes:
    """`raw` as a file holds it: plain, gzip, BGZF, or a gzip cut in the middle."""
    if how == "gzip":
        return gzip.compress(raw)
    if how == "cut-gzip":
        return gzip.compress(raw)[: max(1, len(raw) // 2)]
    if how == "bgzf":
        buf = io.BytesIO()
        with bgzf.BgzfWriter(fileobj=buf) as out:
            out.write(raw)
            out.flush()
            return buf.getvalue()
    return raw


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(content=_content, how=st.sampled_from(["plain", "gzip", "bgzf", "cut-gzip"]),
       regions=_regions)
def test_fuzz_fasta_reader(fuzz_dir: Path, content: bytes, how: str,
                           regions: list[str] | None) -> None:
    """The FASTA fuzzer: random bytes (bare or after a header) and near-FASTA text (line soup,
    records with odd lines, runs of FASTA tokens with CR LF, a BOM, NUL, U, é), each plain, gzip,
    BGZF or a cut gzip, read whole or by regions (fuzzed ones too, which a valid fixed-width file
    is also read by): every outcome is records or one InputError line."""
    _only_input_errors(fuzz_dir, _packed(content, how), regions)
    if regions:
        _only_input_errors(fuzz_dir, _WIDE_AB, regions)


def test_parse_region_examples() -> None:
    r = parse_region("chr1:1,000-2,000")
    assert (r.name, r.start, r.end) == ("chr1", 1000, 2000)
    assert parse_region("chr1") == parse_region("chr1").__class__("chr1", "chr1", None, None)
    assert (parse_region("chr1:5").start, parse_region("chr1:5").end) == (5, None)
    assert parse_region("chr1:5-").end is None  # samtools: to the end of the record
    for bad in ["", "chr1:", "chr1:a-b", " chr1", "chr1:5-3", "chr1:0"]:
        with pytest.raises(InputError):
            parse_region(bad)


def test_path_objects_accepted(tmp_path: Path) -> None:
    p = tmp_path / "p.fa"
    p.write_text(WIDE)
    assert seqs(read_prompts([p])) == WIDE_SEQ
    assert read_prompts([p], regions=["rec3"], index_dir=tmp_path / "i")[0].seq == "A"


def test_copy_of_phix_in_writable_folder_gets_no_neighbour_index(tmp_path: Path) -> None:
    f = tmp_path / "phix.fa.gz"
    shutil.copy(PHIX, f)
    read_prompts([str(f)], regions=["NC_001422.1:10-20"], index_dir=str(tmp_path / "c"))
    assert sorted(os.listdir(tmp_path)) == ["c", "phix.fa.gz"]


# ------------------------------------------------- the command line on bad FASTA input (battery)


def truncated_gzip(d: Path) -> Path:
    data = gzip.compress((">r1\n" + "ACGT" * 5000 + "\n").encode())
    return w(d, "cut.fa.gz", data[: len(data) // 2])


BAD_INPUT_CASES: list[Case] = [
    Case("missing file", lambda d, m: ["generate", d / "nope.fa", "--model", m.good, *FAST],
         2, r"nope\.fa: no such file"),
    Case("directory instead of a file", lambda d, m: ["generate", d, "--model", m.good, *FAST],
         2, r"is a directory, not a FASTA file"),
    Case("empty file", gen_on(lambda d: w(d, "empty.fa", "")), 2,
         r"empty\.fa: is empty: no FASTA records"),
    Case("text that is not FASTA", gen_on(lambda d: w(d, "notes.txt", "Sample sheet\nlane 1\n")),
         2, r"notes\.txt: not FASTA: line 1 should start with '>'"),
    Case("FASTA with no sequence", gen_on(lambda d: w(d, "hdr.fa", ">r1\n>r2\n")),
         2, r"record 'r1' in \S*hdr\.fa is empty"),
    Case("record with only whitespace, --strict",
         gen_on(lambda d: w(d, "ws.fa", ">r1\nACGT\n>r2\n   \n\t \n"), "--strict"),
         2, r"record 'r2' in \S*ws\.fa is empty \(no sequence\); --strict refuses"),
    Case("letters outside IUPAC",
         gen_on(lambda d: w(d, "bad.fa", ">r1\nACGT\n>r2 x\nACGTNNRY\nACJT\n")),
         2, r"record 'r2' in \S*bad\.fa: invalid character 'J' at position 11"),
    Case("NUL byte", gen_on(lambda d: w(d, "nul.fa", b">r1\nACGT\nAC\x00GT\n")),
         2, r"nul\.fa: NUL byte at line 3"),
    Case("truncated gzip", gen_on(truncated_gzip), 2, r"cut\.fa\.gz: truncated or corrupt gzip"),
    Case("binary file (not UTF-8)", gen_on(lambda d: w(d, "bin.fa", b">r1\nAC\xff\xfeGT\n")),
         2, r"bin\.fa: not UTF-8 text"),
    Case("duplicate record ids",
         gen_on(lambda d: w(d, "dup.fa", ">r1\nACGT\n>r2\nAC\n>r1 again\nGG\n")),
         2, r"duplicate record id 'r1'"),
    Case("duplicate ids across files",
         lambda d, m: ["generate", ok_fa(d), w(d, "more.fa", ">r2\nACGT\n"), "--model", m.good,
                       *FAST],
         2, r"duplicate record id 'r2' \(in \S*ok\.fa and in \S*more\.fa\)"),
    Case("stdin given twice", lambda d, m: ["generate", "-", "-", "--model", m.good, *FAST],
         2, r"'-' \(standard input\) can be given only once", stdin=OK_FASTA.encode()),
    Case("empty stdin", lambda d, m: ["generate", "-", "--model", m.good, *FAST], 2,
         r"-: is empty"),
    Case("prompt longer than the context", lambda d, m: [
        "generate", w(d, "long.fa", ">long\n" + "ACGT" * 20 + "\n"), "--model", m.short, *FAST,
        "-n", 4],
        2, r"record 'long' in \S*long\.fa is longer than the model's context \(64 bases\); "
           r"use --prompt-tail"),
    Case("prompt plus -n longer than the context", lambda d, m: [
        "generate", w(d, "long.fa", ">long\n" + "ACGT" * 15 + "\n"), "--model", m.short, *FAST,
        "-n", 8],
        2, r"record 'long': prompt of 60 bases \+ 8 new tokens exceeds the model's context of 64; "
           r"use --prompt-tail"),
]


@pytest.mark.parametrize("case", BAD_INPUT_CASES, ids=case_ids(BAD_INPUT_CASES))
def test_bad_input(case: Case, battery_models: Models, tmp_path: Path):
    """`evspark generate` on each bad input: the exit code, one error line, nothing written."""
    check_bad_input(case, battery_models, tmp_path)


def test_prompt_tail_fixes_the_long_prompt(battery_models: Models, tmp_path: Path):
    src = w(tmp_path, "long.fa", ">long\n" + "ACGT" * 20 + "\n")
    r = run_cli(["generate", src, "--model", battery_models.short, *FAST, "-n", 4,
                 "--prompt-tail", 40])
    assert r.code == 0, r.err
    assert r.out.startswith(">long.cont ") and "new_tokens=4 prompt=long:41-80 " in r.out


# --------------------------------------- odd inputs: BOM, IUPAC and RNA, control characters, ...


def test_a_bom_is_read_the_same_on_every_path(phix_model: Path, tmp_path: Path):
    import gzip

    text = "\ufeff" + FASTA
    src = fasta_file(tmp_path, "bom.fa", text)
    ref = run_cli(["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4]).out
    assert run_cli(["generate", src, "--model", phix_model, *FAST, "-n", 4]).out == ref
    gz = tmp_path / "bom.fa.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert run_cli(["generate", gz, "--model", phix_model, *FAST, "-n", 4]).out == ref
    r = worked("UTF-8 BOM on stdin", ["generate", "-", "--model", phix_model, *FAST, "-n", 4],
               tmp_path, "same records as without the BOM", stdin=text.encode(), MODEL=phix_model)
    assert r.out == ref


def test_iupac_policy_and_rna(phix_model: Path, tmp_path: Path):
    from evspark_cli.io.fasta import read_prompts

    src = fasta_file(tmp_path, "amb.fa", ">n1\nACGUNNRYacgun\n")
    keep = read_prompts([str(src)])[0].seq
    assert keep == "ACGTNNRYACGTN"  # U is T; the codes stay
    rnd = read_prompts([str(src)], iupac="random")[0].seq
    assert rnd[:4] == "ACGT" and set(rnd) <= set("ACGT")
    assert rnd[5] in "ACGT" and rnd[6] in "AG" and rnd[7] in "CT"
    assert read_prompts([str(src)], iupac="random")[0].seq == rnd  # the same every time
    refused("--iupac error on an N", ["generate", src, "--model", phix_model, *FAST, "-n", 4,
                                      "--iupac", "error"], 2,
            r"record 'n1' in \S*amb\.fa: ambiguous base 'N' at position 5 \(--iupac error "
            r"accepts only A, C, G, T\)", tmp_path, MODEL=phix_model)
    r = worked("RNA and ambiguity codes with --iupac random --include-prompt",
               ["generate", src, "--model", phix_model, *FAST, "-n", 4, "--iupac", "random",
                "--include-prompt"], tmp_path, "prompt written as " + rnd, MODEL=phix_model)
    assert r.out.splitlines()[1].startswith(rnd)
    refused("--iupac unknown", ["generate", src, "--model", phix_model, *FAST, "-n", 4, "--iupac",
                                "drop"], 2, r"--iupac must be keep, error, random, got 'drop'",
            tmp_path, MODEL=phix_model)


def test_control_characters_in_ids_are_escaped(short_model: Path, tmp_path: Path):
    src = fasta_file(tmp_path, "ansi.fa", ">\x1b[31mRED\x1b[0m\n" + "ACGT" * 15 + "\n")
    r = run_cli(["generate", src, "--model", short_model, *FAST, "-n", 8])
    line = only_error_line(r.err)
    record("hostile", "ANSI escape in a record id",
           show(["generate", "ansi.fa", "--model", short_model, *FAST, "-n", 8], tmp_path,
                MODEL_CTX64=short_model), r.code, line)
    assert r.code == 2 and "\x1b" not in r.err
    assert line.startswith(r"evspark: error: record '\x1b[31mRED\x1b[0m': prompt of 60 bases")


def test_non_utf8_header_on_stdin_fails_before_the_model(phix_model: Path, tmp_path: Path):
    """Under the C locale Python decodes stdin with surrogateescape: read as bytes instead."""
    p = subprocess.run([sys.executable, "-m", "evspark_cli.cli", "generate", "-", "--model",
                        str(phix_model), *FAST, "-n", "4", "-o", "out.fa"],
                       input=b">r\xff\xfe1\nACGTACGT\n", capture_output=True, cwd=tmp_path,
                       env=child_env(LC_ALL="C", LANG="C"), timeout=120)
    line = only_error_line(p.stderr.decode())
    record("hostile", "non-UTF-8 header on stdin",
           show(["generate", "-", "--model", phix_model, *FAST, "-n", 4, "-o", "out.fa"], tmp_path,
                MODEL=phix_model) + " (C locale)", p.returncode, line)
    assert p.returncode == 2 and "-: not UTF-8 text (byte 0xff near line 1)" in line, line
    assert not list(tmp_path.glob("out.fa*"))


@pytest.mark.slow
def test_endless_input_is_refused_in_bounded_memory(phix_model: Path, tmp_path: Path, normal_peak):
    bounded("generate /dev/zero", ["generate", "/dev/zero", "--model", phix_model, *FAST, "-n", 4],
            2, r"/dev/zero: NUL byte at line 1", tmp_path, normal_peak, MODEL=phix_model)
    endless = subprocess.Popen(["sh", "-c", "echo '>r'; yes ACGTACGTACGTACGTACGTACGTACGTACGT"],
                               stdout=subprocess.PIPE)
    try:
        bounded("endless record on stdin (no newline limit, no NUL)",
                ["generate", "-", "--model", phix_model, *FAST, "-n", 4], 2,
                r"record 'r' in - is longer than the model's context \(4,096 bases\); use "
                r"--prompt-tail N", tmp_path, normal_peak, stdin=endless.stdout, MODEL=phix_model)
    finally:
        endless.kill()
        endless.wait()


def test_a_tail_of_a_long_line_is_read_streaming(phix_model: Path, tmp_path: Path):
    """--prompt-tail holds the tail, not the record: a 10 Mi-base line reads in a few MiB."""
    import tracemalloc

    from evspark_cli.io.fasta import read_prompts

    long = tmp_path / "long.fa"
    with open(long, "w") as f:
        f.write(">chr\n")
        for _ in range(5):
            f.write("ACGT" * (1 << 19))  # one 10 Mi-base line
        f.write("GATTACA\n")
    tracemalloc.start()
    try:
        (p,) = read_prompts([str(long)], prompt_tail=11)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert p.seq == "ACGTGATTACA"
    assert peak < 8 << 20, f"{peak >> 20} MiB held to keep 11 bases"
    worked("--prompt-tail of a 10 Mbp one-line record",
           ["generate", long, "--model", phix_model, *FAST, "-n", 4, "--prompt-tail", 100],
           tmp_path, "1 record of 4 tokens", MODEL=phix_model)


# ---------------------------------------------------------- valid FASTA through `generate`


RECORD_ID = st.text(st.sampled_from("abcXYZ0189_.|-:"), min_size=1, max_size=12)


VALID_FASTA = st.lists(
    st.tuples(RECORD_ID, st.text(st.sampled_from("ACGTacgt"), min_size=1, max_size=90),
              st.integers(1, 80)),
    min_size=1, max_size=4, unique_by=lambda r: r[0])


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(VALID_FASTA)
def test_fuzz_valid_fasta_round_trips_through_generate(battery_models, records):
    from Bio import SeqIO

    text = "".join(f">{rid}\n" + "\n".join(seq[i:i + wd] for i in range(0, len(seq), wd)) + "\n"
                   for rid, seq, wd in records)
    with tempfile.TemporaryDirectory() as t:
        src, out = w(Path(t), "in.fa", text), Path(t) / "out.fa"
        r = run_cli(["generate", src, "--model", battery_models.good, *FAST, "-n", 2,
                     "--include-prompt", "-o", out])
        assert r.code == 0, r.err
        got = [(rec.id, str(rec.seq)) for rec in SeqIO.parse(out, "fasta")]
    assert [g[0] for g in got] == [f"{rid}.ext" for rid, _s, _w in records]
    for (rid, seq, _w), (_gid, gseq) in zip(records, got):
        assert gseq[: len(seq)] == seq.upper() and len(gseq) == len(seq) + 2


@pytest.mark.parametrize("by", ["records", "regions"])
def test_a_record_too_long_for_the_model_fails_only_its_own_shard(short_model: Path,
                                                                    tmp_path: Path, by: str):
    """Records (or regions) of other shards are read only as far as their structure: a record
    longer than the model's context refuses the shard that holds it, the others run."""
    src = fasta_file(tmp_path, "tl.fa", ">a\n" + "ACGT" * 40 + "\n>b\nACGTACGT\n>c\nACGTAAAA\n"
                     ">d\nACGTTTTT\n")
    extra: list = []
    if by == "regions":
        bed = tmp_path / "tl.bed"
        bed.write_text("a\t0\t150\nb\t0\t8\nc\t0\t8\nd\t0\t8\n")
        extra = ["--regions", bed]
    what = "tl.fa" + (" (region a:1-150)" if by == "regions" else "")
    args = ["generate", src, *extra, "--model", short_model, *FAST, "-n", 4]
    refused(f"a too-long {by[:-1]} in its shard (1/3)", [*args, "--shard", "1/3"], 2,
            re.escape(what) + re.escape(" is longer than the model's context (64 bases); use "
                                        "--prompt-tail N"), tmp_path, MODEL_CTX64=short_model)
    for i in (2, 3):
        r = worked(f"another shard (2/3, 3/3) of the input with a too-long {by[:-1]}",
                   [*args, "--shard", f"{i}/3", "-o", tmp_path / f"s{i}.fa"], tmp_path,
                   "exit 0: its own records written", MODEL_CTX64=short_model)
        assert r.code == 0
        assert (tmp_path / f"s{i}.fa").read_text().count(">") == 1  # b, then c
