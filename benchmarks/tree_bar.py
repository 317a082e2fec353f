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

2. **Steady state.** On the first `--steady-prompts` prompts, coupled, every width 0..max cap
   held fixed for the whole job (no timed trials): milliseconds per round, tau and tokens/s,
   what the sizer weighs.
3. **The planner's path scale**, on held-out genomes (`shared/data/valid`, prompts cut at
   1,000 and 3,200 bases): tau and branch wins per round at fixed widths 1 and 3 for each scale
   of `--scales` (`decode/drafters/dspark.py`'s PATH_SCALE), coupled.
4. **A batch's tail.** Records x samples x tokens at the default batch, coupled: one chain
   against `--tree-rows` (branches take the rows that finished jobs leave), tokens/s and jobs
   that differ from native.
"""
from __future__ import annotations

import argparse
import json
import os
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
from evspark_cli.decode.tree import TreeSizer  # noqa: E402
import evspark_cli.decode.drafters.dspark as dspark  # noqa: E402
from evspark_cli.eval.bench import default_prompts  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions, default_batch_size  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

SAMPLERS = {"greedy": SamplerConfig(1.0, 1, 1.0),
            "coupled-t1-k4": SamplerConfig(1.0, 4, 1.0, "coupled")}


def decode(model, jobs, sampler, drafter, gamma, batch, tree_rows=0, fixed=False):
    """Results by job index, the wall time of the whole run, and the decoder's settled width
    (`fixed`: `tree_rows` branches from the first round on, never timed or changed)."""
    dec = BatchDecoder(model, sampler, drafter, gamma if drafter is not None else 0,
                       batch_size=batch, tree_rows=tree_rows)
    if fixed and tree_rows:
        dec.sizer = TreeSizer(block_costs(model, batch, gamma + 1), tree_rows,
                              decided=tree_rows)
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


def steady(model, prompts, drafter, args, log) -> dict:
    """Coupled, each width held fixed: time per round, tau, tokens/s (jobs interleaved)."""
    sampler = SAMPLERS["coupled-t1-k4"]
    opts = DecodeOptions(args.steady_tokens, args.gamma, rule="coupled")
    jobs = build_jobs([Record.of(p, model.config.vocab_size)
                       for p in prompts[: args.steady_prompts]], opts)
    widths = range(max(int(w) for w in args.tree_rows.split(",")) + 1)
    secs = {w: 0.0 for w in widths}
    got: dict[int, dict] = {w: {} for w in widths}
    for job in jobs:
        for w in widths:
            res, dt, _ = decode(model, [job], sampler, drafter, args.gamma, 1 + w, w, fixed=True)
            got[w].update(res)
            secs[w] += dt
    out = {}
    for w in widths:
        t = tally(got[w])
        rounds = sum(r.rounds for r in got[w].values())
        out[f"width={w}"] = {"ms_per_round": round(1000 * secs[w] / rounds, 3),
                             "tokens_per_s": round(t["tokens"] / secs[w], 1), **t}
        log(f"steady width={w}: {out[f'width={w}']}")
    return out


def held_out_prompts(n: int) -> list:
    """Prompts cut from the held-out genomes at 1,000 and 3,200 bases (1,500 bases each)."""
    import gzip

    from Bio import SeqIO

    from evspark_cli.io.types import Prompt

    folder = Path(os.environ.get("EVSPARK_SHARED") or ROOT.parent / "shared") / "data" / "valid"
    out = []
    for f in sorted(folder.glob("*.fa*")):
        with (gzip.open if f.suffix == ".gz" else open)(f, "rt") as h:
            seq = str(next(SeqIO.parse(h, "fasta")).seq).upper()
        for a in (1000, 3200):
            if len(seq) >= a + 1500:
                out.append(Prompt(f"{f.stem}:{a}", "", seq[a: a + 1500], str(f)))
    return out[:n]


def scales(model, drafter, args, log) -> dict:
    """Tau and branch wins per round at fixed widths 1 and 3 for each path scale."""
    prompts = held_out_prompts(8)
    if not prompts:
        return {"skipped": "no shared/data/valid genomes beside the repository"}
    sampler = SAMPLERS["coupled-t1-k4"]
    opts = DecodeOptions(args.steady_tokens // 2, args.gamma, rule="coupled")
    jobs = build_jobs([Record.of(p, model.config.vocab_size) for p in prompts], opts)
    out: dict = {"prompts": len(prompts)}
    kept = dspark.PATH_SCALE
    try:
        for scale in (float(x) for x in args.scales.split(",")):
            dspark.PATH_SCALE = scale
            for w in (0, 1, 3) if scale == float(args.scales.split(",")[0]) else (1, 3):
                res: dict = {}
                for job in jobs:
                    res.update(decode(model, [job], sampler, drafter, args.gamma, 1 + w, w,
                                      fixed=True)[0])
                key = "width=0" if w == 0 else f"scale={scale}/width={w}"
                out[key] = tally(res)
                log(f"held-out {key}: {out[key]}")
    finally:
        dspark.PATH_SCALE = kept
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
    ap.add_argument("--steady-prompts", type=int, default=6)
    ap.add_argument("--steady-tokens", type=int, default=512)
    ap.add_argument("--scales", default="0.05,0.1,0.2,0.3,1.0,3.0")
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
    for rows in set(range(1, max(widths) + 2)) | {4, args.batch_size}:  # block costs, cached
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
    res["steady"] = steady(model, prompts, drafter, args, log)
    res["path_scales"] = scales(model, drafter, args, log)
    res["batched"] = batched(model, prompts, drafter, args, log)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
