"""`--compile` on CPU: decode step and extend(13) through torch.compile vs eager, in one process.

    python benchmarks/compile_probe.py --out benchmarks/results/compile_probe.json

Two copies of a model (default the bundled target), one loaded with `compile=True` (the graph
runner's "compile" backend: the static extend(k) form of model/graphs.py through
torch.compile), advance the same way from the same prompt: a decode step (extend(1) +
commit(1)) then an extend(13) from the new state, timed in pairs so that drift of a shared
machine cancels in extend(13) / step; the two models alternate by round. Also reports the
compile time (first calls), graph breaks of the traced static form (`torch._dynamo.explain`)
and the largest logit difference between the two models; then whole decodes with the two
models alternating per prompt (native, dspark and identity-drafter speculative). The block
lengths a decoder uses are 1 (native) and gamma + 1 (verification); each compiles once per
process.
"""
from __future__ import annotations

import argparse
import sys
import json
import platform
import statistics
import time
import warnings

import torch

from evspark_cli.eval.provenance import provenance

from evspark_cli.model.checkpoint import load_model
from evspark_cli.model import graphs as graphs_mod
from evspark_cli.model.graphs import static_state


def graph_breaks(model, state) -> tuple[int, int]:
    ids, pos, st = torch.full((1, 1), 67), torch.tensor(state.lengths), static_state(state)
    ex = torch._dynamo.explain(lambda: model._run(ids, st, True, position=pos)[0])()
    torch._dynamo.reset()
    return ex.graph_count, ex.graph_break_count


def decode_ab(models: dict, a) -> dict:
    """Whole decodes, the two models alternating per prompt: native, dspark and identity-drafter
    speculative (sampled, T=1, top-k 4, gamma 12); tokens/s and identity overhead per model."""
    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.decode.drafters.base import RngKey
    from evspark_cli.decode.drafters.identity import IdentityDrafter
    from evspark_cli.decode.native import decode_native
    from evspark_cli.decode.sampling import SamplerConfig
    from evspark_cli.decode.speculative import decode_speculative

    sampler, n = SamplerConfig(1.0, 4, 1.0), a.decode_tokens
    gen = torch.Generator().manual_seed(1)
    prompts = [[[65, 67, 71, 84][i] for i in torch.randint(0, 4, (a.context,), generator=gen).tolist()]
               for _ in range(a.decode_prompts)]
    secs = {name: {"native": 0.0, "dspark": 0.0, "identity": 0.0} for name in models}
    same = True
    for name, m in models.items():  # warm-up (the step and gamma + 1 were compiled above)
        decode_native(m, prompts[0], 16, sampler)
        decode_speculative(m, prompts[0], 64, sampler, resolve_drafter(m, "auto"), 12)
        decode_speculative(m, prompts[0], 64, sampler, IdentityDrafter(), 12)
    for r, prompt in enumerate(prompts):
        toks = {}
        for name, m in models.items():
            key = RngKey(0, r, 0)
            for label, drafter in (("native", None), ("dspark", resolve_drafter(m, "auto")),
                                   ("identity", IdentityDrafter())):
                res = (decode_native(m, prompt, n, sampler, key) if drafter is None
                       else decode_speculative(m, prompt, n, sampler, drafter, 12, key))
                secs[name][label] += res.wall_s
                toks[(name, label)] = res.tokens
        same &= all(toks[("eager", lb)] == toks[("compile", lb)] for lb in ("native", "dspark", "identity"))
    total = n * len(prompts)
    out: dict = {"tokens": n, "prompts": len(prompts), "same_tokens": same}
    for name, t in secs.items():
        out[name] = {f"{lb}_tokens_per_s": round(total / s, 1) for lb, s in t.items()}
        out[name]["dspark_speedup"] = round(t["native"] / t["dspark"], 3)
        out[name]["identity_overhead"] = round(t["identity"] / t["native"], 3)
    out["compile_over_eager"] = {lb: round(secs["eager"][lb] / secs["compile"][lb], 3)
                                 for lb in ("native", "dspark", "identity")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="model folder (default: the bundled target)")
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=60, help="timed pairs per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--decode-tokens", type=int, default=512, help="whole decodes (0: skip)")
    ap.add_argument("--decode-prompts", type=int, default=6)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    default_compile_after = graphs_mod.COMPILE_AFTER
    graphs_mod.COMPILE_AFTER = 1  # compile each block length at its first call (timed below)
    torch.set_num_threads(a.threads)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([65, 67, 71, 84])[torch.randint(0, 4, (1, a.context), generator=gen)]
    block = torch.tensor([65, 67, 71, 84] * 4)[None, :13]
    res: dict = {"benchmark": "compile_probe", "torch": torch.__version__, "threads": a.threads,
                 "cpu": platform.processor() or platform.machine(), "context": a.context}
    models = {"eager": load_model(a.model), "compile": load_model(a.model, compile=True)}
    live: dict = {}
    times = {name: {"step": [], "extend13": []} for name in models}
    with torch.inference_mode():
        for name, m in models.items():
            live[name] = m.prefill(prompt, reserve=a.rounds * (a.reps + 8) + 64)[2]
        logits = {}
        for name, m in models.items():  # first calls: eager, then recorded (compiled)
            t = time.perf_counter()
            for _ in range(3):
                lg, _, b = m.extend(live[name], block[:, :1])
                live[name] = b.commit(1)
                logits[name] = m.extend(live[name], block)[0]
            res[f"{name}_first_calls_s"] = round(time.perf_counter() - t, 1)
        res["max_abs_logit_diff"] = float((logits["eager"] - logits["compile"]).abs().max())
        for _ in range(a.rounds):
            for name, m in models.items():
                for r in range(a.reps + 5):
                    t0 = time.perf_counter()
                    _, _, b = m.extend(live[name], block[:, :1])
                    live[name] = b.commit(1)
                    t1 = time.perf_counter()
                    m.extend(live[name], block)
                    t2 = time.perf_counter()
                    if r >= 5:
                        times[name]["step"].append(t1 - t0)
                        times[name]["extend13"].append(t2 - t1)
        # last (it resets dynamo): the compile model's runner has built every table it reads
        res["graphs"], res["graph_breaks"] = graph_breaks(models["compile"], live["compile"])
    for name in models:
        step = statistics.median(times[name]["step"])
        ext = statistics.median(times[name]["extend13"])
        res[name] = {"step_ms": round(1e3 * step, 3), "extend13_ms": round(1e3 * ext, 3),
                     "extend13_over_step": round(ext / step, 3)}
    res["compile_speedup"] = {k: round(res["eager"][f"{k}_ms"] / res["compile"][f"{k}_ms"], 3)
                              for k in ("step", "extend13")}
    if a.decode_tokens:  # as a user runs it: the last round's odd lengths stay eager
        graphs_mod.COMPILE_AFTER = default_compile_after
        res["decode"] = decode_ab(models, a)
    res["compile_replays"] = models["compile"].graphs.replays
    res["compile_disabled_reason"] = models["compile"].graphs.disabled_reason
    print(json.dumps(res, indent=1))
    if a.out:
        res["provenance"] = provenance(" ".join(["python", "benchmarks/compile_probe.py",
                                                 *sys.argv[1:]]))
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
