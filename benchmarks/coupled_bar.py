"""The coupled rule side by side with the residual rule: exactness, single-stream and batched speed.

    python benchmarks/coupled_bar.py --out benchmarks/results/coupled_bar.json
    python benchmarks/coupled_bar.py --prompts-n 2 --tokens 8 --seeds 0 --batch-records 1 \\
        --batch-samples 2 --batch-tokens 8 --out /tmp/c.json          # smoke

Bundled target and dspark drafters, the shared 48-prompt suite (else the example prompts),
one process, on whatever threads torch has.

1. **Exactness and one stream.** For each sampler (coupled T=1 top-k 4 and coupled T=0.7 top-p
   0.9), each prompt is decoded natively and speculatively with each drafter seed at batch 1,
   all at once in turns (decode/interleave.py); the same jobs then run speculatively at the default batch.
   Every speculative job must equal the native job token for token (divergences are counted
   and classified as ties by the perturbed-score gap). Greedy decoding and residual sampling
   (T=1 top-k 4) run the same single-stream pairs for the first seed, as the baselines the
   coupled rule is compared with; the single-stream section also tries `--gamma 16` and the
   confidence draft length with caps `--gamma` and 16.
2. **Batches.** Records x samples x tokens at the default batch: batched native, batched
   speculative (fixed and confidence draft length) under each rule, in turns, and the tokens/s of
   single-stream native decoding measured in section 1 as the single-stream baseline.
3. **Rule against rule** (`--parts rules`, the evidence for the default rule). Sections 1 and 2
   time each rule's native/speculative pair in its own turns, so a comparison of one rule's
   speed with the other's carries the machine's drift between them. Here native and speculative
   decoding under both rules (T=1 top-k 4, fixed gamma, the first drafter seed) take turns as
   four decoders at once: one stream (`--rules-prompts` prompts x `--rules-tokens` tokens, job
   by job at batch 1) and the default batch (the batch section's records x samples x tokens).
   Reported: each rule's speedup over native decoding of its rule, and coupled speculative
   seconds over residual speculative seconds (above 1: coupled is the faster).
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

from evspark_cli.decode.batch import BatchDecoder, JobList  # noqa: E402
from evspark_cli.decode.interleave import interleave, timed_run  # noqa: E402
from evspark_cli.decode.drafters.registry import bundled_drafter_dir, resolve_drafter  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig  # noqa: E402
from evspark_cli.eval.bench import default_prompts  # noqa: E402
from evspark_cli.eval.compare import compare_greedy, default_tie_tolerance  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions, default_batch_size  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

SAMPLERS = {"coupled-t1-k4": SamplerConfig(1.0, 4, 1.0, "coupled"),
            "coupled-t0.7-p0.9": SamplerConfig(0.7, 0, 0.9, "coupled")}
BASELINES = {"greedy": SamplerConfig(1.0, 1, 1.0), "residual-t1-k4": SamplerConfig(1.0, 4, 1.0)}


def decode(model, jobs, sampler, drafter, gamma, batch, adaptive=False, margins=False):
    """Results by job index and the wall time of the whole run."""
    return in_turns(model, jobs, sampler, [(drafter, gamma, adaptive)], batch, margins)[0]


def in_turns(model, jobs, sampler, ways, batch, margins=False) -> list[tuple[dict, float]]:
    """The same jobs through one decoder per (drafter, gamma, adaptive) of `ways`, all at once
    in turns (decode/interleave.py): per way, results by job index and its decoder's seconds."""
    runs = [timed_run(lambda clock, d=d, g=g, a=a: BatchDecoder(
        model, sampler, d, g if d is not None else 0, batch_size=batch, adaptive=a,
        track_margins=margins and d is None, clock=clock), JobList(iter(jobs)))
        for d, g, a in ways]
    interleave(runs)
    out = []
    for r in runs:
        got = {}
        for o in r.outcomes:
            if o.error is not None:
                raise o.error
            got[o.job.index] = o.result
        out.append((got, r.seconds))
    return out


def tally(results) -> dict:
    tokens = sum(len(r.tokens) for r in results.values())
    rounds = sum(r.rounds for r in results.values())
    verified = sum(r.verified for r in results.values())
    return {"tokens": tokens, "tau": round(tokens / rounds, 3) if rounds else None,
            "efficiency": round(tokens / verified, 3) if verified else None}


def divergences(native, spec, tie: float) -> dict:
    """Jobs compared token for token; a divergence is a tie below `tie` (`evspark verify`'s
    default for the model's dtype: 1e-3 in fp32, 0.1 in bf16)."""
    rows = [compare_greedy(str(i), native[i], spec[i], tie) for i in native]
    bad = [r for r in rows if r["divergence"] is not None and not r["tie"]]
    return {"jobs": len(rows), "identical": sum(r["divergence"] is None for r in rows),
            "ties": sum(r["tie"] for r in rows), "non_tie_divergences": len(bad),
            "non_tie_margins": sorted(round(r["native_margin"], 4) for r in bad
                                      if r["native_margin"] is not None)}


def single_stream(model, prompts, drafters, args, log) -> dict:
    """Per sampler: native then each drafter at batch 1, prompt by prompt; then the same jobs
    at the default batch, every job compared with native token for token."""
    out: dict = {}
    samplers = {**SAMPLERS, **BASELINES}
    for name, sampler in samplers.items():
        coupled_or_greedy = sampler.coupled or sampler.greedy
        opts = DecodeOptions(args.tokens, args.gamma, sampler.temperature, sampler.top_k,
                             sampler.top_p, rule=sampler.rule)
        jobs = build_jobs([Record.of(p, model.config.vocab_size) for p in prompts], opts)
        seeds = drafters if name in SAMPLERS else dict(list(drafters.items())[:1])
        variants = [(s, args.gamma, False) for s in seeds]
        if coupled_or_greedy:  # the cap and the schedule, for the first seed
            first = next(iter(seeds))
            variants += [(first, 16, False), (first, args.gamma, True), (first, 16, True)]
            variants = list(dict.fromkeys(variants))  # --gamma 16: each variant once
        native_s, spec_s = 0.0, {v: 0.0 for v in variants}
        native, spec = {}, {v: {} for v in variants}
        ways = [(None, 0, False)] + [(drafters[s], g, a) for s, g, a in variants]
        for job in jobs:  # native and every variant of one job in turns
            (nat, dt), *specs = in_turns(model, [job], sampler, ways, 1, coupled_or_greedy)
            native.update(nat)
            native_s += dt
            for v, (res, dt) in zip(variants, specs):
                spec[v].update(res)
                spec_s[v] += dt
        n_tokens = sum(len(r.tokens) for r in native.values())
        section = {"native_tokens_per_s": round(n_tokens / native_s, 1), "single_stream": {}}
        for v in variants:
            seed, gamma, adaptive = v
            key = f"{seed}/gamma{gamma}/{'confidence' if adaptive else 'fixed'}"
            row = {"speedup": round(native_s / spec_s[v], 3), **tally(spec[v])}
            if coupled_or_greedy:
                row["vs_native"] = divergences(native, spec[v], args.tie)
            section["single_stream"][key] = row
            log(f"{name} b1 {key}: {row}")
        if name in SAMPLERS:  # exactness at the default batch, every seed
            section["default_batch"] = {}
            for seed, d in seeds.items():
                res, dt = decode(model, jobs, sampler, d, args.gamma, args.batch_size)
                row = {"seconds": round(dt, 2), **tally(res), "vs_native": divergences(native, res,
                                                                                       args.tie)}
                section["default_batch"][seed] = row
                log(f"{name} b{args.batch_size} {seed}: {row}")
        out[name] = section
    return out


def batched(model, prompts, drafter, args, single_native: dict, log) -> dict:
    """Records x samples x tokens at the default batch, native and speculative per rule."""
    out: dict = {}
    for name, sampler in (("residual-t1-k4", BASELINES["residual-t1-k4"]),
                          ("coupled-t1-k4", SAMPLERS["coupled-t1-k4"])):
        opts = DecodeOptions(args.batch_tokens, args.gamma, sampler.temperature, sampler.top_k,
                             sampler.top_p, samples=args.batch_samples, rule=sampler.rule)
        jobs = build_jobs([Record.of(p, model.config.vocab_size)
                           for p in prompts[: args.batch_records]], opts)
        modes = [("fixed", False)] + ([("confidence", True)] if sampler.coupled else [])
        (nat, nat_s), *specs = in_turns(model, jobs, sampler, [(None, 0, False)] + [
            (drafter, args.gamma, adaptive) for _, adaptive in modes], args.batch_size)
        tokens = sum(len(r.tokens) for r in nat.values())
        row = {"jobs": len(jobs), "native_tokens_per_s": round(tokens / nat_s, 1)}
        for (mode, _), (res, dt) in zip(modes, specs):
            tps = tokens / dt
            row[mode] = {"tokens_per_s": round(tps, 1),
                         "vs_batched_native": round(tps / row["native_tokens_per_s"], 3),
                         **tally(res)}
            if name in single_native:  # the single-stream section ran
                row[mode]["vs_single_stream_native"] = round(
                    tps / single_native[name]["native_tokens_per_s"], 3)
            if sampler.coupled:
                row[mode]["jobs_differing_from_native"] = sum(
                    res[i].tokens != nat[i].tokens for i in nat)
        differing = any(res[i].tokens != nat[i].tokens for res, _ in specs for i in nat)
        if sampler.coupled and differing:  # classify them: native again, untimed, with the
            # perturbed-score margins (tracking them would slow the timed native run)
            (again, _), = in_turns(model, jobs, sampler, [(None, 0, False)], args.batch_size,
                                   margins=True)
            row["native_rerun_equal"] = all(again[i].tokens == nat[i].tokens for i in nat)
            for (mode, _), (res, _) in zip(modes, specs):
                row[mode]["vs_native"] = divergences(again, res, args.tie)
        out[name] = row
        log(f"batched {name}: {row}")
    return out


def rules_side_by_side(model, prompts, drafter, args, log) -> dict:
    """Native and speculative decoding under both rules in one set of turns, one stream and at
    the default batch (section 3 of the module docstring)."""
    samplers = {"residual": BASELINES["residual-t1-k4"], "coupled": SAMPLERS["coupled-t1-k4"]}

    def jobs_of(sampler, n_prompts, tokens, samples):
        opts = DecodeOptions(tokens, args.gamma, sampler.temperature, sampler.top_k,
                             sampler.top_p, samples=samples, rule=sampler.rule)
        return build_jobs([Record.of(p, model.config.vocab_size) for p in prompts[:n_prompts]],
                          opts)

    def four_ways(job_lists, batch):
        """Seconds and results per (rule, native|speculative), all four decoders in turns."""
        runs = {}
        for rule, sampler in samplers.items():
            for mode, d in (("native", None), ("speculative", drafter)):
                runs[rule, mode] = timed_run(lambda clock, s=sampler, d=d: BatchDecoder(
                    model, s, d, args.gamma if d is not None else 0, batch_size=batch,
                    clock=clock), JobList(iter(job_lists[rule])))
        interleave(list(runs.values()))
        out = {}
        for key, run in runs.items():
            got = {}
            for o in run.outcomes:
                if o.error is not None:
                    raise o.error
                got[o.job.index] = o.result
            out[key] = (got, run.seconds)
        return out

    def summary(timed: list[dict]) -> dict:
        secs = {k: sum(t[k][1] for t in timed) for k in timed[0]}
        row: dict = {}
        for rule in samplers:
            merged = {i: r for t in timed for i, r in t[rule, "speculative"][0].items()}
            native = {i: r for t in timed for i, r in t[rule, "native"][0].items()}
            tokens = sum(len(r.tokens) for r in native.values())
            row[rule] = {"native_tokens_per_s": round(tokens / secs[rule, "native"], 1),
                         "speculative_tokens_per_s": round(tokens / secs[rule, "speculative"], 1),
                         "speedup": round(secs[rule, "native"] / secs[rule, "speculative"], 3),
                         **tally(merged)}
        row["coupled_over_residual"] = round(secs["residual", "speculative"]
                                             / secs["coupled", "speculative"], 3)
        row["native_coupled_over_residual"] = round(secs["residual", "native"]
                                                    / secs["coupled", "native"], 3)
        return row

    out: dict = {}
    single = {rule: jobs_of(s, args.rules_prompts, args.rules_tokens, 1)
              for rule, s in samplers.items()}
    timed = [four_ways({rule: [single[rule][i]] for rule in samplers}, 1)
             for i in range(len(single["residual"]))]
    out["single_stream"] = {"jobs": len(single["residual"]), **summary(timed)}
    log(f"rules b1: {out['single_stream']}")
    batch_jobs = {rule: jobs_of(s, args.batch_records, args.batch_tokens, args.batch_samples)
                  for rule, s in samplers.items()}
    out["default_batch"] = {"jobs": len(batch_jobs["residual"]), "batch": args.batch_size,
                            **summary([four_ways(batch_jobs, args.batch_size)])}
    log(f"rules b{args.batch_size}: {out['default_batch']}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-n", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=None)
    ap.add_argument("--batch-records", type=int, default=16)
    ap.add_argument("--batch-samples", type=int, default=8)
    ap.add_argument("--batch-tokens", type=int, default=512)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the target's dtype (the drafters run in fp32)")
    ap.add_argument("--parts", default="single,batched",
                    help="sections to run: single (exactness, one stream), batched, rules "
                         "(both rules in one set of turns)")
    ap.add_argument("--rules-prompts", type=int, default=24)
    ap.add_argument("--rules-tokens", type=int, default=512)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    model = load_model(ROOT / "models" / "evspark-sh2-192", dtype=args.dtype)
    args.tie = default_tie_tolerance(model.dtype)
    args.batch_size = args.batch_size or default_batch_size(model.device)
    drafters = {f"dspark-seed{s}": resolve_drafter(model, bundled_drafter_dir(model, int(s)))
                for s in args.seeds.split(",")}
    prompts = read_prompts([default_prompts()])[: args.prompts_n]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    res: dict = {"provenance": provenance(" ".join(["python", "benchmarks/coupled_bar.py",
                                                    *sys.argv[1:]])),
                 "config": {**vars(args), "prompts": len(prompts),
                            "threads": torch.get_num_threads()}}
    if "single" in parts:
        res["single_stream"] = single_stream(model, prompts, drafters, args, log)
    if "batched" in parts:
        res["batched"] = batched(model, prompts, next(iter(drafters.values())), args,
                                 res.get("single_stream", {}), log)
    if "rules" in parts:
        res["rules"] = rules_side_by_side(model, prompts, next(iter(drafters.values())), args,
                                          log)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
