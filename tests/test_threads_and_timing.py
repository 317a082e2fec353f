"""Threads and timing: the default thread count is the CPUs this process may use (cpus.py), a
larger one is clamped to them, malformed CPU variables are ignored with EvSpark's own warning,
and --compare-native times interleaved native/speculative pairs and says when their spread makes
a speedup unreliable (generation/run.py)."""
from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import fasta_file, record, run_child, show  # noqa: E402
from tiny import cgroup_tree, run_cli, trained_tiny_dir  # noqa: E402

from evspark_cli.cpus import (  # noqa: E402
    CpuLimit,
    affinity_cpus,
    cgroup_cpus,
    clamp_threads,
    cpu_env_warnings,
    usable_cpus,
)
from evspark_cli.generation.run import COMPARE_PAIRS, PairTiming, RunSummary  # noqa: E402


def test_cgroup_v2_quota_of_the_process_and_its_ancestors(tmp_path):
    proc, root = cgroup_tree(tmp_path, "0::/slurm/job7/step0\n", {
        "slurm/cpu.max": "max 100000\n",
        "slurm/job7/cpu.max": "250000 100000\n",  # 2.5 CPUs
        "slurm/job7/step0/cpu.max": "max 100000\n"})
    assert cgroup_cpus(proc, root) == pytest.approx(2.5)
    limit = usable_cpus({}, proc, root)
    assert limit.count == min(3, affinity_cpus())
    if affinity_cpus() > 3:
        assert limit.source == "cgroup quota"


def test_cgroup_v1_cfs_quota(tmp_path):
    proc, root = cgroup_tree(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "50000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpus(proc, root) == pytest.approx(0.5)
    assert usable_cpus({}, proc, root).count == 1  # never fewer than one thread


def test_no_quota_and_no_cgroups(tmp_path):
    proc, root = cgroup_tree(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cgroup_cpus(proc, root) is None
    assert cgroup_cpus(tmp_path / "missing", tmp_path / "nowhere") is None
    assert usable_cpus({}, proc, root).count == affinity_cpus()


@pytest.mark.parametrize("env,count,source", [
    ({"SLURM_CPUS_PER_TASK": "1"}, 1, "SLURM_CPUS_PER_TASK"),
    ({"NSLOTS": "1", "SLURM_CPUS_PER_TASK": "junk"}, 1, "NSLOTS"),
    ({"OMP_NUM_THREADS": "1"}, 1, "OMP_NUM_THREADS"),
    ({"SLURM_CPUS_PER_TASK": "1(x4)"}, 1, "SLURM_CPUS_PER_TASK"),
    ({"SLURM_CPUS_PER_TASK": "100000"}, None, "affinity"),  # a scheduler cannot grant more
    ({"NSLOTS": "0"}, None, "affinity"),
])
def test_scheduler_variables(tmp_path, env, count, source):
    proc, root = cgroup_tree(tmp_path, "0::/\n", {})
    got = usable_cpus(env, proc, root)
    assert got.count == (count or affinity_cpus())
    if count is not None or affinity_cpus() < 100000:
        assert got.source == source


def test_affinity_is_the_mask_not_the_core_count():
    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no affinity masks on this platform")
    assert affinity_cpus() == len(os.sched_getaffinity(0))


def test_set_threads_default_and_clamp(monkeypatch):
    """An explicit count above the CPUs this process may use is clamped to them (the OpenMP
    runtime fails to create 100,000 threads, and extra ones only compete for the cores)."""
    import torch

    from evspark_cli.api import set_threads

    saved = torch.get_num_threads()
    try:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
        got = set_threads(0)
        assert (got.count, got.source, torch.get_num_threads()) == (1, "SLURM_CPUS_PER_TASK", 1)
        assert not got.clamped
        got = set_threads(3)
        assert (got.count, got.asked, got.clamped, torch.get_num_threads()) == (1, 3, True, 1)
        assert got.describe() == "1 thread (SLURM_CPUS_PER_TASK)"
        got = set_threads(1)
        assert got.describe() == "1 thread (--threads)" and not got.clamped
    finally:
        torch.set_num_threads(saved)


def test_clamp_threads():
    two = CpuLimit(2, "affinity")
    assert clamp_threads(0, two) == clamp_threads(0, two)
    assert (clamp_threads(0, two).count, clamp_threads(0, two).source) == (2, "affinity")
    big = clamp_threads(100_000, two)
    assert (big.count, big.asked, big.clamped, big.source) == (2, 100_000, True, "affinity")
    a_few_more = clamp_threads(4, two)  # a little above the allowance is clamped too
    assert (a_few_more.count, a_few_more.clamped) == (2, True)
    one = clamp_threads(1, two)
    assert (one.count, one.clamped, one.describe()) == (1, False, "1 thread (--threads)")


@pytest.mark.parametrize("value,good", [
    ("4", True), ("+2", True), (" 2 ", True), ("2, 3", True), ("9223372036854775807", True),
    ("abc", False), ("0", False), ("-1", False), ("", False), (" ", False), ("1.5", False),
    ("2x", False), ("2,", False), ("2,0", False), ("2,,3", False), ("2 3", False),
    ("9223372036854775808", False), ("\uff10", False),
])
def test_omp_num_threads_is_judged_as_libgomp_judges_it(value, good):
    """What libgomp accepts (positive integers that fit a signed long, comma-separated per
    nesting level, spaces around each) is kept; anything it would print its own raw line for
    is removed, with one warning."""
    env = {"OMP_NUM_THREADS": value}
    got = cpu_env_warnings(env)
    if good:
        assert got == [] and env == {"OMP_NUM_THREADS": value}
    else:
        assert got == [f"OMP_NUM_THREADS={value!r} is not a positive integer; ignored"]
        assert env == {}


def test_malformed_cpu_variables_are_ignored_with_a_warning_each(tmp_path):
    env = {"OMP_NUM_THREADS": "abc", "MKL_NUM_THREADS": "4,2", "SLURM_CPUS_PER_TASK": "junk",
           "NSLOTS": "0", "OTHER": "x" * 100}
    got = cpu_env_warnings(env)
    assert got == ["SLURM_CPUS_PER_TASK='junk' is not a positive integer; ignored",
                   "NSLOTS='0' is not a positive integer; ignored",
                   "OMP_NUM_THREADS='abc' is not a positive integer; ignored",
                   "MKL_NUM_THREADS='4,2' is not a positive integer; ignored"]
    # the threads variables go (torch reads them), the scheduler's stay for other programs
    assert env == {"SLURM_CPUS_PER_TASK": "junk", "NSLOTS": "0", "OTHER": "x" * 100}
    assert cpu_env_warnings({"SLURM_CPUS_PER_TASK": "4(x2)", "NSLOTS": "8",
                             "MKL_NUM_THREADS": "3", "OMP_NUM_THREADS": "2,1"}) == []
    long = {"NSLOTS": "9" * 60 + "x"}
    assert cpu_env_warnings(long) == [f"NSLOTS='{'9' * 40}...' is not a positive integer; "
                                      "ignored"]
    proc, root = cgroup_tree(tmp_path, "0::/\n", {})
    assert usable_cpus(env, proc, root).source == "affinity"  # the malformed ones count for none


# ----------------------------------------------------------------------- --compare-native


def summary_of(*pairs: tuple[float, float]) -> RunSummary:
    """Pairs of (native seconds, speculative seconds) for 100 tokens each."""
    return RunSummary(pairs=[PairTiming(n, 100, s, 100) for n, s in pairs])


def test_spread_rule():
    steady = summary_of((2.0, 1.0), (2.2, 1.0), (2.1, 1.0))
    assert steady.ratios == pytest.approx([2.0, 2.2, 2.1])
    assert steady.spread == pytest.approx(0.2 / 2.1) and steady.speedup_reliable
    assert steady.speedup == pytest.approx(6.3 / 3.0)  # pooled over the pairs
    noisy = summary_of((2.0, 1.0), (6.0, 1.0), (2.1, 1.0))
    assert noisy.spread == pytest.approx(4.0 / 2.1) and not noisy.speedup_reliable
    assert not summary_of((2.0, 1.0), (2.0, 1.0)).speedup_reliable  # fewer than COMPARE_PAIRS


def test_speedup_text_flags_an_unreliable_speedup():
    from evspark_cli.cli.meter import speedup_text

    assert speedup_text(summary_of((2.0, 1.0), (2.2, 1.0), (2.1, 1.0))) == (
        "speedup 2.10x over native decoding (3 timed pairs 2.00-2.20x, spread 10%)")
    text = speedup_text(summary_of((2.0, 1.0), (6.0, 1.0), (2.1, 1.0)))
    assert text.startswith("speedup 3.37x over native decoding (3 timed pairs 2.00-6.00x, "
                           "spread 190%) UNRELIABLE: the pairs differ by more than 20%")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    return trained_tiny_dir(tmp_path_factory.mktemp("timing_model"), steps=10)


def test_passes_interleave_and_repeat_a_small_run(model):
    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.generation.jobs import Record, build_jobs
    from evspark_cli.generation.options import DecodeOptions
    from evspark_cli.generation.run import GenerationRun
    from evspark_cli.model.checkpoint import load_model

    m = load_model(model)
    opts = DecodeOptions(4, 3, seed=1)
    v = m.config.vocab_size
    jobs = build_jobs([Record.named(i, s, v) for i, s in
                       [("a", "ACGTACGT"), ("b", "GGCCAATT"), ("c", "TTGACA")]], opts)
    run = GenerationRun(m, resolve_drafter(m, "kmer"), opts, batch_size=2, compare_native=True)
    plan = [(p.native, p.pair, p.timing_only, [j.record for j in p.jobs])
            for p in run.passes(jobs)]
    assert plan == [(True, 0, False, ["a", "b"]), (False, 0, False, ["a", "b"]),
                    (True, 1, False, ["c"]), (False, 1, False, ["c"]),
                    (True, 2, True, ["a", "b"]), (False, 2, True, ["a", "b"])]
    outs = list(run.outcomes(jobs))
    assert [o.job.record for o in outs] == ["a", "b", "c"]  # repeats write nothing
    s = run.summary
    assert s.jobs == 3 and s.tokens == 12 and len(s.ratios) == COMPARE_PAIRS
    assert all(p.native_tokens == p.spec_tokens for p in s.pairs)
    assert [p.spec_tokens for p in s.pairs] == [8, 4, 8]
    # without comparison: one pass, no pairs
    plain = GenerationRun(m, resolve_drafter(m, "kmer"), opts, batch_size=2)
    assert len(plain.passes(jobs)) == 1


def test_stats_speedup_is_the_speedup_of_the_pair_a_job_was_timed_in(model):
    """One definition of a speedup: a job's stats row carries its timed pair's ratio (native
    seconds per token over speculative seconds per token), the job alone with a batch of one,
    its slice pooled otherwise; the summary pools the same pairs."""
    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.generation.jobs import Record, build_jobs
    from evspark_cli.generation.options import DecodeOptions
    from evspark_cli.generation.run import GenerationRun
    from evspark_cli.model.checkpoint import load_model

    m = load_model(model)
    opts = DecodeOptions(6, 3, seed=2)
    v = m.config.vocab_size
    jobs = build_jobs([Record.named(i, s, v) for i, s in
                       [("a", "ACGTACGT"), ("b", "GGCCAATT"), ("c", "TTGACA")]], opts)
    for batch, pair_of in ((1, [0, 1, 2]), (2, [0, 0, 1])):
        run = GenerationRun(m, resolve_drafter(m, "kmer"), opts, batch_size=batch,
                            compare_native=True)
        outs = list(run.outcomes(jobs))
        ratios = [p.ratio for p in run.summary.pairs]
        assert all(r is not None and r > 0 for r in ratios)
        assert [o.output.stats["speedup"] for o in outs] == \
            [round(ratios[k], 3) for k in pair_of]
        pooled = run.summary.speedup
        assert min(ratios) <= pooled <= max(ratios)


def test_compare_native_summary_and_threads_on_the_command_line(tmp_path, model):
    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n")
    r = run_cli(["generate", src, "--model", model, "-t", "1", "-n", 8, "--compare-native",
                 "--drafter", "kmer", "-q"])
    assert r.code == 0, r.err
    assert "evspark: generate: 1 record x 1 sample, 1 sequence written, 8 tokens" in r.err
    assert re.search(r"1 thread \(--threads\), batch 1, speedup \d+\.\d\dx over native "
                     r"decoding \(3 timed pairs \d+\.\d\d-\d+\.\d\dx, spread \d+%\)", r.err), r.err
    import torch

    try:
        r = run_cli(["generate", src, "--model", model, "-t", "64", "-n", 2, "-q"])
        n = usable_cpus().count
        if n < 64:
            assert re.search(rf"^evspark: warning: --threads 64 is more than the {n} CPUs? this "
                             rf"process may use \([^)]+\); using {n}$", r.err, re.M), r.err
            assert f", {n} thread{'s' if n > 1 else ''} (" in r.err
    finally:
        torch.set_num_threads(1)


def _summary(err: str) -> str:
    return next(ln for ln in err.splitlines() if ln.startswith("evspark: generate: "))


def test_huge_thread_count_is_clamped_not_a_crash(phix_model, tmp_path):
    """`--threads 100000` once crashed the OpenMP runtime (SIGSEGV, "libgomp: Thread creation
    failed"): it runs on the CPUs this process may use, with one warning saying so."""
    args = ["generate", fasta_file(tmp_path), "--model", phix_model, "-q", "-n", 4,
            "-t", 100000]
    code, err, _ = run_child(args, tmp_path, timeout=180)
    n = usable_cpus().count
    warning = (f"evspark: warning: --threads 100000 is more than the {n} CPU"
               f"{'s' if n > 1 else ''} this process may use")
    lines = err.strip().splitlines()
    machine_free = re.sub(rf"\b{n}\b", "N", lines[0] if lines else err)  # N: this machine's
    record("hostile", "--threads 100000 (far above the CPUs)",
           show(args, tmp_path, MODEL=phix_model), code,
           f"{machine_free}; the run works on N threads")
    assert code == 0, err
    assert lines[0].startswith(warning) and lines[0].endswith(f"; using {n}"), err
    assert f", {n} thread{'s' if n > 1 else ''} (" in _summary(err)
    assert "libgomp" not in err and "Traceback" not in err


def test_malformed_thread_variables_get_evspark_warnings_not_libgomp_lines(phix_model, tmp_path):
    """OMP_NUM_THREADS=abc made libgomp print its own raw line when torch was imported: now the
    variable is removed first and EvSpark says so, once, in its own words (the scheduler's
    variables only get the warning, and are ignored)."""
    args = ["generate", fasta_file(tmp_path), "--model", phix_model, "-q", "-n", 4, "-t", 1]
    env = dict(OMP_NUM_THREADS="abc", MKL_NUM_THREADS="0", SLURM_CPUS_PER_TASK="4x",
               NSLOTS="")
    code, err, _ = run_child(args, tmp_path, timeout=180, **env)
    record("hostile", "malformed OMP_NUM_THREADS, MKL_NUM_THREADS, SLURM_CPUS_PER_TASK, NSLOTS",
           "OMP_NUM_THREADS=abc MKL_NUM_THREADS=0 SLURM_CPUS_PER_TASK=4x NSLOTS= "
           + show(args, tmp_path, MODEL=phix_model), code,
           "one 'evspark: warning: OMP_NUM_THREADS='abc' is not a positive integer; ignored' "
           "line per variable, no libgomp line; the run works")
    assert code == 0, err
    assert "libgomp" not in err and "Traceback" not in err, err
    warnings = [ln for ln in err.splitlines() if ln.startswith("evspark: warning:")]
    assert warnings == [f"evspark: warning: {name}={env[name]!r} is not a positive integer; "
                        "ignored" for name in ("SLURM_CPUS_PER_TASK", "NSLOTS",
                                               "OMP_NUM_THREADS", "MKL_NUM_THREADS")], err
    assert "1 thread (--threads)" in _summary(err)


def test_the_api_warns_of_a_malformed_variable_once(tmp_path):
    """A Python caller gets the warning as a RuntimeWarning on first use of the API (the
    variable is removed when evspark_cli is imported, before torch is)."""
    import subprocess

    from battery import child_env

    code = ("import os, warnings\nwarnings.simplefilter('always')\nimport evspark_cli as evs\n"
            "print('OMP_NUM_THREADS' in os.environ)\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n    evs.tokenize; evs.tokenize\n"
            "print([str(x.message) for x in w])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=child_env(OMP_NUM_THREADS="abc"), cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "libgomp" not in p.stderr
    assert p.stdout.splitlines() == [
        "False", "[\"evspark: OMP_NUM_THREADS='abc' is not a positive integer; ignored\"]"]


# ------------------------------------------------------ the summary counts what it counts


def test_the_summary_and_the_failure_line_count_sequences(tmp_path, model, monkeypatch):
    """A sequence is one sample of a record: the summary says "1 sequence written", and a run
    with samples counts its failed sequences as sequences (with one sample each, records)."""
    from test_cli import plant_prefill_fault

    src = tmp_path / "in.fa"
    src.write_text(">a\nACGTACGTTAGCATGCAAGT\n>b\nGGATTACAGGATTACAGG\n")
    plant_prefill_fault(monkeypatch, "b")
    base = ["generate", src, "--model", model, "-t", 1, "-n", 4, "--drafter", "kmer", "-q"]
    r = run_cli([*base, "--samples", 2, "-o", tmp_path / "two.fa"])
    assert r.code == 1, r.err
    assert "2 records x 2 samples, 2 sequences written (2 failed)" in _summary(r.err)
    assert r.err.strip().splitlines()[-1].startswith(
        "evspark: error: 2 of 4 sequences failed (b.cont_s0, b.cont_s1); "), r.err
    r = run_cli([*base, "-o", tmp_path / "one.fa"])
    assert r.code == 1, r.err
    assert "2 records x 1 sample, 1 sequence written (1 failed)" in _summary(r.err)
    assert r.err.strip().splitlines()[-1].startswith(
        "evspark: error: 1 of 2 records failed (b.cont); "), r.err


# ----------------------------------------------------------------------- decoders in turns


class SleepyDecoder:
    """A decoder whose steps take `work` seconds times the machine's current slowness (a
    machine that runs 3x slower for its first `slow_s` seconds), for `steps` steps; it stamps
    each step with its own clock."""

    def __init__(self, steps: int, work: float, clock, machine) -> None:
        self.left, self.work, self.clock, self.machine = steps, work, clock, machine
        self.stamps: list[float] = []
        self.tokens_emitted = 0  # one token a step

    def step(self, source):
        if self.left == 0:
            return None
        time.sleep(self.work * self.machine())
        self.left -= 1
        self.tokens_emitted += 1
        self.stamps.append(self.clock())
        return []


def drifting_machine(slow_s: float):
    t0 = time.perf_counter()
    return lambda: 3.0 if time.perf_counter() - t0 < slow_s else 1.0


def test_decoders_in_turns_are_each_timed_only_while_they_run():
    from evspark_cli.decode.batch import JobList
    from evspark_cli.decode.interleave import interleave, timed_run

    machine = lambda: 1.0  # noqa: E731
    runs = [timed_run(lambda c: SleepyDecoder(20, 0.002, c, machine), JobList(iter([]))),
            timed_run(lambda c: SleepyDecoder(5, 0.008, c, machine), JobList(iter([])))]
    t0 = time.perf_counter()
    interleave(runs, turn_s=0.01)
    wall = time.perf_counter() - t0
    assert all(r.done for r in runs)
    assert sum(r.seconds for r in runs) <= wall * 1.01
    for r in runs:  # its own steps' time, whatever the other one did meanwhile
        assert 0.04 <= r.seconds < 0.04 + 0.03
        stamps = r.decoder.stamps
        assert stamps[-1] - stamps[0] <= r.seconds  # its clock stopped while it waited


def test_decoders_in_turns_cancel_a_drifting_machine():
    """Equal work on a machine 3x slower for its first 0.15 s: timed one after the other, the
    first pass looks ~2x slower than the second; in turns both see the same machine."""
    from evspark_cli.decode.batch import JobList
    from evspark_cli.decode.interleave import interleave, timed_run

    def pair(turns: bool) -> float:
        machine = drifting_machine(0.15)
        runs = [timed_run(lambda c: SleepyDecoder(40, 0.003, c, machine), JobList(iter([])))
                for _ in range(2)]
        if turns:
            interleave(runs, turn_s=0.01)
        else:
            for r in runs:
                interleave([r])
        return runs[0].seconds / runs[1].seconds

    assert pair(turns=False) > 1.6
    assert 0.75 < pair(turns=True) < 1.33


def test_decoders_in_turns_finish_together_however_different_their_speeds():
    """A decoder 3x faster than the other, on a machine that turns 3x slower after 0.12 s
    (a neighbour arriving): the turn goes to whoever has emitted fewer tokens, so both are at
    the same token when the machine turns and the ratio stays 3. Turns in a fixed order
    leave the slow one alone after the fast one is done: the slowdown falls on it alone."""
    from evspark_cli.decode.batch import JobList
    from evspark_cli.decode.interleave import interleave, timed_run

    t0 = time.perf_counter()
    machine = lambda: 1.0 if time.perf_counter() - t0 < 0.12 else 3.0  # noqa: E731
    runs = [timed_run(lambda c: SleepyDecoder(30, 0.006, c, machine), JobList(iter([]))),
            timed_run(lambda c: SleepyDecoder(30, 0.002, c, machine), JobList(iter([])))]
    turns: list[int] = []
    interleave(runs, turn_s=0.01, on_turn=turns.append)
    slow, fast = runs
    assert slow.decoder.tokens_emitted == fast.decoder.tokens_emitted == 30
    assert 2.3 < slow.seconds / fast.seconds < 3.9
    last_fast = max(t for t, i in enumerate(turns) if i == 1)
    assert len(turns) - 1 - last_fast <= 2  # the slow run's turns after the fast one is done


def test_compare_native_holds_two_batches_in_its_memory_plan(model, monkeypatch):
    """--compare-native decodes a native and a speculative batch at once: the plan counts
    both, halving the default batch a memory limit allows and naming the reason when a batch
    size is refused."""
    import evspark_cli as evs
    from evspark_cli.errors import SettingError
    from evspark_cli.generation.jobs import Record, build_jobs
    from evspark_cli.generation.options import DecodeOptions
    from evspark_cli.generation.plan import plan_batch
    from evspark_cli.model.memory import process_bytes

    m = evs.load_model(model)
    opts = DecodeOptions(3000, samples=64)
    jobs = build_jobs([Record.named("r", "ACGT" * 30, m.config.vocab_size)], opts)
    monkeypatch.setenv("EVSPARK_MAX_MEMORY", str(process_bytes() + (40 << 20)))
    one = plan_batch(m, jobs, opts, None, None)
    two = plan_batch(m, jobs, opts, None, None, decoders=2)
    assert 2 <= one < 32 and two in (one // 2, one // 2 - 1)
    with pytest.raises(SettingError, match=r"a batch of \d+ rows \(twice: --compare-native "
                                           r"holds a native and a speculative batch\)"):
        plan_batch(m, jobs, opts, None, one, decoders=2)
