"""The `evspark` command line as bioinformaticians use it (the CLI contract in docs/).

Every input form gives the same continuation, the output files have the documented shape, an
interrupted or partly failed run resumes to exactly the uninterrupted result, shards recombine
byte for byte, `--help` is fast and torch-free, `info`, `score` and `convert` work, a closed
pipe stops quietly, EVSPARK_DEBUG shows the traceback, and a seed makes a run repeatable.

Most runs are in-process (`evspark_cli.cli.main` with a patched argv): a subprocess pays ~2-3 s
of torch import each time. Subprocesses are used where the process boundary is the point
(stdin pipe, signals, `--help` speed).
"""
from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import OK_FASTA, Models, fasta_file, ok_fa, refused, w, worked  # noqa: E402
from tiny import ORACLE, PHIX, run_cli, trained_tiny_dir  # noqa: E402
from tiny import CliResult as Result  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("generate", "verify", "score", "convert", "info", "train")
STATS_COLUMNS = ("record_id sample prompt_len new_tokens mode drafter gamma rounds tau "
                 "acceptance_rate wall_s tokens_per_s native_wall_s native_tokens_per_s "
                 "speedup rule verified_positions efficiency decode_s prefill_s batch input_id "
                 "region seed job branch_rows branch_wins").split()
BATCH_DEPENDENT = ("verified_positions", "efficiency", "batch")  # a block spans its round's draft
FAST = ["--threads", "1", "-q"]


# ----------------------------------------------------------------------------------- helpers



def ok(args: list[str], stdin: bytes = b"") -> Result:
    r = run_cli(args, stdin)
    assert r.code == 0, f"evspark {' '.join(map(str, args))} -> {r.code}\n{r.err}"
    assert "Traceback" not in r.err
    return r


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("EVSPARK_DEBUG", None)
    return env


def phix() -> str:
    with gzip.open(PHIX, "rt") as f:
        return "".join(line.strip() for line in f if not line.startswith(">")).upper()


def records_text(recs: dict[str, str], width: int = 50) -> str:
    return "".join(f">{rid} test record\n" + "\n".join(textwrap.wrap(seq, width)) + "\n"
                   for rid, seq in recs.items())


def split_fasta(text: str) -> dict[str, str]:
    """Record id -> the record's exact text (header + wrapped lines), in file order."""
    out: dict[str, str] = {}
    for chunk in re.split(r"(?m)^(?=>)", text):
        if chunk:
            out[chunk[1:].split(None, 1)[0]] = chunk
    return out


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny target trained briefly on phiX174: it writes DNA letters."""
    import torch

    torch.set_num_threads(1)
    return trained_tiny_dir(tmp_path_factory.mktemp("model"), steps=20)


@pytest.fixture(scope="module")
def recs() -> dict[str, str]:
    g = phix()
    return {"r1": g[100:190], "r2": g[1000:1047], "r3": g[2000:2130], "r4": g[3000:3033],
            "r5": g[4000:4071]}


def gen(model: Path, *extra) -> list[str]:
    return ["generate", "--model", model, *FAST, *extra]


# ------------------------------------------------------------------------------- input forms


def test_every_input_form_gives_the_same_continuation(tmp_path, model, recs):
    from Bio import bgzf

    two = {k: recs[k] for k in ("r1", "r2")}
    text = records_text(two)
    opts = ["-n", 8, "--seed", 3]
    plain = tmp_path / "in.fa"
    plain.write_text(text)
    ref = ok(gen(model, plain, *opts)).out
    assert set(split_fasta(ref)) == {"r1.cont", "r2.cont"}

    gz = tmp_path / "in.fa.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert ok(gen(model, gz, *opts)).out == ref

    bg = tmp_path / "in.bgzf.gz"
    with bgzf.BgzfWriter(str(bg), "wb") as w:
        w.write(text.encode())
    assert bg.read_bytes()[12:14] == b"BC"
    assert ok(gen(model, bg, *opts)).out == ref
    # regions through pyfaidx on the BGZF file and on the plain one
    assert ok(gen(model, bg, "--region", "r1", "--region", "r2", *opts)).out == ref
    assert ok(gen(model, plain, "--region", "r1", "--region", "r2", *opts)).out == ref

    assert ok(gen(model, "-", *opts), stdin=text.encode()).out == ref
    assert ok(gen(model, "-", *opts), stdin=gzip.compress(text.encode())).out == ref

    a, b = tmp_path / "a.fa", tmp_path / "b.fa"
    a.write_text(records_text({"r1": two["r1"]}))
    b.write_text(records_text({"r2": two["r2"]}, width=13))
    assert ok(gen(model, a, b, *opts)).out == ref

    out = tmp_path / "out.fa"
    ok(gen(model, plain, "-o", out, *opts))
    assert out.read_text() == ref

    # a sub-region continues like a record holding exactly those bases under the region's id
    sub = tmp_path / "sub.fa"
    sub.write_text(f">r1:11-40\n{two['r1'][10:40]}\n")
    got = ok(gen(model, plain, "--region", "r1:11-40", *opts)).out
    assert list(split_fasta(got)) == ["r1:11-40.cont"]
    assert got == ok(gen(model, sub, *opts)).out

    # --prompt-tail N == a file holding only the last N bases (the header records the tail and
    # says which bases they are)
    tail = tmp_path / "tail.fa"
    tail.write_text(records_text({k: v[-20:] for k, v in two.items()}))
    tailed = ok(gen(model, plain, "--prompt-tail", 20, *opts)).out
    assert tailed.count(" prompt_tail=20 ") == 2
    assert f" prompt=r1:{len(two['r1']) - 19}-{len(two['r1'])} " in tailed
    plain_tail = ok(gen(model, tail, *opts)).out
    assert re.sub(r" prompt=\S+", "", tailed.replace(" prompt_tail=20 ", " prompt_tail=none ")) \
        == re.sub(r" prompt=\S+", "", plain_tail)
    assert tailed != ref


@pytest.mark.slow
def test_stdin_through_a_real_pipe(tmp_path, model, recs):
    plain = tmp_path / "in.fa"
    plain.write_text(records_text({"r2": recs["r2"]}))
    ref = ok(gen(model, plain, "-n", 6)).out
    p = subprocess.run([sys.executable, "-m", "evspark_cli.cli",
                        *map(str, gen(model, "-", "-n", 6))],
                       input=gzip.compress(plain.read_bytes()), capture_output=True,
                       env=subprocess_env(), cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    assert p.stdout.decode() == ref
    # quiet: no progress when all is well, only the summary line
    assert p.stderr.decode().splitlines()[0].startswith("evspark: generate: 1 record x 1 sample")
    assert len(p.stderr.decode().splitlines()) == 1


# ------------------------------------------------------------------------------ output format


HEADER = re.compile(r"^(?P<id>\S+) evspark model=(?P<model>\S+) drafter=(?P<drafter>\S+) "
                    r"gamma=(?P<gamma>\d+) temperature=(?P<temperature>\S+) top_k=(?P<top_k>\d+) "
                    r"top_p=(?P<top_p>\S+) seed=(?P<seed>\d+) "
                    r"include_prompt=(?P<include_prompt>yes|no) prompt_tail=(?P<prompt_tail>\S+) "
                    r"iupac=(?P<iupac>\S+) prompt_sha256=(?P<prompt_sha256>[0-9a-f]{16}) "
                    r"new_tokens=(?P<new_tokens>\d+) prompt=(?P<prompt>\S+) "
                    r"rule=(?P<rule>residual|coupled)$")


def test_fasta_output_header_width_samples_and_prompt(tmp_path, model, recs):
    from Bio import SeqIO

    src = tmp_path / "in.fa"
    src.write_text(records_text({k: recs[k] for k in ("r1", "r2")}))
    opts = ["-n", 17, "--seed", 11, "--gamma", 5, "--temperature", 0.7, "--top-k", 3, "--top-p",
            0.9,
            "--samples", 3, "--line-width", 7, "--drafter", "kmer"]
    out, with_prompt = tmp_path / "o.fa", tmp_path / "p.fa"
    ok(gen(model, src, "-o", out, *opts))
    ok(gen(model, src, "-o", with_prompt, "--include-prompt", *opts))

    recs_out = list(SeqIO.parse(out, "fasta"))
    assert [r.id for r in recs_out] == ["r1.cont_s0", "r1.cont_s1", "r1.cont_s2", "r2.cont_s0",
                                        "r2.cont_s1", "r2.cont_s2"]
    for r in recs_out:
        m = HEADER.match(r.description)
        assert m, r.description
        assert m["id"] == r.id
        assert (m["model"], m["drafter"], m["gamma"], m["seed"]) == ("tiny-test", "kmer", "5", "11")
        assert (float(m["temperature"]), int(m["top_k"]), float(m["top_p"])) == (0.7, 3, 0.9)
        assert int(m["new_tokens"]) == len(r.seq) == 17
        assert (m["include_prompt"], m["prompt_tail"], m["iupac"]) == ("no", "none", "keep")
        assert m["prompt"] == r.id.split(".")[0]
        assert set(str(r.seq)) <= set("ACGTN")
    for rid in ("r1", "r2"):  # samples differ from each other
        assert len({str(r.seq) for r in recs_out if r.id.startswith(rid + ".cont_")}) == 3

    lines = out.read_text().splitlines()
    for k, line in enumerate(lines):
        if not line.startswith(">"):
            last = k + 1 == len(lines) or lines[k + 1].startswith(">")
            assert len(line) == 7 or (last and 0 < len(line) <= 7)

    full = {r.id: str(r.seq) for r in SeqIO.parse(with_prompt, "fasta")}
    assert all(HEADER.match(r.description)["include_prompt"] == "yes"
               for r in SeqIO.parse(with_prompt, "fasta"))
    for r in recs_out:  # the same record, prompt first, under the id ending in .ext
        prompt = recs[r.id.split(".")[0]]
        assert full[r.id.replace(".cont", ".ext")] == prompt + str(r.seq)

    wide = ok(gen(model, src, "--line-width", 0, "-n", 70)).out
    assert all(len(s.splitlines()) == 2 for s in split_fasta(wide).values())


def test_a_run_reads_the_model_config_once(tmp_path, model, recs, monkeypatch):
    """generate and verify read config.json once: to bound their inputs, then to load."""
    from evspark_cli.model.config import ModelConfig

    src = tmp_path / "in.fa"
    src.write_text(records_text({"r1": recs["r1"]}))
    real = ModelConfig.load.__func__
    reads: list[str] = []

    def counted(cls, path):
        reads.append(str(path))
        return real(cls, path)

    monkeypatch.setattr(ModelConfig, "load", classmethod(counted))
    ok(gen(model, src, "-n", 4, "-o", tmp_path / "a.fa", "--drafter", "kmer"))
    ok(["verify", src, "--model", model, *FAST, "-n", 4, "--drafter", "kmer"])
    assert reads == [str(Path(model) / "config.json")] * 2, reads


def test_stats_files_have_exactly_the_documented_columns(tmp_path, model, recs):
    src = tmp_path / "in.fa"
    src.write_text(records_text({k: recs[k] for k in ("r1", "r2")}))
    tsv, jsonl, cmp_tsv = tmp_path / "s.tsv", tmp_path / "s.jsonl", tmp_path / "c.tsv"
    ok(gen(model, src, "-n", 9, "--samples", 2, "--stats", tsv, "-o", tmp_path / "a.fa"))
    ok(gen(model, src, "-n", 9, "--stats", jsonl, "-o", tmp_path / "b.fa"))
    ok(gen(model, src, "-n", 9, "--stats", cmp_tsv, "--compare-native", "-o", tmp_path / "c.fa"))

    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t") == STATS_COLUMNS
    rows = [dict(zip(STATS_COLUMNS, ln.split("\t"), strict=True)) for ln in lines[1:]]
    assert [(r["record_id"], r["sample"]) for r in rows] == [
        ("r1.cont_s0", "0"), ("r1.cont_s1", "1"), ("r2.cont_s0", "0"), ("r2.cont_s1", "1")]
    for r in rows:
        assert int(r["prompt_len"]) == len(recs[r["record_id"][:2]])
        assert int(r["new_tokens"]) == 9
        assert r["mode"] == "speculative" and int(r["rounds"]) >= 1
        assert 1.0 <= float(r["tau"]) <= int(r["gamma"]) + 1
        assert 0.0 <= float(r["acceptance_rate"]) <= 1.0
        assert float(r["wall_s"]) > 0 and float(r["tokens_per_s"]) > 0
        assert r["native_wall_s"] == r["native_tokens_per_s"] == r["speedup"] == ""
        assert r["rule"] == "residual"
        # every round verifies at least the row's committed tokens
        assert int(r["verified_positions"]) >= 9
        assert float(r["efficiency"]) == pytest.approx(9 / int(r["verified_positions"]), rel=1e-4)

    objs = [json.loads(ln) for ln in jsonl.read_text().splitlines()]
    assert [o["record_id"] for o in objs] == ["r1.cont", "r2.cont"]
    for o in objs:
        assert list(o) == STATS_COLUMNS
        assert o["native_wall_s"] is None and o["native_tokens_per_s"] is None
        assert o["speedup"] is None

    lines = cmp_tsv.read_text().splitlines()
    assert lines[0].split("\t") == STATS_COLUMNS and len(lines) == 3
    for ln in lines[1:]:
        r = dict(zip(STATS_COLUMNS, ln.split("\t"), strict=True))
        assert float(r["native_wall_s"]) > 0 and float(r["native_tokens_per_s"]) > 0
        assert float(r["speedup"]) > 0


# ------------------------------------------------------------------- interruption and resume


def _reference(tmp_path: Path, model: Path, src: Path, opts: list) -> tuple[bytes, bytes]:
    ref, ref_stats = tmp_path / "ref.fa", tmp_path / "ref.tsv"
    ok(gen(model, src, "-o", ref, "--stats", ref_stats, *opts))
    return ref.read_bytes(), ref_stats.read_bytes()


def _patch_prefill(monkeypatch, hook) -> None:
    """Call hook(job) before each prompt's prefill: where a record first reaches the engine."""
    from evspark_cli.decode.batch import BatchDecoder

    real = BatchDecoder._prefilled

    def patched(self, job):
        hook(job)
        return real(self, job)

    monkeypatch.setattr(BatchDecoder, "_prefilled", patched)


def plant_prefill_fault(monkeypatch, record: str) -> None:
    """Make the prefill of every record whose id starts with `record` fail ("planted fault")."""
    def faulty(job) -> None:
        if job.record.startswith(record):
            raise RuntimeError("planted fault")

    _patch_prefill(monkeypatch, faulty)


def _generated_ids(monkeypatch) -> list[str]:
    """Patch the engine so that the test sees which records a run actually generates."""
    seen: list[str] = []
    _patch_prefill(monkeypatch, lambda job: seen.append(job.label))
    return seen


def _check_resumed(out: Path, stats: Path, ref: bytes, ref_stats: bytes, n: int) -> None:
    assert out.read_bytes() == ref
    assert not Path(f"{out}.partial").exists() and not Path(f"{stats}.partial").exists()
    lines = stats.read_text().splitlines()
    ref_lines = ref_stats.decode().splitlines()
    assert lines[0] == ref_lines[0] and lines.count(lines[0]) == 1 and len(lines) == n + 1
    # identical but for the timing columns
    keep = [i for i, c in enumerate(STATS_COLUMNS) if "wall" not in c and "per_s" not in c
            and c not in BATCH_DEPENDENT and c not in ("decode_s", "prefill_s")]
    assert [[ln.split("\t")[i] for i in keep] for ln in lines] == \
           [[ln.split("\t")[i] for i in keep] for ln in ref_lines]


def test_keyboard_interrupt_then_resume_equals_uninterrupted(tmp_path, model, recs, monkeypatch):
    from evspark_cli.decode.batch import BatchDecoder

    src = tmp_path / "in.fa"
    src.write_text(records_text(recs))
    opts = ["-n", 6, "--seed", 5, "--batch-size", 1]  # one record at a time: r1, r2, then r3
    ref, ref_stats = _reference(tmp_path, model, src, opts)
    out, stats = tmp_path / "out.fa", tmp_path / "out.tsv"

    real, calls = BatchDecoder._prefilled, []

    def interrupt_third(job):
        calls.append(job.label)
        if len(calls) == 3:
            raise KeyboardInterrupt

    _patch_prefill(monkeypatch, interrupt_third)
    r = run_cli(gen(model, src, "-o", out, "--stats", stats, *opts))
    assert r.code == 130 and "--resume" in r.err and "Traceback" not in r.err
    assert not out.exists() and not stats.exists()
    assert list(split_fasta(Path(f"{out}.partial").read_text())) == ["r1.cont", "r2.cont"]
    assert len(Path(f"{stats}.partial").read_text().splitlines()) == 3

    # without --resume the partial is protected
    monkeypatch.setattr(BatchDecoder, "_prefilled", real)
    r = run_cli(gen(model, src, "-o", out, "--stats", stats, *opts))
    assert r.code == 2 and "--resume" in r.err
    # settings that differ from the finished records' headers would mix two runs in one file
    for other in (["-n", 7, "--seed", 5], ["-n", 6, "--seed", 6],
                  ["-n", 6, "--seed", 5, "--greedy"]):
        r = run_cli(gen(model, src, "-o", out, "--stats", stats, "--resume", *other))
        err = r.err.strip().splitlines()
        assert r.code == 2 and len(err) == 1 and "made with" in err[0], r.err
        assert list(split_fasta(Path(f"{out}.partial").read_text())) == ["r1.cont", "r2.cont"]

    seen = _generated_ids(monkeypatch)
    ok(gen(model, src, "-o", out, "--stats", stats, "--resume", *opts))
    assert seen == ["r3.cont", "r4.cont", "r5.cont"]  # finished records were not regenerated
    _check_resumed(out, stats, ref, ref_stats, 5)


_KILLER = """
import os, signal, sys, time
from evspark_cli.decode.batch import BatchDecoder
from evspark_cli import cli
real, calls, mode = BatchDecoder._prefilled, [], sys.argv[1]
def patched(self, job):
    calls.append(1)
    if len(calls) == 3:
        if mode == "KILL":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # the parent sends SIGINT meanwhile
    return real(self, job)
BatchDecoder._prefilled = patched
sys.argv = ["evspark"] + sys.argv[2:]
cli.main()
"""


def _default_sigint() -> None:
    """In the child before it starts: SIGINT back to its default. A job started in the background
    (`nohup pytest &`) has SIGINT ignored, every child inherits that, and Python leaves an
    ignored SIGINT ignored, so the SIGINT this test sends would never reach the run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["SIGINT", "SIGKILL"])
def test_signal_then_resume_equals_uninterrupted(tmp_path, model, recs, monkeypatch, how):
    src = tmp_path / "in.fa"
    src.write_text(records_text(recs))
    opts = ["-n", 6, "--seed", 5, "--batch-size", 1]
    ref, ref_stats = _reference(tmp_path, model, src, opts)
    out, stats = tmp_path / "out.fa", tmp_path / "out.tsv"
    partial = Path(f"{out}.partial")
    args = [sys.executable, "-c", _KILLER, "KILL" if how == "SIGKILL" else "WAIT",
            *map(str, gen(model, src, "-o", out, "--stats", stats, *opts))]
    p = subprocess.Popen(args, env=subprocess_env(), cwd=tmp_path, stderr=subprocess.PIPE,
                         preexec_fn=_default_sigint)
    try:
        if how == "SIGINT":
            deadline = time.monotonic() + 90
            while not (partial.exists() and partial.read_text().count(">") == 2):
                assert p.poll() is None, p.stderr.read().decode()
                assert time.monotonic() < deadline, "no record written in 90 s"
                time.sleep(0.05)
            p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    if how == "SIGINT":
        assert p.returncode == 130, err.decode()
        assert err.decode().count("evspark:") == 1 and b"Traceback" not in err
    else:
        assert p.returncode == -signal.SIGKILL
    assert not out.exists()
    assert list(split_fasta(partial.read_text())) == ["r1.cont", "r2.cont"]
    if how == "SIGKILL":  # killed after r3's stats row, in the middle of its FASTA record,
        # and in the middle of r4's row: torn tails are dropped and redone, r3's row kept once
        with open(partial, "a") as f:
            f.write(">r3.cont evspark model=tiny-test drafter=kmer\nACG")
        with open(f"{stats}.partial", "a") as f:
            f.write(ref_stats.decode().splitlines()[3] + "\n" + "r4.cont\t0\t13")

    seen = _generated_ids(monkeypatch)
    ok(gen(model, src, "-o", out, "--stats", stats, "--resume", *opts))
    assert seen == ["r3.cont", "r4.cont", "r5.cont"]
    _check_resumed(out, stats, ref, ref_stats, 5)


@pytest.mark.parametrize("where", ["FastaOutput", "StatsOutput"])
def test_interrupt_between_the_fasta_and_stats_writes(tmp_path, model, recs, monkeypatch, where):
    """Whichever of the two writes of a record is interrupted, resume gives consistent files."""
    import evspark_cli.io.writers as writers

    src = tmp_path / "in.fa"
    src.write_text(records_text(recs))
    opts = ["-n", 6, "--seed", 5]
    ref, ref_stats = _reference(tmp_path, model, src, opts)
    out, stats = tmp_path / "out.fa", tmp_path / "out.tsv"
    cls = getattr(writers, where)
    real, calls = cls.write, []

    def write(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, *a, **kw)

    monkeypatch.setattr(cls, "write", write)
    assert run_cli(gen(model, src, "-o", out, "--stats", stats, *opts)).code == 130
    monkeypatch.setattr(cls, "write", real)
    ok(gen(model, src, "-o", out, "--stats", stats, "--resume", *opts))
    _check_resumed(out, stats, ref, ref_stats, 5)


@pytest.mark.parametrize("batch", [1, 3])
def test_one_failing_record_keeps_the_others(tmp_path, model, recs, monkeypatch, batch):
    from evspark_cli.decode.batch import BatchDecoder

    src = tmp_path / "in.fa"
    src.write_text(records_text(recs))
    opts = ["-n", 6, "--seed", 2, "--batch-size", batch]
    ref, _ = _reference(tmp_path, model, src, opts)
    out, stats = tmp_path / "out.fa", tmp_path / "out.tsv"
    real = BatchDecoder._prefilled

    def faulty(job):
        if job.label == "r2.cont":
            raise RuntimeError("planted fault")

    _patch_prefill(monkeypatch, faulty)
    r = run_cli(gen(model, src, "-o", out, "--stats", stats, *opts))
    assert r.code == 1 and "Traceback" not in r.err
    assert "record 'r2.cont' failed: planted fault" in r.err
    assert r.err.strip().splitlines()[-1].startswith(
        "evspark: error: 1 of 5 records failed (r2.cont)")
    assert not out.exists() and not stats.exists()
    assert list(split_fasta(Path(f"{out}.partial").read_text())) == [
        "r1.cont", "r3.cont", "r4.cont", "r5.cont"]

    monkeypatch.setattr(BatchDecoder, "_prefilled", real)
    seen = _generated_ids(monkeypatch)
    ok(gen(model, src, "-o", out, "--stats", stats, "--resume", *opts))
    assert seen == ["r2.cont"]
    assert out.read_bytes() == ref  # the redone record is put back in its place
    assert sorted(ln.split("\t")[0] for ln in stats.read_text().splitlines()[1:]) == \
        sorted(f"{r}.cont" for r in recs)


# ---------------------------------------------------------------------------------- sharding


def test_shards_cover_the_input_once_and_recombine_byte_for_byte(tmp_path, model, recs):
    src = tmp_path / "in.fa"
    src.write_text(records_text(recs))
    opts = ["-n", 5, "--seed", 9, "--samples", 2]
    whole = ok(gen(model, src, *opts)).out
    files = [tmp_path / f"part{i}.fa" for i in (1, 2)]
    for i, f in enumerate(files, 1):
        ok(gen(model, src, "--shard", f"{i}/2", *opts, "-o", f))
    ids = [list(split_fasta(f.read_text())) for f in files]
    assert not set(ids[0]) & set(ids[1])
    assert sorted(ids[0] + ids[1]) == sorted(split_fasta(whole))
    # the (record, sample) jobs alternate: job j = record x 2 + sample goes to shard j mod 2 + 1
    assert ids[0] == [f"r{i}.cont_s0" for i in range(1, len(recs) + 1)]
    assert ok(["merge", *files]).out == whole  # input order, the unsharded bytes
    # a single shard of one is the whole run
    assert ok(gen(model, src, "--shard", "1/1", *opts)).out == whole


# ---------------------------------------------------------------------------------- --help


def test_help_is_fast_lists_every_command_and_does_not_import_torch(tmp_path):
    cmd = [sys.executable, "-m", "evspark_cli.cli", "--help"]
    env = subprocess_env()
    # warm the disk cache
    subprocess.run(cmd, capture_output=True, env=env, cwd=tmp_path, timeout=60)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    elapsed = time.perf_counter() - t0
    assert p.returncode == 0, p.stderr
    for c in COMMANDS:
        assert re.search(rf"^\W*{c}\b", p.stdout, re.M), f"{c} missing from --help:\n{p.stdout}"
    assert elapsed < 1.5, f"evspark --help took {elapsed:.2f} s"

    p = subprocess.run([sys.executable, "-X", "importtime", *cmd[1:]], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    imported = {ln.rsplit("|", 1)[-1].strip() for ln in p.stderr.splitlines() if "|" in ln}
    assert "evspark_cli" in imported and "typer" in imported  # the log is complete
    assert not {m for m in imported if m.split(".")[0] in ("torch", "numpy", "safetensors")}

    p = subprocess.run([sys.executable, "-c", "import sys, evspark_cli.cli; "
                        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command):
    r = run_cli([command, "--help"])
    assert r.code == 0 and r.err == ""
    assert "Usage:" in r.out and command in r.out
    assert run_cli([command, "-h"]).out == r.out


def test_unknown_command_and_option_are_usage_errors():
    r = run_cli(["frobnicate"])
    assert r.code == 2 and r.err.startswith("evspark: error:") and len(r.err.splitlines()) == 1
    r = run_cli(["generate", "x.fa", "--no-such-option"])
    assert r.code == 2 and "--no-such-option" in r.err and len(r.err.splitlines()) == 1


# ------------------------------------------------------------------------ info, score, convert


def test_verify_reports_identical_greedy_runs(tmp_path, model, recs):
    src = tmp_path / "in.fa"
    src.write_text(records_text({k: recs[k] for k in ("r1", "r2")}))
    report = tmp_path / "report.json"
    r = ok(["verify", src, "--model", model, *FAST, "-n", 24, "--drafter", "kmer", "--gamma", 5,
            "--report", report])
    assert re.search(r"prompts=2 identical=2 ties=0 non_tie_divergences=0", r.out), r.out
    rows = json.loads(report.read_text())["rows"]
    assert [row["record_id"] for row in rows] == ["r1", "r2"]
    assert all(row["divergence"] is None and row["compared"] == 24 for row in rows)
    assert json.loads(report.read_text())["tie_tolerance"] == 1e-3  # fp32 model: the fp32 default
    whole = json.loads(report.read_text())
    assert whole["native_s"] > 0 and whole["speculative_s"] > 0  # the time of both sides
    prov = whole["provenance"]
    assert "verify" in prov["command"] and prov["date"].endswith("UTC") and prov["machine"]["cpu"]


def test_verify_tie_tolerance_follows_the_dtype_unless_given(tmp_path, model, recs):
    src = tmp_path / "in.fa"
    src.write_text(records_text({"r1": recs["r1"]}))
    for extra, want in (([], 0.1), (["--tie-tolerance", "0.5"], 0.5)):
        report = tmp_path / "report.json"
        ok(["verify", src, "--model", model, *FAST, "-n", 8, "--drafter", "kmer", "--dtype",
            "bfloat16", "--report", report, *extra])
        assert json.loads(report.read_text())["tie_tolerance"] == want


def test_info(model):
    from evspark_cli.model.checkpoint import load_model

    r = ok(["info", "--model", model])
    assert "tiny-test" in r.out and str(model) in r.out
    m = re.search(r"parameters\s+([\d,]+)", r.out)
    assert m and int(m[1].replace(",", "")) == load_model(model).num_parameters()
    assert re.search(r"layer pattern\s+hcs hcm hcl attn", r.out)
    assert "bytes per sequence" in r.out and "bytes per token" in r.out


def test_score_tsv_and_logits(tmp_path, model, recs):
    import torch
    from safetensors.torch import load_file

    src = tmp_path / "in.fa"
    g = phix()
    rnd = "".join("ACGT"[(i * 7919 + i * i * 104729) % 4] for i in range(120))
    src.write_text(records_text({"phix": g[500:700], "r2": recs["r2"], "odd": rnd}))
    tsv, lg = tmp_path / "s.tsv", tmp_path / "l.safetensors"
    ok(["score", src, "--model", model, *FAST, "-o", tsv, "--logits", lg])
    lines = tsv.read_text().splitlines()
    assert lines[0].split("\t") == ["record_id", "length", "bits_per_nt", "total_ll", "scored"]
    rows = {ln.split("\t")[0]: ln.split("\t") for ln in lines[1:]}
    assert list(rows) == ["phix", "r2", "odd"]
    assert int(rows["phix"][1]) == 200 and int(rows["r2"][1]) == len(recs["r2"])
    bits = {k: float(v[2]) for k, v in rows.items()}
    # plausible: far below uniform over 512 tokens (9 bits), around 2 bits for DNA it has seen
    assert all(0.5 < b < 4.0 for b in bits.values()), bits

    tensors = load_file(str(lg))
    assert set(tensors) == {"phix", "r2", "odd"}
    for rid, t in tensors.items():
        assert t.dtype == torch.float32 and tuple(t.shape) == (int(rows[rid][1]) - 1, 512)
        ids = torch.tensor(list({"phix": g[500:700], "r2": recs["r2"], "odd": rnd}[rid].encode()))
        nll = -torch.log_softmax(t, -1).gather(1, ids[1:, None]).mean() / math.log(2)
        assert abs(float(nll) - bits[rid]) < 2e-3

    assert ok(["score", src, "--model", model, *FAST]).out == tsv.read_text()  # stdout default


def test_score_keeps_finished_records_when_one_fails_and_resumes(tmp_path, model, recs,
                                                                  monkeypatch):
    """A record that fails is one error line; the rows scored before and after it stay in
    OUTPUT.partial (no final file), and --resume scores only what is missing."""
    from evspark_cli.eval import score as score_mod

    src = tmp_path / "in.fa"
    src.write_text(records_text({"a": recs["r1"], "bad": recs["r2"], "c": recs["r1"][:40]}))
    tsv = tmp_path / "s.tsv"
    real = score_mod.score_record
    calls: list[int] = []

    def flaky(model, ids, *a, **k):
        calls.append(int(ids.numel()))
        if int(ids.numel()) == len(recs["r2"]):
            raise RuntimeError("simulated failure\nsecond line")
        return real(model, ids, *a, **k)

    monkeypatch.setattr(score_mod, "score_record", flaky)
    r = run_cli(["score", src, "--model", model, *FAST, "-o", tsv])
    assert r.code == 1 and not tsv.exists()
    errs = r.err.strip().splitlines()
    assert errs[0] == "evspark: error: record 'bad' failed: simulated failure"
    assert errs[-1].startswith("evspark: error: 1 of 3 records failed (bad)")
    assert "--resume" in errs[-1]
    partial = (tmp_path / "s.tsv.partial").read_text().splitlines()
    assert [ln.split("\t")[0] for ln in partial] == ["record_id", "a", "c"]

    r = run_cli(["score", src, "--model", model, *FAST, "-o", tsv])  # no --resume: refused
    assert r.code == 2 and "--resume" in r.err
    monkeypatch.setattr(score_mod, "score_record", real)
    calls.clear()
    ok(["score", src, "--model", model, *FAST, "-o", tsv, "--resume"])
    rows = {ln.split("\t")[0]: ln for ln in tsv.read_text().splitlines()[1:]}
    assert sorted(rows) == ["a", "bad", "c"] and rows["a"] == dict(
        (ln.split("\t")[0], ln) for ln in partial[1:])["a"]
    assert not (tmp_path / "s.tsv.partial").exists()
    fresh = ok(["score", src, "--model", model, *FAST]).out.splitlines()
    assert sorted(fresh[1:]) == sorted(tsv.read_text().splitlines()[1:])  # same figures
    jl = tmp_path / "s.jsonl"
    ok(["score", src, "--model", model, *FAST, "-o", jl])
    assert [json.loads(ln)["record_id"] for ln in jl.read_text().splitlines()] == ["a", "bad", "c"]


def test_convert_the_oracle_checkpoint(tmp_path):
    ckpt, cfg = ORACLE / "tiny_vtx.safetensors", ORACLE / "tiny_vtx_config.json"
    out = tmp_path / "conv"
    r = ok(["convert", ckpt, "--config", cfg, "-o", out])
    assert str(out) in r.err
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    info = ok(["info", "--model", out]).out
    assert "tiny-stripedhyena2-oracle" in info
    assert re.search(r"layer pattern\s+hcs hcm hcl attn hcs hcm hcl attn", info)

    # the converted model continues the oracle prompt greedily exactly as vortex did
    from safetensors.torch import load_file

    ref = load_file(str(ORACLE / "tiny_vtx_reference_tensors.safetensors"))
    src = tmp_path / "p.fa"
    src.write_text(">oracle\n" + "".join(map(chr, ref["prompt_ids"].tolist())) + "\n")
    n = 16
    got = ok(gen(out, src, "--greedy", "--drafter", "none", "-n", n, "--line-width", 0,
                 "--dtype", "float32", "--device", "cpu")).out.splitlines()[1]
    tokens = ref["greedy_tokens"][:n].tolist()
    want = "".join(chr(t) if chr(t).isascii() and chr(t).isalpha() else "N" for t in tokens)
    assert got == want


def test_cuda_graph_option_is_accepted_and_changes_nothing_on_cpu(tmp_path, model, recs):
    from evspark_cli.model.checkpoint import load_model

    assert load_model(model).graphs is None  # graphs are a GPU feature
    src = tmp_path / "in.fa"
    src.write_text(records_text({"r1": recs["r1"]}))
    a, b = tmp_path / "a.fa", tmp_path / "b.fa"
    ok(gen(model, src, "-o", a, "-n", 12))
    ok(gen(model, src, "-o", b, "-n", 12, "--no-cuda-graphs"))
    assert a.read_text() == b.read_text()
    ok(["verify", "--model", model, src, "-n", 8, "--drafter", "kmer", "--cuda-graphs"])


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit internals inductor calls
def test_compile_option_writes_the_same_continuations(tmp_path, model, recs):
    src = tmp_path / "in.fa"
    src.write_text(records_text({k: recs[k] for k in ("r1", "r2")}))
    a, b = tmp_path / "a.fa", tmp_path / "b.fa"
    ok(gen(model, src, "-o", a, "-n", 30))
    r = ok(gen(model, src, "-o", b, "-n", 30, "--compile"))
    assert "failed" not in r.err  # compiled, not fallen back to eager
    assert a.read_text() == b.read_text()


# ---------------------------------------------------------- score and verify on odd records


def test_score_context_beyond_the_model_is_refused(short_model: Path, tmp_path: Path):
    refused("score --context beyond the model's context",
            ["score", fasta_file(tmp_path), "--model", short_model, *FAST, "--context", 2_000_000],
            2, r"--context 2,000,000: a base can see at most 63 earlier bases in the model's "
               r"context of 64", tmp_path, MODEL_CTX64=short_model)
    long = fasta_file(tmp_path, "long.fa", ">long\n" + "ACGT" * 40 + "\n")
    refused("score passes longer than the model's context",
            ["score", long, "--model", short_model, *FAST, "--context", 32, "--window", 64],
            2, r"--context 32 \+ --window 64 make passes of 96 tokens over a 160-base record, "
               r"more than the model's context of 64; lower --window", tmp_path,
            MODEL_CTX64=short_model)
    worked("score with the default --context on a 64-token model",
           ["score", long, "--model", short_model, *FAST], tmp_path, "1 row",
           MODEL_CTX64=short_model)


def test_score_of_a_one_base_record_is_nan_not_perfect(tmp_path, random_model):
    fa = tmp_path / "one.fa"
    fa.write_text(">one\nA\n>two\nACGTAC\n")
    lg = tmp_path / "lg.safetensors"
    r = run_cli(["score", fa, "--model", random_model, "--logits", lg, *FAST])
    assert r.code == 0, r.err
    rows = {ln.split("\t")[0]: ln.split("\t")[2] for ln in r.out.splitlines()[1:]}
    assert math.isnan(float(rows["one"])) and math.isfinite(float(rows["two"]))
    assert r.out.splitlines()[1].split("\t")[3:] == ["0", "0"]  # nothing scored: 0 nats
    from safetensors.torch import load_file

    saved = load_file(lg)
    assert tuple(saved["one"].shape) == (0, 512) and saved["two"].shape[0] == 5


def test_verify_table_shows_whole_record_ids(tmp_path, random_model):
    rid = "NZ_CP012345.1_region_1000000-1000200_sample"
    fa = tmp_path / "long.fa"
    fa.write_text(f">{rid}\nACGTACGTAAGGCCTA\n")
    r = run_cli(["verify", fa, "--model", random_model, "-n", 4, "--drafter", "kmer", *FAST])
    assert r.code == 0, r.err
    assert any(line.split()[0] == rid for line in r.out.splitlines()), r.out


# ------------------------------------------------ a closed pipe, debugging, determinism


def test_closed_stdout_pipe_stops_quietly(random_model, masked_fa):
    """`evspark generate in.fa | head -1`: no 'internal error: BrokenPipeError' line."""
    from evspark_cli import cli

    class ClosedPipe(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    err = io.StringIO()
    saved = sys.argv, sys.stdout
    sys.argv = ["evspark", "generate", str(masked_fa), "--model", str(random_model), "-n", "4",
                *FAST]
    sys.stdout = ClosedPipe()
    try:
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ei:
            cli.main()
    finally:
        sys.argv, sys.stdout = saved
    assert ei.value.code == 141
    # nothing but the warning about the input's lower-case bases: no error, no summary
    assert [ln.split(":")[1] for ln in err.getvalue().splitlines()] == [" warning"]


def test_debug_env_gives_a_traceback(battery_models: Models, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("EVSPARK_DEBUG", "1")
    r = run_cli(["generate", ok_fa(tmp_path), "--model", tmp_path / "nomodel", *FAST])
    assert r.code == 3 and "Traceback" in r.err and "evspark: error: model folder" in r.err


def test_same_command_and_seed_is_byte_identical(battery_models: Models, tmp_path: Path):
    src = w(tmp_path, "in.fa", OK_FASTA + ">r3\nTTTAGGCATTACGGACTA\n")
    outs = []
    for k, seed in enumerate((7, 7, 8)):
        out = tmp_path / f"o{k}.fa"
        r = run_cli(["generate", src, "--model", battery_models.good, *FAST, "-n", 24, "--seed",
                     seed, "--samples", 2, "-o", out])
        assert r.code == 0, r.err
        outs.append(out.read_bytes())
    assert outs[0] == outs[1]
    assert outs[0] != outs[2]  # the seed matters (so the check above could fail)
