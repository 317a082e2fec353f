"""The FASTA reader's speed against an earlier commit's: one generated genome, both readers.

    python benchmarks/fasta_reader.py --rev REV --out benchmarks/results/fasta_reader.json
    python benchmarks/fasta_reader.py --rev REV --megabases 2 --repeats 1 --out /tmp/f.json

Writes a FASTA of `--megabases` million random A/C/G/T bases (`--records` records, 60-column
lines, in a temporary folder) and times reading it whole (`read_prompts`, or `iter_records`
with `--reader iter_records`) with this checkout's reader and with the one at `--rev`
(exported with `git archive` into a temporary folder: nothing in this checkout changes). Each
read runs in a fresh process, the two readers alternating, so that neither inherits the
other's memory or warm-up; a process reports the seconds of the read alone (its imports, and a
first read of a two-line FASTA for what a reader imports lazily, are timed apart) and a digest
of what it read, which must agree between the readers. The result (per-read seconds, the best
of each, their ratio) goes to `--out` with its provenance.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.eval.provenance import provenance  # noqa: E402

LINE = 60

_READ = """
import hashlib, json, sys, time
t0 = time.perf_counter()
from evspark_cli.io.fasta import {reader}
path = sys.argv[2]
list({call})  # a two-line FASTA first: what a reader imports lazily is timed with the imports
t1 = time.perf_counter()
path = sys.argv[1]
got = list({call})
t2 = time.perf_counter()
digest = hashlib.sha256()
for p in got:
    digest.update(p.id.encode() + b"\\0" + p.seq.encode() + b"\\0")
print(json.dumps({{"import_s": t1 - t0, "read_s": t2 - t1, "records": len(got),
                  "bases": sum(len(p.seq) for p in got), "sha256": digest.hexdigest()}}))
"""
_CALLS = {"read_prompts": "read_prompts([path])", "iter_records": "iter_records(path)"}


def write_genome(path: Path, megabases: float, records: int, seed: int = 0) -> int:
    """A FASTA of random A/C/G/T in `records` records of about equal length, 60 bases a line;
    returns the number of bases."""
    rng = np.random.default_rng(seed)
    letters = np.frombuffer(b"ACGT", np.uint8)
    total = int(megabases * 1_000_000)
    per = [total // records + (i < total % records) for i in range(records)]
    block = LINE * 16_384  # ~1 MB of bases written at a time
    with open(path, "wb") as f:
        for i, n in enumerate(per):
            f.write(f">chr{i + 1} random bases, {n} bp\n".encode())
            left = n
            while left:
                take = min(block, left)
                seq = letters[rng.integers(0, 4, take)]
                full = take // LINE * LINE
                rows = np.empty((full // LINE, LINE + 1), np.uint8)
                rows[:, :LINE] = seq[:full].reshape(-1, LINE)
                rows[:, LINE] = ord("\n")
                f.write(rows.tobytes())
                if take > full:
                    f.write(seq[full:].tobytes() + b"\n")
                left -= take
    return total


def export_rev(rev: str, dest: Path) -> str:
    """The package at `rev` under `dest` (git archive: the checkout is left as it is); returns
    the commit it names."""
    sha = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.strip()
    archive = subprocess.run(["git", "archive", sha, "evspark_cli"], cwd=ROOT,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    if not (dest / "evspark_cli" / "io" / "fasta.py").is_file():
        raise SystemExit(f"{rev} ({sha[:12]}) has no evspark_cli/io/fasta.py")
    return sha


def read_once(tree: Path, reader: str, fasta: Path, tiny: Path) -> dict:
    """One read of `fasta` by the package in `tree`, in its own process, after one of `tiny`
    (timed with the imports)."""
    code = _READ.format(reader=reader, call=_CALLS[reader])
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", code, str(fasta), str(tiny)], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the reader in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rev", default="HEAD", help="the commit whose reader is compared "
                    "(default HEAD: this checkout's changes against its last commit)")
    ap.add_argument("--megabases", type=float, default=100.0,
                    help="million bases in the generated FASTA (default 100)")
    ap.add_argument("--records", type=int, default=4, help="records in it (default 4)")
    ap.add_argument("--repeats", type=int, default=3, help="reads by each reader (default 3)")
    ap.add_argument("--reader", choices=sorted(_CALLS), default="read_prompts")
    ap.add_argument("--out", type=Path, help="where the JSON result goes")
    args = ap.parse_args(argv)
    if args.records < 1 or args.repeats < 1 or args.megabases <= 0:
        ap.error("--records and --repeats must be >= 1, --megabases > 0")

    with tempfile.TemporaryDirectory(prefix="evspark-fasta-bench-") as tmp:
        tmp_dir = Path(tmp)
        old_tree = tmp_dir / "rev"
        old_tree.mkdir()
        sha = export_rev(args.rev, old_tree)
        fasta = tmp_dir / "genome.fa"
        bases = write_genome(fasta, args.megabases, args.records)
        tiny = tmp_dir / "tiny.fa"
        tiny.write_text(">warm-up\nACGT\n")
        print(f"{fasta.stat().st_size / 1e6:.1f} MB FASTA, {bases:,} bases in {args.records} "
              f"records; {args.reader}: this checkout vs {args.rev} ({sha[:12]})", flush=True)
        runs: dict[str, list[dict]] = {"current": [], "rev": []}
        for i in range(args.repeats):
            order = [("current", ROOT), ("rev", old_tree)]
            for name, tree in order if i % 2 == 0 else order[::-1]:
                got = read_once(tree, args.reader, fasta, tiny)
                runs[name].append(got)
                print(f"  {name:>7}: {got['read_s']:.3f} s (imports {got['import_s']:.3f} s)",
                      flush=True)
    digests = {r["sha256"] for rs in runs.values() for r in rs}
    best = {name: min(r["read_s"] for r in rs) for name, rs in runs.items()}
    ratio = best["current"] / best["rev"]
    print(f"best: current {best['current']:.3f} s, {args.rev} {best['rev']:.3f} s "
          f"(current / rev = {ratio:.3f}); same records read: {len(digests) == 1}")
    result = {
        "megabases": args.megabases, "records": args.records, "line_width": LINE,
        "bases": bases, "reader": args.reader, "rev": args.rev, "rev_commit": sha,
        "read_s": {name: [r["read_s"] for r in rs] for name, rs in runs.items()},
        "import_s": {name: [r["import_s"] for r in rs] for name, rs in runs.items()},
        "best_s": best, "current_over_rev": ratio, "same_output": len(digests) == 1,
        "provenance": provenance(" ".join(["python", "benchmarks/fasta_reader.py",
                                           *(argv if argv is not None else sys.argv[1:])])),
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    raise SystemExit(main())
