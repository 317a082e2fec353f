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

from evspark_cli.cli.meter import GenerationMeter  # noqa: E402
from evspark_cli.cli.progress import Progress, fmt_duration  # noqa: E402

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


def FakeJob(record: int, prompt_len: int, n: int):
    """A job of `n` tokens on a prompt of `prompt_len` bases, keyed by `record`."""
    from evspark_cli.decode.drafters.base import RngKey
    from evspark_cli.decode.jobs import Job

    return Job(record, tuple([65] * prompt_len), n, RngKey(0, record, 0), f"r{record}")


def test_meter_counts_prefill_in_the_time_left():
    """Two records; the second has a long prompt still to prefill. Rounds take 0.1 s for 10
    tokens (100 tokens/s), the first record's 1,000-base prefill took 1 s: with one prompt
    length seen, all of it counts as work (here: bases), so 10,000 bases take 10 s."""
    from evspark_cli.decode.jobs import RoundReport
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    a, b = FakeJob(0, 1000, 100), FakeJob(1, 10_000, 100)
    p = Pass((a, b), native=False)
    meter = GenerationMeter(prog, [p], 2, clock=clock)
    assert prog.total == 200 and meter.time_left() is None
    meter.pass_started(p)
    meter.job_started(a, p)
    clock.t += 1.0 + 0.1  # prefill + the first round
    meter.round_done(RoundReport(10, 1, 8, 9), p)
    assert meter.time_left() is None  # no plain round yet: prefill and decoding not separable
    for _ in range(4):
        clock.t += 0.1
        meter.round_done(RoundReport(10, 1, 8, 9), p)
    assert prog.done == 50 and meter.rate(False) == pytest.approx(100)
    assert meter.prefill_time()(1000) == pytest.approx(1.0)
    assert meter.time_left() == pytest.approx(150 / 100 + 10)
    assert meter.tau() == pytest.approx(9.0)
    meter.job_started(b, p)  # b's prefill happens before the next round
    assert meter.time_left() == pytest.approx(150 / 100)


def test_meter_separates_per_prompt_overhead_from_per_base_cost():
    """Prefills of 100 and 1,000 bases that took 0.2 s and 1.1 s: 0.1 s per prompt plus 1 ms
    per base, so a 10,000-base prompt still to come adds 10.1 s."""
    from evspark_cli.decode.jobs import RoundReport
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    jobs = (FakeJob(0, 100, 30), FakeJob(1, 1000, 30), FakeJob(2, 10_000, 30))
    p = Pass(jobs, native=False)
    meter = GenerationMeter(prog, [p], 3, clock=clock)
    meter.pass_started(p)
    for job, prefill in ((jobs[0], 0.2), (jobs[1], 1.1)):
        meter.job_started(job, p)
        clock.t += prefill + 0.1
        meter.round_done(RoundReport(10, 1, 8, 9), p)
        clock.t += 0.1
        meter.round_done(RoundReport(10, 1, 8, 9), p)
    cost = meter.prefill_time()
    assert cost(0) == pytest.approx(0.1) and cost(10_000) == pytest.approx(10.1)
    assert +meter.todo == {10_000: 1}
    assert meter.time_left() == pytest.approx(50 / 100 + 10.1)


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


def test_meter_sizes_compare_native_passes():
    from evspark_cli.decode.jobs import RoundReport
    from evspark_cli.generation.run import Pass

    clock = Clock()
    prog = Progress("generate", "tokens", quiet=True, clock=clock)
    a = FakeJob(0, 10, 50)
    passes = [Pass((a,), True, 0), Pass((a,), False, 0), Pass((a,), True, 1, True),
              Pass((a,), False, 1, True)]
    meter = GenerationMeter(prog, passes, 1, clock=clock)
    assert prog.total == 200  # every pass's tokens, repeats included
    meter.pass_started(passes[0])
    meter.job_started(a, passes[0])
    for _ in range(6):
        clock.t += 0.5  # native: one token per round, 2 tokens/s
        meter.round_done(RoundReport(1, 1, 0, 0), passes[0])
    # speculative passes have no rate yet: they are counted at the native rate
    # native: 44 + 50 tokens left, speculative 100, at 2 tokens/s; 3 prompts still to prefill
    assert meter.prefill_time()(10) == 0.0  # the first round took as long as the others
    assert meter.time_left() == pytest.approx((94 + 100) / 2)
    assert +meter.todo == {10: 3}  # the other passes prefill it again
    assert "pass 1/4 native" in prog.status


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
                        r"48 tokens in \d+\.\d s, [\d,]+ tokens/s decoding, mean tau \d+\.\d\d, "
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
