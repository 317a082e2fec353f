#!/usr/bin/env python
"""Native decoding speed of this tree against an earlier revision (default: the first engine
commit), alternating the two in fresh subprocesses on the same machine, model and prompt.

    python benchmarks/native_history.py                  # vs 52ce0f7, the first version
    python benchmarks/native_history.py --rev HEAD~3 --tokens 512 --rounds 5

The earlier revision is checked out with `git worktree` into a temporary folder (removed after).
Each child loads the model, warms up, then times `decode_native` (sampled, T=1, top-k 4) on a
short prompt (so prefill is negligible) and a raw decode step (extend(k=1) + commit). Results:
benchmarks/results/native_history.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIRST_VERSION = "52ce0f7"

CHILD = r'''
import json, sys, time, torch
sys.path.insert(0, sys.argv[1])
from evspark_cli.model.checkpoint import load_model
from evspark_cli.decode.native import decode_native
from evspark_cli.decode.sampling import SamplerConfig
torch.set_num_threads(int(sys.argv[3]))
model = load_model(sys.argv[2]).eval()
n = int(sys.argv[4])
prompt = list(b"ATGAAACGCATTAGCACCACCATTACCACCACCATCACC")
sampler = SamplerConfig(1.0, 4, 1.0)
decode_native(model, prompt, 64, sampler)
res = decode_native(model, prompt, n, sampler)
with torch.inference_mode():
    _, _, st = model.prefill(torch.tensor([prompt]), keep_last=1, reserve=n + 64)
    tok = torch.tensor([[65]])
    ts = []
    for _ in range(n):
        t = time.perf_counter(); _, _, b = model.extend(st, tok); st = b.commit(1)
        ts.append(time.perf_counter() - t)
print(json.dumps({"tok_s": n / res.wall_s, "step_s": sorted(ts)[len(ts) // 2], "tokens": res.tokens[:32]}))
'''


def run_child(tree: Path, args) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(args.model), str(args.threads),
                          str(args.tokens)], capture_output=True, text=True, cwd=str(tree))
    if out.returncode != 0:
        raise SystemExit(f"child for {tree} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=FIRST_VERSION, help="earlier revision to compare against")
    ap.add_argument("--model", default=str(ROOT / "models" / "evspark-sh2-192"))
    ap.add_argument("--tokens", type=int, default=768)
    ap.add_argument("--rounds", type=int, default=3, help="alternations of the two trees")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "native_history.json")
    args = ap.parse_args()
    rev = subprocess.run(["git", "rev-parse", "--short", args.rev], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=ROOT, check=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="evspark-rev-") as tmp:
        old = Path(tmp) / rev
        subprocess.run(["git", "worktree", "add", "--detach", str(old), rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            trees = {f"{rev} (earlier)": old, f"{head} (this tree)": ROOT}
            runs: dict[str, list[dict]] = {k: [] for k in trees}
            for _ in range(args.rounds):
                for name, tree in trees.items():
                    runs[name].append(run_child(tree, args))
                    print(f"{name}: {runs[name][-1]['tok_s']:.1f} tok/s", file=sys.stderr)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT,
                           capture_output=True)
    summary = {name: {"tok_s_median": statistics.median(r["tok_s"] for r in rs),
                      "step_ms_median": 1e3 * statistics.median(r["step_s"] for r in rs)}
               for name, rs in runs.items()}
    a, b = (summary[k]["tok_s_median"] for k in trees)
    same = len({tuple(rs[0]["tokens"]) for rs in runs.values()}) == 1
    res = {"benchmark": "native_history", "earlier": rev, "this": head, "model": args.model,
           "tokens": args.tokens, "threads": args.threads, "rounds": args.rounds,
           "summary": summary, "speedup_over_earlier": b / a, "same_tokens": same, "runs": runs,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print("| tree | native tok/s (median) | decode step ms (median) |\n|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | {s['tok_s_median']:.1f} | {s['step_ms_median']:.2f} |")
    print(f"this tree / {rev}: {b / a:.2f}x native decoding speed; same tokens: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
