"""How steady this machine's speed is, and what timing decoders in turns does about it.

    python benchmarks/timing_noise.py --out benchmarks/results/timing_noise.json
    python benchmarks/timing_noise.py --trace-s 2 --records 1 --tokens 16 --repeats 1   # smoke

1. **Trace.** Native decoding runs for `--trace-s` seconds; the mean step time of each
   half-second window shows how the machine's speed drifts while the work stays the same.
2. **Identity drafter against native, two ways.** On the first `--records` example prompts x
   `--tokens` tokens, `--repeats` times: (a) one after the other, the native pass then the
   identity-drafter pass of each prompt, as `--compare-native` timed them before; (b) in turns
   (decode/interleave.py, what `--compare-native`, `verify` and `bench` now do). The identity
   drafter does the same work every time, so the spread of its ratios is the timing's noise.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode.batch import BatchDecoder, JobList  # noqa: E402
from evspark_cli.decode.drafters.base import RngKey  # noqa: E402
from evspark_cli.decode.drafters.registry import resolve_drafter  # noqa: E402
from evspark_cli.decode.interleave import interleave, timed_run  # noqa: E402
from evspark_cli.decode.jobs import Job  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

GAMMA = 12


def trace(model, prompt: tuple[int, ...], seconds: float, sampler) -> list[float]:
    """Mean native step time (ms) per half-second window of native decoding: jobs of 512
    tokens one after another, so the context (and the work of a step) stays the same."""
    dec = BatchDecoder(model, sampler, None, 0)
    jobs = JobList(Job(i, prompt, 512, RngKey(0, i, 0), "trace") for i in range(10 ** 6))
    windows, acc, n = [], 0.0, 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        dec.step(jobs)
        acc, n = acc + time.perf_counter() - t, n + 1
        if acc >= 0.5:
            windows.append(round(1e3 * acc / n, 3))
            acc, n = 0.0, 0
    return windows


def ratio(runs) -> float:
    """Native seconds over identity seconds (both decode the same tokens)."""
    return runs[0].seconds / runs[1].seconds


def one_way(model, drafter, job: Job, sampler, turns: bool) -> float:
    runs = [timed_run(lambda c, d=d: BatchDecoder(model, sampler, d, GAMMA if d else 0, clock=c),
                      JobList(iter([job]))) for d in (None, drafter)]
    if turns:
        interleave(runs)
    else:
        for r in runs:
            interleave([r])
    return ratio(runs)


def spread(xs: list[float]) -> float:
    return (max(xs) - min(xs)) / statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(ROOT / "examples" / "prompts.fa"))
    ap.add_argument("--records", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--trace-s", type=float, default=20.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    model = load_model()
    drafter = resolve_drafter(model, "identity")
    sampler = SamplerConfig(1.0, 4, 1.0)
    prompts = read_prompts([a.prompts])[: a.records]
    jobs = [Job(i, tuple(p.seq.encode()), a.tokens, RngKey(0, i, 0), p.id)
            for i, p in enumerate(prompts)]
    one_way(model, drafter, jobs[0], sampler, True)  # warm
    windows = trace(model, jobs[0].prompt, a.trace_s, sampler)
    print(f"trace: native step {min(windows):.2f}-{max(windows):.2f} ms per half-second window "
          f"({max(windows) / min(windows):.2f}x)", flush=True)
    ways: dict[str, list[float]] = {"one_after_the_other": [], "in_turns": []}
    for _ in range(a.repeats):
        for job in jobs:  # the two ways alternate, so both meet the same drifts
            for name, turns in (("one_after_the_other", False), ("in_turns", True)):
                ways[name].append(round(one_way(model, drafter, job, sampler, turns), 4))
    rows = {}
    for name, xs in ways.items():
        rows[name] = {"ratios": xs, "min": min(xs), "max": max(xs),
                      "median": statistics.median(xs), "spread": round(spread(xs), 4),
                      "above_1": sum(x > 1.0 for x in xs)}
        print(f"identity / native, {name.replace('_', ' ')}: {min(xs):.3f}-{max(xs):.3f} "
              f"(median {statistics.median(xs):.3f}, spread {100 * spread(xs):.0f}%, "
              f"{rows[name]['above_1']} of {len(xs)} above 1)", flush=True)
    result = {"trace_ms_per_window": windows, "trace_window_s": 0.5,
              "trace_max_over_min": round(max(windows) / min(windows), 3),
              "records": len(jobs), "tokens": a.tokens, "repeats": a.repeats, "gamma": GAMMA,
              "sampler": "T=1 top-k 4", "batch": 1, "per_prompt_speedups": rows,
              "threads": torch.get_num_threads(), "provenance": provenance(" ".join(sys.argv))}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
