"""Token trees on idle rows against one chain: single-stream and batched speed, exactness.

    python benchmarks/tree_bar.py --out benchmarks/results/tree_bar.json
    python benchmarks/tree_bar.py --prompts-n 2 --tokens 16 --batch-records 2 \\
        --batch-samples 2 --batch-tokens 16 --out /tmp/t.json            # smoke

Bundled target and dspark drafter (seed 0), the shared 48-prompt suite (else the example
prompts), one process, on whatever threads torch has.

1. **One stream.** For greedy and coupled (T=1 top-k 4) sampling, each prompt is decoded
   natively, then speculatively with one chain (batch 1) and with `--tree-rows N` for each N
   (a batch of 1 + N rows: the job's own row and its branches), right after one another (side
   by side). Every speculative job must equal native decoding token for token. Reported per
   variant: pooled speedup over native, tau, branch rows and wins per round, and the branch
   counts the decoder settled on (its measured choice, `decode/tree.py`).
The measured block-cost tables the decoder's tree sizer reads are made (or read from the cache)
and each decoder runs once before anything is timed.

2. **A batch's tail.** Records x samples x tokens at the default batch, coupled: one chain
   against `--tree-rows` (branches take the rows that finished jobs leave), tokens/s and jobs
   that differ from native.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode.batch import BatchDecoder  # noqa: E402
from evspark_cli.decode.drafters.registry import bundled_drafter_dir, resolve_drafter  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig  # noqa: E402
from evspark_cli.decode.schedule import block_costs  # noqa: E402
from evspark_cli.eval.bench import default_prompts  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions, default_batch_size  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

SAMPLERS = {"greedy": SamplerConfig(1.0, 1, 1.0),
            "coupled-t1-k4": SamplerConfig(1.0, 4, 1.0, "coupled")}


def decode(model, jobs, sampler, drafter, gamma, batch, tree_rows=0):
    """Results by job index, the wall time of the whole run, and the decoder's settled width."""
    dec = BatchDecoder(model, sampler, drafter, gamma if drafter is not None else 0,
                       batch_size=batch, tree_rows=tree_rows)
    t0 = time.perf_counter()
    out = {}
    for o in dec.run(jobs):
        if o.error is not None:
            raise o.error
        out[o.job.index] = o.result
    width = dec.sizer.width if dec.sizer is not None else None
    return out, time.perf_counter() - t0, width


def tally(results) -> dict:
    tokens = sum(len(r.tokens) for r in results.values())
    rounds = sum(r.rounds for r in results.values())
    verified = sum(r.verified for r in results.values())
    return {"tokens": tokens, "tau": round(tokens / rounds, 3) if rounds else None,
            "efficiency": round(tokens / verified, 3) if verified else None,
            "branch_rows_per_round": round(sum(r.branch_rows for r in results.values())
                                           / rounds, 3) if rounds else None,
            "branch_wins_per_round": round(sum(r.branch_wins for r in results.values())
                                           / rounds, 3) if rounds else None}


def differing(native, spec) -> int:
    return sum(native[i].tokens != spec[i].tokens for i in native)


def single_stream(model, prompts, drafter, args, log) -> dict:
    out: dict = {}
    widths = [0] + [int(w) for w in args.tree_rows.split(",")]
    for name, sampler in SAMPLERS.items():
        opts = DecodeOptions(args.tokens, args.gamma, sampler.temperature, sampler.top_k,
                             sampler.top_p, rule=sampler.rule)
        jobs = build_jobs([Record.of(p, model.config.vocab_size) for p in prompts], opts)
        native, native_s = {}, 0.0
        spec = {w: {} for w in widths}
        spec_s = {w: 0.0 for w in widths}
        settled: dict[int, list] = {w: [] for w in widths}
        for job in jobs:
            nat, dt, _ = decode(model, [job], sampler, None, 0, 1)
            native.update(nat)
            native_s += dt
            for w in widths:
                res, dt, width = decode(model, [job], sampler, drafter, args.gamma, 1 + w, w)
                spec[w].update(res)
                spec_s[w] += dt
                settled[w].append(width)
        tokens = sum(len(r.tokens) for r in native.values())
        section = {"native_tokens_per_s": round(tokens / native_s, 1), "variants": {}}
        for w in widths:
            row = {"speedup": round(native_s / spec_s[w], 3),
                   "vs_one_chain": round(spec_s[0] / spec_s[w], 3), **tally(spec[w]),
                   "jobs_differing_from_native": differing(native, spec[w])}
            if w:
                row["settled_widths"] = {str(k): settled[w].count(k)
                                         for k in sorted(set(settled[w]), key=str)}
            section["variants"][f"tree_rows={w}"] = row
            log(f"{name} one stream tree_rows={w}: {row}")
        out[name] = section
    return out


def batched(model, prompts, drafter, args, log) -> dict:
    sampler = SAMPLERS["coupled-t1-k4"]
    opts = DecodeOptions(args.batch_tokens, args.gamma, sampler.temperature, sampler.top_k,
                         sampler.top_p, samples=args.batch_samples, rule=sampler.rule)
    jobs = build_jobs([Record.of(p, model.config.vocab_size)
                       for p in prompts[: args.batch_records]], opts)
    nat, nat_s, _ = decode(model, jobs, sampler, None, 0, args.batch_size)
    tokens = sum(len(r.tokens) for r in nat.values())
    row: dict = {"jobs": len(jobs), "batch_size": args.batch_size,
                 "native_tokens_per_s": round(tokens / nat_s, 1)}
    for w in [0] + [int(w) for w in args.tree_rows.split(",")]:
        res, dt, width = decode(model, jobs, sampler, drafter, args.gamma, args.batch_size, w)
        row[f"tree_rows={w}"] = {"tokens_per_s": round(tokens / dt, 1),
                                 "vs_batched_native": round(nat_s / dt, 3), **tally(res),
                                 "settled_width": width,
                                 "jobs_differing_from_native": differing(nat, res)}
        log(f"batched tree_rows={w}: {row[f'tree_rows={w}']}")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-n", type=int, default=24)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--tree-rows", default="1,2,4", help="the caps tried (comma-separated)")
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--batch-records", type=int, default=16)
    ap.add_argument("--batch-samples", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    model = load_model(ROOT / "models" / "evspark-sh2-192")
    args.batch_size = args.batch_size or default_batch_size(model.device)
    drafter = resolve_drafter(model, bundled_drafter_dir(model, 0))
    prompts = read_prompts([default_prompts()])[: args.prompts_n]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    widths = [int(w) for w in args.tree_rows.split(",")]
    for rows in {1 + w for w in widths} | {args.batch_size}:  # the measured block costs, cached
        block_costs(model, rows, args.gamma + 1)  # before any timing (a first run times them)
    warm = build_jobs([Record.of(prompts[0], model.config.vocab_size)],
                      DecodeOptions(64, args.gamma, rule="coupled"))
    for w in [0] + widths:  # and one untimed run of each decoder
        decode(model, warm, SAMPLERS["coupled-t1-k4"], drafter, args.gamma, 1 + w, w)
    t0 = time.time()
    res: dict = {"provenance": provenance(" ".join(["python", "benchmarks/tree_bar.py",
                                                    *sys.argv[1:]])),
                 "config": {**vars(args), "prompts": len(prompts),
                            "threads": torch.get_num_threads()}}
    res["single_stream"] = single_stream(model, prompts, drafter, args, log)
    res["batched"] = batched(model, prompts, drafter, args, log)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
