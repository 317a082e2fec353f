"""Threads and timing: the default thread count is the CPUs this process may use (cpus.py), and
--compare-native times interleaved native/speculative pairs and says when their spread makes a
speedup unreliable (generation/run.py)."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import run_cli, trained_tiny_dir  # noqa: E402

from evspark_cli.cpus import affinity_cpus, cgroup_cpus, usable_cpus  # noqa: E402
from evspark_cli.generation.run import COMPARE_PAIRS, PairTiming, RunSummary  # noqa: E402


def cgroup_tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "proc_cgroup").write_text(proc)
    return tmp_path / "proc_cgroup", root


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


def test_set_threads_default_and_oversubscription(monkeypatch):
    import torch

    from evspark_cli.api import set_threads

    saved = torch.get_num_threads()
    try:
        monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
        got = set_threads(0)
        assert (got.count, got.source, torch.get_num_threads()) == (1, "SLURM_CPUS_PER_TASK", 1)
        got = set_threads(3)
        assert got.count == 3 and got.source == "--threads" and got.oversubscribed
        assert got.describe() == "3 threads (--threads)"
    finally:
        torch.set_num_threads(saved)


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
    assert re.search(r"1 thread \(--threads\), batch 1, speedup \d+\.\d\dx over native "
                     r"decoding \(3 timed pairs \d+\.\d\d-\d+\.\d\dx, spread \d+%\)", r.err), r.err
    r = run_cli(["generate", src, "--model", model, "-t", "64", "-n", 2, "-q"])
    if affinity_cpus() < 64:
        assert "evspark: warning: --threads 64 is more than the" in r.err
    import torch

    torch.set_num_threads(1)
