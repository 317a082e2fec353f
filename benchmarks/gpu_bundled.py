"""GPU check of the bundled target and its dspark drafter: losslessness and speedup on CUDA.

    python benchmarks/gpu_bundled.py --out $OUT/bundled.json           # on a CUDA machine, ~1-2 min
    python benchmarks/gpu_bundled.py --device cpu --tokens 64 --out /tmp/b.json   # logic check

For each dtype (fp32, bf16) and each prompt of examples/prompts.fa: native vs speculative greedy
decoding token by token (first divergence and the native top-1/top-2 logit gap there, so ties are
told apart from errors), native vs speculative sampled decoding side by side (tokens/s, tau), and
whether the identity drafter's sampled tokens equal native ones (records out of all); and coupled
sampling (`--rule coupled`) natively, with one chain and with token trees (`--tree-rows`
TREE_ROWS on a batch of 1 + TREE_ROWS rows: the decoder keeps the branches its timing says
pay), every coupled run compared with native token for token.
The model replays CUDA graphs for steps and verification blocks (load_model's default on a GPU).
Reads the FASTA with a few lines of Python so that it runs where biopython is not installed.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from evspark_cli.decode.batch import BatchDecoder, run_one
from evspark_cli.decode.drafters.registry import resolve_drafter
from evspark_cli.decode.jobs import Job
from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.eval.compare import compare_greedy
from evspark_cli.model.checkpoint import load_model
from evspark_cli.model.tokenizer import tokenize

ROOT = Path(__file__).resolve().parents[1]
TREE_ROWS = 4


def coupled(model, drafter, ids, tokens, gamma, rng, tree_rows):
    """One coupled job with `tree_rows` branch rows at most (0: one chain, none: native):
    (result, seconds, the width the decoder settled on)."""
    sampler = SamplerConfig(1.0, 4, 1.0, "coupled")
    dec = BatchDecoder(model, sampler, drafter, gamma if drafter is not None else 0,
                       batch_size=1 + (tree_rows or 0), tree_rows=tree_rows or 0)
    t = time.perf_counter()
    res = run_one(dec, Job(0, tuple(ids), tokens, rng))
    return res, time.perf_counter() - t, dec.sizer.width if dec.sizer is not None else None


def read_fasta(path: Path) -> list[tuple[str, str]]:
    recs: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            recs.append((line[1:].split()[0], []))
        elif line.strip() and recs:
            recs[-1][1].append(line.strip())
    return [(name, "".join(parts)) for name, parts in recs]


def run_dtype(dtype: str, device: str, prompts: list[tuple[str, str]], tokens: int, gamma: int,
              tie: float) -> dict:
    model = load_model(None, device=device, dtype=dtype)
    drafter = resolve_drafter(model, "auto")
    greedy, sampled = SamplerConfig(1.0, 1, 1.0), SamplerConfig(1.0, 4, 1.0)
    ids0 = tokenize(prompts[0][1])
    for sc in (greedy, sampled):  # warm-up: graph recordings, kernels, allocator
        decode_native(model, ids0, 32, sc, RngKey(0, 0, 0))
        decode_speculative(model, ids0, 64, sc, drafter, gamma, RngKey(0, 0, 0))
    for t in (None, 0, TREE_ROWS):  # and the coupled decoders (the trees' block-cost table)
        coupled(model, None if t is None else drafter, ids0, 64, gamma, RngKey(0, 0, 0), t)
    rows = []
    for r, (name, seq) in enumerate(prompts):
        ids = tokenize(seq)
        rng = RngKey(0, r, 0)
        nat = decode_native(model, ids, tokens, greedy, rng, name, track_margins=True)
        spec = decode_speculative(model, ids, tokens, greedy, drafter, gamma, rng, label=name)
        row = compare_greedy(name, nat, spec, tie)
        ns = decode_native(model, ids, tokens, sampled, rng, name)
        ss = decode_speculative(model, ids, tokens, sampled, drafter, gamma, rng, label=name)
        ident = decode_speculative(model, ids, tokens, sampled, IdentityDrafter(), gamma, rng)
        row.update(sampled_native_s=ns.wall_s, sampled_spec_s=ss.wall_s,
                   sampled_speedup=ns.wall_s / ss.wall_s, sampled_tau=ss.tau,
                   identity_sampled_equals_native=ident.tokens == ns.tokens)
        cn, cn_s, _ = coupled(model, None, ids, tokens, gamma, rng, None)
        chain, chain_s, _ = coupled(model, drafter, ids, tokens, gamma, rng, 0)
        tree, tree_s, width = coupled(model, drafter, ids, tokens, gamma, rng, TREE_ROWS)
        row.update(coupled_native_s=cn_s, coupled_chain_s=chain_s, coupled_tree_s=tree_s,
                   coupled_chain_tau=chain.tau, coupled_tree_tau=tree.tau,
                   coupled_tree_width=width, coupled_tree_branch_wins=tree.branch_wins,
                   coupled_equal_native=chain.tokens == cn.tokens == tree.tokens)
        rows.append(row)
        print(dtype, json.dumps(row), flush=True)
    n = len(rows)
    return {
        "dtype": str(next(model.parameters()).dtype), "graphs": model.graphs is not None,
        "graphs_disabled_reason": getattr(model.graphs, "disabled_reason", None),
        "rows": rows,
        "greedy_speedup_pooled": sum(r["native_s"] for r in rows) / sum(r["spec_s"] for r in rows),
        "sampled_speedup_pooled": (sum(r["sampled_native_s"] for r in rows)
                                   / sum(r["sampled_spec_s"] for r in rows)),
        "native_tokens_per_s_greedy": n * tokens / sum(r["native_s"] for r in rows),
        "spec_tokens_per_s_greedy": n * tokens / sum(r["spec_s"] for r in rows),
        "greedy_divergences": sum(r["divergence"] is not None for r in rows),
        "greedy_non_tie_divergences": sum(r["divergence"] is not None and not r["tie"] for r in rows),
        "identity_sampled_equals_native": sum(r["identity_sampled_equals_native"] for r in rows),
        "tau_greedy_mean": sum(r["tau"] for r in rows) / n,
        "tau_sampled_mean": sum(r["sampled_tau"] for r in rows) / n,
        "coupled_chain_speedup_pooled": (sum(r["coupled_native_s"] for r in rows)
                                         / sum(r["coupled_chain_s"] for r in rows)),
        "coupled_tree_speedup_pooled": (sum(r["coupled_native_s"] for r in rows)
                                        / sum(r["coupled_tree_s"] for r in rows)),
        "coupled_equal_native": sum(r["coupled_equal_native"] for r in rows),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", default=str(ROOT / "examples" / "prompts.fa"))
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--tie-tolerance", type=float, default=1e-3,
                    help="fp32 tie tolerance; bf16 rows use 0.1 (bf16 logits carry ~1e-2 error)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    prompts = read_fasta(Path(a.prompts))
    from evspark_cli.eval.provenance import provenance

    res: dict = {"device": a.device, "torch": torch.__version__, "tokens": a.tokens, "gamma": a.gamma,
                 "gpu": torch.cuda.get_device_name(0) if a.device == "cuda" else None,
                 "provenance": provenance(" ".join(["python", "benchmarks/gpu_bundled.py",
                                                    *sys.argv[1:]]))}
    for dtype, tie in (("float32", a.tie_tolerance), ("bfloat16", 0.1)):
        t = time.perf_counter()
        res[dtype] = run_dtype(dtype, a.device, prompts, a.tokens, a.gamma, tie)
        res[dtype]["tie_tolerance"] = tie
        res[dtype]["section_s"] = time.perf_counter() - t
        Path(a.out).write_text(json.dumps(res, indent=1))
    summary = {d: {k: v for k, v in res[d].items() if k != "rows"} for d in ("float32", "bfloat16")}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
