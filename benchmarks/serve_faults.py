"""`evspark serve` under floods, signals and pipeline shards: what issue 29's fault bars ask.

    python benchmarks/serve_faults.py --out benchmarks/results/serve_faults.json
    python benchmarks/serve_faults.py --flood 40 --max-queue 8 --in-flight 3 --shard-records 4 \\
        --tokens 16 --out /tmp/f.json                                    # a smoke run

Three phases against a real server on a loopback port (`evspark serve` in a child process):

1. **Flood**: `--flood` requests (one prompt, one sample, `--tokens` tokens each) sent at once
   by `--flood-clients` threads to a server with `--max-queue`, `--floods` times in turn on the
   same server; per flood, counts the answers by status (the bar: only 200 and 429), checks
   every accepted request got its sequence, and samples the server's RSS (/proc) before, during
   (peak) and after it: flat when later floods peak no higher than the first.
2. **SIGTERM**: `--in-flight` requests accepted, then SIGTERM: how many were still unanswered
   when the signal went, how many were answered, the exit code and the seconds to exit against
   `--drain-seconds`.
3. **Shards**: `evspark generate --server` over 4 concurrent `--shard I/4` processes, merged with
   `evspark merge`, against one local `evspark generate` of the same records: byte-identical or
   not, and the wall times of both.

Bounded: loopback only, fixed request counts, a time limit per phase; every server is stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serve_load import prompts  # noqa: E402  (the same shared prompts)

from evspark_cli.eval.provenance import provenance  # noqa: E402


def evspark(*args: str) -> list[str]:
    return [sys.executable, "-m", "evspark_cli.cli", *args]


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(evspark("serve", "--port", "0", *args), stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = proc.stdout.readline().split("listening on ")[1].split()[0]
    with httpx.Client(base_url=url) as c:
        while c.get("/v1/health/ready").status_code != 200:
            time.sleep(0.1)
    return proc, url


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def request(url: str, rid: str, seq: str, tokens: int, limit_s: float) -> tuple[int, str | None]:
    body = {"records": [{"id": rid, "sequence": seq}], "max_new_tokens": tokens}
    with httpx.Client(base_url=url, timeout=limit_s) as c:
        r = c.post("/v1/generate", json=body)
    text = r.json()["outputs"][0]["sequence"] if r.status_code == 200 else None
    return r.status_code, text


def flood(a: argparse.Namespace, ps: dict[str, str]) -> dict:
    """`--floods` floods one after another on one server: each one's answers and the server's
    RSS before, at its peak and after it (flat: a later flood's peak no higher than the
    first's, beyond what a full batch and the prompt cache hold)."""
    proc, url = start_server("--batch-size", str(a.batch_size), "--max-queue", str(a.max_queue),
                             "--threads", str(a.threads))
    items = list(ps.items())
    floods = []
    try:
        for _ in range(a.floods):
            before = rss_mib(proc.pid)
            peak, stop = [before], threading.Event()

            def watch(peak: list[float] = peak, stop: threading.Event = stop) -> None:
                while not stop.is_set():
                    peak.append(rss_mib(proc.pid))
                    stop.wait(0.05)

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            t0 = time.perf_counter()
            with ThreadPoolExecutor(a.flood_clients) as pool:
                got = list(pool.map(lambda i: request(url, *items[i % len(items)], a.tokens,
                                                      a.limit_s), range(a.flood)))
            seconds = time.perf_counter() - t0
            stop.set()
            watcher.join()
            statuses: dict[str, int] = {}
            for status, _ in got:
                statuses[str(status)] = statuses.get(str(status), 0) + 1
            answered = sum(1 for s, t in got
                           if s == 200 and t is not None and len(t) == a.tokens)
            floods.append({"seconds": round(seconds, 2), "statuses": statuses,
                           "only_200_and_429": set(statuses) <= {"200", "429"},
                           "accepted_answered": answered == statuses.get("200", 0),
                           "rss_mib": {"before": round(before, 1), "peak": round(max(peak), 1),
                                       "after": round(rss_mib(proc.pid), 1)}})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return {"requests": a.flood, "clients": a.flood_clients, "max_queue": a.max_queue,
            "floods": floods,
            "only_200_and_429": all(f["only_200_and_429"] for f in floods),
            "accepted_answered": all(f["accepted_answered"] for f in floods),
            "peak_rss_mib": max(f["rss_mib"]["peak"] for f in floods)}


def sigterm(a: argparse.Namespace, ps: dict[str, str]) -> dict:
    proc, url = start_server("--batch-size", str(a.batch_size), "--threads", str(a.threads),
                             "--drain-seconds", str(a.drain_seconds))
    items = list(ps.items())
    with ThreadPoolExecutor(a.in_flight) as pool:
        futures = [pool.submit(request, url, *items[i % len(items)], a.drain_tokens, a.limit_s)
                   for i in range(a.in_flight)]
        with httpx.Client(base_url=url) as c:  # every request accepted: rows busy or queued
            deadline = time.monotonic() + a.limit_s
            while time.monotonic() < deadline:
                m = c.get("/metrics").text
                busy = sum(float(x.split()[-1]) for x in m.splitlines()
                           if x.startswith(("evspark_rows_busy ", "evspark_queue_depth ")))
                if busy >= a.in_flight or any(f.done() for f in futures):
                    break  # all accepted, or short requests already finishing: signal now
                time.sleep(0.05)
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        pending = sum(1 for f in futures if not f.done())
        code = proc.wait(a.drain_seconds + 30)
        exit_s = time.perf_counter() - t0
        got = [f.result() for f in futures]
    answered = sum(1 for s, t in got if s == 200 and t is not None and len(t) == a.drain_tokens)
    return {"in_flight": a.in_flight, "unanswered_at_signal": pending,
            "tokens": a.drain_tokens, "answered": answered,
            "exit_code": code, "exit_s": round(exit_s, 2), "drain_seconds": a.drain_seconds,
            "within_deadline": exit_s <= a.drain_seconds}


def shards(a: argparse.Namespace, ps: dict[str, str]) -> dict:
    with TemporaryDirectory() as tmp:
        d = Path(tmp)
        fa = d / "in.fa"
        fa.write_text("".join(f">{k}\n{v}\n" for k, v in list(ps.items())[:a.shard_records]))
        settings = ["-n", str(a.tokens), "--samples", str(a.shard_samples), "-q", "-t",
                    str(a.threads)]
        t0 = time.perf_counter()
        subprocess.run(evspark("generate", str(fa), *settings, "-o", str(d / "local.fa")),
                       check=True, timeout=a.limit_s)
        local_s = time.perf_counter() - t0
        proc, url = start_server("--batch-size", str(a.batch_size), "--threads", str(a.threads))
        try:
            t0 = time.perf_counter()
            runs = [subprocess.Popen(evspark("generate", str(fa), *settings, "--server", url,
                                             "--shard", f"{i}/4", "-o", str(d / f"s{i}.fa")))
                    for i in range(1, 5)]
            codes = [r.wait(a.limit_s) for r in runs]
            served_s = time.perf_counter() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        subprocess.run(evspark("merge", *(str(d / f"s{i}.fa") for i in range(1, 5)), "-o",
                               str(d / "merged.fa")), check=True, timeout=60)
        same = (d / "merged.fa").read_bytes() == (d / "local.fa").read_bytes()
    return {"records": a.shard_records, "samples": a.shard_samples, "tokens": a.tokens,
            "shard_exit_codes": codes, "merged_identical_to_local": same,
            "local_run_wall_s": round(local_s, 2), "four_served_shards_wall_s": round(served_s, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=1000, help="requests per flood")
    ap.add_argument("--floods", type=int, default=3, help="floods on one server, in turn")
    ap.add_argument("--flood-clients", type=int, default=128)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--in-flight", type=int, default=16)
    ap.add_argument("--drain-tokens", type=int, default=256)
    ap.add_argument("--drain-seconds", type=float, default=60.0)
    ap.add_argument("--shard-records", type=int, default=48)
    ap.add_argument("--shard-samples", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit-s", type=float, default=900.0, help="per phase")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ps = prompts(max(a.shard_records, 48))
    result = {}
    for name, fn in (("flood", flood), ("sigterm", sigterm), ("shards", shards)):
        result[name] = fn(a, ps)
        print(name, json.dumps(result[name]), flush=True)
    result["provenance"] = provenance(" ".join(sys.argv))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
