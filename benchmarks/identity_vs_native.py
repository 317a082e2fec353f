"""The identity drafter against native decoding: a check that native decoding is lean.

    python benchmarks/identity_vs_native.py --out benchmarks/results/identity_vs_native.json
    python benchmarks/identity_vs_native.py --records 2 --tokens 16 --runs 1 --batches 1  # smoke

The identity drafter is the target drafting for itself: every round runs gamma native steps and
then a verification block over them, so it can never be faster than native decoding. Each run is
one `evspark generate --compare-native --drafter identity` (the command a user runs to measure a
speedup) on the first `--records` example prompts, greedy and sampled, at each batch size; the
summary line's pooled speedup (native seconds per token over speculative seconds per token, the
same definition the stats and `bench` use) is read from its result. A speedup above 1.00 means
native decoding carries overhead that every published speedup divides by.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.eval.provenance import provenance  # noqa: E402

SUMMARY = re.compile(r"speedup (\d+\.\d+)x over native decoding \((\d+) timed pairs "
                     r"(\d+\.\d+)-(\d+\.\d+)x, spread (\d+)%\)")


def one_run(prompts: Path, tokens: int, batch: int, greedy: bool, work: Path) -> dict:
    """One generate --compare-native --drafter identity: the summary's pooled speedup and the
    stats' per-record speedups."""
    stats = work / "stats.tsv"
    cmd = [sys.executable, "-m", "evspark_cli.cli", "generate", str(prompts), "-n", str(tokens),
           "--drafter", "identity", "--compare-native", "--batch-size", str(batch), "-q",
           "-o", str(work / "out.fa"), "--stats", str(stats)] + (["--greedy"] if greedy else [])
    for f in (work / "out.fa", stats):
        f.unlink(missing_ok=True)
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr}")
    m = SUMMARY.search(r.stderr)
    if m is None:
        raise SystemExit(f"no speedup in the summary line:\n{r.stderr}")
    rows = list(csv.DictReader(stats.open(), delimiter="\t"))
    return {"speedup": float(m.group(1)), "pairs": int(m.group(2)),
            "pair_range": [float(m.group(3)), float(m.group(4))],
            "spread_pct": int(m.group(5)),
            "stats_speedups": sorted({float(x["speedup"]) for x in rows})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", default=str(ROOT / "examples" / "prompts.fa"))
    ap.add_argument("--records", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        text = Path(a.prompts).read_text().split(">")[1: a.records + 1]
        prompts = work / "prompts.fa"
        prompts.write_text("".join(">" + t for t in text))
        rows = []
        for batch in [int(b) for b in a.batches.split(",")]:
            for greedy in (True, False):
                runs = [one_run(prompts, a.tokens, batch, greedy, work) for _ in range(a.runs)]
                row = {"batch": batch, "mode": "greedy" if greedy else "sampled",
                       "speedups": [r["speedup"] for r in runs], "runs": runs,
                       "max_speedup": max(r["speedup"] for r in runs)}
                rows.append(row)
                print(f"batch {batch} {row['mode']}: identity / native speedup "
                      f"{' '.join(f'{x:.2f}' for x in row['speedups'])}", flush=True)
    result = {"records": a.records, "tokens": a.tokens, "rows": rows,
              "provenance": provenance(" ".join(sys.argv))}
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
