"""`evspark generate --server URL`: a run decoded by a real `evspark serve` (a subprocess on an
ephemeral loopback port) writes what a local run writes, shard by shard, and a server lost
mid-run fails the run with its finished records kept for `--resume`."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

RECORDS = {"r1": "ACGTACGTTAGCATGCAAGTACGATCGATCGA", "r2": "GGGATTACAGATTACATTTAGCCA",
           "r3": "TTGACAGGCATTACCGAT", "r4": "ATGAAACGCATTAGCACCACCATTACCACCACC",
           "r5": "CCGGTTAACCGGATAT"}
SAME = ["record_id", "sample", "prompt_len", "new_tokens", "mode", "drafter", "gamma", "rule",
        "input_id", "region", "seed", "job"]
"""The stats columns a served run shares with a local one (the others are timings, or depend on
the batch through the draft lengths the schedule picks)."""


def evspark(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evspark_cli.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


class Server:
    """`evspark serve` in a subprocess, ready to answer."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "evspark_cli.cli", "serve", "--port", "0", "--threads", "1",
             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        banner = self.proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in banner, banner + self.proc.stderr.read()
        self.url = banner.split("listening on ")[1].split()[0]
        for _ in range(1200):
            try:
                if httpx.get(self.url + "/v1/health/ready").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise AssertionError("the server never became ready")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


@pytest.fixture()
def fasta(tmp_path: Path) -> Path:
    path = tmp_path / "in.fa"
    path.write_text("".join(f">{k} a description\n{v}\n" for k, v in RECORDS.items()))
    return path


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [{k: r[k] for k in SAME} for r in csv.DictReader(f, delimiter="\t")]


SETTINGS = ["-n", "48", "--samples", "2", "--seed", "3", "-q"]


def test_a_served_run_and_its_shards_write_what_a_local_run_writes(tmp_path, fasta):
    local = evspark("generate", str(fasta), *SETTINGS, "-o", str(tmp_path / "local.fa"),
                    "--stats", str(tmp_path / "local.tsv"))
    assert local.returncode == 0, local.stderr
    server = Server("--batch-size", "4")
    try:
        served = evspark("generate", str(fasta), *SETTINGS, "--server", server.url,
                         "-o", str(tmp_path / "served.fa"), "--stats", str(tmp_path / "s.tsv"))
        assert served.returncode == 0, served.stderr
        assert (tmp_path / "served.fa").read_bytes() == (tmp_path / "local.fa").read_bytes()
        assert rows(tmp_path / "s.tsv") == rows(tmp_path / "local.tsv")

        def shard(i: int) -> subprocess.CompletedProcess:
            return evspark("generate", str(fasta), *SETTINGS, "--server", server.url,
                           "--shard", f"{i}/4", "-o", str(tmp_path / f"shard{i}.fa"))

        with ThreadPoolExecutor(4) as pool:  # four pipeline shards share the one model
            done = list(pool.map(shard, range(1, 5)))
        assert all(d.returncode == 0 for d in done), [d.stderr for d in done]
    finally:
        server.kill()
    merged = evspark("merge", *(str(tmp_path / f"shard{i}.fa") for i in range(1, 5)),
                     "-o", str(tmp_path / "merged.fa"))
    assert merged.returncode == 0, merged.stderr
    assert (tmp_path / "merged.fa").read_bytes() == (tmp_path / "local.fa").read_bytes()


def test_a_lost_server_fails_the_run_and_a_resumed_run_finishes_it(tmp_path, fasta):
    out = tmp_path / "out.fa"
    args = ["generate", str(fasta), "-n", "400", "--seed", "5", "-q", "-o", str(out)]
    server = Server("--batch-size", "1")
    try:
        run = subprocess.Popen([sys.executable, "-m", "evspark_cli.cli", *args,
                                "--server", server.url], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        partial = Path(str(out) + ".partial")
        for _ in range(1200):  # the first record finished: the server goes away
            if partial.exists() and partial.read_text().count(">") >= 1:
                break
            time.sleep(0.05)
        server.proc.send_signal(signal.SIGKILL)
        _, err = run.communicate(timeout=120)
    finally:
        server.kill()
    assert run.returncode == 1, err
    last = err.strip().splitlines()[-1]
    assert "lost the connection to the server" in last and "--resume" in last, err
    assert "Traceback" not in err and not out.exists()
    kept = partial.read_text().count(">")
    assert 1 <= kept < len(RECORDS)
    again = Server("--batch-size", "2")
    try:
        resumed = evspark(*args, "--server", again.url, "--resume")
    finally:
        again.kill()
    assert resumed.returncode == 0, resumed.stderr
    local = evspark(*args[:-1], str(tmp_path / "local.fa"))
    assert out.read_bytes() == (tmp_path / "local.fa").read_bytes()
    assert local.returncode == 0


@pytest.mark.parametrize("args, message, code", [
    (["--server", "http://127.0.0.1:9", "--model", "x"], "--model chooses the local model", 2),
    (["--server", "http://127.0.0.1:9", "--batch-size", "4"], "--batch-size chooses", 2),
    (["--api-key-file", "k"], "--api-key-file is for --server", 2),
    (["--server", "http://127.0.0.1:9"], "cannot reach the server at http://127.0.0.1:9", 1),
])
def test_served_runs_refuse_what_they_cannot_do_in_one_line(tmp_path, fasta, args, message,
                                                            code):
    r = evspark("generate", str(fasta), "-n", "8", "-o", str(tmp_path / "o.fa"), *args)
    assert r.returncode == code, r.stderr
    assert message in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not list(tmp_path.glob("o.fa*"))
