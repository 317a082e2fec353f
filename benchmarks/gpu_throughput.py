"""Batched throughput on a GPU: an Evo-2-7B-shaped random bf16 model at batch 1 / 8 / 32.

    python benchmarks/gpu_throughput.py --out $OUT/throughput.json     # CUDA, a few minutes (H200)
    python benchmarks/gpu_throughput.py --small --device cpu --out /tmp/t.json   # logic check

For each batch size and rule (`--rules`, residual and coupled by default; the coupled rows also
with the confidence draft length): tokens/s of native decoding and of speculative decoding with
the identity and k-mer drafters (gamma 12, T=1 top-k 4, prompts of 1k tokens, prefill excluded:
every row
starts from a shared prefilled prompt), the modes interleaved; and the native decode step
against the weight-read bound (bytes of weights / HBM bandwidth, `--bandwidth`, 4.8 TB/s for
an H200), whose ratio is the figure to bring within 1.5x at batch 1. Weights are random (Evo 2
weights cannot be downloaded here), which does not change the cost.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import torch

from evspark_cli.decode.batch import BatchDecoder

from evspark_cli.decode.jobs import Job

from evspark_cli.decode.prefill import prefill_prompt
from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.drafters.kmer import KmerDrafter
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.model.checkpoint import cast_model
from evspark_cli.model.model import StripedHyena

from gpu_check import evo2_7b_config, sync  # noqa: E402  (benchmarks/ is the script's folder)

SAMPLED = SamplerConfig(1.0, 4, 1.0)


def run(model: StripedHyena, prompt: list[int], batch: int, tokens: int, drafter, dev,
        sampler: SamplerConfig = SAMPLED, adaptive: bool = False) -> dict:
    """Tokens/s of `batch` rows decoding `tokens` tokens each from one shared prefill, and their
    tokens (to compare the coupled rule's speculative rows with native sampling)."""
    gamma = 12 if drafter is not None else 0
    pre = prefill_prompt(model, prompt, reserve=tokens + gamma + 16,
                         keep_hidden=drafter.prefix_len if drafter is not None else 0)
    jobs = [Job(s, tuple(prompt), tokens, RngKey(0, 1, s)) for s in range(batch)]
    dec = BatchDecoder(model, sampler, drafter, gamma, batch_size=batch, adaptive=adaptive)
    dec.share_prefill(jobs[0], pre)
    sync(dev)
    t = time.perf_counter()
    outs = [o for o in dec.run(jobs)]
    sync(dev)
    dt = time.perf_counter() - t
    n = sum(len(o.result.tokens) for o in outs if o.result is not None)
    rounds = sum(o.result.rounds for o in outs if o.result is not None)
    verified = sum(o.result.verified for o in outs if o.result is not None)
    return {"tokens": n, "seconds": round(dt, 4), "tokens_per_s": round(n / dt, 1),
            "tau": round(n / rounds, 3) if rounds else None,
            "efficiency": round(n / verified, 3) if verified else None,
            "_out": {o.job.index: o.result.tokens for o in outs if o.result is not None}}


def step_time(model: StripedHyena, prompt: list[int], dev, reps: int) -> float:
    """Median seconds of one native decode step (batch 1) at the prompt's context."""
    pre = prefill_prompt(model, prompt, reserve=reps + 16)
    st = pre.state.clone()
    tok = torch.tensor([[prompt[-1]]], device=dev)
    times = []
    with torch.inference_mode():
        for i in range(reps + 5):
            sync(dev)
            t = time.perf_counter()
            _, _, blk = model.extend(st, tok)
            st = blk.commit(1)
            sync(dev)
            if i >= 5:
                times.append(time.perf_counter() - t)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="a small model (CPU logic check)")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="HBM bytes/s (H200: 4.8e12)")
    ap.add_argument("--no-graphs", action="store_true")
    ap.add_argument("--rules", default="residual,coupled")
    a = ap.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(0)
    cfg = evo2_7b_config(a.small)
    model = StripedHyena(cfg)
    for p in model.parameters():  # random weights of a sensible scale
        torch.nn.init.normal_(p, 0.0, 0.02)
    model = cast_model(model.to(dev), torch.bfloat16 if dev.type == "cuda" else torch.float32).eval()
    if dev.type == "cuda" and not a.no_graphs:
        model.use_graphs("cuda")
    prompt = [65 + (i * 7919) % 4 for i in range(a.prompt_len)]
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    step = step_time(model, prompt, dev, 20 if a.small else 50)
    result = {"machine": {"device": torch.cuda.get_device_name(0) if dev.type == "cuda" else
                          platform.processor(), "torch": torch.__version__},
              "model": {"config": cfg.model_name, "parameters": model.num_parameters(),
                        "weight_bytes": weight_bytes, "dtype": str(next(model.parameters()).dtype)},
              "native_step_s": step, "weight_read_bound_s": weight_bytes / a.bandwidth,
              "step_over_bound": round(step / (weight_bytes / a.bandwidth), 3), "batches": {}}
    drafters = {"native": (None, False), "identity": (IdentityDrafter(), False),
                "kmer": (KmerDrafter(), False)}
    for b in (int(x) for x in a.batches.split(",")):
        for rule in a.rules.split(","):
            sampler = SamplerConfig(1.0, 4, 1.0, rule)
            modes = dict(drafters)
            if rule == "coupled":
                modes["kmer-confidence"] = (KmerDrafter(), True)
            row = {}
            for name, (d, adaptive) in modes.items():  # warm-up (graphs), then the timed run
                run(model, prompt, b, 16, d, dev, sampler, adaptive)
                row[name] = run(model, prompt, b, a.tokens, d, dev, sampler, adaptive)
            native = row["native"].pop("_out")
            for name in modes:
                if name == "native":
                    continue
                out = row[name].pop("_out")
                row[f"{name}_vs_native"] = round(row[name]["tokens_per_s"] /
                                                 row["native"]["tokens_per_s"], 3)
                if rule == "coupled":
                    row[name]["rows_differing_from_native"] = sum(
                        out[i] != native[i] for i in native)
            key = str(b) if rule == "residual" else f"{b}/{rule}"
            result["batches"][key] = row
            print(json.dumps({key: row}), flush=True)
    from evspark_cli.eval.provenance import provenance

    result["provenance"] = provenance(" ".join(["python", "benchmarks/gpu_throughput.py",
                                                *sys.argv[1:]]))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
