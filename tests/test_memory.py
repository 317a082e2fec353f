"""Memory estimates from a config (model/memory.py): exact where they count what the engine holds,
and the refusals that use them (a batch, --max-memory, a score's logits, a huge --gamma)."""
from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from battery import FAST, fasta_file, refused, worked
from test_engine import CONFIGS
from tiny import cgroup_tree

from evspark_cli.errors import InputError
from evspark_cli.model import memory
from evspark_cli.model.kvcache import class_layout_bytes


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameters_and_state_bytes_are_what_the_model_holds(make_model, name):
    cfg = CONFIGS[name]
    model = make_model(cfg)
    held = sum(p.numel() for p in model.parameters()) + sum(b.numel() for b in model.buffers())
    assert memory.parameter_count(cfg) == held
    nb = model.empty_state(1, capacity=1).nbytes()
    assert memory.fixed_state_bytes(cfg) == nb["fixed"]
    assert memory.kv_bytes_per_token(cfg, torch.float32) == nb["kv_per_token"]
    assert memory.kv_bytes_per_token(cfg, torch.bfloat16) == nb["kv_per_token"] // 2


def test_a_batch_at_a_context_costs_its_rows_state():
    """The estimate grows by exactly one row's state (fixed + KV at the context, with the
    allocator's slack) per row, and the row's KV part is linear in the context."""
    cfg = CONFIGS["stripe"]
    a = memory.run_memory(cfg, torch.float32, torch.float32, 1000, 13, rows=4)
    b = memory.run_memory(cfg, torch.float32, torch.float32, 2000, 13, rows=4)
    kv = memory.kv_bytes_per_token(cfg, torch.float32)
    assert a.per_row == memory.fixed_state_bytes(cfg) + 1000 * kv
    assert b.per_row - a.per_row == 1000 * kv
    slack = 1 + memory.ALLOCATOR_SLACK
    assert a.total(5) - a.total(4) == pytest.approx(a.per_row * slack, abs=1)


def test_phases_that_never_overlap_count_once():
    """A prefill runs between rounds and rows join after their prefill, so the estimate holds
    the largest of a round's block, a prefill chunk's transients and (class layout) a shelf's
    growth, not their sum (the sum overstated a mixed-length CPU batch's peak by 31 %)."""
    cfg, f32 = CONFIGS["stripe"], torch.float32
    slack = 1 + memory.ALLOCATOR_SLACK
    for rows, chunk in ((8, 512), (1, 4096)):
        est = memory.run_memory(cfg, f32, f32, 4000, 13, rows=rows, chunk=chunk)
        round_block = memory.block_bytes(cfg, rows, 13)
        chunk = min(chunk, 4000)  # a chunk is never longer than the context
        prefill = memory.prefill_bytes(cfg, chunk) + memory.block_bytes(cfg, 1, chunk)
        assert sorted(est.moments) == sorted((round_block, prefill))
        assert est.total(rows) == est.parameters + math.ceil(
            (rows * est.per_row + est.transient + max(round_block, prefill)) * slack)
    needs = [5000, 300, 5000, 9000, 700]
    cls = memory.run_memory(cfg, f32, f32, 9000, 13, rows=4, needs=needs, chunk=512)
    held, growth = class_layout_bytes(sorted(needs, reverse=True)[:4], cls.kv_position)
    assert growth > 0
    assert cls.total(4) == cls.parameters + math.ceil(
        (4 * cls.fixed_row + held + cls.transient + max((growth,) + cls.moments)) * slack)


def test_largest_batch_is_the_boundary():
    cfg = CONFIGS["mixed"]
    f32 = torch.float32
    for budget in (3 << 20, 50 << 20, 1 << 30):
        n = memory.largest_batch(cfg, f32, f32, 8192, 13, budget)
        est = lambda r: memory.run_memory(cfg, f32, f32, 8192, 13, r, False).total(r)  # noqa: E731
        assert n == 0 or est(n) <= budget
        assert est(n + 1) > budget


def test_a_batch_that_does_not_fit_names_the_largest_that_does():
    cfg = CONFIGS["stripe"]
    f32 = torch.float32
    budget = 200 << 20  # ~25 MB of KV per row at 100k tokens, ~85 MB of transients
    n = memory.largest_batch(cfg, f32, f32, 100_000, 13, budget)
    assert 0 < n < 64
    memory.check_batch_fits(cfg, f32, f32, n, 100_000, 13, budget)  # fits: no error
    with pytest.raises(InputError, match=rf"largest batch that fits is {n} \(batch_size {n}\)"):
        memory.check_batch_fits(cfg, f32, f32, 64, 100_000, 13, budget)
    with pytest.raises(InputError, match="not even one row fits"):
        memory.check_batch_fits(cfg, f32, f32, 1, 10**9, 13, budget)
    memory.check_batch_fits(cfg, f32, f32, 10**6, 10**6, 13, None)  # nothing known: no check


def test_sizes_and_the_memory_limit(monkeypatch):
    assert memory.parse_size("512M") == 512 << 20
    assert memory.parse_size("2.5GiB") == int(2.5 * (1 << 30))
    assert memory.parse_size("1000") == 1000
    for bad in ("lots", "-1G", "0"):
        with pytest.raises(InputError):
            memory.parse_size(bad)
    monkeypatch.setenv("EVSPARK_MAX_MEMORY", "3M")
    assert memory.available_bytes("cpu") == 3 << 20
    monkeypatch.delenv("EVSPARK_MAX_MEMORY")
    free = memory.available_bytes("cpu")
    assert free is None or free > 3 << 20


# ------------------------------------------- the command line: --max-memory, unbounded asks


def test_a_model_larger_than_max_memory_is_refused(phix_model: Path, tmp_path: Path):
    refused("--max-memory below what the process holds",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
             "--max-memory", "100K"], 2,
            r"--max-memory 100K: less than this process already holds \([\d.]+ [KMG]iB: Python, "
            r"torch and what is loaded\)", tmp_path, MODEL=phix_model)
    refused("--max-memory below the model's size and what the process holds",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
             "--max-memory", str(memory.process_bytes() + (100 << 10))], 3,
            r"loading model \S+ needs about [\d.]+ [KMG]iB of memory, --max-memory less the "
            r"[\d.]+ [KMG]iB this process holds is [\d.]+ KiB", tmp_path, MODEL=phix_model)
    refused("--max-memory not a size",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
             "--max-memory", "lots"], 2,
            r"--max-memory must be a positive size such as 512M or 8G, got 'lots'",
            tmp_path, MODEL=phix_model)


def test_score_logits_that_do_not_fit_are_refused(phix_model: Path, tmp_path: Path):
    """Passes of 128 tokens fit in 4 MiB beyond what the process holds; the logits of 6,000
    positions (12 MiB) do not."""
    recs = "".join(f">s{i}\n" + "ACGTTGCAAC" * 200 + "\n" for i in range(3))
    refused("score --logits beyond --max-memory",
            ["score", fasta_file(tmp_path, "long.fa", recs), "--model", phix_model, *FAST,
             "--context", 64, "--window", 64, "--logits", tmp_path / "l.safetensors",
             "--max-memory", str(memory.process_bytes() + (4 << 20))], 2,
            r"--logits: keeping the logits of every position needs about [\d.]+ MiB of memory, "
            r"--max-memory less the [\d.]+ MiB this process holds is", tmp_path,
            MODEL=phix_model)


def test_a_huge_gamma_reserves_only_what_rounds_use(phix_model: Path, tmp_path: Path, monkeypatch):
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
               ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 8, "--gamma",
                2_000_000, "--drafter", "kmer"], tmp_path, "3 records of 8 tokens",
               MODEL=phix_model)
    assert r.out.count(">") == 3 and all(n <= 8 + 7 + 16 for n in reserves), reserves
    assert all(len(s) == 8 for s in re.findall(r"(?m)^[A-Z]+$", r.out))


# ------------------------------------------------------ the process's own memory cgroup


def test_the_memory_limit_of_the_process_own_cgroup_is_read(tmp_path: Path):
    """v1: the limit of the folder /proc/self/cgroup names (not only the hierarchy's root),
    the working set being usage less the inactive page cache; v2 likewise, at any level."""
    from evspark_cli.cgroups import memory_limits

    proc, root = cgroup_tree(tmp_path, "4:memory:/slurm/job7\n0::/\n", {
        "memory/memory.limit_in_bytes": "9223372036854771712",  # the root: no limit
        "memory/slurm/job7/memory.limit_in_bytes": str(6 << 30),
        "memory/slurm/job7/memory.usage_in_bytes": str(2 << 30),
        "memory/slurm/job7/memory.stat": f"cache 5\ntotal_inactive_file {1 << 30}\n"})
    [lim] = memory_limits(proc, root)
    assert (lim.limit, lim.used, lim.left) == (6 << 30, 1 << 30, 5 << 30)
    proc, root = cgroup_tree(tmp_path / "v2", "0::/user/app.scope\n", {
        "memory.max": "max",
        "user/memory.max": str(3 << 30), "user/memory.current": str(1 << 30),
        "user/app.scope/memory.max": "max", "user/app.scope/memory.current": "7"})
    [lim] = memory_limits(proc, root)
    assert lim.left == 2 << 30 and lim.folder.name == "user"


def _memory_cgroup(limit: str) -> Path | None:
    """A fresh memory cgroup limited to `limit` (benchmarks/memory_check.py's), or None where
    this process may not make one (not root, no writable memory controller)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "memory_check", Path(__file__).resolve().parents[1] / "benchmarks" / "memory_check.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    try:
        return mod.cgroup_for(limit)
    except OSError:
        return None


@pytest.mark.slow
def test_generate_in_a_memory_cgroup_plans_to_its_limit(tmp_path: Path):
    """A run in a memory cgroup (a SLURM job's, a container's) lowers its default batch to what
    its estimate says fits under the cgroup's limit, and stays under it: no OOM kill."""
    import random

    folder = _memory_cgroup("600M")
    if folder is None:
        pytest.skip("cannot create a memory cgroup here (needs root and a cgroup mount)")
    rng = random.Random(3)
    src = tmp_path / "p.fa"
    src.write_text(">p\n" + "".join(rng.choice("ACGT") for _ in range(8000)) + "\n")

    def enter() -> None:
        (folder / "cgroup.procs").write_text(str(os.getpid()))

    env = {k: v for k, v in os.environ.items() if k != "EVSPARK_MAX_MEMORY"}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "evspark_cli.cli", "generate", str(src),
                                 "-n", "32", "--samples", "32", "--threads", "1", "-q", "-o",
                                 str(tmp_path / "o.fa")], stderr=subprocess.PIPE, text=True,
                                env=env, preexec_fn=enter)
        _, err = proc.communicate(timeout=600)
    finally:
        with contextlib.suppress(OSError):
            folder.rmdir()
    assert proc.returncode == 0, err  # -9 / 137 would be the OOM killer
    m = re.search(r"batch size lowered to (\d+) \(from 32\) to fit in memory", err)
    assert m and 1 <= int(m.group(1)) < 32, err
    assert (tmp_path / "o.fa").read_text().count(">") == 32
