"""Embeddings against forward hooks: `embed` on the shared prompts, compared with what PyTorch
forward hooks on the model's modules see, and with the fast path's own numbers.

    python benchmarks/embed_check.py --out benchmarks/results/embed_check.json
    python benchmarks/embed_check.py --prompts-n 2 --out /tmp/e.json     # a smoke run

For each prompt of ../shared/data/prompts.fa (else windows of phiX174 from tests/fixtures) and
each layer of `--layers`, `eval/embed.embed_record` (pool `none`, the command's path) against:
(1) a PyTorch forward hook registered on that module (`blocks.N.mlp.l3`, `blocks.N.post_norm`,
`norm`), as Evo 2's `return_embeddings` takes them, during the model's recording pass; (2) that
pass's logits against the model's plain `forward`; (3) for `blocks.N` outputs, the fast path's
blocks (`ResidualBlock.forward`, the decode path's code) fed by hand. Reports the largest absolute difference of each, the logits' difference from
`forward`, and the bases embedded per second. Writes the result with its provenance.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.eval.embed import embed_record, resolve_layers  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402
from evspark_cli.model.tokenizer import tokenize_tensor  # noqa: E402


def prompts(n: int) -> list[tuple[str, str]]:
    shared = Path(os.environ.get("EVSPARK_SHARED") or ROOT.parent / "shared")
    path = shared / "data" / "prompts.fa"
    if path.is_file():
        got = [(p.id, p.seq) for p in read_prompts([str(path)])]
    else:
        phix = read_prompts([str(ROOT / "tests" / "fixtures" / "phiX174.fa.gz")])
        genome = phix[0].seq
        got = [(f"phix:{i * 500}", genome[i * 500: i * 500 + 400]) for i in range(10)]
    return got[:n]


def hooked(model, names: list[str], ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """What forward hooks on the named modules see during `model.activations`."""
    seen: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(n).register_forward_hook(
        lambda m, i, o, n=n: seen.__setitem__(n, o.detach().clone())) for n in names]
    try:
        model.activations(ids, names)
    finally:
        for h in handles:
            h.remove()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts-n", type=int, default=48)
    ap.add_argument("--layers", default="blocks.6.mlp.l3,blocks.3.post_norm,blocks.-1,final")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    model = load_model(None, device="cpu", dtype="float32")
    names = resolve_layers(model, a.layers.split(","))
    modules = [n for n in names if not n.split(".")[-1].isdigit()]  # blocks.N is not a call
    diffs = {"hook": 0.0, "fast_path_block": 0.0, "logits_vs_forward": 0.0}
    bases, seconds = 0, 0.0
    for _pid, seq in prompts(a.prompts_n):
        ids = tokenize_tensor(seq)
        t0 = time.perf_counter()
        got = embed_record(model, ids, names, "none", window=len(seq), context=0)
        seconds += time.perf_counter() - t0
        bases += len(seq)
        seen = hooked(model, modules, ids[None])
        for n in modules:
            diffs["hook"] = max(diffs["hook"], float((seen[n][0] - got[n]).abs().max()))
        with torch.inference_mode():
            logits, _ = model.activations(ids[None], [])
            diffs["logits_vs_forward"] = max(diffs["logits_vs_forward"],
                                             float((logits - model(ids[None])).abs().max()))
            x = model.embedding_layer(ids[None])
            for i, blk in enumerate(model.blocks):
                x, _ = blk.forward(x, None, (0,))
                if f"blocks.{i}" in got:
                    diffs["fast_path_block"] = max(diffs["fast_path_block"], float(
                        (x[0] - got[f"blocks.{i}"]).abs().max()))
    result = {"config": {**vars(a), "layers": names, "prompts": a.prompts_n, "bases": bases},
              "max_abs_difference": diffs,
              "bases_per_s": round(bases / seconds, 1),
              "provenance": provenance(" ".join(sys.argv))}
    print(json.dumps({k: result[k] for k in ("max_abs_difference", "bases_per_s")}, indent=2))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
