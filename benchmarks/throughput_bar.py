"""Batched throughput on a CPU, end to end: the figures of docs/performance.md's throughput rows.

    python benchmarks/throughput_bar.py --out benchmarks/results/throughput.json
    python benchmarks/throughput_bar.py --quick --out /tmp/t.json      # a smoke run, minutes

Four measurements, each side by side in one run on this machine:
1. batch-size sweep (part of the workload): tokens/s of batched native and speculative
   decoding at each batch size; the best speculative batch is the CPU default's evidence. Each
   slice of the sweep holds 192 jobs by default (24 prompts x 8 samples), a multiple of every
   batch size swept, so that every batch runs full and none is capped by a short slice;
2. the workload (48 shared prompts x 8 samples x 512 new tokens, sampled T=1 top-k 4) at one
   batch size: batched speculative vs single-stream native and vs batched native, the modes
   interleaved slice by slice, a batch size's native and speculative decoders in turns
   (eval/throughput.py);
3. `--samples 8` from one long prompt (65,536 bases cut from a genome): the whole
   `evspark generate` command, batched, against 8 separate single-stream native commands;
4. peak memory (max RSS of a whole `evspark generate` process) at the default batch for
   1k, 8k and 65k-base prompts;
plus 5. single-stream speed against an earlier commit (`--baseline-rev`): `evs.generate` on the
same prompts and seeds in both trees, alternating, with the tokens compared; and 6. (`mixed`)
mixed prompt lengths: `--mixed-records` prompts cut from `--genome` at lengths spread on a log
scale over 64..16,384 bases with 1-4 samples each, next to as many prompts of 1,000 bases with
the same samples and tokens (eval/throughput.py's `mixed_workload`), native and speculative at
batch 1 and the workload's batch.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("EVSPARK_SHARED", ROOT.parent / "shared"))


def _shared_or_examples(*parts: str) -> Path:
    """A file of the shared data folder when there is one, else the bundled example prompts."""
    path = SHARED.joinpath(*parts)
    return path if path.is_file() else ROOT / "examples" / "prompts.fa"


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout.strip()


_MEASURE = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
err = p.stderr.read().decode(errors="replace")
_, status, usage = os.wait4(p.pid, 0)
print(json.dumps([time.perf_counter() - t0, usage.ru_maxrss / 1024,
                  os.waitstatus_to_exitcode(status), err[-500:]]))
"""


def timed_command(cmd: list[str], env: dict | None = None) -> tuple[float, float, int]:
    """(wall seconds, peak RSS MiB, exit code) of one whole command (its own process).

    The command is started by a small Python process: a child's peak RSS counts the memory of
    the process it was forked from (Linux keeps the high-water mark across exec), and this
    process holds a model and its batches."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, *cmd], env=env, capture_output=True,
                         text=True, check=True)
    wall, rss, code, err = json.loads(out.stdout.strip().splitlines()[-1])
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} -> {code}: {err}")
    return wall, rss, code


def sweep_and_workload(args, log) -> dict:
    import torch

    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.eval.throughput import ThroughputConfig, measure_throughput
    from evspark_cli.io.fasta import read_prompts
    from evspark_cli.model.checkpoint import load_model

    torch.set_num_threads(args.threads)
    model = load_model(None)
    drafter = resolve_drafter(model, "auto")
    prompts = read_prompts([str(args.prompts)])
    out: dict = {}
    sizes = [int(x) for x in args.sweep.split(",")]
    per_slice = -(-min(args.sweep_records, len(prompts)) // args.sweep_slices) * args.samples
    if per_slice < max(sizes):
        raise SystemExit(f"a sweep slice holds {per_slice} jobs, fewer than batch {max(sizes)}: "
                         "raise --sweep-records or lower --sweep-slices")
    scfg = ThroughputConfig(records=args.sweep_records, samples=args.samples,
                            new_tokens=args.sweep_tokens, batch_sizes=sizes, gamma=12,
                            slices=args.sweep_slices)
    out["sweep"] = measure_throughput(model, prompts, drafter, scfg, log)
    spec = {r["batch_size"]: r["tokens_per_s"] for r in out["sweep"]["modes"].values()
            if r["decoder"] == "speculative"}
    best = max(spec, key=spec.get)
    out["sweep"]["best_speculative_batch"] = best
    batch = args.batch or best
    wcfg = ThroughputConfig(records=args.records, samples=args.samples,
                            new_tokens=args.tokens, batch_sizes=[1, batch], gamma=12,
                            slices=args.slices)
    out["workload"] = measure_throughput(model, prompts, drafter, wcfg, log)
    out["workload"]["batch_size"] = batch
    return out


def mixed_lengths_workload(args, log) -> dict:
    import torch

    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.eval.throughput import (
        ThroughputConfig,
        measure_throughput,
        mixed_workload,
        throughput_options,
    )
    from evspark_cli.generation.options import CPU_BATCH
    from evspark_cli.io.fasta import read_prompts
    from evspark_cli.model.checkpoint import load_model

    torch.set_num_threads(args.threads)
    model = load_model(None)
    drafter = resolve_drafter(model, "auto")
    source = [p.seq for p in read_prompts([str(args.genome)])]
    batch = args.batch or CPU_BATCH
    cfg = ThroughputConfig(new_tokens=args.mixed_tokens, batch_sizes=[1, batch], gamma=12,
                           slices=args.mixed_slices)
    opts, vocab = throughput_options(cfg), model.config.vocab_size
    out: dict = {}
    for name, equal in (("mixed", None), ("equal", 1000)):
        jobs = mixed_workload(source, args.mixed_records, opts, vocab, (64, args.mixed_longest),
                              equal_length=equal)
        out[name] = measure_throughput(model, [], drafter, cfg, lambda m: log(f"{name} {m}"),
                                       jobs=jobs)
    spec = f"speculative/b{batch}"
    mixed, equal = out["mixed"]["modes"], out["equal"]["modes"]
    out["summary"] = {
        "batch_size": batch,
        "mixed_batch_gain": round(mixed[spec]["tokens_per_s"]
                                  / mixed["speculative/b1"]["tokens_per_s"], 3),
        "mixed_over_equal": round(mixed[spec]["tokens_per_s"] / equal[spec]["tokens_per_s"], 3),
        "mixed_vs_native_single": round(mixed[spec]["tokens_per_s"]
                                        / mixed["native/b1"]["tokens_per_s"], 3)}
    return out


def long_prompt_samples(args, log) -> dict:
    """`generate --samples 8` from one long prompt vs 8 single-stream native commands."""
    from evspark_cli.io.fasta import read_prompts

    genome = read_prompts([str(args.genome)])[0].seq
    tmp = Path(tempfile.mkdtemp())
    fa = tmp / "long.fa"
    fa.write_text(f">long\n{genome[: args.long_context]}\n")
    evspark = [sys.executable, "-m", "evspark_cli.cli"]
    common = ["-n", str(args.long_tokens), "--threads", str(args.threads), "-q"]
    batched_cmd = evspark + ["generate", str(fa), "--samples", "8", "-o", str(tmp / "b.fa"),
                             *common]
    wall_b, rss_b, _ = timed_command(batched_cmd)
    log(f"samples 8 batched: {wall_b:.1f} s, peak RSS {rss_b:.0f} MiB")
    natives = []
    for s in range(8):
        cmd = evspark + ["generate", str(fa), "--drafter", "none", "--batch-size", "1",
                         "--seed", str(s), "-o", str(tmp / f"n{s}.fa"), *common]
        natives.append(timed_command(cmd)[0])
        log(f"native run {s + 1}/8: {natives[-1]:.1f} s")
    shutil.rmtree(tmp, ignore_errors=True)
    return {"context": args.long_context, "new_tokens": args.long_tokens,
            "batched_command": " ".join(batched_cmd[2:]), "batched_wall_s": round(wall_b, 2),
            "batched_peak_rss_mib": round(rss_b),
            "native_runs_wall_s": [round(x, 2) for x in natives],
            "native_total_wall_s": round(sum(natives), 2),
            "speedup": round(sum(natives) / wall_b, 3)}


def peak_memory(args, log) -> list[dict]:
    """Max RSS of `generate` at the default batch (its rows all prompts of one length)."""
    from evspark_cli.io.fasta import read_prompts

    genome = read_prompts([str(args.genome)])[0].seq
    out = []
    for L in (1024, 8192, 65536):
        tmp = Path(tempfile.mkdtemp())
        fa = tmp / "p.fa"
        fa.write_text(f">ctx{L}\n{genome[:L]}\n")
        cmd = [sys.executable, "-m", "evspark_cli.cli", "generate", str(fa), "--samples",
               str(args.memory_rows), "-n", "64", "--threads", str(args.threads), "-q", "-o",
               str(tmp / "o.fa")]
        wall, rss, _ = timed_command(cmd)
        out.append({"context": L, "rows": args.memory_rows, "peak_rss_mib": round(rss),
                    "wall_s": round(wall, 2)})
        log(f"memory at {L}: {rss:.0f} MiB")
        shutil.rmtree(tmp, ignore_errors=True)
    return out


_SINGLE = """
import json, sys, time, torch
import evspark_cli as evs
from evspark_cli.io.fasta import read_prompts
torch.set_num_threads(int(sys.argv[3]))
m = evs.load_model()
ps = read_prompts([sys.argv[1]])[: int(sys.argv[2])]
toks, t = [], 0.0
for i, p in enumerate(ps):
    t0 = time.perf_counter()
    out = evs.generate(m, p.seq, max_new_tokens=int(sys.argv[4]), seed=i, record=i)
    t += time.perf_counter() - t0
    toks.append(out.tokens)
print(json.dumps({"seconds": t, "tokens": toks}))
"""


def single_stream_vs_baseline(args, log) -> dict:
    """`evs.generate` (batch of one) in this tree and in `--baseline-rev`, alternating."""
    tmp = Path(tempfile.mkdtemp())
    base = tmp / "baseline"
    base.mkdir()
    subprocess.run(f"git archive {args.baseline_rev} | tar -x -C {base}", shell=True, cwd=ROOT,
                   check=True, executable="/bin/bash")
    trees = {"this": ROOT, "baseline": base}
    times: dict[str, list[float]] = {k: [] for k in trees}
    tokens: dict[str, list] = {}
    for r in range(args.rounds):
        for name, tree in (trees.items() if r % 2 == 0 else reversed(list(trees.items()))):
            env = dict(os.environ, PYTHONPATH=str(tree))
            res = subprocess.run([sys.executable, "-c", _SINGLE, str(args.prompts),
                                  str(args.single_prompts), str(args.threads),
                                  str(args.single_tokens)], env=env, cwd=tmp,
                                 capture_output=True, text=True, check=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            times[name].append(got["seconds"])
            tokens[name] = got["tokens"]
            log(f"single-stream {name} round {r + 1}: {got['seconds']:.1f} s")
    shutil.rmtree(tmp, ignore_errors=True)
    n = args.single_prompts * args.single_tokens
    return {"baseline_rev": git("rev-parse", args.baseline_rev), "prompts": args.single_prompts,
            "new_tokens": args.single_tokens, "rounds": args.rounds,
            "seconds": times, "tokens_per_s": {k: round(n / statistics.median(v), 1)
                                               for k, v in times.items()},
            "ratio_this_over_baseline": round(statistics.median(times["baseline"])
                                              / statistics.median(times["this"]), 3),
            "same_tokens": tokens["this"] == tokens["baseline"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    ap.add_argument("--prompts", default=str(_shared_or_examples("data", "prompts.fa")),
                    help="default: the shared 48-prompt suite, else the example prompts")
    ap.add_argument("--genome", default=str(_shared_or_examples("data", "valid",
                                                                "ecoli_536.fa.gz")),
                    help="long prompts are cut from it (default: E. coli 536 from the shared "
                    "folder, else the example prompts)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--records", type=int, default=48)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--slices", type=int, default=6)
    ap.add_argument("--batch", type=int, default=0, help="workload batch (0: the sweep's best)")
    ap.add_argument("--sweep", default="1,2,4,8,12,16,24,32,48")
    ap.add_argument("--sweep-records", type=int, default=24)
    ap.add_argument("--sweep-slices", type=int, default=1)
    ap.add_argument("--sweep-tokens", type=int, default=256)
    ap.add_argument("--long-context", type=int, default=65536)
    ap.add_argument("--long-tokens", type=int, default=512)
    ap.add_argument("--memory-rows", type=int, default=16)
    ap.add_argument("--baseline-rev", default="")
    ap.add_argument("--single-prompts", type=int, default=12)
    ap.add_argument("--single-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--mixed-records", type=int, default=16)
    ap.add_argument("--mixed-longest", type=int, default=16384)
    ap.add_argument("--mixed-tokens", type=int, default=256)
    ap.add_argument("--mixed-slices", type=int, default=1)
    ap.add_argument("--parts", default="sweep,long,memory,single,mixed")
    a = ap.parse_args()
    if a.quick:
        a.records, a.samples, a.tokens, a.slices = 4, 2, 32, 2
        a.sweep, a.sweep_records, a.sweep_tokens, a.sweep_slices = "1,4", 4, 24, 1
        a.long_context, a.long_tokens, a.memory_rows = 2048, 16, 4
        a.single_prompts, a.single_tokens, a.rounds = 2, 16, 2
        a.mixed_records, a.mixed_longest, a.mixed_tokens = 4, 2048, 16
    parts = set(a.parts.split(","))
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    from evspark_cli.eval.provenance import provenance

    res: dict = {"provenance": provenance(" ".join(["python", "benchmarks/throughput_bar.py",
                                                   *sys.argv[1:]]))}
    t0 = time.time()
    if "sweep" in parts:
        res.update(sweep_and_workload(a, log))
    if "long" in parts:
        res["samples_from_long_prompt"] = long_prompt_samples(a, log)
    if "memory" in parts:
        res["peak_memory"] = peak_memory(a, log)
    if "mixed" in parts:
        res["mixed_lengths"] = mixed_lengths_workload(a, log)
    if "single" in parts and a.baseline_rev:
        res["single_stream"] = single_stream_vs_baseline(a, log)
    res["wall_s"] = round(time.time() - t0)
    Path(a.out).write_text(json.dumps(res, indent=1))
    log(f"wrote {a.out}")


if __name__ == "__main__":
    main()
