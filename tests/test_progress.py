"""Feedback while a command runs (cli/progress.py): the bar on a terminal, timestamped lines in a
log at a bounded rate, nothing with --quiet, a summary line on every run, and a time left that
counts prefill and native passes."""
from __future__ import annotations

import io
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import run_cli, trained_tiny_dir  # noqa: E402

from evspark_cli.cli.formats import fmt_duration  # noqa: E402
from evspark_cli.cli.meter import GenerationMeter  # noqa: E402
from evspark_cli.cli.progress import Progress  # noqa: E402

LINE = re.compile(r"^evspark \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] (\w+): ")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def lines_progress(total: float | None = 100, quiet: bool = False, **kw):
    out, clock = io.StringIO(), Clock()
    return Progress("generate", "tokens", total, quiet=quiet, stream=out, tty=False,
                    clock=clock, **kw), out, clock


def test_log_lines_are_timestamped_and_rate_limited():
    prog, out, clock = lines_progress(interval=10.0, min_gap=0.5)
    with prog:
        for step in range(1, 401):  # 400 updates in 4 s: far more than a log should get
            clock.t += 0.01
            prog.advance(0.25)
            if step % 40 == 0:  # a record ends every 0.4 s: faster than two lines a second
                prog.milestone(f"{step // 40}/10 sequences")
    lines = out.getvalue().splitlines()
    assert all(LINE.match(ln) for ln in lines), lines
    # the first line at once, then at most one per 0.5 s: 4 s -> at most 1 + 8 + the last
    assert 4 <= len(lines) <= 10
    assert "0.2/100 tokens (0%)" in lines[0]
    assert "100/100 tokens (100%)" in lines[-1] and "10/10 sequences" in lines[-1]


def test_log_heartbeat_without_milestones():
    prog, out, clock = lines_progress(interval=10.0)
    with prog:
        for _ in range(60):  # one minute of slow progress and no record finishing
            clock.t += 1.0
            prog.advance(1)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 + 5 + 1  # the first update, one per 10 s, the end
    assert "31/100 tokens (31%), 1.00 tokens/s, elapsed 0:00:31, ETA 0:01:09" in lines[3]


def test_quiet_prints_only_the_summary():
    prog, out, clock = lines_progress(quiet=True)
    with prog:
        prog.advance(50)
        prog.milestone("1/2 sequences")
    prog.summary("evspark: generate: done")
    assert out.getvalue() == "evspark: generate: done\n"


def test_bar_on_a_terminal_shows_count_rate_and_eta():
    out, clock = io.StringIO(), Clock()
    prog = Progress("generate", "tokens", 4096, stream=out, tty=True, clock=clock)
    prog.start()
    for _ in range(20):
        clock.t += 0.1
        prog.advance(64)
    text = prog.text()
    prog.close()  # draws the bar's last state (then clears it: the summary takes its place)
    assert "1,280/4,096 tokens (31%)" in text and "640 tokens/s" in text and "ETA 0:00:04" in text
    assert "1,280/4,096 tokens" in out.getvalue() and "ETA 0:00:04" in out.getvalue()


def test_durations():
    assert fmt_duration(None) == "-:--:--" and fmt_duration(3725.4) == "1:02:05"


# ------------------------------------------------------------------------- generation meter


def FakeJob(record: int, prompt_len: int, n: int, name: str = ""):
    """A job of `n` tokens on a prompt of `prompt_len` bases, keyed by `record`."""
    from evspark_cli.decode.drafters.base import RngKey
    from evspark_cli.decode.jobs import Job

    return Job(record, tuple([65] * prompt_len), n, RngKey(0, record, 0), f"r{record}", name)


def machine(a: float, b: float, work=float):
    """A machine whose prefill costs `a` seconds per prompt plus `b` per unit of work: the
    seconds of a chunk from `before` to `after` bases."""
    return lambda before, after: (a if before == 0 else 0.0) + b * (work(after) - work(before))


def prefill(meter, job, p, clock, cost, chunk: int = 2048, upto: int | None = None):
    """`job`'s prefill events as the engine tells them (0, each chunk's end but the last, all
    bases), the fake clock advanced by `cost(before, after)` per chunk; stops after the chunk
    that reaches `upto` bases when given (the prefill still in progress)."""
    n = len(job.prompt)
    points = [*range(chunk, n - 1, chunk), n]
    meter.prefill_progress(job, 0, n, p)
    before = 0
    for after in points:
        clock.t += cost(before, after)
        meter.prefill_progress(job, after, n, p)
        before = after
        if upto is not None and after >= upto:
            return


def rounds(meter, p, clock, count: int, tokens: int = 10, seconds: float = 0.1) -> None:
    from evspark_cli.decode.jobs import RoundReport

    for _ in range(count):
        clock.t += seconds
        meter.round_done(RoundReport(tokens, 1, tokens - 1, tokens), p)


def test_meter_counts_prefill_in_the_time_left():
    """Two records; the second has a long prompt still to prefill. Rounds take 0.1 s for 10
    tokens (100 tokens/s), the first record's 1,000-base prefill took 1 s: with one prompt
    length seen, all of it counts as work (here: bases), so 10,000 bases take 10 s."""
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    a, b = FakeJob(0, 1000, 100), FakeJob(1, 10_000, 100)
    p = Pass((a, b), native=False)
    meter = GenerationMeter(prog, [p], 2, clock=clock)
    assert prog.total == 200 and meter.time_left() is None
    meter.pass_started(p)
    meter.job_started(a, p)
    prefill(meter, a, p, clock, machine(0.0, 1e-3))
    rounds(meter, p, clock, 1)  # the pass's first round: it also holds the decoder's setup
    assert meter.time_left() is None  # no decoding timed yet
    rounds(meter, p, clock, 4)
    assert prog.done == 50 and meter.rate(False) == pytest.approx(100)
    assert meter.prefill_time()(1000) == pytest.approx(1.0)
    assert meter.time_left() == pytest.approx(150 / 100 + 10)
    assert meter.tau() == pytest.approx(10.0)
    prefill(meter, b, p, clock, machine(0.0, 1e-3), upto=2048)  # b's first chunk
    assert meter.time_left() == pytest.approx(150 / 100 + (10_000 - 2048) / 1000)
    assert prog.status == "prefill r1: 2,048 of 10,000 bases, 1,000 bases/s, ~8 s left"
    prefill(meter, b, p, clock, machine(0.0, 1e-3), upto=10_000)
    assert prog.status == "" and meter.time_left() == pytest.approx(150 / 100)


def test_meter_separates_per_prompt_overhead_from_per_base_cost():
    """Prefills of 100 and 1,000 bases that took 0.2 s and 1.1 s: 0.1 s per prompt plus 1 ms
    per base, so a 10,000-base prompt still to come adds 10.1 s."""
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    jobs = (FakeJob(0, 100, 30), FakeJob(1, 1000, 30), FakeJob(2, 10_000, 30))
    p = Pass(jobs, native=False)
    meter = GenerationMeter(prog, [p], 3, clock=clock)
    meter.pass_started(p)
    for job in jobs[:2]:
        prefill(meter, job, p, clock, machine(0.1, 1e-3))
        rounds(meter, p, clock, 2)
    cost = meter.prefill_time()
    assert cost(0) == pytest.approx(0.1) and cost(10_000) == pytest.approx(10.1)
    assert +meter.todo == {10_000: 1}
    assert meter.time_left() == pytest.approx(50 / 100 + 10.1)


def bundled_work():
    from evspark_cli.cli.meter import prefill_work
    from evspark_cli.model.config import ModelConfig

    cfg = ModelConfig.load(Path(__file__).resolve().parents[1] / "models" / "evspark-sh2-192"
                           / "config.json")
    return prefill_work(cfg)


def short_then_long(prog, clock):
    """Issue #32's run: a 200-base record, then a 200,000-base one (64 tokens each, batch 1) on
    a machine like the bundled model's on a CPU (4 ms per prompt, 23,400 units of work a
    second), after 5 s of decoder setup (a measured schedule) in the pass's first round."""
    from evspark_cli.generation.run import Pass

    work = bundled_work()
    cost = machine(0.004, 1 / 23_400, work)
    short, long = FakeJob(0, 200, 64, "chrM"), FakeJob(1, 200_000, 64, "chr1")
    p = Pass((short, long), native=False)
    meter = GenerationMeter(prog, [p], 2, work, clock=clock)
    meter.pass_started(p)
    clock.t += 5.0
    prefill(meter, short, p, clock, cost)
    rounds(meter, p, clock, 8, tokens=8, seconds=0.08)  # 100 tokens/s
    meter.record_done()
    return meter, p, long, cost, cost(0, 200_000)


def test_eta_of_a_long_record_after_a_short_one_is_sensible():
    """The short record's prefill (mostly overhead, all of it counted as work) and the setup
    in the first round must not make the long record's estimate absurd (it was ~1000x off):
    before the long prefill starts it is within 2x, after two of its chunks exact, and in the
    last rounds it is the few tokens left at the decoding rate."""
    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    meter, p, long, cost, truth = short_then_long(prog, clock)
    assert truth == pytest.approx(194, rel=0.01)
    assert 1.0 <= meter.time_left() / (0.64 + truth) < 2.0
    prefill(meter, long, p, clock, cost, upto=40_960)
    left = cost(0, 200_000) - cost(0, 40_960)
    assert meter.time_left() == pytest.approx(0.64 + left)
    assert re.fullmatch(r"prefill chr1: 40,960 of 200,000 bases, [\d,]+ bases/s, ~\d min left",
                        prog.status), prog.status
    prefill(meter, long, p, clock, cost, upto=200_000)
    etas = []
    for _ in range(8):
        rounds(meter, p, clock, 1, tokens=8, seconds=0.08)
        etas.append(meter.time_left())
    assert etas[0] == pytest.approx(0.56) and etas[-2] == pytest.approx(0.08) and not etas[-1]


def test_log_shows_a_long_prefill_every_interval():
    """In a log, a prefill of 194 s prints a line at least every 10 s (each chunk, at most
    4.3 s here, is a chance), with the bases done, the rate and the time left."""
    out, clock = io.StringIO(), Clock()
    prog = Progress("generate", "tokens", stream=out, tty=False, clock=clock)
    with prog:
        meter, p, long, cost, truth = short_then_long(prog, clock)
        out.truncate(0)
        out.seek(0)
        prefill(meter, long, p, clock, cost, upto=200_000)
    lines = [ln for ln in out.getvalue().splitlines() if "prefill chr1" in ln]
    assert truth / 14.3 <= len(lines) <= truth / 10 + 1, lines
    assert all(re.search(r"generate: prefill chr1: [\d,]+ of 200,000 bases, [\d,]+ bases/s, "
                         r"~\d+ (s|min) left: 64/128 tokens \(50%\), 1/2 sequences", ln)
               for ln in lines), lines


def test_bar_status_shows_the_prefill_then_clears():
    from evspark_cli.decode.jobs import RoundReport

    out, clock = io.StringIO(), Clock()
    prog = Progress("generate", "tokens", stream=out, tty=True, clock=clock)
    prog.start()
    meter, p, long, cost, _ = short_then_long(prog, clock)
    prefill(meter, long, p, clock, cost, upto=4096)
    clock.t += 1  # past the bar's refresh interval
    prefill(meter, long, p, clock, cost, upto=6144)
    detail = prog._bar.tasks[0].fields["detail"]  # what the bar's last column shows
    assert detail.startswith("prefill chr1: 6,144 of 200,000 bases, ") and "1/2 sequences" in detail
    prefill(meter, long, p, clock, cost, upto=200_000)
    clock.t += 1
    meter.round_done(RoundReport(8, 1, 7, 8), p)
    assert prog._bar.tasks[0].fields["detail"] == "1/2 sequences, tau 8.00"
    prog.close()


def test_meter_sizes_compare_native_passes():
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    a = FakeJob(0, 10, 50)
    passes = [Pass((a,), True, 0), Pass((a,), False, 0), Pass((a,), True, 1, True),
              Pass((a,), False, 1, True)]
    meter = GenerationMeter(prog, passes, 1, clock=clock)
    assert prog.total == 200  # every pass's tokens, repeats included
    meter.pass_started(passes[0])
    prefill(meter, a, passes[0], clock, machine(0.0, 0.0))
    rounds(meter, passes[0], clock, 6, tokens=1, seconds=0.5)  # native: 2 tokens/s
    # speculative passes have no rate yet: they are counted at the native rate
    # native: 44 + 50 tokens left, speculative 100, at 2 tokens/s; 3 prompts still to prefill
    assert meter.prefill_time()(10) == 0.0
    assert meter.time_left() == pytest.approx((94 + 100) / 2)
    assert +meter.todo == {10: 3}  # the other passes prefill it again
    assert "pass 1/4 native" in prog.status


def test_a_failed_prefill_does_not_stay_in_progress():
    """A prefill that raised tells no end: the next round (or prefill) closes it."""
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    a, b = FakeJob(0, 5000, 10), FakeJob(1, 100, 10)
    p = Pass((a, b), native=False)
    meter = GenerationMeter(prog, [p], 2, clock=clock)
    meter.pass_started(p)
    prefill(meter, a, p, clock, machine(0.0, 1e-3), upto=2048)  # then it fails
    prefill(meter, b, p, clock, machine(0.0, 1e-3))
    assert meter.current is None and not +meter.todo
    rounds(meter, p, clock, 3, tokens=2)
    assert meter.time_left() == pytest.approx(14 / 20)  # 20 tokens, 6 done, at 20 tokens/s


def test_prefill_work_grows_with_attention_over_the_prefix():
    from evspark_cli.cli.meter import prefill_work
    from evspark_cli.model.config import ModelConfig

    cfg = ModelConfig.load(Path(__file__).resolve().parents[1] / "models" / "evspark-sh2-192"
                           / "config.json")
    work = prefill_work(cfg)
    n0 = 8 * (4 * 192 + 3 * 512) / 2  # 8 layers, 2 of them attention
    assert work(100) == pytest.approx(100 + 100 ** 2 / n0)
    assert work(16_000) / work(200) == pytest.approx(80 * (1 + 16_000 / n0) / (1 + 200 / n0))
    no_attention = ModelConfig.from_dict({**cfg.to_dict(), "attn_layer_idxs": [],
                                          "hcl_layer_idxs": [2, 3, 6, 7]})
    assert prefill_work(no_attention)(5000) == 5000


# ---------------------------------------------------------------------------- the commands


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return trained_tiny_dir(tmp_path_factory.mktemp("progress_model"), steps=10)


def test_generate_log_has_timestamped_progress_and_the_summary(tmp_path, model):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nTTGACAGCTAGCTCAGTCCT\n")
    r = run_cli(["generate", src, "--model", model, "-t", "1", "-n", 12, "--samples", 2,
                 "-o", tmp_path / "o.fa"])
    assert r.code == 0, r.err
    lines = r.err.splitlines()
    progress = [ln for ln in lines if LINE.match(ln)]
    assert progress and all(LINE.match(ln).group(1) == "generate" for ln in progress)
    assert "48/48 tokens (100%)" in progress[-1] and "4/4 sequences" in progress[-1]
    summary = lines[-1]
    assert re.fullmatch(r"evspark: generate: 2 records x 2 samples, 4 sequences written, "
                        r"48 tokens in \d+\.\d s \(prefill \d+\.\d s\), [\d,]+ tokens/s "
                        r"decoding, mean tau \d+\.\d\d, "
                        r"1 thread \(--threads\), batch 4", summary), summary

    q = run_cli(["generate", src, "--model", model, "-t", "1", "-n", 4, "-q"])
    assert q.code == 0 and q.err.splitlines() == [q.err.strip()]  # the summary alone
    assert q.err.startswith("evspark: generate: 2 records x 1 sample, 2 sequences written")


def test_score_verify_and_their_summaries(tmp_path, model):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nTTGACAGCTAGCTCAGTCCT\n")
    r = run_cli(["score", src, "--model", model, "-t", "1", "--context", 8, "--window", 8])
    assert r.code == 0, r.err
    assert any(LINE.match(ln) and "40/40 bases (100%)" in ln for ln in r.err.splitlines())
    assert r.err.splitlines()[-1].startswith("evspark: score: 2 of 2 records scored, 40 bases in")
    v = run_cli(["verify", src, "--model", model, "-t", "1", "-n", 6, "--drafter", "kmer", "-q"])
    assert v.code == 0, v.err
    assert v.err.splitlines() == [v.err.strip()]
    assert re.match(r"evspark: verify: 2 prompts, 12 tokens compared, 0 ties, 0 non-tie "
                    r"divergences, \d+\.\d s, 1 thread \(--threads\)", v.err)


# ------------------------------------------------------------- prefill progress, end to end


def test_prefill_tells_its_progress_between_chunks():
    """The engine tells a prefill's start, each chunk but the last, and its end (all bases, the
    anchor included); a one-base prompt (nothing to prefill) tells its start and end."""
    import torch
    from tiny import tiny_config

    from evspark_cli.decode.prefill import prefill_prompt
    from evspark_cli.model.model import StripedHyena

    torch.manual_seed(0)
    model = StripedHyena(tiny_config(prefill_chunk=64))
    told: list[tuple[int, int]] = []
    pre = prefill_prompt(model, [1] * 200, reserve=8, progress=lambda d, n: told.append((d, n)))
    assert told == [(0, 200), (64, 200), (128, 200), (192, 200), (200, 200)]
    assert pre.state.seqlen == 199
    told.clear()
    prefill_prompt(model, [1], reserve=8, progress=lambda d, n: told.append((d, n)))
    assert told == [(0, 1), (1, 1)]


@pytest.fixture()
def every_update(monkeypatch):
    """Log lines on every update (no 10 s cadence), so a short run shows its progress lines."""
    from evspark_cli.cli import progress

    monkeypatch.setattr(progress, "INTERVAL_S", 0.0)


@pytest.fixture(scope="module")
def small_chunks(tmp_path_factory) -> Path:
    """A random tiny model that prefills in chunks of 64 bases: a 1,000-base prompt takes 16."""
    from tiny import random_tiny_dir

    return random_tiny_dir(tmp_path_factory.mktemp("chunks") / "m", prefill_chunk=64)


def test_generate_log_shows_a_long_prompt_being_prefilled(tmp_path, small_chunks, every_update):
    src = tmp_path / "in.fa"
    src.write_text(">short\nACGTACGTAC\n>long\n" + "ACGTTGCA" * 125 + "\n")
    r = run_cli(["generate", src, "--model", small_chunks, "-t", "1", "-n", 4,
                 "--batch-size", 1, "-o", tmp_path / "o.fa"])
    assert r.code == 0, r.err
    prefills = [ln for ln in r.err.splitlines() if "prefill long:" in ln]
    shown = [int(m.group(1).replace(",", "")) for ln in prefills
             if (m := re.search(r"prefill long: ([\d,]+) of 1,000 bases", ln))]
    assert shown[0] == 0 and shown[1:] == list(range(64, 999, 64)), prefills
    assert all(LINE.match(ln) for ln in prefills)
    assert re.search(r"prefill long: 960 of 1,000 bases, [\d,.]+ bases/s, ~\d+ s left: "
                     r"4/8 tokens \(50%\), 1/2 sequences", prefills[-1]), prefills[-1]
    assert "prefill" not in r.err.splitlines()[-2]  # cleared when the prefill ends


def test_score_shows_progress_inside_a_long_record(tmp_path, small_chunks, every_update):
    src = tmp_path / "in.fa"
    src.write_text(">long\n" + "ACGTTGCA" * 75 + "\n")  # 600 bases, scored 64 at a time
    r = run_cli(["score", src, "--model", small_chunks, "-t", "1", "--context", 8,
                 "--window", 64])
    assert r.code == 0, r.err
    counts = [int(m.group(1)) for ln in r.err.splitlines()
              if (m := re.search(r"score: (\d+)/600 bases", ln))]
    assert [c for c in counts if 0 < c < 600] == [*range(64, 599, 64), 599], counts
    assert counts[-1] == 600


# ------------------------------------------------------------------------- standard output


def test_write_stdout_names_a_failed_write(monkeypatch):
    import errno
    import os

    from evspark_cli.errors import StdoutError
    from evspark_cli.files import write_stdout

    class Refusing(io.StringIO):
        def __init__(self, error: OSError) -> None:
            super().__init__()
            self.error = error

        def write(self, text: str) -> int:
            raise self.error

    monkeypatch.setattr(sys, "stdout", Refusing(OSError(errno.ENOSPC,
                                                        os.strerror(errno.ENOSPC))))
    with pytest.raises(StdoutError, match="^standard output: No space left on device$") as e:
        write_stdout(">a\nACGT\n")
    assert e.value.exit_code == 1
    monkeypatch.setattr(sys, "stdout", Refusing(BrokenPipeError(errno.EPIPE, "Broken pipe")))
    with pytest.raises(BrokenPipeError):  # a reader that went away: the CLI stops quietly
        write_stdout(">a\nACGT\n")


def evspark_process(args: list, stdout):
    """`evspark ARGS` in a process of its own (its real stdout: a file, a pipe)."""
    import subprocess

    return subprocess.Popen([sys.executable, "-m", "evspark_cli.cli", *map(str, args)],
                            stdout=stdout, stderr=subprocess.PIPE)


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("command", ["generate", "verify", "info"])
def test_a_full_disk_on_stdout_is_one_line(tmp_path, model, command):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nTTGACAGCTAGCTCAGTCCT\n")
    args = {"generate": ["generate", src, "--model", model, "-t", "1", "-n", 4, "-q"],
            "verify": ["verify", src, "--model", model, "-t", "1", "-n", 4, "--drafter", "kmer",
                       "-q"],
            "info": ["info", "--model", model]}[command]
    with open("/dev/full", "wb") as full:
        p = evspark_process(args, full)
        err = p.stderr.read().decode()
        p.wait()
    assert p.returncode == 1, err
    assert err.splitlines() == ["evspark: error: standard output: No space left on device"], err


def test_a_reader_that_goes_away_is_quiet(tmp_path, model):
    import subprocess

    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nTTGACAGCTAGCTCAGTCCT\n")
    p = evspark_process(["generate", src, "--model", model, "-t", "1", "-n", 4, "-q"],
                        subprocess.PIPE)
    p.stdout.close()  # `| head -0`: every write meets a closed pipe
    err = p.stderr.read().decode()
    p.wait()
    assert p.returncode == 141 and err == "", err


def test_a_log_gets_a_line_every_interval_while_no_update_comes():
    """The heartbeat: a long prefill chunk (here: a sleep) sends no update, the log still gets
    its line every `interval` seconds, saying what the last update said."""
    import time

    buf = io.StringIO()
    with Progress("generate", "tokens", total=10, stream=buf, tty=False, interval=0.3) as prog:
        prog.update(0, status="prefill chr1: 2,048 of 200,000 bases")
        time.sleep(1.4)
    lines = [ln for ln in buf.getvalue().splitlines() if LINE.match(ln)]
    assert len(lines) >= 4, lines  # the first update's, >= 3 heartbeats, the last one
    assert all("prefill chr1: 2,048 of 200,000 bases" in ln for ln in lines)


def test_summary_progress_and_stats_agree_on_decoding_tokens_per_s(tmp_path, model):
    """One definition of decoding tokens/s (new tokens over the rounds' time): the summary
    line, the last progress line and the stats' totals agree within 5 % (rounding only)."""
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nTTGACAGCTAGCTCAGTCCTAGGA\n>c\nGATTACA\n")
    stats = tmp_path / "s.tsv"
    r = run_cli(["generate", src, "--model", model, "-t", "1", "-n", 96, "--samples", 3,
                 "-b", 4, "-o", tmp_path / "o.fa", "--stats", stats])
    assert r.code == 0, r.err
    summary = float(re.search(r"([\d,]+) tokens/s decoding", r.err).group(1).replace(",", ""))
    last = [ln for ln in r.err.splitlines() if LINE.match(ln)][-1]
    progress = float(re.search(r"([\d.,]+) tokens/s", last).group(1).replace(",", ""))
    rows = [ln.split("\t") for ln in stats.read_text().splitlines()]
    col = {name: i for i, name in enumerate(rows[0])}
    tokens = sum(int(x[col["new_tokens"]]) for x in rows[1:])
    decode_s = sum(float(x[col["decode_s"]]) for x in rows[1:])
    pooled = tokens / decode_s
    for figure in (progress, pooled):
        assert abs(figure - summary) <= 0.05 * summary, (summary, progress, pooled)
    assert all(float(x[col["prefill_s"]]) >= 0 and x[col["batch"]] == "4" for x in rows[1:])
    assert [x[col["input_id"]] for x in rows[1:]] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3
    assert [int(x[col["job"]]) for x in rows[1:]] == list(range(9))


def test_a_prompt_longer_than_the_trained_context_is_warned_about(tmp_path, model):
    import shutil

    from evspark_cli.model.config import ModelConfig

    model = Path(shutil.copytree(model, tmp_path / "m"))
    cfg = ModelConfig.load(model / "config.json")
    cfg.trained_context = trained = 64  # as `evspark train` records its window
    cfg.save(model / "config.json")
    src = tmp_path / "in.fa"
    src.write_text(">long\n" + "ACGT" * (trained // 4 + 8) + "\n>short\nACGT\n")
    r = run_cli(["generate", src, "--model", model, "-t", "1", "-n", 2, "-q"])
    assert r.code == 0, r.err
    warning = [ln for ln in r.err.splitlines() if ln.startswith("evspark: warning:")]
    assert len(warning) == 1 and "'long'" in warning[0] and "'short'" not in warning[0]
    assert "trained on" in warning[0] and f"--prompt-tail {trained}" in warning[0]
    r = run_cli(["generate", src, "--model", model, "-t", "1", "-n", 2, "-q",
                 "--prompt-tail", trained])
    assert "warning" not in r.err


def test_meter_follows_compare_native_passes_taking_turns():
    """--compare-native's native pass and its speculative twin alternate: each turn tells
    `pass_started` again; the pass count and status stay the pass's own, and only a pass's
    first round interval (its decoder's setup) is left out of the rates."""
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    a = FakeJob(0, 10, 50)
    passes = [Pass((a,), True, 0), Pass((a,), False, 0)]
    meter = GenerationMeter(prog, passes, 1, clock=clock)
    for turn in range(3):
        for p in passes:
            meter.pass_started(Pass(p.jobs, p.native, p.pair))  # the run makes equal passes
            assert meter.setup == (turn == 0)
            assert f"pass {passes.index(p) + 1}/2 {'native' if p.native else 'speculative'}" \
                in prog.status
            rounds(meter, p, clock, 2, tokens=1 if p.native else 4, seconds=0.5)
    assert meter.pass_index == 2
    # timed rounds: native 5 of 6 (2 tokens/s), speculative 5 of 6 (8 tokens/s)
    assert meter.rate(True) == pytest.approx(2.0) and meter.rate(False) == pytest.approx(8.0)
