"""Native decoding's time per token against a bare loop of `extend(1)` + sampling + `commit`.

    python benchmarks/native_step.py --out benchmarks/results/native_step.json
    python benchmarks/native_step.py --tokens 32 --repeats 1 --batches 1,4   # a smoke run

Speculative speedups divide by native decoding's time, so native decoding must carry no
overhead of its own: this times, on the same prompts and batch sizes, (a) the batched decoder
with no drafter (what `generate --drafter none` and `--compare-native` run) and (b) the bare
loop a native step cannot be leaner than: one `extend` of one token per row, the sampler
transform, one inverse-CDF draw per row from the same counter-based random numbers, one
`commit`. Both start from the same prefilled state (prefill is not timed) and must emit the same
tokens. The two run at once in turns of 50 ms (decode/interleave.py), each timed only during
its own turns, `--repeats` times; their total times per token are compared.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode.batch import BatchDecoder, JobList  # noqa: E402
from evspark_cli.decode.interleave import interleave, timed_run  # noqa: E402
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


class BareLoop:
    """The leanest native loop over len(jobs) rows forked from one prefill, one token per row a
    step (a `Stepper`, so it can take turns with the decoder): one `extend` of one token per
    row, the sampler transform, one inverse-CDF draw per row from the same counter-based
    random numbers, one `commit`."""

    def __init__(self, model, pre, jobs: list[Job], sampler: SamplerConfig) -> None:
        self.model, self.pre, self.jobs, self.sampler = model, pre, jobs, sampler
        self.state: InferenceState | None = None
        self.anchors: list[int] = []
        self.out: list[list[int]] = [[] for _ in jobs]
        self.left = jobs[0].max_new_tokens
        self.tokens_emitted = 0

    @torch.inference_mode()
    def step(self, source) -> list | None:
        if self.left == 0:
            return None
        jobs = self.jobs
        if self.state is None:  # the rows forked from the prefill, as the decoder forks them
            self.state = self.pre.state.select([0] * len(jobs))
            for c in self.state.caches():
                c.reserve(len(jobs[0].prompt) + row_reserve(jobs[0].max_new_tokens, 0))
            self.anchors = [self.pre.anchor] * len(jobs)
        ids = torch.tensor([[a] for a in self.anchors], dtype=torch.long)
        pos = self.state.lengths
        logits, _hidden, block = self.model.extend(self.state, ids)
        p = sampler_probs(logits[:, 0], self.sampler)
        u = torch.tensor([j.rng.float(pos[b] + 1, Purpose.SAMPLE) for b, j in enumerate(jobs)],
                         dtype=torch.float64)
        self.anchors = sample_from_probs(p, u).tolist()
        self.state = block.commit(1)
        for b, a in enumerate(self.anchors):
            self.out[b].append(a)
        self.left -= 1
        self.tokens_emitted += len(jobs)
        return []


def pair(model, pre, jobs: list[Job], sampler: SamplerConfig) -> tuple[dict, dict]:
    """The bare loop and the batched decoder (no drafter) on the same rows, in turns
    (decode/interleave.py): seconds of each, and the tokens each emitted."""
    bare = timed_run(lambda clock: BareLoop(model, pre, jobs, sampler), JobList(iter([])))

    def decoder(clock) -> BatchDecoder:
        dec = BatchDecoder(model, sampler, None, 0, batch_size=len(jobs), clock=clock,
                           capacity=len(jobs[0].prompt) + row_reserve(jobs[0].max_new_tokens, 0))
        dec.share_prefill(jobs[0], pre)
        return dec

    dec = timed_run(decoder, JobList(iter(jobs)))
    interleave([bare, dec])
    got = {o.job.index: o.result.tokens for o in dec.outcomes}
    return ({"bare": bare.seconds, "decoder": dec.seconds},
            {"bare": bare.decoder.out, "decoder": [got[j.index] for j in jobs]})


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
        times: dict[str, list[float]] = {"bare": [], "decoder": []}
        same = True
        for _ in range(a.repeats):
            secs, toks = pair(model, pre, jobs, sampler)
            for k in times:
                times[k].append(secs[k])
            same = same and toks["bare"] == toks["decoder"]
        ratios = [d / b for d, b in zip(times["decoder"], times["bare"])]
        per_token = {k: sum(v) / (len(v) * B * a.tokens) for k, v in times.items()}
        row = {"batch": B, "tokens_per_row": a.tokens, "seconds": times,
               "us_per_token": {k: round(v * 1e6, 2) for k, v in per_token.items()},
               "decoder_over_bare": round(per_token["decoder"] / per_token["bare"], 4),
               "decoder_over_bare_per_repeat": [round(r, 4) for r in ratios],
               "same_tokens": same}
        rows.append(row)
        print(f"batch {B}: bare {row['us_per_token']['bare']} us/token, decoder "
              f"{row['us_per_token']['decoder']} us/token, ratio {row['decoder_over_bare']} "
              f"(repeats {min(ratios):.3f}-{max(ratios):.3f}), same tokens {same}", flush=True)
    result = {"rows": rows, "threads": torch.get_num_threads(),
              "provenance": provenance(" ".join(sys.argv))}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
