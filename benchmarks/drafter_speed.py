"""Drafters side by side in one stream: speedup over native decoding, timed in turns.

    python benchmarks/drafter_speed.py --ways models/evspark-sh2-192/drafters/seed0@16 \\
        runs/o3g32/seed0@16 runs/o3g32/seed0@24 --out benchmarks/results/drafter_speed.json
    python benchmarks/drafter_speed.py --ways models/evspark-sh2-192/drafters/seed0@4 \\
        --prompts-n 1 --tokens 16 --rules greedy --out /tmp/s.json                # smoke

Each `FOLDER@GAMMA` is a drafter folder and the draft length it runs at. Per rule (coupled T=1
top-k 4, greedy), every prompt of the shared suite (else the example prompts) is decoded
natively and with every way at batch 1, all at once in turns (decode/interleave.py), so the
machine's drift weighs on all alike; each way's speedup is native seconds over its seconds,
pooled over the prompts, and its output is compared with native decoding token for token.
Where `drafter_budget.py` counts acceptance, this times it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from coupled_bar import divergences, in_turns, tally  # noqa: E402
from drafter_budget import load_suite, suite_options  # noqa: E402
from evspark_cli.decode.drafters.registry import resolve_drafter  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig  # noqa: E402
from evspark_cli.eval.compare import default_tie_tolerance  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions  # noqa: E402

RULES = {"coupled-t1-k4": SamplerConfig(1.0, 4, 1.0, "coupled"),
         "greedy": SamplerConfig(1.0, 1, 1.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ways", nargs="+", required=True, help="FOLDER@GAMMA drafter ways")
    suite_options(ap, 12, 1024, ",".join(RULES))
    args = ap.parse_args()
    model, prompts = load_suite(args)
    specs = [(f, int(g)) for f, g in (w.rsplit("@", 1) for w in args.ways)]
    drafters = {f: resolve_drafter(model, f) for f, _ in specs}
    t0 = time.time()
    out: dict = {}
    for rule in args.rules.split(","):
        sampler = RULES[rule]
        opts = DecodeOptions(args.tokens, 12, sampler.temperature, sampler.top_k, sampler.top_p,
                             rule=sampler.rule)
        jobs = build_jobs([Record.of(p, model.config.vocab_size) for p in prompts], opts)
        ways = [(None, 0, False)] + [(drafters[f], g, False) for f, g in specs]
        seconds = [0.0] * len(ways)
        results: list[dict] = [{} for _ in ways]
        for job in jobs:  # native and every way of one job in turns
            for i, (res, dt) in enumerate(in_turns(model, [job], sampler, ways, 1)):
                seconds[i] += dt
                results[i].update(res)
        rows = {}
        for i, (f, g) in enumerate(specs, 1):
            rows[f"{f}@{g}"] = {"speedup": round(seconds[0] / seconds[i], 3),
                                **tally(results[i]),
                                "vs_native": divergences(results[0], results[i],
                                                         default_tie_tolerance(model.dtype))}
            print(f"{rule} {f}@{g}: {rows[f'{f}@{g}']}", file=sys.stderr, flush=True)
        out[rule] = {"native_tokens_per_s": round(
            sum(len(r.tokens) for r in results[0].values()) / seconds[0], 1), "ways": rows}
    res = {"provenance": provenance(" ".join(["python", "benchmarks/drafter_speed.py",
                                              *sys.argv[1:]])),
           "config": vars(args), "rules": out, "wall_s": round(time.time() - t0, 1)}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
