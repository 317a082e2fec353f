"""Acceptance of drafters side by side: tau and per-position acceptance, not speed.

    python benchmarks/drafter_budget.py --drafters models/evspark-sh2-192/drafters/seed0 \\
        runs/long/seed0 --out benchmarks/results/drafter_budget.json
    python benchmarks/drafter_budget.py --drafters models/evspark-sh2-192/drafters/seed0 \\
        --prompts-n 2 --tokens 16 --out /tmp/d.json                         # smoke

Every drafter decodes the same jobs (the shared prompts, else the example prompts) with the
bundled target under each rule (coupled and residual, T=1 top-k 4, and greedy) at one gamma, in
batches (tau does not depend on the batch: a row's tokens never depend on its neighbours).
Counts, not timings, so the run may share the machine. Each row records the drafter folder's
training recipe (its config.json) beside the figures.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode.batch import BatchDecoder  # noqa: E402
from evspark_cli.decode.drafters.registry import resolve_drafter  # noqa: E402
from evspark_cli.decode.sampling import SamplerConfig  # noqa: E402
from evspark_cli.eval.bench import default_prompts  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

RULES = {"coupled-t1-k4": SamplerConfig(1.0, 4, 1.0, "coupled"),
         "residual-t1-k4": SamplerConfig(1.0, 4, 1.0),
         "greedy": SamplerConfig(1.0, 1, 1.0)}


def acceptance(model, drafter, prompts, sampler: SamplerConfig, args) -> dict:
    """tau, accepted / verified, and the conditional acceptance of each draft position."""
    opts = DecodeOptions(args.tokens, args.gamma, sampler.temperature, sampler.top_k,
                         sampler.top_p, rule=sampler.rule)
    jobs = build_jobs([Record.of(p, model.config.vocab_size) for p in prompts], opts)
    dec = BatchDecoder(model, sampler, drafter, args.gamma, batch_size=args.batch_size)
    results = [o.result for o in dec.run(jobs)]
    tokens = sum(len(r.tokens) for r in results)
    rounds = sum(r.rounds for r in results)
    verified = sum(r.verified for r in results)
    trials = [sum(r.position_trials[j] for r in results) for j in range(args.gamma)]
    accepts = [sum(r.position_accepts[j] for r in results) for j in range(args.gamma)]
    return {"tau": round(tokens / rounds, 3), "efficiency": round(tokens / verified, 3),
            "position_acceptance": [round(a / t, 3) if t else None
                                    for a, t in zip(accepts, trials)]}


def suite_options(ap: argparse.ArgumentParser, prompts_n: int, tokens: int, rules: str) -> None:
    """The options every drafter comparison takes: how many shared prompts, tokens, rules."""
    ap.add_argument("--prompts-n", type=int, default=prompts_n)
    ap.add_argument("--tokens", type=int, default=tokens)
    ap.add_argument("--rules", default=rules)
    ap.add_argument("--out", required=True)


def load_suite(args: argparse.Namespace) -> tuple:
    """The bundled target and the first --prompts-n shared prompts (else the examples)."""
    model = load_model(ROOT / "models" / "evspark-sh2-192")
    return model, read_prompts([default_prompts()])[: args.prompts_n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafters", nargs="+", required=True, help="drafter folders")
    ap.add_argument("--gamma", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=16)
    suite_options(ap, 16, 512, ",".join(RULES))
    args = ap.parse_args()
    model, prompts = load_suite(args)
    t0 = time.time()
    rows = []
    for folder in args.drafters:
        drafter = resolve_drafter(model, folder)
        recipe = json.loads((Path(folder) / "config.json").read_text()).get("training", {})
        row: dict = {"drafter": folder, "training": recipe}
        for rule in args.rules.split(","):
            row[rule] = acceptance(model, drafter, prompts, RULES[rule], args)
            print(f"{folder} {rule}: {row[rule]}", file=sys.stderr, flush=True)
        rows.append(row)
    res = {"provenance": provenance(" ".join(["python", "benchmarks/drafter_budget.py",
                                              *sys.argv[1:]])),
           "config": {k: v for k, v in vars(args).items() if k != "drafters"},
           "rows": rows, "wall_s": round(time.time() - t0, 1)}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
