"""Figures for a target's MODEL_CARD.md: bits/nt per validation file, decode speed, sample stats.

    python benchmarks/model_card_stats.py --model models/evspark-sh2-192 \
        --valid ../shared/data/valid --prompts ../shared/data/prompts.fa --out benchmarks/results/model_card.json

Bits/nt use `evspark score`'s tiling (every scored base sees >= --context bases where the genome
has them); samples are 1024-token continuations (greedy and T=1/top-k 4) of suite prompts, whose GC
content and k-mer spectra are compared with the prompt's source genome.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

import torch

from evspark_cli.api import generate
from evspark_cli.eval.score import score_sequence
from evspark_cli.io.fasta import read_prompts
from evspark_cli.model.checkpoint import load_model
from evspark_cli.model.tokenizer import tokenize_tensor


def kmer_freqs(seq: str, k: int) -> dict[str, float]:
    c = Counter(seq[i: i + k] for i in range(len(seq) - k + 1))
    n = sum(c.values()) or 1
    return {key: v / n for key, v in c.items()}


def tvd(a: dict[str, float], b: dict[str, float]) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def gc(seq: str) -> float:
    return sum(seq.count(x) for x in "GC") / max(1, len(seq))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--valid", required=True, help="folder of validation FASTA files")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--prompts-tsv", required=True, help="prompts.tsv (names each prompt's source file)")
    ap.add_argument("--data-root", required=True, help="folder the tsv's source_file paths are relative to")
    ap.add_argument("--prompt-ids", default="P11,P24,P32,P36")
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--max-tokens", type=int, default=1_000_000, help="scored bases per file (cap)")
    ap.add_argument("--new-tokens", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--files", default="", help="comma list of validation file names to score (default all)")
    ap.add_argument("--no-score", action="store_true", help="only the samples")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = load_model(a.model)
    res: dict = {"model": a.model, "parameters": model.num_parameters(), "context": a.context,
                 "bits_per_nt": {}, "samples": []}
    wanted = set(a.files.split(",")) if a.files else None
    for f in sorted(Path(a.valid).glob("*.fa*")):
        if a.no_score or (wanted is not None and f.name not in wanted):
            continue
        recs = read_prompts([str(f)])
        t0 = time.time()
        total_bits = total_n = 0.0
        for r in recs:
            budget = a.max_tokens - int(total_n)
            if budget <= 0:
                break
            bpn, _ = score_sequence(model, tokenize_tensor(r.seq), a.context, a.window, max_tokens=budget)
            n = min(len(r.seq) - 1, budget)
            total_bits += bpn * n
            total_n += n
        res["bits_per_nt"][f.name] = {"bits_per_nt": round(total_bits / total_n, 4),
                                      "scored_bases": int(total_n), "seconds": round(time.time() - t0, 1)}
        print(f.name, res["bits_per_nt"][f.name], flush=True)
    prompts = {p.id: p for p in read_prompts([a.prompts])}
    sources = {}
    for line in Path(a.prompts_tsv).read_text().splitlines()[1:]:
        cols = line.split("\t")
        sources[cols[0]] = cols[2]
    spectra: dict[str, dict[int, dict[str, float]]] = {}
    floor_gen = torch.Generator().manual_seed(0)
    for pid in a.prompt_ids.split(","):
        p = prompts[pid]
        src = sources[pid]
        if src not in spectra:
            genome = "".join(r.seq for r in read_prompts([str(Path(a.data_root) / src)]))
            spectra[src] = {k: kmer_freqs(genome, k) for k in (1, 2, 3, 4)}
            spectra[src]["gc"] = gc(genome)  # type: ignore[index]
            # floor: k-mer TVD of random genome windows of the same length against the genome
            starts = torch.randint(0, len(genome) - a.new_tokens, (8,), generator=floor_gen).tolist()
            spectra[src]["floor"] = {k: sum(tvd(kmer_freqs(genome[s:s + a.new_tokens], k),  # type: ignore[index]
                                                spectra[src][k]) for s in starts) / 8 for k in (1, 2, 3, 4)}
        for mode, top_k in (("greedy", 1), ("sampled", 4)):
            out = generate(model, p.seq, a.new_tokens, drafter=None, top_k=top_k, seed=0,
                           record_id=pid)
            row = {"prompt": pid, "mode": mode, "gc": round(gc(out.text), 4),
                   "tokens_per_s": out.stats["tokens_per_s"],
                   "acgt_fraction": round(sum(out.text.count(x) for x in "ACGT") / len(out.text), 4)}
            row["source"] = src
            row["source_gc"] = round(spectra[src]["gc"], 4)  # type: ignore[arg-type]
            for k in (1, 2, 3, 4):
                row[f"tvd{k}_vs_source"] = round(tvd(kmer_freqs(out.text, k), spectra[src][k]), 4)
                row[f"tvd{k}_genome_window_floor"] = round(spectra[src]["floor"][k], 4)  # type: ignore[index]
            res["samples"].append(row)
            print(row, flush=True)
    res["native_tokens_per_s"] = round(sum(r["tokens_per_s"] for r in res["samples"]) / len(res["samples"]), 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["bits_per_nt"], indent=1))


if __name__ == "__main__":
    main()
