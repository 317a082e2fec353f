"""GPU check on a randomly initialised Evo-2-7B-shaped model (bf16): one prepared script.

    python benchmarks/gpu_check.py --out $OUT/gpu.json            # on a CUDA machine, ~1 min (H200)
    python benchmarks/gpu_check.py --dtype float32 --modes graphs --out $OUT/fp32.json
    python benchmarks/gpu_check.py --small --device cpu --out /tmp/gpu.json   # logic check on CPU

Measures, eagerly and with CUDA graphs (model/graphs.py): native decoding tokens/s (prefill
excluded), identity-drafter overhead (gamma 12; native and identity runs alternate twice, the
best of each is kept, tau and the draft/verify split are reported, and the overhead past the
first rounds, which pay for eager calls and graph recordings), extend(k) cost for
k = 1..16 relative to a step, the consistency of extend(k) with k one-token steps (bf16 rounds
them differently, which is why the identity drafter's tau falls below 13 in bf16), and whether
greedy tokens agree between eager and graphs. `benchmarks/gpu_run.sh` runs it with the rest of
the GPU check. Weights are random (Evo 2 weights cannot be downloaded here), which does not
change the cost.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from evspark_cli.decode.drafters.base import RngKey
from evspark_cli.decode.drafters.identity import IdentityDrafter
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.prefill import prefill_prompt
from evspark_cli.decode.sampling import SamplerConfig
from evspark_cli.decode.speculative import decode_speculative
from evspark_cli.model.checkpoint import cast_model
from evspark_cli.model.config import ModelConfig
from evspark_cli.model.model import StripedHyena
from evspark_cli.eval.provenance import provenance


def evo2_7b_config(small: bool) -> ModelConfig:
    n = 8 if small else 32
    pattern = ["hcs", "hcm", "hcl", "attn"] + ["hcs", "hcm", "hcl"] * 4
    pattern = (pattern * 3)[:n]
    if not small:
        pattern[-1] = "attn"
    idx = {k: [i for i, t in enumerate(pattern) if t == k] for k in ("hcs", "hcm", "hcl", "attn")}
    D = 256 if small else 4096
    return ModelConfig(model_name="evo2-7b-shaped-random", hidden_size=D, num_layers=n,
                       num_attention_heads=D // 128, hcs_layer_idxs=idx["hcs"], hcm_layer_idxs=idx["hcm"],
                       hcl_layer_idxs=idx["hcl"], attn_layer_idxs=idx["attn"],
                       hcs_filter_groups=D // 16, hcm_filter_groups=D // 16,
                       inner_mlp_size=(1024 if small else 11264), max_seqlen=1 << 20,
                       use_interpolated_rotary_pos_emb=True, rotary_emb_scaling_factor=128.0)


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, dev, reps: int, warmup: int = 3) -> float:
    """Median seconds of fn over reps calls, after warm-up calls (graph recording among them)."""
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        sync(dev)
        t = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def steady(res, skip: int = 40) -> float:
    """Seconds per token from the first progress mark at or past `skip` tokens to the end."""
    marks = [m for m in res.progress if m[0] >= skip]
    (n0, t0), (n1, t1) = marks[0], marks[-1]
    return (t1 - t0) / max(1, n1 - n0)


def measure(model: StripedHyena, prompt: list[int], dev: torch.device, tokens: int) -> dict:
    """Step, extend(k) for k = 1..16, native decoding and the identity drafter's overhead."""
    out: dict = {}
    with torch.inference_mode():
        ids = torch.tensor([prompt[:-1]], device=dev)
        t = time.perf_counter()
        _, _, state = model.prefill(ids, keep_last=1, reserve=4096)
        sync(dev)
        out["prefill_s"] = time.perf_counter() - t
        tok = torch.tensor([[65]], device=dev)
        step = timed(lambda: model.extend(state, tok)[2].commit(1), dev, 20)
        out["step_s"] = step
        out["extend_ratio"] = {}
        for k in range(1, 17):
            blk = torch.full((1, k), 67, device=dev)
            out["extend_ratio"][k] = timed(lambda: model.extend(state, blk), dev, 10) / step
        # bf16 consistency: extend(8) vs 8 single steps
        blk = torch.tensor([[65, 67, 71, 84, 65, 67, 71, 84]], device=dev)
        for _ in range(2):
            lb, _, _ = model.extend(state, blk)
        st = state
        outs = []
        for j in range(8):
            lg, _, b = model.extend(st, blk[:, j: j + 1])
            st = b.commit(1)
            outs.append(lg)
        out["extend_vs_steps_max_abs_logit_diff"] = float((lb - torch.cat(outs, 1)).abs().max())
    sampler = SamplerConfig(1.0, 4, 1.0)
    pre = prefill_prompt(model, prompt, reserve=tokens + 64, keep_hidden=0)
    decode_native(model, prompt, 32, sampler, RngKey(0, 0, 0), prefilled=pre)  # warm-up, recordings
    decode_speculative(model, prompt, 32, sampler, IdentityDrafter(), 12, RngKey(0, 0, 0), prefilled=pre)
    pairs = []  # native and identity-drafter runs alternate: order effects show up as spread
    for _ in range(2):
        nat = decode_native(model, prompt, tokens, sampler, RngKey(0, 0, 0), prefilled=pre)
        spec = decode_speculative(model, prompt, tokens, sampler, IdentityDrafter(), 12,
                                  RngKey(0, 0, 0), prefilled=pre)
        per_token = [b[1] - a[1] for a, b in zip(nat.progress, nat.progress[1:])]
        pairs.append({"native_s": nat.wall_s, "identity_s": spec.wall_s, "identity_tau": spec.tau,
                      "native_steady_ms_per_token": 1e3 * steady(nat),
                      "identity_steady_ms_per_token": 1e3 * steady(spec),
                      "identity_draft_s": spec.draft_s, "identity_verify_s": spec.verify_s,
                      "native_token_ms_median": 1e3 * statistics.median(per_token),
                      "identity_equals_native": spec.tokens == nat.tokens})
    out["pairs"] = pairs
    nat_s, spec_s = min(p["native_s"] for p in pairs), min(p["identity_s"] for p in pairs)
    out["native_tokens_per_s"] = tokens / nat_s
    out["identity_overhead"] = spec_s / nat_s
    # past the first rounds: a run's first step and first block of each shape run eagerly and
    # the second records a graph (each decode clones the prompt's state, so new KV caches)
    out["identity_overhead_steady"] = (min(p["identity_steady_ms_per_token"] for p in pairs)
                                       / min(p["native_steady_ms_per_token"] for p in pairs))
    # identity drafts come from steps, verification from extend(13): equal in exact arithmetic,
    # so sampled tokens match where the bf16 rounding of the two (extend_vs_steps) flips no draw
    out["identity_equals_native"] = all(p["identity_equals_native"] for p in pairs)
    greedy = decode_native(model, prompt, 64, SamplerConfig(1.0, 1, 1.0), prefilled=pre)
    out["greedy_tokens"] = greedy.tokens
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--dtype", default=None, help="bfloat16 (default on CUDA) or float32")
    ap.add_argument("--modes", default="eager,graphs", help="comma list of eager, graphs")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device(a.device)
    cfg = evo2_7b_config(a.small)
    with torch.device(dev):
        model = StripedHyena(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("log_poles"):
                p.uniform_(-0.5, -1e-3)
            elif p.dim() >= 2:
                p.normal_(0, 0.02)
            elif name.endswith("scale"):
                p.fill_(1.0)
            else:
                p.normal_(0, 0.02)
    dtype = getattr(torch, a.dtype) if a.dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    model = cast_model(model, dtype).eval()
    res: dict = {"config": cfg.to_dict(), "parameters": model.num_parameters(), "device": str(dev),
                 "dtype": str(dtype),
                 "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else None,
                 "torch": torch.__version__}
    prompt = torch.randint(0, 4, (a.prompt,)).tolist()
    prompt = [[65, 67, 71, 84][i] for i in prompt]
    # CUDA graphs on a GPU; on CPU the same static form re-run eagerly (a logic check)
    backend = "cuda" if dev.type == "cuda" else "eager"
    modes = a.modes.split(",")
    for mode in modes:
        model.graphs = None
        if mode == "graphs":
            model.use_graphs(backend)
        res[mode] = measure(model, prompt, dev, a.tokens)
        print(mode, json.dumps(res[mode]), flush=True)
    if "eager" in res and "graphs" in res:
        res["graph_speedup_native"] = (res["graphs"]["native_tokens_per_s"]
                                       / res["eager"]["native_tokens_per_s"])
        res["graph_speedup_step"] = res["eager"]["step_s"] / res["graphs"]["step_s"]
        res["graph_vs_eager_same_greedy_tokens"] = (res["graphs"]["greedy_tokens"]
                                                    == res["eager"]["greedy_tokens"])
    res["graphs_disabled_reason"] = model.graphs.disabled_reason if model.graphs else None
    res["provenance"] = provenance(" ".join(["python", "benchmarks/gpu_check.py", *sys.argv[1:]]))
    print(json.dumps(res, indent=1))
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
