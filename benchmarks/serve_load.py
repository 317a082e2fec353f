"""`evspark serve` under load: aggregate tokens/s at 1, 8 and 32 concurrent clients against the
same requests served one at a time (speculative, then native) and one local batch.

    python benchmarks/serve_load.py --out benchmarks/results/serve_load.json
    python benchmarks/serve_load.py --prompts 8 --tokens 64 --out /tmp/s.json   # a smoke run

The workload: `--prompts` shared prompts (../shared/data/prompts.fa, else examples/prompts.fa)
x `--samples` samples x `--tokens` new tokens, sampled (T=1, top-k 4, the defaults), sent as one
request per (prompt, sample) to a real server on a loopback port (`evspark serve` in a child
process, `--batch-size 32`), by N client threads with httpx. Each request's output is compared
with the local `generate_many` of the same jobs (byte-identical or not), and latency p50 / p95 /
p99 and the time to the first streamed token are reported per concurrency. Bounded: loopback
only, a fixed request count, a time limit per phase (`--limit-s`), and the server is stopped at
the end. Writes the figures with their provenance.
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

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("EVSPARK_SHARED", ROOT.parent / "shared"))

import evspark_cli as evs  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.api import set_threads  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402


def prompts(n: int) -> dict[str, str]:
    path = SHARED / "data" / "prompts.fa"
    path = path if path.is_file() else ROOT / "examples" / "prompts.fa"
    got = read_prompts([str(path)])
    return {p.id: p.seq for p in list(got)[:n]}


def start_server(batch: int, threads: int, prompt_cache_mb: int | None = None
                 ) -> tuple[subprocess.Popen, str]:
    cache = [] if prompt_cache_mb is None else ["--prompt-cache-mb", str(prompt_cache_mb)]
    proc = subprocess.Popen([sys.executable, "-m", "evspark_cli.cli", "serve", "--port", "0",
                             "--batch-size", str(batch), "--max-queue", "100000",
                             "--threads", str(threads), "--drain-seconds", "5", *cache],
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    banner = proc.stdout.readline()
    url = banner.split("listening on ")[1].split()[0]
    with httpx.Client(base_url=url) as c:
        while c.get("/v1/health/ready").status_code != 200:
            time.sleep(0.1)
    return proc, url


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


_CLIENTS = threading.local()


def client(url: str) -> httpx.Client:
    """This client thread's connection, kept across its requests as a real client keeps it (a
    new httpx.Client per request spent about 25 ms of CPU, its TLS context built anew, on the
    cores the server decodes on)."""
    c = getattr(_CLIENTS, "client", None)
    if c is None or str(c.base_url).rstrip("/") != url.rstrip("/"):
        c = _CLIENTS.client = httpx.Client(base_url=url, timeout=600)
    return c


def one(url: str, rid: str, seq: str, sample: int, tokens: int, drafter: str | None
        ) -> dict:
    """One request, streamed: its latency, time to first token and sequence."""
    body = {"records": [{"id": rid, "sequence": seq, "samples": [sample]}],
            "samples": sample + 1, "max_new_tokens": tokens, "stream": True,
            **({"drafter": drafter} if drafter else {})}
    t0 = time.perf_counter()
    first, text = None, None
    with client(url).stream("POST", "/v1/generate", json=body) as r:
        event = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                if event == "tokens" and first is None:
                    first = time.perf_counter() - t0
                elif event == "output":
                    text = json.loads(line[6:])["sequence"]
    return {"latency": time.perf_counter() - t0, "ttft": first, "text": text,
            "key": (rid, sample)}


def phase(url: str, jobs: list[tuple[str, str, int]], tokens: int, clients: int,
          drafter: str | None, limit_s: float) -> dict:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        futs = [pool.submit(one, url, rid, seq, s, tokens, drafter) for rid, seq, s in jobs]
        done = [f.result(timeout=max(1.0, limit_s - (time.perf_counter() - t0)))
                for f in futs]
    wall = time.perf_counter() - t0
    lat = sorted(d["latency"] for d in done)
    ttft = sorted(d["ttft"] for d in done if d["ttft"] is not None)

    def pct(xs: list[float], q: float) -> float:
        return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)

    return {"clients": clients, "drafter": drafter or "server's", "requests": len(done),
            "wall_s": round(wall, 2), "tokens_per_s": round(len(done) * tokens / wall, 1),
            "latency_p50_s": pct(lat, .5), "latency_p95_s": pct(lat, .95),
            "latency_p99_s": pct(lat, .99), "ttft_p50_s": pct(ttft, .5),
            "ttft_p95_s": pct(ttft, .95), "texts": {f"{k[0]}_s{k[1]}": d["text"]
                                                     for d in done for k in [d["key"]]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=48)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--limit-s", type=float, default=1800.0, help="per phase")
    ap.add_argument("--native-requests", type=int, default=None,
                    help="the one-at-a-time native phase sends only the first N requests (it is "
                    "the longest; one at a time, its tokens/s does not depend on N); 0 skips it")
    ap.add_argument("--prompt-cache-mb", type=int, default=None,
                    help="the server's --prompt-cache-mb (default: the server's default)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ps = prompts(a.prompts)
    jobs = [(rid, seq, s) for rid, seq in ps.items() for s in range(a.samples)]
    set_threads(a.threads)
    model = evs.load_model(device="cpu")
    t0 = time.perf_counter()
    local = evs.generate_many(model, ps, samples=a.samples, max_new_tokens=a.tokens,
                              batch_size=a.batch_size)
    local_s = time.perf_counter() - t0
    want = {o.stats["record_id"]: o.text for o in local}
    if a.samples == 1:
        want = {f"{k}_s0": v for k, v in want.items()}
    del model
    proc, url = start_server(a.batch_size, a.threads, a.prompt_cache_mb)
    runs = []
    try:
        plan = [(c, None) for c in (int(x) for x in a.clients.split(","))]
        plan.insert(0, (1, None))  # one at a time with speculation: NIM's model
        if a.native_requests != 0:
            plan.insert(1, (1, "none"))
        seen = set()
        for clients, drafter in plan:
            if (clients, drafter) in seen:
                continue
            seen.add((clients, drafter))
            sent = jobs[:a.native_requests] if drafter == "none" and a.native_requests else jobs
            cpu0 = (time.process_time(), cpu_s(proc.pid))
            r = phase(url, sent, a.tokens, clients, drafter, a.limit_s)
            # where the 2 cores went: the clients (this process) and the server
            r["client_cpu_s"] = round(time.process_time() - cpu0[0], 2)
            r["server_cpu_s"] = round(cpu_s(proc.pid) - cpu0[1], 2)
            texts = r.pop("texts")
            # native decoding under the residual rule is lossless in distribution, not token
            # for token, so only the speculative phases are compared with the local run
            r["identical_to_local"] = (sum(texts[k] == want[k] for k in want)
                                       if drafter != "none" else None)
            runs.append(r)
            print(json.dumps(r), flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    total = len(jobs) * a.tokens
    local_tps = total / local_s
    one_spec = next(r for r in runs if r["clients"] == 1 and r["drafter"] != "none")
    one_nat = next((r for r in runs if r["drafter"] == "none"), None)
    best = max(runs, key=lambda r: r["clients"] if r["drafter"] != "none" else 0)
    result = {
        "workload": {"prompts": len(ps), "samples": a.samples, "tokens": a.tokens,
                     "requests": len(jobs), "batch_size": a.batch_size, "threads": a.threads,
                     "prompt_cache_mb": a.prompt_cache_mb},
        "local_batch": {"wall_s": round(local_s, 2), "tokens_per_s": round(local_tps, 1)},
        "phases": runs,
        "ratios_at_most_clients": {
            "clients": best["clients"],
            "vs_one_at_a_time_speculative": round(best["tokens_per_s"] / one_spec["tokens_per_s"],
                                                  2),
            "vs_one_at_a_time_native": (round(best["tokens_per_s"] / one_nat["tokens_per_s"], 2)
                                        if one_nat else None),
            "vs_local_batch": round(best["tokens_per_s"] / local_tps, 2)},
        "requests_identical_to_local": all(r["identical_to_local"] == len(jobs) for r in runs
                                           if r["drafter"] != "none"),
        "provenance": provenance(" ".join(sys.argv)),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["ratios_at_most_clients"]))


if __name__ == "__main__":
    main()
