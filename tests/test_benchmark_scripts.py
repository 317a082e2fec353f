"""The benchmark scripts still run against today's engine: each one's smoke mode, in a child
process, writes a result file with its provenance. (Their figures are measured by hand, never in
the test suite: docs/performance.md.)"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny import SHARED

ROOT = Path(__file__).resolve().parents[1]

SMOKE = {
    "bench_engine": ["--quick", "--kv-contexts", "256", "--prefill-sizes", "64", "--threads", "1"],
    "throughput_bar": ["--quick", "--parts", "sweep"],
    "weight_layout": ["--rows", "1", "--cycle-mb", "1", "--rounds", "1", "--context", "32",
                      "--model-rounds", "1", "--batches", "1", "2", "--threads", "1"],
    "compile_probe": ["--context", "64", "--reps", "2", "--rounds", "1", "--decode-tokens", "0",
                      "--threads", "1"],
    "gpu_check": ["--small", "--device", "cpu", "--prompt", "64", "--tokens", "64"],
    "gpu_bundled": ["--device", "cpu", "--tokens", "16"],
    "gpu_throughput": ["--small", "--device", "cpu", "--batches", "1,2", "--tokens", "8",
                       "--prompt-len", "64"],
    "native_step": ["--tokens", "8", "--repeats", "1", "--batches", "1,2", "--prompt-len", "64",
                    "--threads", "1"],
    "identity_vs_native": ["--records", "1", "--tokens", "8", "--runs", "1", "--batches", "1"],
    "timing_noise": ["--trace-s", "1", "--records", "1", "--tokens", "8", "--repeats", "1"],
    "fasta_reader": ["--megabases", "0.2", "--repeats", "1"],
    "batch_bound": ["--batches", "2", "--gammas", "4", "--tokens", "16", "--jobs", "2",
                    "--rule", "coupled"],
    "coupled_bar": ["--prompts-n", "2", "--tokens", "8", "--seeds", "0", "--batch-records", "1",
                    "--batch-samples", "2", "--batch-tokens", "8"],
    "drafter_budget": ["--drafters", "models/evspark-sh2-192/drafters/seed0", "--prompts-n", "1",
                       "--tokens", "8", "--gamma", "4", "--rules", "greedy,coupled-t1-k4"],
    "drafter_speed": ["--ways", "models/evspark-sh2-192/drafters/seed0@4", "--prompts-n", "1",
                      "--tokens", "8", "--rules", "greedy"],
    "tree_bar": ["--prompts-n", "2", "--tokens", "16", "--tree-rows", "1,2",
                 "--steady-prompts", "1", "--steady-tokens", "16", "--scales", "0.2",
                 "--batch-records", "2", "--batch-samples", "2", "--batch-tokens", "16"],
    "memory_check": ["--cases", "2k-64x", "--threads", "1", "--tolerance", "10"],
    "mixed_profile": ["--records", "2", "--samples", "1", "--tokens", "4", "--lengths", "64,128",
                      "--equal-length", "96", "--batch-size", "2", "--threads", "1"],
    "embed_check": ["--prompts-n", "2", "--threads", "1"],
    "serve_load": ["--prompts", "2", "--samples", "2", "--tokens", "8", "--clients", "1,2",
                   "--native-requests", "1", "--threads", "1"],
    "serve_faults": ["--flood", "24", "--flood-clients", "24", "--max-queue", "4",
                     "--in-flight", "2", "--drain-tokens", "16", "--shard-records", "4",
                     "--shard-samples", "1", "--tokens", "8", "--threads", "1",
                     "--limit-s", "240"],
    "variant_bar": ["--variants", "3", "--window", "256", "--mutagenesis-bases", "2",
                    "--threads", "1"],
}


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SMOKE))
def test_a_benchmark_script_runs_in_its_smoke_mode(script, tmp_path):
    if script == "fasta_reader" and subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True).returncode:
        pytest.skip("fasta_reader compares with a git revision: not a git checkout")
    out = tmp_path / f"{script}.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / f"{script}.py"),
                          *SMOKE[script], "--out", str(out)], cwd=ROOT, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "EVSPARK_SHARED": str(SHARED)})
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert script in result["provenance"]["command"]
