"""Probe: `torch.compile` of the static extend(k) form on CPU, against eager, in one process.

    python benchmarks/compile_probe.py --out benchmarks/results/compile_probe.json

The graph runner's static form (model/graphs.py: device-tensor position, fixed shapes, masked
attention over the preallocated KV cache, fixed-size Hyena state buffers) is what a CUDA graph
replays; it has no Python-int position, so `torch.compile(dynamic=False)` traces it once per
block length with no recompiles and no graph breaks (checked here with `torch._dynamo.explain`).
This measures what that would give on a CPU before it becomes a backend: eager `extend(k)`,
the static form run eagerly, and the compiled static form, interleaved, for k = 1 and 13, with
the compile time and the largest logit difference. Not used by the package.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from evspark_cli.model.checkpoint import load_model
from evspark_cli.model.graphs import static_state


def median_ms(fn, reps: int) -> float:
    for _ in range(5):
        fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * statistics.median(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: the bundled target)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(a.model)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([65, 67, 71, 84])[torch.randint(0, 4, (1, a.context), generator=gen)]
    res: dict = {"benchmark": "compile_probe", "torch": torch.__version__, "threads": a.threads,
                 "cpu": platform.processor() or platform.machine(), "context": a.context}
    with torch.inference_mode():
        _, _, state = model.prefill(prompt, reserve=256)
        for k in (1, 13):  # derived tables (fused weights, RoPE rows of the whole cache) first
            model.extend(state, torch.full((1, k), 67))
        for blk in model.blocks:
            if blk.kind == "attn":
                cap = next(s for s in state.layers if hasattr(s, "cache")).cache.capacity
                blk.inner_mha_cls.rotary_emb.table(cap)
        fns = {}
        for k in (1, 13):
            ids = torch.full((1, k), 67)
            pos, st = torch.tensor(state.seqlen), static_state(state)

            def run(ids=ids, pos=pos, st=st):
                return model._run(ids, st, True, position=pos)[0]

            if k == 1:
                ex = torch._dynamo.explain(run)()
                res["graphs"], res["graph_breaks"] = ex.graph_count, ex.graph_break_count
                torch._dynamo.reset()
            t = time.perf_counter()
            compiled = torch.compile(run, dynamic=False)
            diff = float((compiled() - run()).abs().max())
            fns[k] = (ids, run, compiled, time.perf_counter() - t, diff)
        time.sleep(5)  # let inductor's compile workers go idle before timing
        rows = {k: {"eager_extend_ms": [], "static_eager_ms": [], "compiled_ms": []} for k in fns}
        for _ in range(a.rounds):
            for k, (ids, run, compiled, _, _) in fns.items():
                rows[k]["eager_extend_ms"].append(median_ms(lambda: model.extend(state, ids), a.reps))
                rows[k]["static_eager_ms"].append(median_ms(run, a.reps))
                rows[k]["compiled_ms"].append(median_ms(compiled, a.reps))
        for k, (_, _, _, ct, diff) in fns.items():
            rows[k] = {n: round(statistics.median(v), 3) for n, v in rows[k].items()}
            rows[k].update(compile_s=round(ct, 1), max_abs_logit_diff=diff)
        res["k"] = rows
        res["speedup_vs_eager"] = {k: round(r["eager_extend_ms"] / r["compiled_ms"], 3) for k, r in rows.items()}
        res["extend13_over_step"] = {n: round(rows[13][n] / rows[1][n], 3)
                                     for n in ("eager_extend_ms", "static_eager_ms", "compiled_ms")}
    print(json.dumps(res, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
