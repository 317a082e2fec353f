#!/usr/bin/env python
"""One-row product GB/s against the weight working set: why a CPU step costs what it does.

Matrix-vector throughput against the bytes of weights a step streams, next to the bytes one
decode step of a model reads.

A decode step multiplies one token's activations by every weight matrix once. When all of them
fit in the last-level cache they come back from it at tens of GB/s; past the cache's (effective)
size each step evicts what the next one needs and they stream from DRAM, several times slower.
This script cycles a 1-row product over n copies of a 1024 x 192 fp32 matrix (n sets the
working set) and prints GB/s per working-set size, two ways: `F.linear` on the (out, in) layout
nn.Linear keeps (MKL runs it on one core), and the engine's `layers.linear` on the input-major
layout that `load_model` gives CPU weights (split over the cores); then the weight bytes per
decode step of a model folder.

    python benchmarks/cache_cliff.py --model models/evspark-sh2-192 --threads 2

Results: benchmarks/results/cache_cliff.json (and a markdown table on stdout).
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

from evspark_cli.eval.provenance import provenance
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def gemv_throughput(n_mats: int, engine: bool, reps: int = 50) -> float:
    """GB/s of weights read by one-row products cycling over n_mats distinct 1024 x 192 matrices:
    F.linear on (out, in) storage, or (engine) layers.linear on input-major storage."""
    from evspark_cli.model.layers import linear

    mats = [torch.randn(1024, 192) for _ in range(n_mats)]
    product = F.linear
    if engine:
        mats, product = [w.t().contiguous().t() for w in mats], linear
    x = torch.randn(1, 1, 192)
    with torch.inference_mode():
        for _ in range(5):
            for w in mats:
                product(x, w)
        t = time.perf_counter()
        for _ in range(reps):
            for w in mats:
                product(x, w)
        dt = time.perf_counter() - t
    return reps * n_mats * mats[0].numel() * 4 / dt / 1e9


def step_weight_bytes(model) -> int:
    """Bytes of weights one decode step reads: every block's matrices (the MLP's two input
    projections count once, as the fused product reads them) plus the tied output embedding."""
    total = model.embedding_layer.weight.numel() * model.embedding_layer.weight.element_size()
    for blk in model.blocks:
        for p in blk.parameters():
            total += p.numel() * p.element_size()
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "evspark-sh2-192"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--sizes-mb", type=float, nargs="+",
                    default=[2, 6, 10, 12, 13, 14, 15, 16, 20, 32])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cache_cliff.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from evspark_cli.model.checkpoint import load_model

    model = load_model(args.model)
    step_mb = step_weight_bytes(model) / 1e6
    rows = []
    for mb in args.sizes_mb:
        n = max(1, round(mb * 1e6 / (1024 * 192 * 4)))
        rows.append({"working_set_mb": round(n * 1024 * 192 * 4 / 1e6, 1),
                     "gb_per_s": round(gemv_throughput(n, engine=False), 1),
                     "engine_gb_per_s": round(gemv_throughput(n, engine=True), 1)})
    res = {"benchmark": "cache_cliff", "model": args.model, "step_weight_mb": round(step_mb, 2),
           "threads": args.threads, "machine": platform.processor() or platform.machine(),
           "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "provenance": provenance(" ".join(["python", "benchmarks/cache_cliff.py",
                                              *sys.argv[1:]]))}
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print("| weights cycled (MB) | F.linear, (out, in) GB/s | engine linear, input-major GB/s |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['working_set_mb']} | {r['gb_per_s']} | {r['engine_gb_per_s']} |")
    print(f"\n{Path(args.model).name}: {step_mb:.1f} MB of fp32 weights read per decode step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
