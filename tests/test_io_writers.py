"""Outputs: evspark_cli.io.writers (partial/resume/rename) and evspark_cli.io.shard.

The writers in the library, and through `evspark generate`: the bad output paths of
tests/RELIABILITY.md, outputs that are an input by another path (a bind mount, a hard link) or
each other, and `.partial` files that are symlinks, in use by a live run, or replaced under it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from battery import (
    FAST,
    FASTA,
    Case,
    Models,
    case_ids,
    check_bad_input,
    child_env,
    fasta_file,
    gen,
    only_error_line,
    record,
    refused,
    ro_dir,
    shorten,
    show,
    w,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny import one_line_error, run_cli

from evspark_cli.errors import InputError, SettingError
from evspark_cli.io.fasta import read_prompts
from evspark_cli.io.shard import parse_shard, select_shard
from evspark_cli.io.writers import FastaOutput, StatsOutput, check_output_path

COLUMNS = ("record_id sample prompt_len new_tokens mode drafter gamma rounds tau acceptance_rate "
           "wall_s tokens_per_s native_wall_s native_tokens_per_s speedup").split()
RECORDS = [("r1", "evspark model=m seed=0", "ACGTACGTACGTAGG"), ("r2_s0", "", "A"),
           ("r3", "x y", "GATTACA" * 3)]


def write_all(out: FastaOutput, records=RECORDS) -> None:
    for rid, desc, seq in records:
        out.write(rid, desc, seq)


# --------------------------------------------------------------------------- FASTA output

@pytest.mark.parametrize("width", [7, 60, 0, 1])
def test_fasta_round_trip(tmp_path: Path, width: int) -> None:
    path = tmp_path / "out.fa"
    with FastaOutput(str(path), line_width=width) as out:
        write_all(out)
        assert not path.exists() and (tmp_path / "out.fa.partial").exists()
        out.finish()
    assert path.exists() and not (tmp_path / "out.fa.partial").exists()
    back = read_prompts([str(path)])
    assert [(p.id, p.description, p.seq) for p in back] == RECORDS
    lines = [ln for ln in path.read_text().splitlines() if not ln.startswith(">")]
    if width:
        assert max(map(len, lines)) <= width
    else:
        assert len(lines) == len(RECORDS)


def test_exception_leaves_only_partial(tmp_path: Path) -> None:
    path = tmp_path / "o.fa"
    with pytest.raises(RuntimeError):
        with FastaOutput(str(path)) as out:
            out.write("a", "", "ACGT")
            raise RuntimeError("boom")
    assert not path.exists()
    assert (tmp_path / "o.fa.partial").read_text() == ">a\nACGT\n"


def test_no_finish_means_no_output(tmp_path: Path) -> None:
    path = tmp_path / "o.fa"
    with FastaOutput(str(path)) as out:
        out.write("a", "", "ACGT")
    assert not path.exists() and (tmp_path / "o.fa.partial").exists()


def test_existing_partial_needs_resume(tmp_path: Path) -> None:
    (tmp_path / "o.fa.partial").write_text(">a\nAC\n")
    with pytest.raises(InputError, match=r"o\.fa\.partial exists .*pass resume.* or delete it"):
        FastaOutput(str(tmp_path / "o.fa"))


def test_resume_keeps_finished_and_drops_torn_tail(tmp_path: Path) -> None:
    path = tmp_path / "o.fa"
    out = FastaOutput(str(path), line_width=5)
    write_all(out, RECORDS[:2])
    out.close()
    with open(tmp_path / "o.fa.partial", "ab") as f:
        f.write(b">r3 x y\nGATTA\nCAG")  # crash in the middle of a record
    with FastaOutput(str(path), line_width=5, resume=True) as out:
        assert out.done_ids == {"r1", "r2_s0"}
        for rid, desc, seq in RECORDS:
            if rid not in out.done_ids:
                out.write(rid, desc, seq)
        out.finish()
    assert [(p.id, p.description, p.seq) for p in read_prompts([str(path)])] == RECORDS


@pytest.mark.parametrize("tail",
                         [b">", b">r3", b">r3 x y\n", b">r3 x y\nGATTA\nCAGATTAC\n",
                          b">r3\nGA\xc3"])
def test_resume_drops_any_incomplete_last_record(tmp_path: Path, tail: bytes) -> None:
    path = tmp_path / "o.fa"
    out = FastaOutput(str(path), line_width=5)
    write_all(out, RECORDS[:2])
    out.close()
    good = (tmp_path / "o.fa.partial").read_bytes()
    with open(tmp_path / "o.fa.partial", "ab") as f:
        f.write(tail)
    out = FastaOutput(str(path), line_width=5, resume=True)
    out.close()
    kept = (tmp_path / "o.fa.partial").read_bytes()
    # a header-only record ending in '\n' is a complete empty record; everything else is cut
    assert kept == good or (tail == b">r3 x y\n" and kept == good + tail)


def test_resume_rejects_corrupt_middle(tmp_path: Path) -> None:
    (tmp_path / "o.fa.partial").write_text(">a\nAC#GT\n>b\nAC\n")
    with pytest.raises(InputError, match="cannot resume.*delete it"):
        FastaOutput(str(tmp_path / "o.fa"), resume=True)
    (tmp_path / "o.fa.partial").write_text("garbage\n>b\nAC\n")
    with pytest.raises(InputError, match="cannot resume"):
        FastaOutput(str(tmp_path / "o.fa"), resume=True)


def test_resume_with_other_line_width_is_an_error(tmp_path: Path) -> None:
    out = FastaOutput(str(tmp_path / "o.fa"), line_width=4)
    write_all(out)
    out.close()
    with pytest.raises(InputError, match="line_width"):
        FastaOutput(str(tmp_path / "o.fa"), line_width=6, resume=True)


def test_resume_without_partial_starts_fresh(tmp_path: Path) -> None:
    with FastaOutput(str(tmp_path / "o.fa"), resume=True) as out:
        assert out.done_ids == set()
        out.write("a", "", "AC")
        out.finish()
    assert (tmp_path / "o.fa").read_text() == ">a\nAC\n"


def test_second_writer_on_same_partial_is_refused(tmp_path: Path) -> None:
    first = FastaOutput(str(tmp_path / "o.fa"))
    first.write("a", "", "AC")
    with pytest.raises(InputError, match=r"o\.fa\.partial is in use by process \d+"):
        FastaOutput(str(tmp_path / "o.fa"), resume=True)
    first.close()


def test_crashed_process_leaves_only_partial(tmp_path: Path) -> None:
    path = tmp_path / "o.fa"
    code = (
        "import os, sys\n"
        "from evspark_cli.io.writers import FastaOutput\n"
        f"out = FastaOutput({str(path)!r})\n"
        "out.write('a', '', 'ACGT'); out.write('b', 'd', 'GG')\n"
        "os._exit(9)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    rc = subprocess.run([sys.executable, "-c", code], env=env, timeout=60).returncode
    assert rc == 9 and not path.exists()
    with FastaOutput(str(path), resume=True) as out:
        assert out.done_ids == {"a", "b"}


def test_fasta_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    with FastaOutput(None, line_width=3) as out:
        out.write("a", "desc", "ACGTA")
        out.finish()
    assert capsys.readouterr().out == ">a desc\nACG\nTA\n"
    with pytest.raises(InputError, match="resume"):
        FastaOutput("-", resume=True)


def test_fasta_write_misuse(tmp_path: Path) -> None:
    with FastaOutput(str(tmp_path / "o.fa")) as out:
        out.write("a", "", "AC")
        for args in [("a", "", "AC"), ("", "", "AC"), ("x y", "", "A"), ("z", "two\nlines", "A"),
                     ("w", "", "AC\nGT"),
                     ("v", "", ">AC")]:
            with pytest.raises(ValueError):
                out.write(*args)
    with pytest.raises(InputError, match="line_width"):
        FastaOutput(str(tmp_path / "p.fa"), line_width=-1)


# --------------------------------------------------------------------------- output path checks

@pytest.mark.parametrize("make,needle", [
    (lambda t: str(t / "missing" / "o.fa"), "does not exist"),
    (lambda t: str(t), "is a directory"),
    (lambda t: "/dev/null", "not a regular file"),
    (lambda t: "", "empty output path"),
])
def test_check_output_path_errors(tmp_path: Path, make, needle: str) -> None:
    with pytest.raises(InputError, match=needle):
        check_output_path(make(tmp_path))
    if make(tmp_path):
        with pytest.raises(InputError, match=needle):
            FastaOutput(make(tmp_path))


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_check_output_path_read_only_dir(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(InputError, match="not writable"):
            check_output_path(str(ro / "o.fa"))
    finally:
        ro.chmod(0o700)


def test_check_output_path_not_writable_simulated(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # root ignores chmod
    with pytest.raises(InputError, match="is not writable"):
        check_output_path(str(tmp_path / "o.fa"))


def test_check_output_path_ok(tmp_path: Path) -> None:
    check_output_path(None)
    check_output_path("-")
    check_output_path(str(tmp_path / "new.fa"))
    (tmp_path / "old.fa").write_text("x")
    check_output_path(str(tmp_path / "old.fa"))  # overwritten at finish


# --------------------------------------------------------------------------- stats

ROW = {"record_id": "r1", "sample": 0, "prompt_len": 64, "new_tokens": 128, "mode": "speculative",
       "drafter": "kmer", "gamma": 12, "rounds": 11, "tau": 11.636363636,
       "acceptance_rate": 0.8787878,
       "wall_s": 1.23456789, "tokens_per_s": 103.68, "native_wall_s": None,
       "native_tokens_per_s": None,
       "speedup": None}


def test_stats_tsv(tmp_path: Path) -> None:
    path = tmp_path / "s.tsv"
    with StatsOutput(str(path), COLUMNS) as out:
        out.write(ROW)
        out.write({"record_id": "r2", "sample": 1, "speedup": float("nan"), "wall_s": 1e-9})
        out.finish()
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == COLUMNS
    row = dict(zip(COLUMNS, lines[1].split("\t")))
    assert row["record_id"] == "r1" and row["sample"] == "0" and row["tau"] == "11.6364"
    assert row["wall_s"] == "1.23457" and row["native_wall_s"] == "" and row["speedup"] == ""
    row2 = dict(zip(COLUMNS, lines[2].split("\t")))
    assert row2["speedup"] == "nan" and row2["wall_s"] == "1e-09" and row2["mode"] == ""
    assert all(len(ln.split("\t")) == len(COLUMNS) for ln in lines)


def test_stats_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with StatsOutput(str(path), COLUMNS) as out:
        out.write(ROW)
        out.write({"record_id": "r2", "speedup": float("inf")})
        out.finish()
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert list(rows[0]) == COLUMNS
    assert rows[0]["tau"] == 11.6364 and rows[0]["native_wall_s"] is None and rows[0]["gamma"] == 12
    assert rows[1]["speedup"] is None and rows[1]["sample"] is None


def test_stats_bad_extension_and_misuse(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"\.tsv or \.jsonl"):
        StatsOutput(str(tmp_path / "s.csv"), COLUMNS)
    with StatsOutput(str(tmp_path / "s.TSV"), COLUMNS) as out:
        with pytest.raises(ValueError, match="unknown"):
            out.write({"record_idd": "x"})


@pytest.mark.parametrize("ext", ["tsv", "jsonl"])
def test_stats_resume(tmp_path: Path, ext: str) -> None:
    path = tmp_path / f"s.{ext}"
    out = StatsOutput(str(path), COLUMNS)
    out.write(ROW)
    out.write({**ROW, "record_id": "r2"})
    out.close()
    with open(f"{path}.partial", "ab") as f:
        f.write(b"r3\t0\t6" if ext == "tsv" else b'{"record_id": "r3", "sam')
    with pytest.raises(InputError, match="pass resume"):
        StatsOutput(str(path), COLUMNS)
    with StatsOutput(str(path), COLUMNS, resume=True) as out:
        assert out.done_ids == {"r1", "r2"} and len(out.done_rows) == 2
        out.write({**ROW, "record_id": "r3"})
        out.finish()
    text = path.read_text().splitlines()
    assert len(text) == (4 if ext == "tsv" else 3)
    assert text[-1].startswith("r3\t" if ext == "tsv" else '{"record_id": "r3"')


def test_stats_resume_other_columns_is_error(tmp_path: Path) -> None:
    out = StatsOutput(str(tmp_path / "s.tsv"), COLUMNS)
    out.close()
    with pytest.raises(InputError, match="columns differ"):
        StatsOutput(str(tmp_path / "s.tsv"), COLUMNS[:-1], resume=True)


def test_stats_resume_torn_header(tmp_path: Path) -> None:
    (tmp_path / "s.tsv.partial").write_text("record_id\tsam")
    with StatsOutput(str(tmp_path / "s.tsv"), COLUMNS, resume=True) as out:
        assert out.done_ids == set()
        out.finish()
    assert (tmp_path / "s.tsv").read_text() == "\t".join(COLUMNS) + "\n"


# --------------------------------------------------------------------------- shard

@pytest.mark.parametrize("text,want", [("1/1", (1, 1)), ("2/5", (2, 5)), (" 3 / 4 ", (3, 4))])
def test_parse_shard_ok(text: str, want: tuple[int, int]) -> None:
    assert parse_shard(text) == want


@pytest.mark.parametrize("text",
                         ["3/2", "0/2", "a/b", "1", "1/0", "0/0", "-1/2", "1/2/3", "", "1.0/2"])
def test_parse_shard_bad(text: str) -> None:
    with pytest.raises(SettingError, match="^shard ") as e:
        parse_shard(text)
    assert e.value.render(lambda s: "--" + s).startswith("--shard ")


@settings(max_examples=60, deadline=None)
@given(items=st.lists(st.integers(), max_size=40))
def test_shards_cover_exactly_once(items: list[int]) -> None:
    tagged = list(enumerate(items))
    assert select_shard(tagged, None) == tagged
    for n in range(1, 6):
        parts = [select_shard(tagged, (i, n)) for i in range(1, n + 1)]
        assert sorted(x for part in parts for x in part) == tagged
        for i, part in enumerate(parts, start=1):
            assert part == sorted(part) and all(k % n == i - 1 for k, _ in part)
        sizes = [len(p) for p in parts]
        assert max(sizes) - min(sizes) <= 1


# ------------------------------------------- the command line on bad output paths (battery)


BAD_INPUT_CASES: list[Case] = [
    Case("--stats with an unknown extension",
         lambda d, m: [*gen()(d, m), "-o", d / "out.fa", "--stats", d / "out.csv"], 2,
         r"--stats \S*out\.csv: use a \.tsv or \.jsonl", outputs=False),
    Case("output in a missing directory",
         lambda d, m: [*gen()(d, m), "-o", d / "no/such/out.fa"], 2,
         r"out\.fa: output directory \S+ does not exist", outputs=False),
    Case("output without write permission",
         lambda d, m: [*gen()(d, m), "-o", ro_dir(d) / "out.fa"],
         2, r"out\.fa: output directory \S*readonly is not writable", outputs=False,
         note="as root: run in a private mount namespace with the folder bind-mounted read-only"),
    Case("output path is an existing directory", lambda d, m: [*gen()(d, m), "-o", d], 2,
         r"is a directory; give an output file name", outputs=False),
    Case("leftover .partial without --resume",
         lambda d, m: [*gen()(d, m), "-o", w(d, "out.fa.partial", ">x\nAC\n").with_suffix("")],
         2, r"out\.fa\.partial exists .*pass --resume", outputs=False),
    Case("leftover stats .partial without --resume",
         lambda d, m: [*gen()(d, m), "-o", d / "out.fa", "--stats",
                       w(d, "out.tsv.partial", "record_id\n").with_suffix("")],
         2, r"out\.tsv\.partial exists .*pass --resume", outputs=False),
    Case("--resume to stdout", gen("--resume"), 2, r"--resume needs an output file", outputs=False),
]


@pytest.mark.parametrize("case", BAD_INPUT_CASES, ids=case_ids(BAD_INPUT_CASES))
def test_bad_input(case: Case, battery_models: Models, tmp_path: Path):
    """`evspark generate` with each bad output: the exit code, one error line, nothing written."""
    check_bad_input(case, battery_models, tmp_path)


# ------------------------------------------------------------- another path to an input


def _can_bind_mount() -> bool:
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    with tempfile.TemporaryDirectory() as t:
        a, b = Path(t, "a"), Path(t, "b")
        a.mkdir(), b.mkdir()
        p = subprocess.run(["unshare", "--mount", "sh", "-c", 'mount --bind "$0" "$1"', a, b],
                           capture_output=True)
        return p.returncode == 0


@pytest.mark.skipif(not _can_bind_mount(), reason="needs root and unshare for a bind mount")
def test_output_through_a_bind_mount_of_the_input_is_refused(phix_model: Path, tmp_path: Path):
    data, alias = tmp_path / "data", tmp_path / "alias"
    data.mkdir(), alias.mkdir()
    src = fasta_file(data)
    before = src.read_bytes()
    args = ["generate", "data/in.fa", "--model", phix_model, *FAST, "-n", 4, "-o", "alias/in.fa"]
    p = subprocess.run(["unshare", "--mount", "sh", "-c",
                        'mount --bind data alias && exec "$@"', "sh", sys.executable, "-m",
                        "evspark_cli.cli", *map(str, args)],
                       capture_output=True, text=True, cwd=tmp_path, env=child_env(),
                       timeout=120)
    line = only_error_line(p.stderr)
    record("hostile", "output is the input through a bind mount",
           show(args, tmp_path, MODEL=phix_model) + " (alias/ a bind mount of data/)",
           p.returncode, shorten(line, tmp_path))
    assert p.returncode == 2, p.stderr
    assert re.search(r"--output alias/in\.fa is also an input \(data/in\.fa\)", line), line
    assert src.read_bytes() == before


def test_output_hard_linked_to_the_input_is_refused(phix_model: Path, tmp_path: Path):
    src = fasta_file(tmp_path)
    os.link(src, tmp_path / "same.fa")
    refused("output is a hard link to the input",
            ["generate", src, "--model", phix_model, *FAST, "-n", 4, "-o", tmp_path / "same.fa"],
            2, r"--output \S*same\.fa is also an input", tmp_path, MODEL=phix_model)
    assert src.read_text() == FASTA


def test_outputs_never_overwrite_an_input_or_each_other(tmp_path, random_model, masked_fa):
    before = masked_fa.read_text()
    r = run_cli(["generate", masked_fa, "--model", random_model, "-n", 4, "-o", masked_fa, *FAST])
    assert "also an input" in one_line_error(r, 2)
    assert masked_fa.read_text() == before
    same = tmp_path / "o.tsv"
    r = run_cli(["generate", masked_fa, "--model", random_model, "-n", 4, "-o", same, "--stats",
                 same, *FAST])
    assert "same file" in one_line_error(r, 2)
    r = run_cli(["score", masked_fa, "--model", random_model, "-o", same, "--logits", same, *FAST])
    assert "same file" in one_line_error(r, 2)
    r = run_cli(["verify", masked_fa, "--model", random_model, "-n", 4, "--report", masked_fa,
                 *FAST])
    assert "also an input" in one_line_error(r, 2)
    assert masked_fa.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fa"]


def test_output_named_like_the_stats_partial_is_refused(phix_model: Path, tmp_path: Path):
    refused("-o X.tsv.partial --stats X.tsv",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o",
             tmp_path / "X.tsv.partial", "--stats", tmp_path / "X.tsv"], 2,
            r"--output \S*X\.tsv\.partial and --stats \S*X\.tsv would both write "
            r"\S*X\.tsv\.partial", tmp_path, MODEL=phix_model)
    assert not list(tmp_path.glob("X.tsv*"))


@pytest.mark.parametrize("out", [[], ["-o", "-"]], ids=["default", "dash"])
def test_stats_and_fasta_both_on_stdout_are_refused(phix_model: Path, tmp_path: Path, out):
    """`--stats -` with the FASTA on standard output would interleave TSV rows into it."""
    refused(f"--stats - with the FASTA on stdout ({' '.join(out) or 'no -o'})",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, *out,
             "--stats", "-"], 2,
            r"^evspark: error: --output and --stats would both write to standard output "
            r"\(interleaved\); give all but one of them a file$", tmp_path, MODEL=phix_model)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fa"]
    ok = run_cli(["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
                  "-o", tmp_path / "o.fa", "--stats", "-"])  # one of them on stdout is fine
    assert ok.code == 0, ok.err
    assert ok.out.startswith("record_id\t")


# ------------------------------------------------ a symlinked, live or replaced .partial


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "fresh"])
def test_symlinked_partial_is_never_followed(phix_model: Path, tmp_path: Path, resume: bool):
    victim = fasta_file(tmp_path, "victim.fa", ">v1\nAAAA\n>v2\nCCCC\n")
    (tmp_path / "out.fa.partial").symlink_to(victim)
    args = ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o",
            tmp_path / "out.fa", *(["--resume"] if resume else [])]
    refused(f"symlinked .partial{' with --resume' if resume else ''}", args, 2,
            r"out\.fa\.partial is a symbolic link; refusing to follow it", tmp_path,
            MODEL=phix_model)
    assert victim.read_text() == ">v1\nAAAA\n>v2\nCCCC\n"
    assert not (tmp_path / "out.fa").exists()


HOLDER = """
import sys, time
from evspark_cli.io.writers import FastaOutput
out = FastaOutput(sys.argv[1])
out.write("a", "evspark", "ACGT")
print("ready", flush=True)
time.sleep(60)
"""


def test_a_live_partial_is_in_use_by_its_process(phix_model: Path, tmp_path: Path):
    out = tmp_path / "out.fa"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                              text=True, env=child_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        for resume in ([], ["--resume"]):
            refused("second run on a live .partial" + (" with --resume" if resume else ""),
                    ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
                     "-o", out, *resume],
                    2, rf"out\.fa\.partial is in use by process {holder.pid} \(a run writing "
                       r"\S*out\.fa\); wait for it to finish or stop it", tmp_path,
                    MODEL=phix_model)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / "out.fa.partial").read_text() == ">a evspark\nACGT\n"


def test_a_partial_replaced_under_a_live_run_is_not_renamed(phix_model: Path, tmp_path: Path,
                                                            monkeypatch):
    """While the run writes, its .partial is deleted and another file takes the name (what a
    second run started on the same -o does): the run exits 1 without renaming the stranger's
    file, and its own records are saved beside it."""
    from evspark_cli.io.writers import FastaOutput

    out = tmp_path / "out.fa"
    partial = tmp_path / "out.fa.partial"
    real = FastaOutput.write
    calls = []

    def steal(self, *a, **k):
        written = real(self, *a, **k)
        calls.append(1)
        if len(calls) == 1:  # after the first record: delete and replace the partial
            partial.unlink()
            partial.write_text(">other\nGGGG\n")
        return written

    monkeypatch.setattr(FastaOutput, "write", steal)
    args = ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o", out]
    line = refused("a .partial replaced under a live run", args, 1,
                   r"out\.fa\.partial was deleted or replaced while this run was writing it, so "
                   r"\S*out\.fa was not written; this run's records are in "
                   r"\S*out\.fa\.partial\.\d+",
                   tmp_path, MODEL=phix_model)
    assert not out.exists()
    assert partial.read_text() == ">other\nGGGG\n"  # the stranger's file is untouched
    rescue = Path(re.search(r"are in (\S+) \(", line)[1])
    assert [ln.split()[0] for ln in rescue.read_text().splitlines() if ln.startswith(">")] == \
        [">r1.cont", ">r2.cont", ">r3.cont"]


# ------------------------------------- every file a run reads (BED, indexes, model, drafter)


BED = "r1\t0\t10\n"


def _model_copy(model: Path, d: Path) -> Path:
    """A copy of `model` a refusal that failed would clobber, instead of the shared one."""
    return Path(shutil.copytree(model, d / "model"))


@pytest.mark.parametrize("cmd,out", [
    (["generate", "-n", 4], ["-o"]), (["generate", "-n", 4, "-o", "x.fa"], ["--stats"]),
    (["score"], ["-o"]), (["score"], ["--logits"]), (["verify", "-n", 4], ["--report"]),
], ids=["generate-o", "generate-stats", "score-o", "score-logits", "verify-report"])
def test_an_output_onto_the_bed_file_is_refused(phix_model: Path, tmp_path: Path, cmd, out):
    bed = w(tmp_path, "rr.bed", BED)
    src = fasta_file(tmp_path)
    flag = "--output" if out[0] == "-o" else out[0]
    args = [cmd[0], src, "--regions", bed, "--model", phix_model, *FAST,
            *[tmp_path / a if str(a).endswith(".fa") else a for a in cmd[1:]], *out, bed]
    refused(f"{cmd[0]} {out[0]} onto its --regions BED file", args, 2,
            rf"^evspark: error: {flag} \S*rr\.bed is also an input; it would be overwritten$",
            tmp_path, MODEL=phix_model)
    assert bed.read_text() == BED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fa", "rr.bed"]


@pytest.mark.parametrize("name,exists", [("in.fa.fai", False), ("in.fa.fai", True),
                                         ("in.fa.gz.gzi", False)],
                         ids=["fai-to-be-built", "fai", "gzi"])
def test_an_output_onto_the_fasta_index_is_refused(phix_model: Path, tmp_path: Path, name,
                                                   exists):
    """The `.fai` (and a BGZF input's `.gzi`) a region read reads or builds beside its input
    is an input too, whether or not it exists yet."""
    src = fasta_file(tmp_path)
    if name.endswith(".gzi"):
        from Bio import bgzf

        with bgzf.BgzfWriter(str(tmp_path / "in.fa.gz"), "wb") as f:
            f.write(src.read_bytes())
        src.unlink()
        src = tmp_path / "in.fa.gz"
    if exists:
        w(tmp_path, name, "r1\t22\t10\t22\t23\n")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    refused(f"-o the input's {name.rsplit('.', 1)[1]}" + (" (existing)" if exists else ""),
            ["generate", src, "--model", phix_model, *FAST, "-n", 4, "-o", tmp_path / name], 2,
            rf"--output \S*{re.escape(name)} is also an input \(the index of \S*in\.fa"
            r"(\.gz)?\); it would be overwritten", tmp_path, MODEL=phix_model)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_output_into_the_model_folder_is_refused(phix_model: Path, tmp_path: Path):
    model = _model_copy(phix_model, tmp_path)
    before = (model / "config.json").read_bytes()
    src = fasta_file(tmp_path)
    refused("-o MODEL/config.json", ["generate", src, "--model", model, *FAST, "-n", 4, "-o",
                                     model / "config.json"], 2,
            r"--output (\S+)/config\.json is also an input \(in the model folder \1\); it "
            r"would be overwritten", tmp_path, MODEL=model)
    refused("score --logits MODEL/model.safetensors",
            ["score", src, "--model", model, *FAST, "--logits", model / "model.safetensors"],
            2, r"--logits (\S+)/model\.safetensors is also an input \(in the model folder "
               r"\1\)", tmp_path, MODEL=model)
    assert (model / "config.json").read_bytes() == before


def test_an_output_into_the_drafter_folder_is_refused(phix_model: Path, tmp_path: Path):
    """A drafter folder, given as a folder or as the model's own (`dspark`, `auto`), is read
    too (the refusal comes before it is loaded, so these stand-in files are never parsed)."""
    model = _model_copy(phix_model, tmp_path)
    own = model / "drafters" / "seed0"
    own.mkdir(parents=True)
    w(own, "config.json", "{}")
    other = tmp_path / "drafter"
    other.mkdir()
    w(other, "model.safetensors", "weights")
    src = fasta_file(tmp_path)
    for drafter, out in (("dspark", own / "config.json"), ("auto", own / "config.json"),
                         (other, other / "model.safetensors")):
        name = "DRAFTER" if drafter == other else drafter
        refused(f"--drafter {name} -o a file of that drafter's folder",
                ["generate", src, "--model", model, *FAST, "-n", 4, "--drafter", drafter,
                 "-o", out], 2,
                r"--output \S+ is also an input \(in the drafter folder \S+\); it would be "
                r"overwritten", tmp_path, MODEL=model, DRAFTER=other)
    assert (own / "config.json").read_text() == "{}"
    assert (other / "model.safetensors").read_text() == "weights"


def test_bench_distill_and_train_refuse_an_output_onto_what_they_read(phix_model: Path,
                                                                      tmp_path: Path):
    model = _model_copy(phix_model, tmp_path)
    w(model, "report.md", "the model's own notes")
    src = fasta_file(tmp_path)
    refused("bench -o MODEL holding a report.md",
            ["bench", "--model", model, "--prompts", src, "-o", model, *FAST], 2,
            r"--output (\S+)/report\.md is also an input \(in the model folder \1\)",
            tmp_path, MODEL=model)
    assert (model / "report.md").read_text() == "the model's own notes"
    cache = tmp_path / "cache"
    cache.mkdir()
    w(cache, "config.json", "{}")
    refused("distill -o its teacher cache",
            ["distill", "--model", model, "--cache", cache, "-o", cache, *FAST], 2,
            r"--output \S*cache/config\.json is also an input \(in the teacher cache "
            r"\S*cache\)", tmp_path, MODEL=model)
    assert (cache / "config.json").read_text() == "{}"
    run = tmp_path / "run"
    run.mkdir()
    config = w(run, "config.json", json.dumps({
        "out_dir": str(run), "model": json.loads((model / "config.json").read_text()),
        "train": [str(src)], "valid": [], "steps": 2, "window": 8, "batch_size": 2}))
    before = config.read_text()
    refused("train --export onto its own --config",
            ["train", "--config", config, "--export", run, "-q"], 2,
            r"--export \S*run/config\.json is also an input", tmp_path, MODEL=model)
    assert config.read_text() == before


def test_run_inputs_lists_every_file_a_run_reads(tmp_path: Path, phix_model: Path):
    """The list behind the refusals: FASTA files with their indexes (and their entry in an
    index folder), the BED file, the model's files and the drafter's."""
    from evspark_cli.files import Input, Output, check_distinct
    from evspark_cli.limits import run_inputs

    src = str(fasta_file(tmp_path))
    index_dir = tmp_path / "idx"
    index_dir.mkdir()
    found = run_inputs([src, "-"], bed="r.bed", model_dir=phix_model, drafters=["kmer"],
                       index_dir=str(index_dir))
    paths = [x.path if isinstance(x, Input) else x for x in found]
    assert paths[:2] == [src, src + ".fai"] and "r.bed" in paths and "-" not in paths
    assert {str(phix_model / "config.json"), str(phix_model / "model.safetensors")} <= set(paths)
    cached = [x for x in found if isinstance(x, Input) and x.path.startswith(str(index_dir))]
    assert cached and all(x.create for x in cached)
    with pytest.raises(InputError, match=r"is also an input \(the index of \S*in\.fa\)"):
        check_distinct(found, [Output("--output", cached[1].path)])
