#!/usr/bin/env python
"""What bounds batched speculative decoding against batched native decoding: a round in steps.

    python benchmarks/batch_bound.py --out benchmarks/results/batch_bound.json
    python benchmarks/batch_bound.py --batches 2 --gammas 4 --tokens 24 --out /tmp/b.json  # smoke
    python benchmarks/batch_bound.py --batches 1,32 --gammas 12,16 --rule coupled --out /tmp/c.json

At a full batch a CPU is compute-bound: a verification pass over gamma + 1 positions per row
costs several native steps, so a round must emit that many tokens per row before it pays. This
script measures that price. For each batch size B, B jobs (at least `--jobs`; the shared
prompts, else the examples; sampled T=1 top-k 4 under `--rule`, residual by default; bundled
target, dspark seed 0) run natively and, for each draft cap gamma, speculatively, all at once
in turns (decode/interleave.py), every row in one batch. Each round's time is split, by wrapping the
methods as `mixed_profile.py` does, into the verification pass (`StripedHyena.extend`),
drafting (the drafter rows' `propose` and `observe`) and the rest (sampler, acceptance rule,
commit, bookkeeping). Only rounds in which every row drafts the whole cap count, and each
part is the median over them; the unit is the median native step at the same batch size.

Per (B, gamma), besides tau, the same-run speedup (native seconds / speculative seconds, the
prefills included) and `decode_speedup` (the same without the prefills: all rounds' seconds):
- `round_steps`, `verify_steps`, `draft_steps`: a round and its parts, in native steps;
- `model_speedup`: tau x step / round, the speedup the medians predict (close to the
  measured one when the medians are typical);
- `ceiling_perfect_drafts`: (gamma + 1) x step / round: every draft accepted, at this drafter's
  cost;
- `ceiling_free_drafter`: tau x step / (round - drafting): this acceptance, drafting for free;
- `ceiling_perfect_free`: (gamma + 1) x step / (round - drafting): both, the engine's ceiling.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode.batch import BatchDecoder, JobList  # noqa: E402
from evspark_cli.decode.drafters import dspark  # noqa: E402
from evspark_cli.decode.drafters.registry import bundled_drafter_dir, resolve_drafter  # noqa: E402
from evspark_cli.decode.interleave import interleave, timed_run  # noqa: E402
from evspark_cli.decode.jobs import largest_draft  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig  # noqa: E402
from evspark_cli.eval.bench import default_prompts  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402
from evspark_cli.model.model import StripedHyena  # noqa: E402


class RoundTimes:
    """Per decoder, each round's seconds in total and in the verification pass and drafting,
    recorded by wrapping the methods that do them (rounds never overlap: the decoders take turns
    a whole step at a time)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)
        self.rounds: dict[int, list[dict]] = defaultdict(list)
        self._wrap(StripedHyena, "extend", "verify")
        self._wrap(dspark.DSparkRows, "propose", "draft")
        self._wrap(dspark.DSparkRows, "observe", "draft")
        original = BatchDecoder._round
        times = self

        def round_(decoder: BatchDecoder):
            times.parts.clear()
            gammas = [largest_draft(decoder.gamma, r.remaining) for r in decoder.rows]
            t0 = time.perf_counter()
            out = original(decoder)
            total = time.perf_counter() - t0
            full = decoder.gamma == 0 or min(gammas) == decoder.gamma
            times.rounds[id(decoder)].append({"total": total, "full": full, **times.parts})
            return out

        BatchDecoder._round = round_  # type: ignore[method-assign]

    def _wrap(self, owner: type, name: str, part: str) -> None:
        original = getattr(owner, name)
        parts = self.parts

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                parts[part] += time.perf_counter() - t0

        setattr(owner, name, timed)

    def medians(self, decoder: BatchDecoder) -> dict[str, float]:
        """The median round and parts over the decoder's full rounds, and the seconds of all
        its rounds (its decoding without the prefills)."""
        every = self.rounds[id(decoder)]
        rows = [r for r in every if r["full"]]
        return {k: statistics.median(r.get(k, 0.0) for r in rows)
                for k in ("total", "verify", "draft")} | {
                    "rounds": len(rows), "decode_s": sum(r["total"] for r in every)}


def measure(model, prompts, drafter, batch: int, gammas: list[int], tokens: int, jobs_n: int,
            times: RoundTimes, sampler: SamplerConfig) -> dict:
    """Native and speculative decoding of `jobs_n` jobs (at least `batch`) at each gamma, in
    turns."""
    opts = DecodeOptions(tokens, max(gammas), sampler.temperature, sampler.top_k, sampler.top_p,
                         rule=sampler.rule)
    records = [Record.of(prompts[i % len(prompts)], model.config.vocab_size)
               for i in range(max(batch, jobs_n))]
    jobs = build_jobs(records, opts)
    runs = [timed_run(lambda clock, g=g: BatchDecoder(
        model, sampler, drafter if g else None, g, batch_size=batch, clock=clock),
        JobList(iter(jobs))) for g in [0, *gammas]]
    interleave(runs)
    native = times.medians(runs[0].decoder)
    step = native["total"]
    out: dict = {"native_step_ms": round(step * 1e3, 3), "native_rounds": native["rounds"],
                 "gammas": {}}
    for g, run in zip(gammas, runs[1:]):
        results = [o.result for o in run.outcomes]
        emitted = sum(len(r.tokens) for r in results)
        tau = emitted / sum(r.rounds for r in results)
        m = times.medians(run.decoder)
        rnd, draft = m["total"], m["draft"]
        out["gammas"][str(g)] = {
            "tau": round(tau, 3), "rounds_counted": m["rounds"],
            "speedup": round(runs[0].seconds / run.seconds, 3),
            "decode_speedup": round(native["decode_s"] / m["decode_s"], 3),
            "round_ms": round(rnd * 1e3, 3),
            "round_steps": round(rnd / step, 3), "verify_steps": round(m["verify"] / step, 3),
            "draft_steps": round(draft / step, 3),
            "model_speedup": round(tau * step / rnd, 3),
            "ceiling_perfect_drafts": round((g + 1) * step / rnd, 3),
            "ceiling_free_drafter": round(tau * step / (rnd - draft), 3),
            "ceiling_perfect_free": round((g + 1) * step / (rnd - draft), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--gammas", default="8,12,16")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--jobs", type=int, default=8, help="jobs per batch size (at least a batch)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                    help="the target's dtype (the drafter runs in fp32)")
    ap.add_argument("--rule", default="residual", choices=["residual", "coupled"],
                    help="how the sampled tokens are drawn and drafts accepted")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    sampler = SamplerConfig(1.0, 4, 1.0, args.rule)
    model = load_model(ROOT / "models" / "evspark-sh2-192", dtype=args.dtype)
    drafter = resolve_drafter(model, bundled_drafter_dir(model, 0))
    prompts = read_prompts([default_prompts()])
    times = RoundTimes()
    t0 = time.time()
    res: dict = {"provenance": provenance(" ".join(["python", "benchmarks/batch_bound.py",
                                                    *sys.argv[1:]])),
                 "config": {**vars(args), "threads": torch.get_num_threads(),
                            "sampler": f"T=1 top-k 4, {args.rule}", "drafter": "dspark seed 0"},
                 "batches": {}}
    gammas = [int(g) for g in args.gammas.split(",")]
    for b in (int(x) for x in args.batches.split(",")):
        res["batches"][str(b)] = row = measure(model, prompts, drafter, b, gammas, args.tokens,
                                               args.jobs, times, sampler)
        print(f"batch {b}: {json.dumps(row)}", file=sys.stderr, flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
