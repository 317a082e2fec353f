#!/usr/bin/env python
"""Which kernel computes the MLP's GELU, and what that costs a decode step and a verification block.

    python benchmarks/gelu_kernel.py --out benchmarks/results/gelu_kernel.json

On CPU, `F.gelu` sends a contiguous fp32 or bf16 tensor to a oneDNN primitive and a strided one to
ATen's own vectorised kernel. A decode step's activations are one contiguous row; a verification
block's are a strided chunk of the fused MLP product. `layers.gelu` makes every call take ATen's
kernel. This script measures, on a model folder:

1. each kernel alone in a hot loop, one row and gamma + 1 rows (and whether the values agree);
2. the whole model in one process, switching `layers.gelu` between `F.gelu` (oneDNN for steps)
   and the engine's choice batch by batch, in identity-drafter-like rounds (gamma steps, then
   extend(gamma + 1), committed): step, block, block / step and the model-only overhead floor
   (gamma step + block) / ((gamma + 1) step), per context.
"""
from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import evspark_cli.model.layers as layers
from evspark_cli.model.checkpoint import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verify_cost import identity_rounds, round_options  # noqa: E402


def hot_loop_us(fn, x: torch.Tensor, n: int = 5000) -> float:
    for _ in range(300):
        fn(x)
    t = time.perf_counter()
    for _ in range(n):
        fn(x)
    return (time.perf_counter() - t) / n * 1e6


@torch.inference_mode()
def main() -> None:
    # batches alternate the two kernels
    a = round_options(__doc__.split("\n")[0], batches=16).parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(a.model)
    g, k = a.gamma, a.gamma + 1
    width = model.config.mlp_size
    engine_gelu = layers.gelu
    choices = {"F.gelu": F.gelu, "layers.gelu": engine_gelu}
    result: dict = {"model": a.model, "gamma": g, "threads": a.threads, "torch": torch.__version__,
                    "machine": platform.processor() or platform.machine(),
                    "onednn": torch.backends.mkldnn.is_available(), "hot_loop_us": {},
                    "contexts": {}}

    gen = torch.Generator().manual_seed(0)
    fused = torch.randn(1, k, 2 * width, generator=gen) * 3
    print("| rows | F.gelu us (contiguous) | layers.gelu us | F.gelu on a block's strided chunk us"
          " | same values as ATen's kernel on the strided chunk: F.gelu / layers.gelu |")
    print("|---|---|---|---|---|")
    for rows in (1, k):
        chunk = fused[:, :rows, :width]  # strided for rows > 1, as in a block
        dense = chunk.contiguous()
        ref = F.gelu(fused[:, :, :width])[:, :rows]
        row = {"F.gelu": hot_loop_us(F.gelu, dense), "layers.gelu": hot_loop_us(engine_gelu, dense),
               "F.gelu_strided": hot_loop_us(F.gelu, chunk) if rows > 1 else None,
               "F.gelu_equals_strided": torch.equal(F.gelu(dense), ref),
               "layers.gelu_equals_strided": torch.equal(engine_gelu(dense), ref)}
        result["hot_loop_us"][str(rows)] = row
        strided = "-" if row["F.gelu_strided"] is None else f"{row['F.gelu_strided']:.2f}"
        print(f"| {rows} | {row['F.gelu']:.2f} | {row['layers.gelu']:.2f} | "
              f"{strided} | {row['F.gelu_equals_strided']} / "
              f"{row['layers.gelu_equals_strided']} |")

    print("\n| context | GELU | step ms | extend(%d) ms | extend / step | overhead floor |" % k)
    print("|---|---|---|---|---|---|")
    for ctx in a.contexts:
        ids = torch.randint(0, 4, (1, ctx), generator=gen) + 65
        _, _, st0 = model.prefill(ids, reserve=(a.rounds + 3) * (g + k) + 64)
        toks = (torch.randint(0, 4, (max(a.rounds, 3) * k,), generator=gen) + 65).tolist()
        times: dict[str, tuple[list[float], list[float]]] = {c: ([], []) for c in choices}
        for b in range(a.batches):
            order = list(choices) if b % 2 == 0 else list(reversed(choices))
            for name in order:
                layers.gelu = choices[name]
                identity_rounds(model, st0, toks, g, 2)
                slots, block = identity_rounds(model, st0, toks, g, a.rounds)
                times[name][0].append(sum(slots) / g)
                times[name][1].append(block)
        layers.gelu = engine_gelu
        per: dict = {}
        for name, (steps, blocks) in times.items():
            s1, sk = statistics.median(steps), statistics.median(blocks)
            per[name] = {"step_ms": s1 * 1e3, "extend_ms": sk * 1e3, "extend_over_step": sk / s1,
                         "overhead_floor": (g * s1 + sk) / (k * s1)}
            print(f"| {ctx} | {name} | {s1 * 1e3:.3f} | {sk * 1e3:.3f} | {sk / s1:.3f} | "
                  f"{per[name]['overhead_floor']:.4f} |")
        per["step_speedup"] = per["F.gelu"]["step_ms"] / per["layers.gelu"]["step_ms"]
        per["extend_speedup"] = per["F.gelu"]["extend_ms"] / per["layers.gelu"]["extend_ms"]
        print(f"| {ctx} | speedup | {per['step_speedup']:.3f}x | "
              f"{per['extend_speedup']:.3f}x | | |")
        result["contexts"][str(ctx)] = per
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
