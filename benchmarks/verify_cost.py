#!/usr/bin/env python
"""Where a verification block's extra cost goes, measured inside identity-drafter-like rounds.

    python benchmarks/verify_cost.py --out benchmarks/results/verify_cost.json

With the identity drafter a round is gamma decode steps plus one extend(gamma + 1) for gamma + 1
tokens, so the model alone puts a floor under its overhead over native decoding:
(gamma * step + extend) / ((gamma + 1) * step), before any per-round bookkeeping. This script
runs such rounds (gamma steps, then one block, committed) from a real prefill, times the two
kinds of call as they occur in decoding (caches as a decode leaves them, not a hot loop), and
then profiles the same rounds to split extend(gamma + 1) - step by operator class:

- gemm: the projections, MLPs and unembedding (bmm, baddbmm, mm, addmm, matmul); their FLOPs
  grow with the block length, so this is compute the block cannot avoid, and its throughput
  (GFLOP/s of the extra rows) is reported;
- attention: the scaled-dot-product kernels (the block's queries over the whole cache);
- other ops: elementwise maths, copies, concatenations, the LI scan;
- python: wall time not spent inside any operator (interpreter and dispatch).

The profiler slows everything a little; its split is reported as fractions of the profiled
difference and applied to the unprofiled one.

Two more figures say what part of the floor no engine bookkeeping can remove: the draft step
right after a block against the later ones (the block leaves the caches colder), and the same
rounds on a *dispatch-only* copy of the model (same layer pattern and filter paths, every width
cut to a few channels, so its operators do almost no arithmetic): what a step and a block cost
in Python and operator dispatch alone.
"""
from __future__ import annotations

import argparse
import sys
import collections
import json
import platform
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from evspark_cli.eval.provenance import provenance
from torch.profiler import ProfilerActivity, profile, record_function

from evspark_cli.model.checkpoint import load_model
from evspark_cli.model.layers import input_major
from evspark_cli.model.model import StripedHyena

GEMM_OPS = {"aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm", "aten::matmul"}


def classify(name: str) -> str:
    if name in GEMM_OPS:
        return "gemm"
    if "scaled_dot_product" in name or "attention" in name:
        return "attention"
    return "other ops"


def linear_flops_per_token(model) -> int:
    """2 x the weights every token streams through a product (projections, MLPs, unembedding)."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 2 * (n + model.embedding_layer.weight.numel())


def dispatch_only(model: StripedHyena) -> StripedHyena:
    """The model's layer pattern with 8-channel heads, 8 channels per filter group and a 64-wide
    MLP: the same operators on the same code paths, with next to no arithmetic in them."""
    cfg = model.config
    heads = cfg.num_attention_heads
    hidden = 8 * heads

    def groups(g: int) -> int:  # keep grouped filters grouped (their Toeplitz path)
        return hidden // 8 if cfg.hidden_size // g > 1 else hidden

    small = replace(cfg, hidden_size=hidden, inner_mlp_size=64,
                    hcs_filter_groups=groups(cfg.hcs_filter_groups),
                    hcm_filter_groups=groups(cfg.hcm_filter_groups))
    tiny = StripedHyena(small).eval()
    with torch.no_grad():
        for p in tiny.parameters():
            p.normal_(0.0, 0.02)
    input_major(tiny)
    return tiny


def identity_rounds(model, st0, toks: list[int], g: int, n: int, label: bool = False
                    ) -> tuple[list[float], float]:
    """n rounds of g steps then one extend(g + 1), committed: (mean seconds of the step in each
    slot of the round, mean seconds of a block)."""
    k = g + 1
    s, slots, tk, i = st0, [0.0] * g, 0.0, 0
    for _ in range(n):
        for j in range(g):
            t = time.perf_counter()
            with record_function("step") if label else _null():
                _, _, b = model.extend(s, torch.tensor([[toks[i]]]))
                s = b.commit(1)
            slots[j] += time.perf_counter() - t
            i += 1
        t = time.perf_counter()
        with record_function("block") if label else _null():
            _, _, b = model.extend(s, torch.tensor([toks[i - g: i + 1]]))
            s = b.commit(k)
        tk += time.perf_counter() - t
    return [x / n for x in slots], tk / n


def round_options(description: str, batches: int) -> argparse.ArgumentParser:
    """The options of a benchmark built on `identity_rounds` (this one)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--model", default="models/evspark-sh2-192")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1000, 2000])
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=20, help="rounds per timed batch")
    ap.add_argument("--batches", type=int, default=batches, help="timed batches per context")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    return ap


@torch.inference_mode()
def main() -> None:
    a = round_options(__doc__.split("\n")[0], batches=8).parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(a.model)
    tiny = dispatch_only(model)
    g, k = a.gamma, a.gamma + 1
    gen = torch.Generator().manual_seed(0)
    result: dict = {"model": a.model, "gamma": g, "threads": a.threads, "torch": torch.__version__,
                    "machine": platform.processor() or platform.machine(), "contexts": {}}
    print("| context | step ms | extend(%d) ms | extend / step | model-only overhead floor |"
          " gemm | attention | other ops | python | extra-row GEMM GFLOP/s |"
          " first step after a block / later steps | dispatch-only step / block ms |" % k)
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ctx in a.contexts:
        ids = torch.randint(0, 4, (1, ctx), generator=gen) + 65
        _, _, st0 = model.prefill(ids, reserve=(a.rounds + 3) * (g + k) + 64)
        toks = (torch.randint(0, 4, (max(a.rounds, 3) * k,), generator=gen) + 65).tolist()

        def rounds(n: int, label: bool = False, net=model, start=st0
                   ) -> tuple[list[float], float]:
            return identity_rounds(net, start, toks, g, n, label)

        rounds(3)
        steps, blocks, firsts, laters = [], [], [], []
        for _ in range(a.batches):
            slots, sk = rounds(a.rounds)
            steps.append(sum(slots) / g)
            blocks.append(sk)
            firsts.append(slots[0])
            laters.append(statistics.median(slots[1:]))
        s1, sk = statistics.median(steps), statistics.median(blocks)
        first_penalty = statistics.median(f / lt for f, lt in zip(firsts, laters))
        _, _, tiny0 = tiny.prefill(ids, reserve=(a.rounds + 3) * (g + k) + 64)
        rounds(3, net=tiny, start=tiny0)
        d_steps, d_blocks = [], []
        for _ in range(a.batches):
            slots, sk_d = rounds(a.rounds, net=tiny, start=tiny0)
            d_steps.append(sum(slots) / g)
            d_blocks.append(sk_d)
        d1, dk = statistics.median(d_steps), statistics.median(d_blocks)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            rounds(a.rounds, label=True)
        self_t = {"step": collections.Counter(), "block": collections.Counter()}
        wall = collections.Counter()
        for ev in prof.events():
            if ev.name in ("step", "block"):
                wall[ev.name] += ev.cpu_time_total
                continue
            par = ev.cpu_parent
            while par is not None and par.name not in ("step", "block"):
                par = par.cpu_parent
            if par is not None:
                self_t[par.name][classify(ev.name)] += ev.self_cpu_time_total
        n1, nk = a.rounds * g, a.rounds
        split = {}
        for cls in ("gemm", "attention", "other ops"):
            split[cls] = self_t["block"][cls] / nk - self_t["step"][cls] / n1
        split["python"] = ((wall["block"] / nk - sum(self_t["block"].values()) / nk)
                           - (wall["step"] / n1 - sum(self_t["step"].values()) / n1))
        total = sum(split.values())
        extra = sk - s1
        share = {c: v / total for c, v in split.items()}
        extra_us = {c: share[c] * extra * 1e6 for c in share}
        gflops = linear_flops_per_token(model) * (k - 1) / (extra_us["gemm"] * 1e-6) / 1e9
        floor = (g * s1 + sk) / (k * s1)
        result["contexts"][str(ctx)] = {
            "step_ms": s1 * 1e3, "extend_ms": sk * 1e3, "extend_over_step": sk / s1,
            "model_only_overhead_floor": floor, "extra_us": extra_us, "extra_share": share,
            "extra_per_verified_token_us": extra * 1e6 / (k - 1),
            "extra_row_gemm_gflops": gflops,
            "first_step_after_block_over_later": first_penalty,
            "dispatch_only": {"step_ms": d1 * 1e3, "extend_ms": dk * 1e3,
                              "share_of_step": d1 / s1, "share_of_block_extra": (dk - d1) / extra},
            "steps_ms": [x * 1e3 for x in steps],
            "blocks_ms": [x * 1e3 for x in blocks]}
        print(f"| {ctx} | {s1 * 1e3:.3f} | {sk * 1e3:.3f} | {sk / s1:.3f} | {floor:.4f} | "
              + " | ".join(f"{extra_us[c]:.0f} us ({share[c]:.0%})"
                           for c in ("gemm", "attention", "other ops", "python"))
              + f" | {gflops:.0f} | {first_penalty:.3f} | {d1 * 1e3:.2f} / {dk * 1e3:.2f} |")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        result["provenance"] = provenance(" ".join(["python", "benchmarks/verify_cost.py",
                                                    *sys.argv[1:]]))
        a.out.write_text(json.dumps(result, indent=1))


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    main()
