"""`--resume` of an interrupted run: it continues only a `.partial` of the same run.

A `.partial` whose finished records were made with other settings (--include-prompt,
--prompt-tail, --iupac, --samples, --region), from another input, or with a stats file of
another run (or none) is refused in one line and left as it was; the same settings complete the
run to exactly the uninterrupted result. Ctrl-C names only the `.partial` files that exist;
SIGTERM (how SLURM and containers stop a job) takes the same path, with exit 143; a run whose
FASTA went to standard output says to delete its stats `.partial` instead of offering --resume.
The generate tests that kill a real run with SIGINT or SIGKILL are in test_cli.py; SIGTERM's,
and score's, are here.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from battery import FAST, FASTA, child_env, fasta_file, record, refused, shorten, show, worked
from tiny import at_round, run_cli


def _half_done(phix_model: Path, d: Path, *opts) -> Path:
    """A run that finished 2 of 3 records (its last record cut off the final file)."""
    out = d / "out.fa"
    r = run_cli(["generate", fasta_file(d), "--model", phix_model, *FAST, "-n", 4, "-o", out,
                 *opts])
    assert r.code == 0, r.err
    text = out.read_text()
    keep = text[: text.index(">r3")]
    out.unlink()
    (d / "out.fa.partial").write_text(keep)
    return out


@pytest.mark.parametrize("case,first,then,pattern", [
    ("--include-prompt", [], ["--include-prompt"],  # named, although it also renames (.ext)
     r"record 'r1\.cont' made with include_prompt=no, this run has include_prompt=yes"),
    ("--prompt-tail", [], ["--prompt-tail", 10],
     r"record 'r1\.cont' made with prompt_tail=none, this run has prompt_tail=10"),
    ("--iupac", [], ["--iupac", "random"],
     r"record 'r1\.cont' made with iupac=keep, this run has iupac=random"),
    ("--samples", [], ["--samples", 2],
     r"record 'r1\.cont', which this run does not write \(other inputs, --region, --shard or "
     r"--samples\?\)"),
    ("--region", [], ["--region", "r2", "--region", "r3"],
     r"record 'r1\.cont', which this run does not write"),
], ids=["include-prompt", "prompt-tail", "iupac", "samples", "region"])
def test_resume_with_other_record_settings_is_refused(phix_model, tmp_path, case, first, then,
                                                      pattern):
    out = _half_done(phix_model, tmp_path, *first)
    kept = (tmp_path / "out.fa.partial").read_text()
    refused(f"--resume with another {case}",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o", out,
             "--resume", *then], 2, r"--resume: \S*out\.fa\.partial has " + pattern,
            tmp_path, MODEL=phix_model)
    assert (tmp_path / "out.fa.partial").read_text() == kept and not out.exists()


def test_resume_with_other_input_contents_is_refused(phix_model: Path, tmp_path: Path):
    out = _half_done(phix_model, tmp_path)
    fasta_file(tmp_path, text=FASTA.replace("ACGTACGTACGG", "TTTTACGTACGG"))
    refused("--resume after the input changed",
            ["generate", tmp_path / "in.fa", "--model", phix_model, *FAST, "-n", 4, "-o", out,
             "--resume"], 2,
            r"record 'r1\.cont' made with prompt_sha256=[0-9a-f]{16}, this run has "
            r"prompt_sha256=[0-9a-f]{16}", tmp_path, MODEL=phix_model)


def test_a_stale_stats_partial_is_not_continued(phix_model: Path, tmp_path: Path):
    """A stats .partial left by a run with another -n is refused, not extended."""
    out, stats = tmp_path / "out.fa", tmp_path / "out.tsv"
    r = run_cli(["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 12, "-o",
                 out, "--stats", stats])
    assert r.code == 0, r.err
    stats.rename(tmp_path / "out.tsv.partial")
    out.unlink()
    kept = (tmp_path / "out.tsv.partial").read_text()
    refused("--resume onto a stale stats .partial (-n 12, now -n 4)",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o", out,
             "--stats", stats, "--resume"], 2,
            r"out\.tsv\.partial has a row for 'r1\.cont' with new_tokens=12, this run has "
            r"new_tokens=4", tmp_path, MODEL=phix_model)
    assert (tmp_path / "out.tsv.partial").read_text() == kept
    assert not (tmp_path / "out.fa.partial").exists()


def test_resume_adding_stats_to_a_run_without_is_refused(phix_model: Path, tmp_path: Path):
    out = _half_done(phix_model, tmp_path)
    refused("--resume with --stats of a run that had none",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o", out,
             "--stats", tmp_path / "out.tsv", "--resume"], 2,
            r"has 2 finished records but there is no \S*out\.tsv\.partial", tmp_path,
            MODEL=phix_model)
    assert not (tmp_path / "out.tsv.partial").exists()


def test_a_resume_with_the_same_settings_still_completes(phix_model: Path, tmp_path: Path):
    ref = run_cli(["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
                   "--include-prompt", "--prompt-tail", 12, "--iupac", "random"]).out
    out = _half_done(phix_model, tmp_path, "--include-prompt", "--prompt-tail", 12, "--iupac",
                     "random")
    worked("--resume with the same settings",
           ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o", out,
            "--include-prompt", "--prompt-tail", 12, "--iupac", "random", "--resume"],
           tmp_path, "the final file equals an uninterrupted run", MODEL=phix_model)
    assert out.read_text() == ref


def test_an_interrupt_names_only_partials_that_exist(phix_model: Path, tmp_path: Path, monkeypatch):
    from evspark_cli.model import checkpoint

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "load_model", interrupt)
        args = ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "-o",
                tmp_path / "out.fa"]
        r = run_cli(args)
    record("hostile", "Ctrl-C while the model loads", show(args, tmp_path, MODEL=phix_model),
           r.code, r.err.strip())
    assert r.code == 130 and r.err.strip() == "evspark: interrupted"
    assert not list(tmp_path.glob("out.fa*"))


    at_round(monkeypatch, 2)
    r = run_cli(args)
    assert r.code == 130
    assert r.err.strip() == (f"evspark: interrupted; finished records are kept in "
                             f"{tmp_path / 'out.fa.partial'} (rerun with --resume)")


# ------------------------------------------------- SIGTERM (SLURM, containers) is Ctrl-C


MANY = "".join(f">r{i}\n{'ACGTTGCAGGATTACA'[i:] + 'GATTACAACGT'[:i]}\n" for i in range(5))


def _sigterm_here() -> None:
    """What `kill PID` does, from inside the run: the handler raises where the run is."""
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # the handler runs before this returns


def test_sigterm_keeps_finished_records_like_ctrl_c(phix_model: Path, tmp_path: Path,
                                                    monkeypatch):
    """In this process: the second decoding round gets SIGTERM; the run flushes what is
    finished, names --resume in one line, exits 143 and leaves SIGTERM as it found it; the
    resumed run gives the uninterrupted file."""

    src = fasta_file(tmp_path, text=MANY)
    opts = [*FAST, "-n", 6, "--seed", 3, "-b", 1]
    ref = run_cli(["generate", src, "--model", phix_model, *opts]).out
    out = tmp_path / "out.fa"
    restore = at_round(monkeypatch, 8, _sigterm_here)
    args = ["generate", src, "--model", phix_model, *opts, "-o", out]
    r = run_cli(args)
    record("hostile", "SIGTERM mid-run (generate)", show(args, tmp_path, MODEL=phix_model),
           r.code, shorten(r.err.strip(), tmp_path))
    assert r.code == 143, r.err
    assert r.err.strip() == (f"evspark: interrupted by SIGTERM; finished records are kept in "
                             f"{tmp_path / 'out.fa.partial'} (rerun with --resume)")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert not out.exists() and (tmp_path / "out.fa.partial").read_text().count(">") >= 1
    restore()
    worked("--resume after SIGTERM", [*args, "--resume"], tmp_path,
           "the final file equals an uninterrupted run", MODEL=phix_model)
    assert out.read_text() == ref


def test_sigterm_in_score_keeps_its_rows(phix_model: Path, tmp_path: Path, monkeypatch):
    from evspark_cli.eval import score as scoring

    src = fasta_file(tmp_path, text=MANY)
    out = tmp_path / "bits.tsv"
    ref = run_cli(["score", src, "--model", phix_model, *FAST]).out
    real, calls = scoring.score_record, []

    def third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            _sigterm_here()
        return real(*a, **k)

    monkeypatch.setattr(scoring, "score_record", third)
    args = ["score", src, "--model", phix_model, *FAST, "-o", out]
    r = run_cli(args)
    record("hostile", "SIGTERM mid-run (score)", show(args, tmp_path, MODEL=phix_model), r.code,
           shorten(r.err.strip(), tmp_path))
    assert r.code == 143 and r.err.strip().endswith(
        f"finished records are kept in {tmp_path / 'bits.tsv.partial'} (rerun with --resume)")
    assert (tmp_path / "bits.tsv.partial").read_text() == "\n".join(ref.splitlines()[:3]) + "\n"
    monkeypatch.setattr(scoring, "score_record", real)
    assert run_cli([*args, "--resume"]).code == 0
    assert out.read_text() == ref


def test_sigterm_in_verify_is_one_line(phix_model: Path, tmp_path: Path, monkeypatch):
    """verify writes its report at the end: an interrupted one leaves nothing."""
    from evspark_cli.eval import verify

    monkeypatch.setattr(verify, "verify_prompts", lambda *a, **k: _sigterm_here())
    args = ["verify", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4, "--report",
            tmp_path / "v.json"]
    r = run_cli(args)
    assert r.code == 143 and r.err.strip() == "evspark: interrupted by SIGTERM", r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fa"]


# ----------------------------------------------- the same, from outside: a real signal


_STOPPED = """
import sys, time
from evspark_cli import cli
from evspark_cli.decode.batch import BatchDecoder
from evspark_cli.eval import score as scoring
calls = []
def third(real):
    def wait(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            time.sleep(120)  # the parent signals meanwhile
        return real(*a, **k)
    return wait
BatchDecoder._prefilled = third(BatchDecoder._prefilled)
scoring.score_record = third(scoring.score_record)
sys.argv = ["evspark"] + sys.argv[1:]
cli.main()
"""


def _default_signals() -> None:
    """In the child before it starts: SIGINT and SIGTERM at their defaults. A job started in
    the background (`nohup pytest &`) has SIGINT ignored, its children inherit that, and Python
    leaves an ignored SIGINT ignored (as EvSpark leaves an ignored SIGTERM): the signal this
    test sends would never reach the run."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.mark.slow
@pytest.mark.parametrize("command,how", [("generate", "SIGTERM"), ("score", "SIGTERM"),
                                         ("score", "SIGINT")])
def test_a_signalled_run_resumes_to_the_uninterrupted_output(phix_model: Path, tmp_path: Path,
                                                             command, how):
    """A child run gets the signal while its third record runs: two records kept, one line,
    exit 128 + the signal; `--resume` then gives the uninterrupted output, byte for byte."""
    src = fasta_file(tmp_path, text=MANY)
    opts = [*FAST, "-n", 6, "--seed", 3, "-b", 1] if command == "generate" else FAST
    ref = run_cli([command, src, "--model", phix_model, *opts]).out
    out = tmp_path / ("out.fa" if command == "generate" else "bits.tsv")
    partial = Path(f"{out}.partial")
    done = (lambda t: t.count(">") == 2) if command == "generate" else \
        (lambda t: len(t.splitlines()) == 3)  # the header and two rows
    args = [command, src, "--model", phix_model, *opts, "-o", out]
    p = subprocess.Popen([sys.executable, "-c", _STOPPED, *map(str, args)], env=child_env(),
                         cwd=tmp_path, stderr=subprocess.PIPE, preexec_fn=_default_signals)
    try:
        deadline = time.monotonic() + 90
        while not (partial.exists() and done(partial.read_text())):
            assert p.poll() is None, p.stderr.read().decode()
            assert time.monotonic() < deadline, "no record written in 90 s"
            time.sleep(0.05)
        p.send_signal(getattr(signal, how))
        _, err = p.communicate(timeout=90)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 128 + getattr(signal, how), err.decode()
    line = err.decode().strip()
    assert line.count("\n") == 0 and "--resume" in line and "Traceback" not in line, line
    assert done(partial.read_text()) and not out.exists()
    assert run_cli([*args, "--resume"]).code == 0
    assert out.read_bytes() == ref.encode()


# --------------------------------------- an interrupted run to stdout: no --resume to offer


def test_an_interrupted_stdout_run_says_to_delete_its_stats_partial(phix_model: Path,
                                                                     tmp_path: Path,
                                                                     monkeypatch):
    """The FASTA went to standard output, so there is nothing --resume could continue: the
    interrupt line says to delete the stats `.partial`, a plain rerun is refused saying the
    same (never --resume), and once it is deleted the rerun works."""

    src = fasta_file(tmp_path, text=MANY)
    stats = tmp_path / "s.tsv"
    args = ["generate", src, "--model", phix_model, *FAST, "-n", 6, "-b", 1, "--stats", stats]
    restore = at_round(monkeypatch, 8)
    r = run_cli(args)
    kept = tmp_path / "s.tsv.partial"
    record("hostile", "Ctrl-C of a run to stdout with --stats", show(args, tmp_path,
           MODEL=phix_model), r.code, shorten(r.err.strip(), tmp_path))
    assert r.code == 130
    assert r.err.strip() == (f"evspark: interrupted; finished records are kept in {kept}, but a "
                             "run writing to standard output cannot be resumed: delete it "
                             "before a rerun")
    restore()
    rows = kept.read_text()
    refused("rerun to stdout onto a stats .partial", args, 2,
            r"s\.tsv\.partial exists \(left by an interrupted run\); a run writing to standard "
            r"output cannot resume it: delete it to rerun$", tmp_path, MODEL=phix_model)
    assert kept.read_text() == rows
    kept.unlink()
    r = worked("rerun to stdout once the stats .partial is deleted", args, tmp_path,
               "every record on stdout, the stats file complete", MODEL=phix_model)
    assert r.out.count(">") == 5 and len(stats.read_text().splitlines()) == 6


def test_a_failed_record_of_a_stdout_run_does_not_offer_resume(phix_model: Path,
                                                               tmp_path: Path, monkeypatch):
    from evspark_cli.decode.batch import BatchDecoder

    real = BatchDecoder._prefilled

    def faulty(self, job):
        if job.label == "r2.cont":
            raise RuntimeError("planted fault")
        return real(self, job)

    monkeypatch.setattr(BatchDecoder, "_prefilled", faulty)
    stats = tmp_path / "s.tsv"
    r = run_cli(["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
                 "--stats", stats])
    assert r.code == 1 and r.out.count(">") == 2, r.err
    assert r.err.strip().splitlines()[-1] == (
        f"evspark: error: 1 of 3 records failed (r2.cont); the others were written to standard "
        f"output (their stats rows in {tmp_path / 's.tsv.partial'}: delete it before a rerun)")


@pytest.mark.parametrize("args", [["verify", "-n", 4, "-b", 0], ["verify", "-n", 4, "-b", -1],
                                  ["score", "--context", 5000], ["score", "--max-memory", "1K"]],
                         ids=["verify-b0", "verify-b-1", "score-context", "score-memory"])
def test_a_refused_score_or_verify_leaves_no_output(phix_model: Path, tmp_path: Path, args):
    """Refused after the options are parsed (a batch size, a context the model cannot see, a
    memory limit): no output, no `.partial`, so a plain rerun is not refused."""
    out = ["--report", tmp_path / "v.json"] if args[0] == "verify" else \
        ["-o", tmp_path / "s.tsv", "--logits", tmp_path / "l.safetensors"]
    r = run_cli([args[0], fasta_file(tmp_path), "--model", phix_model, *FAST, *args[1:], *out])
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fa"]
