#!/usr/bin/env python
"""The identity drafter's overhead over native decoding, as many short interleaved pairs.

    python benchmarks/identity_overhead.py --out benchmarks/results/identity_overhead.json
    python benchmarks/identity_overhead.py --compile      # the --compile decode path

The identity drafter proposes the target's own tokens, so a round is gamma native steps plus one
verification block: its time over native decoding is the price of the speculative machinery.
That price is a few percent, while a shared 2-core machine drifts by more than that within
seconds. So this script decodes many prompts natively and with the identity drafter back to
back (the order alternates per pair) and reports, besides the pooled ratio, the median and
quartiles of the per-pair ratios, which one slow moment cannot move much. Per round it also
splits the identity decode into drafting and verification, in native steps.

Each prompt is a random 1 kb DNA string; sampled decoding (T = 1, top-k 4, Evo 2's default);
the two decodes must give the same tokens (the identity drafter reproduces native sampling).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.model import graphs
from evspark_cli.model.checkpoint import load_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="models/evspark-sh2-192")
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=256, help="new tokens per decode")
    ap.add_argument("--context", type=int, default=1000)
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--compile", action="store_true", help="decode through torch.compile")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    graphs.COMPILE_AFTER = 1  # --compile: every block length compiles at its first (warm-up) call
    model = load_model(a.model, compile=a.compile)
    sampler = SamplerConfig(1.0, 4, 1.0)
    gen = torch.Generator().manual_seed(0)
    bases = [65, 67, 71, 84]
    t_start = time.perf_counter()
    warm = [bases[i] for i in torch.randint(0, 4, (a.context,), generator=gen).tolist()]
    # lazy caches, and with --compile every block length the timed runs use, compiled first
    decode_native(model, warm, 32, sampler)
    decode_speculative(model, warm, a.tokens, sampler, IdentityDrafter(), a.gamma)
    ratios, nat_s, idn_s, draft, verify, rounds, taus = [], 0.0, 0.0, 0.0, 0.0, 0, []
    for i in range(a.pairs):
        prompt = [bases[j] for j in torch.randint(0, 4, (a.context,), generator=gen).tolist()]
        runs = {}
        for kind in (("native", "identity") if i % 2 == 0 else ("identity", "native")):
            if kind == "native":
                runs[kind] = decode_native(model, prompt, a.tokens, sampler)
            else:
                runs[kind] = decode_speculative(model, prompt, a.tokens, sampler,
                                                IdentityDrafter(), a.gamma)
        nat, idn = runs["native"], runs["identity"]
        if nat.tokens != idn.tokens:
            raise SystemExit(f"pair {i}: the identity drafter did not reproduce native sampling")
        n_s, i_s = nat.wall_s - nat.prefill_s, idn.wall_s - idn.prefill_s
        ratios.append(i_s / n_s)
        nat_s += n_s
        idn_s += i_s
        step = n_s / a.tokens
        draft += idn.draft_s / step
        verify += idn.verify_s / step
        rounds += idn.rounds
        taus.append(idn.tau)
    q = statistics.quantiles(ratios, n=4)
    res = {
        "benchmark": "identity_overhead",
        "model": a.model, "compile": a.compile, "pairs": a.pairs, "tokens": a.tokens,
        "context": a.context, "gamma": a.gamma, "threads": a.threads,
        "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "native_tokens_per_s": a.pairs * a.tokens / nat_s,
        "identity_tokens_per_s": a.pairs * a.tokens / idn_s,
        "overhead_pooled": idn_s / nat_s,
        "overhead_median_of_pairs": statistics.median(ratios),
        "overhead_quartiles": [q[0], q[2]],
        "tau_mean": statistics.mean(taus),
        "draft_steps_per_round": draft / rounds,
        "verify_steps_per_round": verify / rounds,
        "pair_ratios": ratios,
        "wall_s": time.perf_counter() - t_start,
    }
    print(f"identity overhead over native ({'compile' if a.compile else 'eager'}, {a.pairs} pairs x "
          f"{a.tokens} tokens): pooled {res['overhead_pooled']:.4f}, median of pairs "
          f"{res['overhead_median_of_pairs']:.4f} (quartiles {q[0]:.4f} - {q[2]:.4f}); tau "
          f"{res['tau_mean']:.2f}; per round: drafting {res['draft_steps_per_round']:.2f} steps, "
          f"verification {res['verify_steps_per_round']:.2f} steps; native "
          f"{res['native_tokens_per_s']:.0f} tok/s")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
