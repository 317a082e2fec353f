#!/usr/bin/env python
"""Engine costs on CPU: decode step, extend(k) / step, commit vs replay, KV length, prefill.

Decode step, extend(k), commit(j), snapshot-and-replay, prefill throughput and state size, for a
model folder (e.g. the bundled target) or a randomly
initialised ~10M-parameter StripedHyena 2 with Evo 2's stripe.

    python benchmarks/bench_engine.py --model models/evspark-sh2-192   # the bundled target
    python benchmarks/bench_engine.py            # random 256 x 12 stripe (several minutes)
    python benchmarks/bench_engine.py --quick    # tiny smoke run (seconds)

`--kv-contexts 32768 131072 262144` also times a decode step and extend(k) against KV caches of
those lengths (rows filled with random keys/values: the cost of a step does not depend on their
content, and a real prefill of 262k tokens takes minutes; `evspark bench` measures real ones).

Results go to benchmarks/results/engine.json (quick runs: engine_quick.json) and a markdown
summary is printed. Timings are medians over --reps repetitions after --warmup repetitions, under
torch.inference_mode. Prefill runs each length in a fresh subprocess so that its peak RSS
(resource.getrusage ru_maxrss) is its own.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from evspark_cli.eval.provenance import provenance

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from evspark_cli.model.config import ModelConfig  # noqa: E402
from evspark_cli.model.model import StripedHyena  # noqa: E402
from evspark_cli.train.pretrain import init_weights  # noqa: E402

EXTEND_KS = tuple(range(1, 17))
KV_EXTEND_KS = (1, 4, 8, 13, 16)
COMMIT_JS = (1, 4, 8, 13, 16)


# ------------------------------------------------------------------------------ setup


def evo2_pattern(n_layers: int) -> dict[str, list[int]]:
    """Evo 2 7B's stripe truncated to n layers: attention at i % 7 == 3, Hyena SE/MR/LI cycling."""
    idx: dict[str, list[int]] = {"hcs": [], "hcm": [], "hcl": [], "attn": []}
    h = 0
    for i in range(n_layers):
        if i % 7 == 3:
            idx["attn"].append(i)
        else:
            idx[("hcs", "hcm", "hcl")[h % 3]].append(i)
            h += 1
    return idx


def make_config(hidden: int, layers: int) -> ModelConfig:
    idx = evo2_pattern(layers)
    return ModelConfig(
        model_name=f"bench-{hidden}x{layers}", hidden_size=hidden, num_layers=layers,
        num_attention_heads=max(1, hidden // 64),
        hcs_layer_idxs=idx["hcs"], hcm_layer_idxs=idx["hcm"], hcl_layer_idxs=idx["hcl"],
        attn_layer_idxs=idx["attn"],
        hcs_filter_groups=max(1, hidden // 16), hcm_filter_groups=max(1, hidden // 16),
        hcs_filter_length=7, hcm_filter_length=128, state_size=16, short_filter_length=3,
        use_interpolated_rotary_pos_emb=True, rotary_emb_scaling_factor=4.0,
        max_seqlen=65536, prefill_chunk=8192)


def build_model(args) -> StripedHyena:
    if args.compile:  # each length compiles at its first (warm-up) call, not inside timed ones
        from evspark_cli.model import graphs

        graphs.COMPILE_AFTER = 1
    if args.model:
        from evspark_cli.model.checkpoint import load_model

        return load_model(args.model, dtype=args.dtype, compile=args.compile).eval()
    torch.manual_seed(0)
    model = StripedHyena(make_config(args.hidden, args.layers))
    init_weights(model, 0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if dtype != torch.float32:
        from evspark_cli.model.checkpoint import cast_model

        cast_model(model, dtype)
    if args.compile:
        model.use_graphs("compile")
    return model.eval()


def rss_mib() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mib() -> float:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        return float("nan")


def median_time(fn, reps: int, warmup: int, inner: int = 1) -> float:
    """Median seconds per call of fn over `reps` samples of `inner` calls each, after warm-up."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return statistics.median(samples)


def ids(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.tensor([[65, 67, 71, 84][i] for i in torch.randint(0, 4, (n,), generator=g)])[None]


# ------------------------------------------------------------------------------ measurements


@torch.inference_mode()
def bench_decode(model: StripedHyena, args) -> dict:
    ctx = args.context
    prompt = ids(ctx, 1)
    drafts = ids(max(EXTEND_KS) + max(COMMIT_JS) + 8, 2)
    _, _, state = model.prefill(prompt, keep_last=1, reserve=args.reserve)

    # decode step: extend(k=1) + commit(1); the state advances (realistic decoding)
    box = {"st": state, "i": 0}

    def step():
        tok = drafts[:, box["i"] % 8: box["i"] % 8 + 1]
        _, _, blk = model.extend(box["st"], tok)
        box["st"] = blk.commit(1)
        box["i"] += 1

    step_s = median_time(step, args.reps, args.warmup)
    base = box["st"]  # context + warm-up + reps tokens; every later measurement starts here

    # extend(k) paired with a step: each repetition times one decode step and one extend(k) from
    # the same live state (its rows past the length are scratch), so that drift of a shared
    # machine cancels in the ratio; extend_over_step[k] = median extend(k) / median paired step
    extend_s, paired_step_s = {}, {}
    for k in EXTEND_KS:
        t_ext, t_step = [], []
        for r in range(args.warmup + args.reps):
            t0 = time.perf_counter()
            step()
            t1 = time.perf_counter()
            model.extend(box["st"], drafts[:, :k])
            t2 = time.perf_counter()
            if r >= args.warmup:
                t_step.append(t1 - t0)
                t_ext.append(t2 - t1)
        extend_s[k], paired_step_s[k] = statistics.median(t_ext), statistics.median(t_step)

    # commit(j) of a k=16 block: slicing only
    _, _, blk16 = model.extend(base, drafts[:, :16])
    commit_s = {j: median_time(lambda: blk16.commit(j), args.reps, args.warmup, inner=200)
                for j in COMMIT_JS}

    # rollback: slice commit vs snapshot-and-replay (clone before the round, re-feed j tokens)
    clone_s = median_time(lambda: base.clone(), args.reps, args.warmup)
    snapshot = base.clone()
    replay_s = {}
    for j in COMMIT_JS:
        def replay():
            _, _, b = model.extend(snapshot, drafts[:, :j])
            b.commit(j)
        replay_s[j] = median_time(replay, args.reps, args.warmup)
    round_slice, round_replay = {}, {}
    for j in COMMIT_JS:  # a whole verification round with 16 tokens, accepting j of them
        def r_slice():
            _, _, b = model.extend(base, drafts[:, :16])
            b.commit(j)

        def r_replay():
            snap = base.clone()
            _, _, b = model.extend(base, drafts[:, :16])
            _, _, r = model.extend(snap, drafts[:, :j])
            r.commit(j)
        round_slice[j] = median_time(r_slice, args.reps, args.warmup)
        round_replay[j] = median_time(r_replay, args.reps, args.warmup)

    nb = base.nbytes()
    kv_rows = sum(s.cache.capacity for s in base.layers if hasattr(s, "cache"))
    return {
        "context_tokens": base.seqlen,
        "step_s": step_s,
        "steps_per_s": 1.0 / step_s,
        "extend_s": {str(k): v for k, v in extend_s.items()},
        "paired_step_s": {str(k): v for k, v in paired_step_s.items()},
        "extend_over_step": {str(k): v / paired_step_s[k] for k, v in extend_s.items()},
        "extend_per_token_over_step": {str(k): v / (k * paired_step_s[k])
                                       for k, v in extend_s.items()},
        "commit_s": {str(j): v for j, v in commit_s.items()},
        "clone_s": clone_s,
        "replay_extend_commit_s": {str(j): v for j, v in replay_s.items()},
        "rollback_replay_over_slice": {str(j): (clone_s + replay_s[j]) / commit_s[j]
                                       for j in COMMIT_JS},
        "round16_slice_s": {str(j): v for j, v in round_slice.items()},
        "round16_replay_s": {str(j): v for j, v in round_replay.items()},
        "state_bytes": {
            "fixed_per_sequence": nb["fixed"],
            "kv_per_token": nb["kv_per_token"],
            "total_at_context": nb["total"],
            "per_token_at_context": nb["total"] / base.seqlen,
            "kv_rows_allocated_all_layers": kv_rows,
        },
    }


@torch.inference_mode()
def bench_kv_contexts(model: StripedHyena, args) -> list[dict]:
    """Step and extend(k) against KV caches of the given lengths (random rows, see module doc)."""
    from evspark_cli.model.state import InferenceState, KVState

    out = []
    drafts = ids(16, 5)
    for L in args.kv_contexts:
        empty = model.empty_state(1, capacity=L + 64)
        layers = []
        g = torch.Generator().manual_seed(L)
        for st in empty.layers:
            if isinstance(st, KVState):
                for t in (st.cache.k, st.cache.v):
                    t[:, :, :L] = torch.randn(t[:, :, :L].shape, generator=g).to(t.dtype)
                layers.append(KVState(st.cache, (L,), st.cache.version))
            else:
                layers.append(st)
        state = InferenceState(tuple(layers), (L,))
        reps = max(5, args.reps // 5)
        t = {k: median_time(lambda: model.extend(state, drafts[:, :k])[2].commit(k), reps, 2)
             for k in KV_EXTEND_KS}
        out.append({"kv_tokens": L, "extend_s": {str(k): v for k, v in t.items()},
                    "extend_over_step": {str(k): v / t[1] for k, v in t.items()},
                    "kv_bytes": state.nbytes()["kv_per_token"] * L})
        print(f"  kv {L}: step {t[1] * 1e3:.2f} ms, extend(13) {t[13] / t[1]:.2f} x step", file=sys.stderr)
        del state, layers, empty
    return out


def plot_extend(res: dict, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    d = res["decode"]
    ks = [int(k) for k in d["extend_over_step"]]
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(ks, list(d["extend_over_step"].values()), marker="o",
            label=f"context {d['context_tokens']}")
    for row in res.get("kv_contexts", []):
        kk = [int(k) for k in row["extend_over_step"]]
        ax.plot(kk, list(row["extend_over_step"].values()), marker="s", label=f"KV {row['kv_tokens']}")
    ax.axhline(1.6, color="grey", linestyle=":", label="goal at k=13 (1.6)")
    ax.set_xlabel("k (tokens in the block)")
    ax.set_ylabel("extend(k) time / decode step")
    ax.set_title(res["model"].get("name") or "engine")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def child_prefill(args) -> dict:
    """Run in a fresh process: one prefill of args.child_prefill tokens, timed, with peak RSS."""
    model = build_model(args)  # outside inference_mode (see the engine note in the report)
    with torch.inference_mode():
        return _timed_prefill(model, args)


def _timed_prefill(model: StripedHyena, args) -> dict:
    warm = ids(64, 3)
    model.prefill(warm, keep_last=1, reserve=0)
    rss0 = rss_mib()
    now0 = current_rss_mib()
    n = args.child_prefill
    prompt = ids(n, 4)
    t0 = time.perf_counter()
    logits, _, state = model.prefill(prompt, keep_last=1, reserve=args.reserve)
    dt = time.perf_counter() - t0
    assert torch.isfinite(logits).all()
    nb = state.nbytes()
    return {"tokens": n, "seconds": dt, "tokens_per_s": n / dt,
            "peak_rss_mib": rss_mib(), "peak_rss_before_mib": rss0, "rss_before_mib": now0,
            "peak_rss_increase_mib": rss_mib() - rss0,
            "chunk": model.config.prefill_chunk,
            "state_bytes_total": nb["total"], "state_bytes_per_token": nb["total"] / n}


def bench_prefill(args) -> list[dict]:
    out = []
    for n in args.prefill_sizes:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-prefill", str(n),
               "--hidden", str(args.hidden), "--layers", str(args.layers), "--dtype", args.dtype,
               "--reserve", str(args.reserve), "--threads", str(args.threads)]
        if args.model:
            cmd += ["--model", str(args.model)]
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT))
        if res.returncode != 0:
            out.append({"tokens": n, "error": (res.stderr.strip().splitlines() or ["?"])[-1]})
        else:
            out.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(f"  prefill {n}: {out[-1]}", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------ report


def fmt_s(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def markdown(res: dict) -> str:
    d, m = res["decode"], res["model"]
    lines = [f"## EvSpark engine benchmark ({res['device']}, {m['dtype']}, {res['threads']} threads)",
             "",
             f"Model: hidden {m['hidden_size']}, {m['num_layers']} layers {m['pattern']}, "
             f"{m['parameters'] / 1e6:.2f} M parameters. Context {d['context_tokens']} tokens.",
             "",
             "| measurement | value | ratio |", "|---|---|---|",
             f"| decode step (extend k=1 + commit 1) | {fmt_s(d['step_s'])} | "
             f"{d['steps_per_s']:.1f} tok/s |"]
    for k, v in d["extend_s"].items():
        lines.append(f"| extend(k={k}) | {fmt_s(v)} | {d['extend_over_step'][k]:.2f} x step "
                     f"({d['extend_per_token_over_step'][k]:.2f} per token) |")
    for j, v in d["commit_s"].items():
        lines.append(f"| commit(j={j}) of a 16-block (slice) | {fmt_s(v)} | |")
    lines.append(f"| state.clone() (snapshot) | {fmt_s(d['clone_s'])} | |")
    for j, v in d["replay_extend_commit_s"].items():
        lines.append(f"| replay: extend(snapshot, {j}) + commit | {fmt_s(v)} | clone+replay = "
                     f"{d['rollback_replay_over_slice'][j]:.0f} x slice commit |")
    for j in d["round16_slice_s"]:
        a, b = d["round16_slice_s"][j], d["round16_replay_s"][j]
        lines.append(f"| round of 16, accept {j}: slice / replay | {fmt_s(a)} / {fmt_s(b)} | "
                     f"replay {b / a:.2f} x |")
    sb = d["state_bytes"]
    lines += [f"| state fixed bytes per sequence | {sb['fixed_per_sequence'] / 2**10:.1f} KiB | |",
              f"| KV bytes per token | {sb['kv_per_token']} B | |",
              f"| state bytes at context | {sb['total_at_context'] / 2**20:.2f} MiB | "
              f"{sb['per_token_at_context']:.0f} B/token |"]
    for row in res.get("kv_contexts", []):
        e = row["extend_s"]
        lines.append(f"| KV {row['kv_tokens']} tokens: step / extend(13) | {fmt_s(e['1'])} / "
                     f"{fmt_s(e['13'])} | {row['extend_over_step']['13']:.2f} x step |")
    for p in res["prefill"]:
        if "error" in p:
            lines.append(f"| prefill {p['tokens']} tokens | failed: {p['error']} | |")
        else:
            lines.append(f"| prefill {p['tokens']} tokens | {p['tokens_per_s']:.0f} tok/s "
                         f"({p['seconds']:.2f} s) | peak RSS {p['peak_rss_mib']:.0f} MiB "
                         f"(+{p['peak_rss_increase_mib']:.0f} over the loaded model) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny smoke run (small model, few reps)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 256; quick 64)")
    ap.add_argument("--layers", type=int, default=None, help="layers (default 12; quick 7)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--model", default=None, help="model folder (default: a random Evo 2 stripe)")
    ap.add_argument("--kv-contexts", type=int, nargs="*", default=[],
                    help="also time step/extend(k) against KV caches of these lengths")
    ap.add_argument("--context", type=int, default=None,
                    help="prompt tokens before the decode measurements (default 1024; quick 64)")
    ap.add_argument("--reps", type=int, default=None, help="timed repetitions (default 50; quick 5)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up repetitions (default 10; quick 2)")
    ap.add_argument("--reserve", type=int, default=1024, help="KV rows reserved past the prompt")
    ap.add_argument("--prefill-sizes", type=int, nargs="*", default=None,
                    help="prefill lengths (default 1024 8192 32768; quick 256 1024)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    ap.add_argument("--compile", action="store_true", help="decode through torch.compile "
                    "(load_model(compile=True)); each block length compiles once, in warm-up")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON output (default benchmarks/results/engine.json; quick: engine_quick.json)")
    ap.add_argument("--child-prefill", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    q = args.quick
    args.hidden = args.hidden or (64 if q else 256)
    args.layers = args.layers or (7 if q else 12)
    args.context = args.context or (64 if q else 1024)
    args.reps = args.reps or (5 if q else 50)
    args.warmup = args.warmup if args.warmup is not None else (2 if q else 10)
    if args.prefill_sizes is None:
        args.prefill_sizes = [256, 1024] if q else [1024, 8192, 32768]
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.child_prefill is not None:
        print(json.dumps(child_prefill(args)))
        return 0

    model = build_model(args)
    cfg = model.config
    n_params = model.num_parameters()
    print(f"model: hidden {cfg.hidden_size}, {cfg.num_layers} layers {cfg.layer_pattern}, "
          f"{n_params:,} parameters ({n_params / 1e6:.2f} M)", file=sys.stderr)
    t0 = time.perf_counter()
    decode = bench_decode(model, args)
    kv_contexts = bench_kv_contexts(model, args)
    prefill = bench_prefill(args)
    res = {
        "benchmark": "engine",
        "quick": q,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {"context": args.context, "reps": args.reps, "warmup": args.warmup,
                     "reserve": args.reserve, "extend_ks": list(EXTEND_KS),
                     "commit_js": list(COMMIT_JS), "prefill_sizes": args.prefill_sizes,
                     "timing": "median seconds per call under torch.inference_mode"},
        "model": {"name": cfg.model_name if args.model else None, "folder": args.model,
                  "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
                  "pattern": cfg.layer_pattern, "heads": cfg.num_attention_heads,
                  "mlp_size": cfg.mlp_size, "parameters": n_params, "dtype": args.dtype},
        "decode": decode,
        "kv_contexts": kv_contexts,
        "prefill": prefill,
        "wall_s": time.perf_counter() - t0,
    }
    out = args.out or ROOT / "benchmarks" / "results" / ("engine_quick.json" if q else "engine.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    res["provenance"] = provenance(" ".join(["python", "benchmarks/bench_engine.py", *(argv or sys.argv[1:])]))
    out.write_text(json.dumps(res, indent=2) + "\n")
    png = plot_extend(res, out.with_suffix(".png"))
    if png is not None:
        print(f"wrote {png}", file=sys.stderr)
    print(markdown(res))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
