#!/usr/bin/env python
"""Few-row products per weight layout: why CPU weights are stored input-major and split.

(model/layers.py: `input_major`, `linear`.)

For each projection shape of a model (default: the bundled target's), times a product of k rows
(k = 1: a decode step, 13: a verification block at gamma 12) against enough copies of the weight
to exceed the last-level cache, so that every product streams its weight from DRAM as in a real
decode step. Three ways, interleaved over --rounds rounds (medians reported):

- `output-major`: F.linear on the (out, in) row-major weight (how nn.Linear stores it);
- `input-major`:  F.linear on the same values stored (in, out) row-major (seen through .t());
- `split`:        `layers.linear` on the input-major weight (bmm over column slices of the
                  weight, one per core).

Then the whole model, both ways in one process: the model folder loaded as `load_model` gives it
(input-major, split products) and a copy with contiguous (out, in) weights, each timing a decode
step (extend k = 1 + commit) and extend(13) from the same live state at --context tokens,
interleaved over --model-rounds rounds, for each of --batches rows (1: a single stream; 32: the
CPU default batch, where products have more rows than `linear` splits).

    python benchmarks/weight_layout.py                  # writes results/weight_layout.json
    python benchmarks/weight_layout.py --threads 2 --rows 1 13
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from evspark_cli.eval.provenance import provenance
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evspark_cli.model.config import ModelConfig  # noqa: E402
from evspark_cli.model.layers import linear  # noqa: E402


def model_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(out, in) of every projection kind a decode step multiplies by."""
    D, Fm = cfg.hidden_size, cfg.mlp_size
    return {"qkv / Hyena in-projection": (3 * D, D), "out-projection": (D, D),
            "MLP l1+l2 (fused)": (2 * Fm, D), "MLP l3": (D, Fm),
            "unembedding": (cfg.vocab_size, D)}


def time_way(fn, weights, xs, rounds: int) -> float:
    """Median microseconds per product over `rounds` passes through all weight copies."""
    for w, x in zip(weights, xs):
        fn(x, w)
    per = []
    for _ in range(rounds):
        t = time.perf_counter()
        for w, x in zip(weights, xs):
            fn(x, w)
        per.append((time.perf_counter() - t) / len(weights) * 1e6)
    return statistics.median(per)


def model_ab(folder: str, context: int, rounds: int, batch: int = 1) -> dict:
    """Median ms of a decode step and of extend(13) for `batch` rows: output-major model vs
    load_model's layout."""
    from evspark_cli.model.checkpoint import load_model

    models = {"input-major": load_model(folder), "output-major": load_model(folder)}
    with torch.no_grad():
        for p in models["output-major"].parameters():
            p.data = p.data.contiguous()
    g = torch.Generator().manual_seed(0)
    prompt = torch.tensor(list(b"ACGT"))[torch.randint(0, 4, (batch, context), generator=g)]
    times: dict[str, list[float]] = {}
    with torch.inference_mode():
        states = {n: m.prefill(prompt, keep_last=1, reserve=4096)[2] for n, m in models.items()}
        one, block = torch.full((batch, 1), 65), torch.full((batch, 13), 65)
        for _ in range(rounds):
            for name in ("input-major", "output-major", "output-major", "input-major"):
                m, st = models[name], states[name]
                for what, ids in (("step", one), ("extend13", block)):
                    for _ in range(3):
                        m.extend(st, ids)[2].commit(ids.shape[1])
                    t = time.perf_counter()
                    for _ in range(30):
                        m.extend(st, ids)[2].commit(ids.shape[1])
                    times.setdefault(f"{name} {what}", []).append((time.perf_counter() - t) / 30 * 1e3)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "models" / "evspark-sh2-192"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 13])
    ap.add_argument("--cycle-mb", type=float, default=48.0, help="weight bytes cycled per shape")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--context", type=int, default=1024, help="prompt tokens before the model A/B")
    ap.add_argument("--model-rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32],
                    help="rows of the whole-model A/B (1: single stream; 32: the CPU default)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "weight_layout.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = ModelConfig.load(Path(args.model) / "config.json")
    g = torch.Generator().manual_seed(0)
    rows_out = []
    print("| shape (out x in) | rows | output-major us | input-major us | split us | split GB/s | vs output-major |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for name, (d_out, d_in) in model_shapes(cfg).items():
            copies = max(4, int(args.cycle_mb * 1e6 / (d_out * d_in * 4)))
            plain = [torch.randn(d_out, d_in, generator=g) for _ in range(copies)]
            inmaj = [w.t().contiguous().t() for w in plain]
            for k in args.rows:
                xs = [torch.randn(1, k, d_in, generator=g) for _ in range(copies)]
                t = {"output-major": [], "input-major": [], "split": []}
                for _ in range(3):  # interleave the three ways against machine drift
                    t["output-major"].append(time_way(F.linear, plain, xs, args.rounds))
                    t["input-major"].append(time_way(F.linear, inmaj, xs, args.rounds))
                    t["split"].append(time_way(linear, inmaj, xs, args.rounds))
                med = {w: statistics.median(v) for w, v in t.items()}
                gbs = d_out * d_in * 4 / med["split"] / 1e3
                rows_out.append({"projection": name, "out": d_out, "in": d_in, "rows": k,
                                 "copies": copies, **{f"{w}_us": v for w, v in med.items()},
                                 "split_GB_s": gbs})
                print(f"| {name} {d_out}x{d_in} | {k} | {med['output-major']:.1f} | "
                      f"{med['input-major']:.1f} | {med['split']:.1f} | {gbs:.1f} | "
                      f"{med['output-major'] / med['split']:.2f}x |")
    abs_ = {b: model_ab(args.model, args.context, args.model_rounds, b) for b in args.batches}
    print(f"\nwhole model at {args.context} tokens of context (median ms, interleaved):\n")
    print("| rows | layout | decode step | extend(13) | extend(13) / step |\n|---|---|---|---|---|")
    for b, ab in abs_.items():
        for name in ("output-major", "input-major"):
            st, ex = ab[f"{name} step"], ab[f"{name} extend13"]
            print(f"| {b} | {name} | {st:.3f} | {ex:.3f} | {ex / st:.2f} |")
    for b, ab in abs_.items():
        print(f"{b} rows: input-major speedup: step "
              f"{ab['output-major step'] / ab['input-major step']:.2f}x, extend(13) "
              f"{ab['output-major extend13'] / ab['input-major extend13']:.2f}x")
    ab = abs_[args.batches[0]]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "weight_layout", "model": args.model, "threads": args.threads,
        "torch": torch.__version__, "cycle_mb": args.cycle_mb, "rounds": args.rounds,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": rows_out,
        "model_ab_ms": ab, "model_ab_context": args.context,
        "model_ab_ms_by_rows": {str(b): v for b, v in abs_.items()},
        "provenance": provenance(" ".join(["python", "benchmarks/weight_layout.py",
                                           *sys.argv[1:]]))}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
