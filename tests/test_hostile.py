"""Nothing lost, nothing clobbered, nothing unbounded: the hostile cases, one test each.

Each case is what a hostile tester tries: another path to an input as the output, a symlinked
or stolen `.partial`, a resume with other settings, configs that ask for unbounded memory,
values that pass a check and fail every record, odd alphabets and terminals. Each test checks
the one line and exit code (or the correct result), that no input changed, and for the memory
cases that the run stayed within 1 GiB of a normal run's peak before refusing (measured in a
child process, with an address-space limit as a safety net).

`EVSPARK_UPDATE_RELIABILITY=1 pytest tests/test_hostile.py` rewrites its section of
tests/RELIABILITY.md from the actual runs.
"""
from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import cell, updating, write_section  # noqa: E402
from tiny import random_tiny_dir, run_cli, shared_trained_tiny  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--threads", "1", "-q"]
GIB = 1 << 30
FASTA = (">r1 first\nACGTACGTACGGATTACAGGAT\n>r2\nGGGGATTACAGATTACATTGCA\n"
         ">r3\nTTAGGCATTACGGACTAGCA\n")
ROWS: dict[str, tuple[str, int, str]] = {}  # case -> (command, exit, message or result)


# ----------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return shared_trained_tiny(tmp_path_factory)


@pytest.fixture(scope="module")
def short_model(tmp_path_factory) -> Path:
    return random_tiny_dir(tmp_path_factory.mktemp("short") / "m", max_seqlen=64)


@pytest.fixture(scope="module")
def drafter(model: Path, tmp_path_factory) -> Path:
    """A dspark drafter folder for `model` (random weights: lossless whatever they are)."""
    import torch

    from evspark_cli.decode.drafters.dspark import DSparkConfig, DSparkNet, save_drafter
    from evspark_cli.model.checkpoint import weights_hash

    torch.manual_seed(0)
    cfg = DSparkConfig(target_hidden=32, target_layers=2, width=32, layers=1, heads=2,
                       prefix_len=8, target_hash=weights_hash(model), target_name="tiny-test")
    return save_drafter(DSparkNet(cfg), tmp_path_factory.mktemp("drafter") / "d")


def fasta(d: Path, name: str = "in.fa", text: str = FASTA) -> Path:
    p = d / name
    p.write_text(text)
    return p


def shorten(text: str, d: Path, **names: Path) -> str:
    """Paths as the table shows them: named folders by name, the case's folder left out, and
    process ids (which change from run to run) as PID."""
    for name, path in names.items():
        text = text.replace(str(path), name)
    text = text.replace(str(d) + "/", "").replace(str(d), ".")
    return re.sub(r"(process |\.partial\.)\d+", r"\1PID", text)


def show(args: list, d: Path, **names: Path) -> str:
    """A command as the table shows it: paths shortened, the test-only options left out."""
    text = shorten(" ".join(str(a) for a in args), d, **names)
    return "evspark " + text.replace(" --threads 1 -q", "").replace(" --threads 1", "")


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evspark: error: "), err
    assert "Traceback" not in err and "internal error" not in err, err
    return lines[0]


def refused(case: str, args: list, code: int, pattern: str, d: Path, stdin: bytes = b"",
            **names: Path) -> str:
    """Run `evspark ARGS` in this process: one error line matching `pattern`, exit `code`."""
    r = run_cli(args, stdin)
    line = one_line(r.err)
    ROWS[case] = (show(args, d, **names), r.code, shorten(line, d, **names))
    assert r.code == code, r.err
    assert re.search(pattern, line), f"{line!r} does not match {pattern!r}"
    return line


def worked(case: str, args: list, d: Path, result: str, stdin: bytes = b"", **names: Path):
    r = run_cli(args, stdin)
    assert r.code == 0, r.err
    ROWS[case] = (show(args, d, **names), 0, result)
    return r


# ------------------------------------------------------------------- a child with its peak RSS

DRIVER = """
import os, resource, sys
try:
    from evspark_cli import cli
    cli.main()
finally:
    with open(os.environ["EVSPARK_TEST_PEAK"], "w") as f:
        f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))
"""
ADDRESS_LIMIT = 6 * GIB
"""The child's address space: far above a run of the tiny models (~1 GiB), so only a run that
allocates without bound meets it (and then fails instead of taking the machine's memory)."""


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LC_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("EVSPARK_DEBUG", None)
    env.update(extra)
    return env


def run_child(args: list, cwd: Path, stdin=subprocess.DEVNULL, timeout: float = 240,
              **env: str) -> tuple[int, str, int]:
    """`evspark ARGS` in a child limited to ADDRESS_LIMIT: (exit, stderr, peak RSS bytes)."""
    peak = cwd / f".peak-{time.monotonic_ns()}"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))

    p = subprocess.run([sys.executable, "-c", DRIVER, *map(str, args)], stdin=stdin,
                       capture_output=True, text=True, cwd=cwd, timeout=timeout,
                       env=child_env(EVSPARK_TEST_PEAK=str(peak), **env), preexec_fn=limit)
    used = int(peak.read_text()) if peak.is_file() else ADDRESS_LIMIT
    peak.unlink(missing_ok=True)
    return p.returncode, p.stderr, used


@pytest.fixture(scope="module")
def normal_peak(model: Path, tmp_path_factory) -> int:
    """The peak RSS of an ordinary generate run with the tiny model: the footprint the bounded
    cases are measured against."""
    d = tmp_path_factory.mktemp("normal")
    code, err, peak = run_child(["generate", fasta(d), "--model", model, *FAST, "-n", 4], d)
    assert code == 0, err
    return peak


def bounded(case: str, args: list, code: int, pattern: str, d: Path, normal: int,
            stdin=subprocess.DEVNULL, **names: Path) -> None:
    """A refusal in a child process that stayed within 1 GiB of a normal run's peak."""
    rc, err, peak = run_child(args, d, stdin=stdin)
    line = one_line(err)
    extra = max(peak - normal, 0) >> 20
    ROWS[case] = (show(args, d, **names), rc, f"{shorten(line, d, **names)} [bounded: peak "
                                              f"{extra} MiB above a normal run's]")
    assert rc == code, err
    assert re.search(pattern, line), f"{line!r} does not match {pattern!r}"
    assert peak < normal + GIB, f"peak {peak / GIB:.2f} GiB vs a normal run's {normal / GIB:.2f}"


# ------------------------------------------------------------- 1. another path to the same file


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
def test_output_through_a_bind_mount_of_the_input_is_refused(model: Path, tmp_path: Path):
    data, alias = tmp_path / "data", tmp_path / "alias"
    data.mkdir(), alias.mkdir()
    src = fasta(data)
    before = src.read_bytes()
    args = ["generate", "data/in.fa", "--model", model, *FAST, "-n", 4, "-o", "alias/in.fa"]
    p = subprocess.run(["unshare", "--mount", "sh", "-c",
                        'mount --bind data alias && exec "$@"', "sh", sys.executable, "-m",
                        "evspark_cli.cli", *map(str, args)],
                       capture_output=True, text=True, cwd=tmp_path, env=child_env(),
                       timeout=120)
    line = one_line(p.stderr)
    ROWS["output is the input through a bind mount"] = (
        show(args, tmp_path, MODEL=model) + " (alias/ a bind mount of data/)", p.returncode,
        shorten(line, tmp_path))
    assert p.returncode == 2, p.stderr
    assert re.search(r"--output alias/in\.fa is also an input \(data/in\.fa\)", line), line
    assert src.read_bytes() == before


def test_output_hard_linked_to_the_input_is_refused(model: Path, tmp_path: Path):
    src = fasta(tmp_path)
    os.link(src, tmp_path / "same.fa")
    refused("output is a hard link to the input",
            ["generate", src, "--model", model, *FAST, "-n", 4, "-o", tmp_path / "same.fa"],
            2, r"--output \S*same\.fa is also an input", tmp_path, MODEL=model)
    assert src.read_text() == FASTA


# ----------------------------------------------------------------- 2. a symlinked .partial


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "fresh"])
def test_symlinked_partial_is_never_followed(model: Path, tmp_path: Path, resume: bool):
    victim = fasta(tmp_path, "victim.fa", ">v1\nAAAA\n>v2\nCCCC\n")
    (tmp_path / "out.fa.partial").symlink_to(victim)
    args = ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o",
            tmp_path / "out.fa", *(["--resume"] if resume else [])]
    refused(f"symlinked .partial{' with --resume' if resume else ''}", args, 2,
            r"out\.fa\.partial is a symbolic link; refusing to follow it", tmp_path, MODEL=model)
    assert victim.read_text() == ">v1\nAAAA\n>v2\nCCCC\n"
    assert not (tmp_path / "out.fa").exists()


# --------------------------------------------------- 3. a live .partial, deleted or replaced


HOLDER = """
import sys, time
from evspark_cli.io.writers import FastaOutput
out = FastaOutput(sys.argv[1])
out.write("a", "evspark", "ACGT")
print("ready", flush=True)
time.sleep(60)
"""


def test_a_live_partial_is_in_use_by_its_process(model: Path, tmp_path: Path):
    out = tmp_path / "out.fa"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE,
                              text=True, env=child_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        for resume in ([], ["--resume"]):
            refused("second run on a live .partial" + (" with --resume" if resume else ""),
                    ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o", out,
                     *resume],
                    2, rf"out\.fa\.partial is in use by process {holder.pid} \(a run writing "
                       r"\S*out\.fa\); wait for it to finish or stop it", tmp_path, MODEL=model)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (tmp_path / "out.fa.partial").read_text() == ">a evspark\nACGT\n"


def test_a_partial_replaced_under_a_live_run_is_not_renamed(model: Path, tmp_path: Path,
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
    args = ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o", out]
    line = refused("a .partial replaced under a live run", args, 1,
                   r"out\.fa\.partial was deleted or replaced while this run was writing it, so "
                   r"\S*out\.fa was not written; this run's records are in "
                   r"\S*out\.fa\.partial\.\d+",
                   tmp_path, MODEL=model)
    assert not out.exists()
    assert partial.read_text() == ">other\nGGGG\n"  # the stranger's file is untouched
    rescue = Path(re.search(r"are in (\S+) \(", line)[1])
    assert [ln.split()[0] for ln in rescue.read_text().splitlines() if ln.startswith(">")] == \
        [">r1.cont", ">r2.cont", ">r3.cont"]


# ------------------------------------------------------------ 4. convert onto its own folder


def test_convert_onto_its_own_folder_is_refused(model: Path, tmp_path: Path):
    folder = Path(shutil.copytree(model, tmp_path / "m"))
    before = (folder / "model.safetensors").read_bytes()
    refused("convert -o the checkpoint's own folder",
            ["convert", folder / "model.safetensors", "--config", folder / "config.json", "-o",
             folder], 2, r"--output \S*m/model\.safetensors is also an input; it would be "
                         r"overwritten",
            tmp_path)
    assert (folder / "model.safetensors").read_bytes() == before
    other = tmp_path / "other"
    shutil.copytree(model, other)
    refused("convert -o a folder holding a model",
            ["convert", folder / "model.safetensors", "--config", folder / "config.json", "-o",
             other], 2, r"other already holds a model \(config\.json\)", tmp_path)


# ------------------------------------------------------------------ 5. unbounded allocations


def test_a_huge_gamma_reserves_only_what_rounds_use(model: Path, tmp_path: Path, monkeypatch):
    """--gamma 2000000 -n 8: the state is reserved for the 7 drafts a round can use."""
    from evspark_cli.model.model import StripedHyena

    real = StripedHyena.prefill
    reserves: list[int] = []

    def spy(self, ids, *a, **k):
        reserves.append(int(k.get("reserve", 0)))
        if reserves[-1] > 10_000:
            raise AssertionError(f"prefill reserves {reserves[-1]} positions for 8 tokens")
        return real(self, ids, *a, **k)

    monkeypatch.setattr(StripedHyena, "prefill", spy)
    r = worked("--gamma 2000000 -n 8",
               ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 8, "--gamma",
                2_000_000, "--drafter", "kmer"], tmp_path, "3 records of 8 tokens",
               MODEL=model)
    assert r.out.count(">") == 3 and all(n <= 8 + 7 + 16 for n in reserves), reserves
    assert all(len(s) == 8 for s in re.findall(r"(?m)^[A-Z]+$", r.out))


def _config_folder(model: Path, d: Path, name: str, change) -> Path:
    folder = Path(shutil.copytree(model, d / name))
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _million_layers(cfg: dict) -> None:
    n = 10 ** 6
    cfg.update(num_layers=n, hidden_layers=None, hcs_layer_idxs=list(range(0, n, 4)),
               hcm_layer_idxs=list(range(1, n, 4)), hcl_layer_idxs=list(range(2, n, 4)),
               attn_layer_idxs=list(range(3, n, 4)))


@pytest.mark.parametrize("name,change,pattern", [
    ("hidden_size 16384", lambda c: c.update(hidden_size=16384, num_attention_heads=16),
     r"its config implies [\d,]+ parameters but its weights file holds [\d,]+ numbers"),
    ("num_layers 10^6", _million_layers,
     r"its config implies [\d,]+ parameters but its weights file holds [\d,]+ numbers"),
], ids=["hidden_size", "num_layers"])
def test_configs_too_big_are_refused_before_building(model, tmp_path, normal_peak, name, change,
                                                     pattern):
    folder = _config_folder(model, tmp_path, "m", change)
    bounded(f"config with {name}", ["generate", fasta(tmp_path), "--model", folder, *FAST,
                                    "-n", 4], 3, pattern, tmp_path, normal_peak)


def test_a_model_larger_than_max_memory_is_refused(model: Path, tmp_path: Path):
    refused("--max-memory below the model's size",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "--max-memory",
             "100K"], 3, r"loading model \S+ needs about [\d.]+ [KMG]iB of memory, --max-memory is "
                         r"100\.0 KiB", tmp_path, MODEL=model)
    refused("--max-memory not a size",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "--max-memory",
             "lots"], 2, r"--max-memory must be a positive size such as 512M or 8G, got 'lots'",
            tmp_path, MODEL=model)


def test_endless_input_is_refused_in_bounded_memory(model: Path, tmp_path: Path, normal_peak):
    bounded("generate /dev/zero", ["generate", "/dev/zero", "--model", model, *FAST, "-n", 4],
            2, r"/dev/zero: NUL byte at line 1", tmp_path, normal_peak, MODEL=model)
    endless = subprocess.Popen(["sh", "-c", "echo '>r'; yes ACGTACGTACGTACGTACGTACGTACGTACGT"],
                               stdout=subprocess.PIPE)
    try:
        bounded("endless record on stdin (no newline limit, no NUL)",
                ["generate", "-", "--model", model, *FAST, "-n", 4], 2,
                r"record 'r' in - is longer than the model's context \(4,096 bases\); use "
                r"--prompt-tail N", tmp_path, normal_peak, stdin=endless.stdout, MODEL=model)
    finally:
        endless.kill()
        endless.wait()


def test_a_tail_of_a_long_line_is_read_streaming(model: Path, tmp_path: Path):
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
           ["generate", long, "--model", model, *FAST, "-n", 4, "--prompt-tail", 100], tmp_path,
           "1 record of 4 tokens", MODEL=model)


def test_score_context_beyond_the_model_is_refused(short_model: Path, tmp_path: Path):
    refused("score --context beyond the model's context",
            ["score", fasta(tmp_path), "--model", short_model, *FAST, "--context", 2_000_000],
            2, r"--context 2,000,000: a base can see at most 63 earlier bases in the model's "
               r"context of 64", tmp_path, MODEL_CTX64=short_model)
    long = fasta(tmp_path, "long.fa", ">long\n" + "ACGT" * 40 + "\n")
    refused("score passes longer than the model's context",
            ["score", long, "--model", short_model, *FAST, "--context", 32, "--window", 64],
            2, r"--context 32 \+ --window 64 make passes of 96 tokens over a 160-base record, "
               r"more than the model's context of 64; lower --window", tmp_path,
            MODEL_CTX64=short_model)
    worked("score with the default --context on a 64-token model",
           ["score", long, "--model", short_model, *FAST], tmp_path, "1 row",
           MODEL_CTX64=short_model)


def test_score_logits_that_do_not_fit_are_refused(model: Path, tmp_path: Path):
    """Passes of 128 tokens fit in 4 MiB; the logits of 6,000 positions (12 MiB) do not."""
    recs = "".join(f">s{i}\n" + "ACGTTGCAAC" * 200 + "\n" for i in range(3))
    refused("score --logits beyond --max-memory",
            ["score", fasta(tmp_path, "long.fa", recs), "--model", model, *FAST, "--context", 64,
             "--window", 64, "--logits", tmp_path / "l.safetensors", "--max-memory", "4M"], 2,
            r"--logits: keeping the logits of every position needs about [\d.]+ MiB of memory, "
            r"--max-memory less the model is", tmp_path, MODEL=model)


def _drafter_folder(drafter: Path, d: Path, change) -> Path:
    folder = Path(shutil.copytree(drafter, d / "dr"))
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_drafter_with_a_huge_vocabulary_is_refused_unbuilt(model, drafter, tmp_path, normal_peak):
    folder = _drafter_folder(drafter, tmp_path, lambda c: c.update(vocab_size=500_000_000))
    bounded("drafter config with vocab_size 5e8",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "--drafter", folder],
            3, r"drafter \S*dr has vocab_size 500000000, its target 512", tmp_path, normal_peak,
            MODEL=model)
    folder = _drafter_folder(drafter, tmp_path / "x", lambda c: c.update(prefix_len=10 ** 9))
    bounded("drafter config with prefix_len 10^9",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "--drafter", folder],
            3, r"describes a drafter of [\d,]+ parameters, far more than its weights hold",
            tmp_path, normal_peak, MODEL=model)


# ---------------------------------------------------------------- 6. a resume mixing two runs


def _half_done(model: Path, d: Path, *opts) -> Path:
    """A run that finished 2 of 3 records (its last record cut off the final file)."""
    out = d / "out.fa"
    r = run_cli(["generate", fasta(d), "--model", model, *FAST, "-n", 4, "-o", out, *opts])
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
def test_resume_with_other_record_settings_is_refused(model, tmp_path, case, first, then,
                                                      pattern):
    out = _half_done(model, tmp_path, *first)
    kept = (tmp_path / "out.fa.partial").read_text()
    refused(f"--resume with another {case}",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o", out,
             "--resume", *then], 2, r"--resume: \S*out\.fa\.partial has " + pattern,
            tmp_path, MODEL=model)
    assert (tmp_path / "out.fa.partial").read_text() == kept and not out.exists()


def test_resume_with_other_input_contents_is_refused(model: Path, tmp_path: Path):
    out = _half_done(model, tmp_path)
    fasta(tmp_path, text=FASTA.replace("ACGTACGTACGG", "TTTTACGTACGG"))
    refused("--resume after the input changed",
            ["generate", tmp_path / "in.fa", "--model", model, *FAST, "-n", 4, "-o", out,
             "--resume"], 2,
            r"record 'r1\.cont' made with prompt_sha256=[0-9a-f]{16}, this run has "
            r"prompt_sha256=[0-9a-f]{16}", tmp_path, MODEL=model)


def test_a_stale_stats_partial_is_not_continued(model: Path, tmp_path: Path):
    """A stats .partial left by a run with another -n is refused, not extended."""
    out, stats = tmp_path / "out.fa", tmp_path / "out.tsv"
    r = run_cli(["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 12, "-o", out,
                 "--stats", stats])
    assert r.code == 0, r.err
    stats.rename(tmp_path / "out.tsv.partial")
    out.unlink()
    kept = (tmp_path / "out.tsv.partial").read_text()
    refused("--resume onto a stale stats .partial (-n 12, now -n 4)",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o", out,
             "--stats", stats, "--resume"], 2,
            r"out\.tsv\.partial has a row for 'r1\.cont' with new_tokens=12, this run has "
            r"new_tokens=4", tmp_path, MODEL=model)
    assert (tmp_path / "out.tsv.partial").read_text() == kept
    assert not (tmp_path / "out.fa.partial").exists()


def test_resume_adding_stats_to_a_run_without_is_refused(model: Path, tmp_path: Path):
    out = _half_done(model, tmp_path)
    refused("--resume with --stats of a run that had none",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o", out,
             "--stats", tmp_path / "out.tsv", "--resume"], 2,
            r"has 2 finished records but there is no \S*out\.tsv\.partial", tmp_path,
            MODEL=model)
    assert not (tmp_path / "out.tsv.partial").exists()


def test_a_resume_with_the_same_settings_still_completes(model: Path, tmp_path: Path):
    ref = run_cli(["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4,
                   "--include-prompt", "--prompt-tail", 12, "--iupac", "random"]).out
    out = _half_done(model, tmp_path, "--include-prompt", "--prompt-tail", 12, "--iupac",
                     "random")
    worked("--resume with the same settings",
           ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o", out,
            "--include-prompt", "--prompt-tail", 12, "--iupac", "random", "--resume"],
           tmp_path, "the final file equals an uninterrupted run", MODEL=model)
    assert out.read_text() == ref


# ------------------------------------------------------------ 7. an output named as a partial


def test_output_named_like_the_stats_partial_is_refused(model: Path, tmp_path: Path):
    refused("-o X.tsv.partial --stats X.tsv",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o",
             tmp_path / "X.tsv.partial", "--stats", tmp_path / "X.tsv"], 2,
            r"--output \S*X\.tsv\.partial and --stats \S*X\.tsv would both write "
            r"\S*X\.tsv\.partial", tmp_path, MODEL=model)
    assert not list(tmp_path.glob("X.tsv*"))


# --------------------------------------------- 8. values that pass a check and fail every record


def test_top_p_below_fp32_is_refused(model: Path, tmp_path: Path):
    refused("--top-p 1e-46", ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4,
                              "--top-p", "1e-46", "-o", tmp_path / "o.fa"], 2,
            r"--top-p must be at least 1\.2e-38 \(the smallest probability the fp32 sampler "
            r"represents\), got 1e-46", tmp_path, MODEL=model)
    assert not list(tmp_path.glob("o.fa*"))


@pytest.mark.parametrize("case,change,pattern", [
    ("drafter \"heads\": \"4\"", lambda c: c.update(heads="4"),
     r"config\.json: heads must be an integer >= 1, got '4'"),
    ("drafter alphabet outside the vocabulary", lambda c: c.update(alphabet=[65, 9999]),
     r"alphabet must be distinct token ids below vocab_size 512"),
], ids=["heads", "alphabet"])
def test_drafter_configs_with_wrong_types_are_refused(model, drafter, tmp_path, case, change,
                                                      pattern):
    folder = _drafter_folder(drafter, tmp_path, change)
    refused(case, ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "--drafter",
                   folder], 3, pattern, tmp_path, MODEL=model)


@pytest.mark.parametrize("case,change,pattern", [
    ("config eps NaN", lambda c: c.update(eps=float("nan")),
     r"config: eps must be a finite number > 0, got nan"),
    ("config inner_mlp_size -5", lambda c: c.update(inner_mlp_size=-5),
     r"config: inner_mlp_size must be null or an integer >= 1, got -5"),
    ("config hcs_filter_groups [4]", lambda c: c.update(hcs_filter_groups=[4]),
     r"config: hcs_filter_groups must be an integer >= 1, got \[4\]"),
    ("config a flag that is not true/false", lambda c: c.update(final_norm=[1]),
     r"config: final_norm must be true or false, got \[1\]"),
], ids=["nan", "negative", "list", "flag"])
def test_model_configs_with_bad_values_are_refused(model, tmp_path, case, change, pattern):
    folder = _config_folder(model, tmp_path, "m", change)
    refused(case, ["generate", fasta(tmp_path), "--model", folder, *FAST, "-n", 4], 3, pattern,
            tmp_path)


def test_deeply_nested_configs_are_refused(model, drafter, tmp_path):
    folder = Path(shutil.copytree(model, tmp_path / "m"))
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    refused("deeply nested config.json", ["generate", fasta(tmp_path), "--model", folder,
                                          *FAST, "-n", 4], 3,
            r"config \S*config\.json is not valid JSON: nested too deeply", tmp_path)
    dr = Path(shutil.copytree(drafter, tmp_path / "dr"))
    (dr / "config.json").write_text('{"kind": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused("deeply nested drafter config.json",
            ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "--drafter", dr],
            3, r"config\.json: not valid JSON \(nested too deeply\)", tmp_path, MODEL=model)


# --------------------------------------------------------------------------------- smaller


def test_a_bom_is_read_the_same_on_every_path(model: Path, tmp_path: Path):
    import gzip

    text = "\ufeff" + FASTA
    src = fasta(tmp_path, "bom.fa", text)
    ref = run_cli(["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4]).out
    assert run_cli(["generate", src, "--model", model, *FAST, "-n", 4]).out == ref
    gz = tmp_path / "bom.fa.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    assert run_cli(["generate", gz, "--model", model, *FAST, "-n", 4]).out == ref
    r = worked("UTF-8 BOM on stdin", ["generate", "-", "--model", model, *FAST, "-n", 4],
               tmp_path, "same records as without the BOM", stdin=text.encode(), MODEL=model)
    assert r.out == ref


def test_iupac_policy_and_rna(model: Path, tmp_path: Path):
    from evspark_cli.io.fasta import read_prompts

    src = fasta(tmp_path, "amb.fa", ">n1\nACGUNNRYacgun\n")
    keep = read_prompts([str(src)])[0].seq
    assert keep == "ACGTNNRYACGTN"  # U is T; the codes stay
    rnd = read_prompts([str(src)], iupac="random")[0].seq
    assert rnd[:4] == "ACGT" and set(rnd) <= set("ACGT")
    assert rnd[5] in "ACGT" and rnd[6] in "AG" and rnd[7] in "CT"
    assert read_prompts([str(src)], iupac="random")[0].seq == rnd  # the same every time
    refused("--iupac error on an N", ["generate", src, "--model", model, *FAST, "-n", 4,
                                      "--iupac", "error"], 2,
            r"record 'n1' in \S*amb\.fa: ambiguous base 'N' at position 5 \(--iupac error "
            r"accepts only A, C, G, T\)", tmp_path, MODEL=model)
    r = worked("RNA and ambiguity codes with --iupac random --include-prompt",
               ["generate", src, "--model", model, *FAST, "-n", 4, "--iupac", "random",
                "--include-prompt"], tmp_path, "prompt written as " + rnd, MODEL=model)
    assert r.out.splitlines()[1].startswith(rnd)
    refused("--iupac unknown", ["generate", src, "--model", model, *FAST, "-n", 4, "--iupac",
                                "drop"], 2, r"--iupac must be keep, error, random, got 'drop'",
            tmp_path, MODEL=model)


def test_control_characters_in_ids_are_escaped(short_model: Path, tmp_path: Path):
    src = fasta(tmp_path, "ansi.fa", ">\x1b[31mRED\x1b[0m\n" + "ACGT" * 15 + "\n")
    r = run_cli(["generate", src, "--model", short_model, *FAST, "-n", 8])
    line = one_line(r.err)
    ROWS["ANSI escape in a record id"] = (show(["generate", "ansi.fa", "--model", short_model,
                                                *FAST, "-n", 8], tmp_path,
                                               MODEL_CTX64=short_model), r.code, line)
    assert r.code == 2 and "\x1b" not in r.err
    assert line.startswith(r"evspark: error: record '\x1b[31mRED\x1b[0m': prompt of 60 bases")


def test_model_given_as_a_file(model: Path, tmp_path: Path):
    refused("--model names a file", ["generate", fasta(tmp_path), "--model",
                                     model / "config.json", *FAST, "-n", 4], 3,
            r"config\.json is a file, not a model folder \(give the folder that holds "
            r"config\.json and model\.safetensors\)", tmp_path, MODEL=model)


def test_non_utf8_header_on_stdin_fails_before_the_model(model: Path, tmp_path: Path):
    """Under the C locale Python decodes stdin with surrogateescape: read as bytes instead."""
    p = subprocess.run([sys.executable, "-m", "evspark_cli.cli", "generate", "-", "--model",
                        str(model), *FAST, "-n", "4", "-o", "out.fa"],
                       input=b">r\xff\xfe1\nACGTACGT\n", capture_output=True, cwd=tmp_path,
                       env=child_env(LC_ALL="C", LANG="C"), timeout=120)
    line = one_line(p.stderr.decode())
    ROWS["non-UTF-8 header on stdin"] = (show(["generate", "-", "--model", model, *FAST, "-n",
                                               4, "-o", "out.fa"], tmp_path, MODEL=model)
                                         + " (C locale)", p.returncode, line)
    assert p.returncode == 2 and "-: not UTF-8 text (byte 0xff near line 1)" in line, line
    assert not list(tmp_path.glob("out.fa*"))


def test_an_interrupt_names_only_partials_that_exist(model: Path, tmp_path: Path, monkeypatch):
    from evspark_cli.model import checkpoint

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(checkpoint, "load_model", interrupt)
        args = ["generate", fasta(tmp_path), "--model", model, *FAST, "-n", 4, "-o",
                tmp_path / "out.fa"]
        r = run_cli(args)
    ROWS["Ctrl-C while the model loads"] = (show(args, tmp_path, MODEL=model), r.code,
                                            r.err.strip())
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


def test_bench_reports_the_prompts_it_ran(model: Path, tmp_path: Path):
    one = fasta(tmp_path, "one.fa", ">p1\n" + "ACGTTGCA" * 8 + "\n")
    out = tmp_path / "bench"
    args = ["bench", "--model", model, "--prompts", one, "-o", out, *FAST, "-n", 4, "--seeds",
            "0", "--baselines", "kmer", "--rollbacks", "slice", "--skip",
            "tvd,gamma,context,depth"]
    r = run_cli(args)
    assert r.code == 0, r.err
    report = (out / "report.md").read_text()
    ROWS["bench --prompts with 1 record"] = (show(args, tmp_path, MODEL=model), 0,
                                             re.search(r"\d+ prompts? x", report)[0] + " in "
                                             "report.md")
    assert "1 prompts x" in report or "1 prompt x" in report
    assert json.loads((out / "results.json").read_text())["config"]["n_prompts"] == 1


# ---------------------------------------------------------------------------- the table


@pytest.fixture(scope="module", autouse=True)
def _write_table():
    yield
    if not updating():
        return
    lines = ["## Nothing lost, nothing clobbered, nothing unbounded", "",
             "Generated by `EVSPARK_UPDATE_RELIABILITY=1 pytest tests/test_hostile.py` from the "
             "actual runs (`MODEL` = a tiny trained model folder, `MODEL_CTX64` = one with a "
             "64-token context; every command also ran with `--threads 1 -q`). A refused case "
             "prints exactly this one line, changes no input and leaves no new `.partial`; the "
             "cases marked bounded ran in a child process, and their peak memory (resident set) "
             "is given against a normal generate run's (the bar: under 1 GiB more). Exit 0 rows "
             "give the correct result described.", "",
             "| case | command | exit | message or result |", "|---|---|---|---|"]
    for case, (cmd, code, msg) in ROWS.items():
        lines.append(f"| {case} | `{cell(cmd)}` | {code} | {cell(msg)} |")
    write_section("hostile", lines)
