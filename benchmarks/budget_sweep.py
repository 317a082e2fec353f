"""tau vs supervised positions: drafters distilled with different budgets, same prompts and seeds.

    python benchmarks/budget_sweep.py --model models/evspark-sh2-192 --drafters D1 D2 ... \
        --prompts ../shared/data/prompts.fa --n-prompts 16 -n 256 --out benchmarks/results/budget.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.dspark import load_drafter
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.io.fasta import read_prompts
from evspark_cli.model.checkpoint import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--drafters", nargs="+", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--n-prompts", type=int, default=16)
    ap.add_argument("-n", type=int, default=256)
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    model = load_model(a.model)
    prompts = read_prompts([a.prompts])[: a.n_prompts]
    rows = []
    for folder in a.drafters:
        d = load_drafter(folder, model)
        acc = rounds = 0
        for i, p in enumerate(prompts):
            r = decode_speculative(model, list(p.seq.encode()), a.n, SamplerConfig(1.0, 4, 1.0), d,
                                   a.gamma, RngKey(7, i, 0))
            acc += sum(r.accepted)
            rounds += r.rounds
        tr = d.cfg.training
        row = {"drafter": folder, "steps": tr.get("steps"), "supervised_positions": tr.get("supervised_positions"),
               "tau": (acc + rounds) / rounds}
        print(row, flush=True)
        rows.append(row)
    Path(a.out).write_text(json.dumps({"gamma": a.gamma, "prompts": len(prompts), "new_tokens": a.n,
                                       "sampler": "T=1, top-k 4", "rows": rows}, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(2)
    main()
