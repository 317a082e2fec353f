"""Native decoding's time per token against a bare loop of `extend(1)` + sampling + `commit`.

    python benchmarks/native_step.py --out benchmarks/results/native_step.json
    python benchmarks/native_step.py --tokens 32 --repeats 1 --batches 1,4   # a smoke run

Speculative speedups divide by native decoding's time, so native decoding must carry no
overhead of its own: this times, on the same prompts and batch sizes, (a) the batched decoder
with no drafter (what `generate --drafter none` and `--compare-native` run) and (b) the bare
loop a native step cannot be leaner than: one `extend` of one token per row, the sampler
transform, one inverse-CDF draw per row from the same counter-based random numbers, one
`commit`. Both start from the same prefilled state (prefill is not timed) and must emit the same
tokens. The two alternate, `--repeats` times each (taking turns to go first); the best of
each is compared.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode.batch import BatchDecoder  # noqa: E402
from evspark_cli.decode.drafters.base import RngKey  # noqa: E402
from evspark_cli.decode.jobs import Job, row_reserve  # noqa: E402
from evspark_cli.decode.prefill import prefill_prompt  # noqa: E402
from evspark_cli.decode.sampling import (  # noqa: E402
    Purpose,
    SamplerConfig,
    sample_from_probs,
    sampler_probs,
)
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402
from evspark_cli.model.state import InferenceState  # noqa: E402


@torch.inference_mode()
def bare_loop(model, pre, jobs: list[Job], sampler: SamplerConfig) -> tuple[float, list]:
    """The leanest native loop over len(jobs) rows forked from one prefill: seconds, tokens."""
    B, n = len(jobs), jobs[0].max_new_tokens
    state: InferenceState = pre.state.select([0] * B)
    for c in state.caches():
        c.reserve(len(jobs[0].prompt) + row_reserve(n, 0))
    anchors = [pre.anchor] * B
    out: list[list[int]] = [[] for _ in range(B)]
    ends: list[float] = []
    for _ in range(n):
        ids = torch.tensor([[a] for a in anchors], dtype=torch.long)
        pos = state.lengths
        logits, _hidden, block = model.extend(state, ids)
        p = sampler_probs(logits[:, 0], sampler)
        u = torch.tensor([j.rng.float(pos[b] + 1, Purpose.SAMPLE) for b, j in enumerate(jobs)],
                         dtype=torch.float64)
        anchors = sample_from_probs(p, u).tolist()
        state = block.commit(1)
        for b, a in enumerate(anchors):
            out[b].append(a)
        ends.append(time.perf_counter())
    return _steps(ends), out


@torch.inference_mode()
def decoder(model, pre, jobs: list[Job], sampler: SamplerConfig) -> tuple[float, list]:
    """The batched decoder with no drafter on the same rows: seconds, tokens."""
    dec = BatchDecoder(model, sampler, None, 0, batch_size=len(jobs),
                       capacity=len(jobs[0].prompt) + row_reserve(jobs[0].max_new_tokens, 0))
    dec.share_prefill(jobs[0], pre)
    ends: list[float] = []
    dec.on_round = lambda report: ends.append(time.perf_counter())
    got = {o.job.index: o.result.tokens for o in dec.run(jobs)}
    return _steps(ends), [got[j.index] for j in jobs]


def _steps(ends: list[float]) -> float:
    """Seconds from the end of the first step to the end of the last, scaled to every step (the
    first step's start differs between the two loops: the decoder forks its rows there)."""
    return (ends[-1] - ends[0]) * len(ends) / (len(ends) - 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(ROOT / "examples" / "prompts.fa"))
    ap.add_argument("--prompt-len", type=int, default=1000)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    model = load_model()
    seq = read_prompts([a.prompts])[0].seq[-a.prompt_len:]
    ids = tuple(seq.encode())
    sampler = SamplerConfig(1.0, 4, 1.0)
    pre = prefill_prompt(model, ids, row_reserve(a.tokens, 0))
    rows = []
    for B in [int(b) for b in a.batches.split(",")]:
        jobs = [Job(s, ids, a.tokens, RngKey(0, 7, s), f"s{s}", "r", s) for s in range(B)]
        times = {"bare": [], "decoder": []}
        tokens = {}
        loops = [("bare", bare_loop), ("decoder", decoder)]
        for r in range(a.repeats):
            for name, fn in loops if r % 2 == 0 else loops[::-1]:  # neither always goes first
                secs, toks = fn(model, pre, jobs, sampler)
                times[name].append(secs)
                tokens[name] = toks
        per_token = {k: min(v) / (B * a.tokens) for k, v in times.items()}
        row = {"batch": B, "tokens_per_row": a.tokens, "seconds": times,
               "best_us_per_token": {k: round(v * 1e6, 2) for k, v in per_token.items()},
               "decoder_over_bare": round(per_token["decoder"] / per_token["bare"], 4),
               "same_tokens": tokens["bare"] == tokens["decoder"]}
        rows.append(row)
        print(f"batch {B}: bare {row['best_us_per_token']['bare']} us/token, decoder "
              f"{row['best_us_per_token']['decoder']} us/token, ratio "
              f"{row['decoder_over_bare']}, same tokens {row['same_tokens']}", flush=True)
    result = {"rows": rows, "threads": torch.get_num_threads(),
              "provenance": provenance(" ".join(sys.argv))}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
