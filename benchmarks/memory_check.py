"""Does the memory estimate hold? Each case decodes in a child process, which plans its batch
as `evspark generate` does (`--max-memory`, or a memory cgroup's limit) and reports the
estimate (`generation.plan.peak_estimate`); the parent reads the child's peak resident set
from the kernel (wait4's ru_maxrss) and compares.

    python benchmarks/memory_check.py                      # the default cases
    python benchmarks/memory_check.py --cases 20k-16x-1G   # some of them
    python benchmarks/memory_check.py --cgroup 900M        # also one run in a memory cgroup

A case passes when the run finishes, its peak is within `--tolerance` (20 %) of the estimate and,
with a limit, at or below the limit: `--max-memory` against the resident peak, a cgroup's limit
against the cgroup's own peak count (which leaves out shared library pages another cgroup was
charged for, and adds page cache). Writes benchmarks/results/memory_check.json (`-o`).
Prompts are cut from a shared genome (../shared/data) or, without one, drawn at random.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MIXED = (64, 128, 256, 512, 1024, 2048, 4096, 8192) * 2  # a user's contigs, genes and regions
CASES = {  # name: (prompt bases, or one record per length, samples, batch size or None,
    #               --max-memory or None, new tokens)
    "20k-16x-1G": (20_000, 16, None, "1G", 64),
    "20k-16x-b8": (20_000, 16, 8, None, 64),
    "20k-16x": (20_000, 16, None, None, 64),
    "2k-64x": (2_000, 64, None, None, 128),
    "200k-1x": (200_000, 1, 1, None, 32),
    "200k-16x-4G": (200_000, 16, None, "4G", 32),
    "mixed-16x4": (MIXED, 4, None, None, 256),
    "mixed-16x4-800M": (MIXED, 4, None, "800M", 256),
}
DEFAULT = ["20k-16x-1G", "20k-16x-b8", "2k-64x", "200k-1x", "200k-16x-4G", "mixed-16x4",
           "mixed-16x4-800M"]


@dataclass
class Result:
    case: str
    bases: int | list[int]
    samples: int
    batch: int
    max_memory: str | None
    cgroup: str | None
    estimate_mib: float
    peak_mib: float
    peak_over_estimate: float
    within_limit: bool | None
    seconds: float
    ok: bool
    exit_code: int
    cgroup_peak_mib: float | None  # the cgroup's own peak count (its limit's measure)


def prompt(bases: int, index: int = 0) -> str:
    """`bases` bases of a shared genome ($EVSPARK_SHARED or ../shared) when one is long enough
    (the `index`-th such window from its end, so that records of one length differ), else random
    ones."""
    from evspark_cli.io.fasta import read_prompts

    shared = Path(os.environ.get("EVSPARK_SHARED") or ROOT.parent / "shared")
    want = bases * (index + 1)
    for path in sorted((shared / "data" / "valid").glob("*.fa*")):
        for p in read_prompts([str(path)], prompt_tail=want):
            if len(p.seq) >= want:
                return p.seq[:bases]
    import random

    rng = random.Random(bases * 1000 + index)
    return "".join(rng.choice("ACGT") for _ in range(bases))


def child(spec: dict) -> None:
    """Plan and decode one case in this process; print its batch and estimate as JSON."""
    import torch

    from evspark_cli.api import set_threads
    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.generation.jobs import Record, build_jobs
    from evspark_cli.generation.options import DecodeOptions
    from evspark_cli.generation.plan import peak_estimate, plan_batch
    from evspark_cli.generation.run import GenerationRun
    from evspark_cli.model.checkpoint import load_model

    set_threads(spec["threads"])
    bases = spec["bases"]
    lengths = bases if isinstance(bases, list) else [bases]
    seqs = {f"p{i}_{n}": prompt(n, i) for i, n in enumerate(lengths)}
    model = load_model(None, max_memory=spec["max_memory"])
    drafter = resolve_drafter(model, "auto")
    options = DecodeOptions(spec["tokens"], 12, 1.0, 4, 1.0, 0, spec["samples"])
    jobs = build_jobs(Record.listed(seqs, model.config.vocab_size), options)
    rows = plan_batch(model, jobs, options, drafter, spec["batch"], spec["max_memory"])
    estimate = peak_estimate(model, jobs, options, drafter, rows)
    print(json.dumps({"batch": rows, "estimate": estimate}), flush=True)
    with torch.inference_mode():
        for outcome in GenerationRun(model, drafter, options, rows).outcomes(jobs):
            if outcome.error is not None:
                raise outcome.error


def cgroup_for(limit: str) -> Path:
    """A fresh memory cgroup (v2, else v1) limited to `limit`; needs the right to create one."""
    from evspark_cli.model.memory import parse_size

    nbytes = parse_size(limit)
    name = f"evspark-memory-check-{os.getpid()}"
    v2 = Path("/sys/fs/cgroup/unified") if Path("/sys/fs/cgroup/unified").is_dir() else None
    v1 = Path("/sys/fs/cgroup/memory")
    if v1.is_dir():
        folder = v1 / name
        folder.mkdir()
        (folder / "memory.limit_in_bytes").write_text(str(nbytes))
        return folder
    base = v2 or Path("/sys/fs/cgroup")
    folder = base / name
    folder.mkdir()
    (folder / "memory.max").write_text(str(nbytes))
    return folder


def run_case(name: str, threads: int, cgroup: str | None) -> Result:
    bases, samples, batch, max_memory, tokens = CASES[name]
    if cgroup is not None:
        max_memory = None  # the cgroup is the limit: the child must find it by itself
    spec = dict(bases=bases, samples=samples, batch=batch, max_memory=max_memory,
                tokens=tokens, threads=threads)
    folder = cgroup_for(cgroup) if cgroup is not None else None

    def enter() -> None:
        if folder is not None:
            (folder / "cgroup.procs").write_text(str(os.getpid()))

    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps(spec)],
                            stdout=subprocess.PIPE, text=True, preexec_fn=enter)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.monotonic() - t0
    charged = None  # what the cgroup counted at its peak: the limit applies to that
    if folder is not None:
        for counter in ("memory.max_usage_in_bytes", "memory.peak"):
            if (folder / counter).is_file():
                charged = int((folder / counter).read_text().split()[0])
                break
        folder.rmdir()
    planned = json.loads(out.splitlines()[0]) if out.strip() else {"batch": 0, "estimate": 0}
    peak = usage.ru_maxrss * 1024
    est = planned["estimate"]
    limit = cgroup or max_memory
    within = None
    if limit is not None:
        from evspark_cli.model.memory import parse_size

        within = (charged if charged is not None else peak) <= parse_size(limit)
    ratio = peak / est if est else float("inf")
    ok = proc.returncode == 0 and abs(ratio - 1) <= ARGS.tolerance and within is not False
    return Result(name, bases, samples, planned["batch"], max_memory, cgroup,
                  round(est / 2**20, 1), round(peak / 2**20, 1), round(ratio, 3), within,
                  round(seconds, 1), ok, proc.returncode,
                  None if charged is None else round(charged / 2**20, 1))


def main() -> int:
    from evspark_cli.eval.provenance import provenance

    results = [run_case(c, ARGS.threads, None) for c in ARGS.cases]
    if ARGS.cgroup:
        results.append(run_case(ARGS.cgroup_case, ARGS.threads, ARGS.cgroup))
    for r in results:
        print(f"{r.case:14} batch {r.batch:3}  estimate {r.estimate_mib:8.1f} MiB  peak "
              f"{r.peak_mib:8.1f} MiB  peak/estimate {r.peak_over_estimate:.2f}  "
              f"limit {'-' if r.within_limit is None else 'held' if r.within_limit else 'BROKEN'}"
              f"  {'ok' if r.ok else 'FAIL'}  ({r.seconds:.0f} s)"
              + (f"  [cgroup {r.cgroup}: its peak {r.cgroup_peak_mib} MiB, exit {r.exit_code}]"
                 if r.cgroup else ""))
    report = {"provenance": provenance(command=" ".join(sys.argv)),
              "tolerance": ARGS.tolerance, "results": [asdict(r) for r in results]}
    Path(ARGS.output).parent.mkdir(parents=True, exist_ok=True)
    Path(ARGS.output).write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--cases", nargs="+", default=DEFAULT, choices=sorted(CASES))
    ap.add_argument("--cgroup", help="also run --cgroup-case in a memory cgroup of this size")
    ap.add_argument("--cgroup-case", default="20k-16x", choices=sorted(CASES))
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tolerance", type=float, default=0.2)
    ap.add_argument("-o", "--output", "--out",
                    default=str(ROOT / "benchmarks/results/memory_check.json"))
    ARGS = ap.parse_args()
    if ARGS.child:
        child(json.loads(ARGS.child))
        sys.exit(0)
    sys.exit(main())
