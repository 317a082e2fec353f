"""Variant effect scores: shared-prefix scoring against scoring every window from scratch.

    python benchmarks/variant_bar.py --out benchmarks/results/variant_bar.json
    python benchmarks/variant_bar.py --variants 8 --window 1024 --out /tmp/v.json   # a smoke run

Random SNVs, insertions and deletions (`--variants`, a third multi-allelic SNV sites) at
random positions of a shared genome (../shared/data, else phiX174 from tests/fixtures), each
scored with Evo 2's windows (`--window`, default 8,192) by `eval/variants.score_variants`:
the shared prefix prefilled once per site and forked into the reference and ALT rows, against
`naive=True` (every window its own pass, in the model's prefill chunks: `window_ll`). Both are
timed in the same process on the bundled target in fp32, `--chunk-windows` windows at a time
both ways in alternating order (so the machine's drift over a long run weighs on both alike);
the largest difference of any score and delta is reported. Then in-silico saturation
mutagenesis of a `--mutagenesis-bases` region (every base to the three others, one window
holding the region: `score_mutagenesis`, one reference pass whose block commits give each
position's state) against every variant's window from scratch, timed as the first half of the
naive variants, the one-pass run, then the second half (each half scores the reference window
too: one window more than the naive computation needs, of 2 x 3 per base). Writes the result
with its provenance. The defaults are the issue's workload: about an hour on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.eval.variants import (  # noqa: E402
    consecutive_sites,
    saturation_variants,
    score_mutagenesis,
    score_variants,
    site_chunks,
)
from evspark_cli.io.fasta import open_reference  # noqa: E402
from evspark_cli.io.types import Variant  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

OTHER = {"A": "CGT", "C": "AGT", "G": "ACT", "T": "ACG"}


def genome() -> Path:
    shared = Path(os.environ.get("EVSPARK_SHARED") or ROOT.parent / "shared")
    for p in (shared / "data" / "train" / "ecoli_K12_MG1655.fa.gz",
              ROOT / "tests" / "fixtures" / "phiX174.fa.gz"):
        if p.is_file():
            return p
    raise SystemExit("no genome found")


def draw(ref, n: int, seed: int) -> list[Variant]:
    """n alleles: SNVs (a third of the sites multi-allelic), 1-6 base insertions and deletions."""
    rnd = random.Random(seed)
    name = max(ref.ids(), key=ref.length)
    length = ref.length(name)
    out: list[Variant] = []
    while len(out) < n:
        pos = rnd.randrange(1, length - 10)
        here = ref.fetch(name, pos, pos + 6).upper()
        if any(c not in "ACGT" for c in here):
            continue
        kind = rnd.choice(["snv", "snv", "ins", "del"])
        if kind == "snv":
            alts = OTHER[here[0]] if rnd.random() < 1 / 3 else rnd.choice(OTHER[here[0]])
            out += [Variant(name, pos, f"s{pos}", here[0], a) for a in alts]
        elif kind == "ins":
            k = rnd.randint(1, 6)
            out.append(Variant(name, pos, f"i{pos}", here[0],
                               here[0] + "".join(rnd.choice("ACGT") for _ in range(k))))
        else:
            k = rnd.randint(1, 6)
            out.append(Variant(name, pos, f"d{pos}", here[: k + 1], here[0]))
    out = out[:n]
    return sorted(out, key=lambda v: (v.pos, v.ref, v.alt))


def shaped(shape: str):
    """A random fp32 model of `shape` (HIDDENxLAYERS) with Evo 2's stripe: times, not scores."""
    from bench_engine import make_config

    from evspark_cli.model.model import StripedHyena
    from evspark_cli.train.pretrain import init_weights

    hidden, layers = (int(x) for x in shape.lower().split("x"))
    torch.manual_seed(0)
    model = StripedHyena(make_config(hidden, layers))
    init_weights(model, 0)
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", type=int, default=500, help="alleles")
    ap.add_argument("--chunk-windows", type=int, default=24,
                    help="windows (whole sites) timed both ways in turn")
    ap.add_argument("--window", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mutagenesis-bases", type=int, default=200,
                    help="bases of the mutagenesis region (3 variants each; 0: none)")
    ap.add_argument("--shape", help="HIDDENxLAYERS: a randomly initialised model with Evo 2's "
                    "stripe (bench_engine.make_config: attention at every 7th layer from the "
                    "4th) instead of the bundled target, to time a model whose attention is as "
                    "small a share of a window's work as in Evo 2")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    path = genome()
    ref = open_reference(str(path))
    variants = draw(ref, a.variants, a.seed)
    model = load_model() if a.shape is None else shaped(a.shape)
    score_variants(model, ref, variants[:1], a.window)  # warm-up, untimed
    times: dict[str, float] = {"shared": 0.0, "naive": 0.0}
    scores: dict[str, list] = {"shared": [], "naive": []}
    # both ways chunk by chunk, in alternating order, so that the machine's drift over a long
    # run weighs on both alike
    for i, chunk in enumerate(site_chunks(consecutive_sites(variants), a.chunk_windows)):
        for mode in (("shared", "naive") if i % 2 == 0 else ("naive", "shared")):
            t0 = time.perf_counter()
            got = score_variants(model, ref, chunk, a.window, naive=mode == "naive")
            times[mode] += time.perf_counter() - t0
            scores[mode] += got
    mut: dict = {}
    if a.mutagenesis_bases:
        name = max(ref.ids(), key=ref.length)
        start = ref.length(name) // 3
        end = start + a.mutagenesis_bases - 1
        every = saturation_variants(ref, name, start, end)
        halves = (every[: len(every) // 2], every[len(every) // 2:])
        got = {"one pass": [], "naive": []}
        seconds = {"one pass": 0.0, "naive": 0.0}
        for mode, only in (("naive", halves[0]), ("one pass", None), ("naive", halves[1])):
            t0 = time.perf_counter()
            got[mode] += score_mutagenesis(model, ref, name, start, end, a.window,
                                           naive=mode == "naive", only=only)
            seconds[mode] += time.perf_counter() - t0
        mut.update({f"{mode}_s": round(t, 3) for mode, t in seconds.items()})
        mut.update(region=f"{name}:{start}-{end}", variants=len(got["naive"]),
                   speedup=round(mut["naive_s"] / mut["one pass_s"], 3),
                   max_abs_difference_nats=max(
                       max(abs(f.ref_ll - n.ref_ll), abs(f.delta - n.delta))
                       for f, n in zip(got["one pass"], got["naive"])))
    ref.close()
    diff = max(max(abs(s.ref_ll - n.ref_ll), abs(s.alt_ll - n.alt_ll), abs(s.delta - n.delta))
               for s, n in zip(scores["shared"], scores["naive"]))
    sites = len({(v.chrom, v.pos) for v in variants})
    result = {"config": {**vars(a), "genome": str(path.relative_to(path.parents[2])),
                         "alleles": len(variants), "sites": sites,
                         "kinds": {k: sum(v.id[0] == k[0] for v in variants)
                                   for k in ("snv", "ins", "del")}},
              "seconds": {k: round(v, 3) for k, v in times.items()},
              "speedup": round(times["naive"] / times["shared"], 3),
              "max_abs_difference_nats": diff,
              "mutagenesis": mut,
              "provenance": provenance(" ".join(sys.argv))}
    print(json.dumps({k: result[k] for k in ("seconds", "speedup", "max_abs_difference_nats",
                                             "mutagenesis")}))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
