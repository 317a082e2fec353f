"""`--resume` of an interrupted run: it continues only a `.partial` of the same run.

A `.partial` whose finished records were made with other settings (--include-prompt,
--prompt-tail, --iupac, --samples, --region), from another input, or with a stats file of
another run (or none) is refused in one line and left as it was; the same settings complete the
run to exactly the uninterrupted result. Ctrl-C names only the `.partial` files that exist.
The interruption tests that kill a real run and resume it are in test_cli.py.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from battery import FAST, FASTA, fasta_file, record, refused, show, worked
from tiny import run_cli


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

    from evspark_cli.decode.batch import BatchDecoder

    real, calls = BatchDecoder._round, []

    def later(self):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self)

    monkeypatch.setattr(BatchDecoder, "_round", later)
    r = run_cli(args)
    assert r.code == 130
    assert r.err.strip() == (f"evspark: interrupted; finished records are kept in "
                             f"{tmp_path / 'out.fa.partial'} (rerun with --resume)")
