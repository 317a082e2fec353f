"""examples/: the Snakemake scatter/gather workflow and the shell pipeline, run for real.

The sharded workflow must gather exactly the output of one unsharded `evspark generate` run
(byte for byte, `evspark merge`), with one stats header; the pipeline must give what
`evspark generate --region` gives.
"""
from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import trained_tiny_dir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
EVSPARK_CMD = f"{sys.executable} -m evspark_cli.cli"
STATS_HEADER = ("record_id\tsample\tprompt_len\tnew_tokens\tmode\tdrafter\tgamma\trounds\ttau\t"
                "acceptance_rate\twall_s\ttokens_per_s\tnative_wall_s\tnative_tokens_per_s\tspeedup\t"
                "rule\tverified_positions\tefficiency\tdecode_s\tprefill_s\tbatch\tinput_id\t"
                "region\tseed\tjob\tbranch_rows\tbranch_wins")

RECORDS = {
    "chrA": "ATGAAACGCATTAGCACCACCATTACCACCACCATCACCATTACCACAGGTAACGGTGCGG",
    "chrB": "GCTGACGCGTACAGGAAACACAGAAAAAAGCCCGCACCTGACAGTGCGGGCTTTTTTTTTCGACC",
    "plasmid_1": "TTGACAGCTAGCTCAGTCCTAGGTATAATGCTAGC",
    "contig.7": "AAGGAGGTGATCCAATGCGTAAAGGAGAAGAACTTTTCACTGGAGTTGTCCCAATTCTTGTTGAATTAGATGGT",
}


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["PATH"] = str(Path(sys.executable).parent) + os.pathsep + e.get("PATH", "")
    e.pop("EVSPARK_DEBUG", None)
    return e


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    import torch

    torch.set_num_threads(1)
    return trained_tiny_dir(tmp_path_factory.mktemp("model"), steps=20)


def write_input(d: Path) -> Path:
    src = d / "genomes.fa"
    src.write_text("".join(f">{k} sample record\n{v[:40]}\n{v[40:]}\n" for k, v in RECORDS.items()))
    return src


def by_id(fasta: str) -> dict[str, str]:
    return {c[1:].split(None, 1)[0]: c for c in re.split(r"(?m)^(?=>)", fasta) if c}


def evspark(*args) -> str:
    p = subprocess.run([sys.executable, "-m", "evspark_cli.cli", *map(str, args)],
                       capture_output=True,
                       text=True, env=env(), timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


@pytest.mark.slow
@pytest.mark.skipif(not SNAKEMAKE.is_file(), reason="snakemake is not installed next to python")
def test_snakemake_scatter_gather_equals_an_unsharded_run(tmp_path, model):
    src = write_input(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"input: {src}\nshards: 3\nmodel: {model}\ngamma: 4\nn_tokens: 6\nseed: 4\n"
                   f"threads: 1\ndevice: cpu\noutdir: out\nevspark: {EVSPARK_CMD}\n")
    p = subprocess.run([str(SNAKEMAKE), "-s", str(EXAMPLES / "Snakefile"), "--directory", str(work),
                        "--cores", "2", "--configfile", str(cfg)],
                       capture_output=True, text=True, env=env(), timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    out = work / "out"
    gathered = (out / "generated.fa").read_text()
    whole = evspark("generate", src, "--model", model, "--gamma", 4, "-n", 6, "--seed", 4,
                    "--threads", 1, "-q", "--device", "cpu")
    got = by_id(gathered)
    assert sorted(got) == sorted(f"{r}.cont" for r in RECORDS) and len(got) == gathered.count(">")
    assert gathered == whole  # evspark merge: the records in input order, byte for byte

    stats = (out / "stats.tsv").read_text().splitlines()
    assert stats[0] == STATS_HEADER and stats.count(STATS_HEADER) == 1
    assert [ln.split("\t")[0] for ln in stats[1:]] == [f"{r}.cont" for r in RECORDS]

    for i in (1, 2, 3):
        # the log holds timestamped progress and the run's summary line
        log = (out / "logs" / f"shard{i}.log").read_text().splitlines()
        assert log, f"shard{i}.log is empty"
        assert re.match(r"evspark \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] generate: ", log[0]), log
        assert log[-1].startswith("evspark: generate: ") and " tokens in " in log[-1], log
        bench = (out / "benchmarks" / f"shard{i}.tsv").read_text().splitlines()
        assert bench[0].split("\t")[0] == "s" and len(bench) == 2
        assert not (out / "shards" / f"shard{i}.fa.partial").exists()
    # the round-robin split: records 1 and 4 in shard 1, 2 in shard 2, 3 in shard 3
    assert list(by_id((out / "shards" / "shard1.fa").read_text())) == ["chrA.cont", "contig.7.cont"]
    assert list(by_id((out / "shards" / "shard3.fa").read_text())) == ["plasmid_1.cont"]


@pytest.mark.slow
@pytest.mark.parametrize("extractor,region", [
    ("samtools", "chrB:1,1-5,0"), ("samtools", "{chrB}:11-50"), ("python", "chrB:1,1-5,0"),
    ("python", "chrB:11"), ("python", "chrA")])
def test_pipeline_script_equals_evspark_region(tmp_path, model, extractor, region):
    """pipeline.sh and `generate --region` give byte-identical FASTA for the same region and
    seed, however the region is written (commas, an open end, braces), whichever extractor."""
    if not shutil.which("bash"):
        pytest.skip("bash not available")
    if extractor == "samtools" and not shutil.which("samtools"):
        pytest.skip("samtools is not installed (the python extractor is tested)")
    src = write_input(tmp_path)
    out = tmp_path / "cont.fa.gz"
    e = env() | {"EVSPARK": EVSPARK_CMD, "PYTHON": sys.executable, "EVSPARK_MODEL": str(model),
                 "N": "7", "SEED": "3"}
    if extractor == "python":  # a samtools that fails: the script falls back to Biopython
        shim = tmp_path / "bin"
        shim.mkdir()
        (shim / "samtools").write_text("#!/bin/sh\nexit 1\n")
        (shim / "samtools").chmod(0o755)
        e["PATH"] = f"{shim}{os.pathsep}{e['PATH']}"
    p = subprocess.run(["bash", str(EXAMPLES / "pipeline.sh"), str(src), region, str(out),
                        "--threads", "1", "--gamma", "3"], capture_output=True, text=True, env=e,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = gzip.decompress(out.read_bytes()).decode()
    want = evspark("generate", src, "--region", region, "--model", model, "-n", 7, "--seed", 3,
                   "--threads", 1, "--gamma", 3, "-q")
    assert got == want
    name = {"chrA": "chrA", "chrB:11": f"chrB:11-{len(RECORDS['chrB'])}"}.get(region,
                                                                              "chrB:11-50")
    assert got.startswith(f">{name}.cont evspark ") and "new_tokens=7" in got
    assert f" prompt={name} " in got.splitlines()[0]


def test_pipeline_script_checks_its_arguments_from_any_folder(tmp_path):
    """From another folder: a missing genome is one line and exit 2 (no Python traceback);
    --help prints the usage; no arguments use the bundled example prompts wherever it runs."""
    if not shutil.which("bash"):
        pytest.skip("bash not available")
    script = str(EXAMPLES / "pipeline.sh")
    p = subprocess.run(["bash", script, str(tmp_path / "none.fa")], capture_output=True,
                       text=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"pipeline.sh: error: {tmp_path / 'none.fa'}: no such readable file (usage: "
        "examples/pipeline.sh [GENOME.fa[.gz]] [REGION] [OUT.fa.gz] [evspark options...])"]
    h = subprocess.run(["bash", script, "--help"], capture_output=True, text=True, timeout=60)
    assert h.returncode == 0 and h.stdout.startswith("usage: examples/pipeline.sh")
    e = env() | {"EVSPARK": EVSPARK_CMD, "PYTHON": sys.executable, "N": "3"}
    d = subprocess.run(["bash", script, "", "", str(tmp_path / "c.fa.gz"), "--threads", "1"],
                       capture_output=True, text=True, cwd=tmp_path, env=e, timeout=300)
    assert d.returncode == 0, d.stderr
    assert gzip.decompress((tmp_path / "c.fa.gz").read_bytes()).startswith(b">P05:1-100.cont")


@pytest.mark.slow
@pytest.mark.skipif(not SNAKEMAKE.is_file(), reason="snakemake is not installed next to python")
def test_snakemake_shards_on_one_server_equal_an_unsharded_run(tmp_path, model):
    """The served variant: one `evspark serve`, every shard `generate --server` on it."""
    src = write_input(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    server = subprocess.Popen([sys.executable, "-m", "evspark_cli.cli", "serve", "--port", "0",
                               "--model", str(model), "--threads", "1", "--batch-size", "4"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**env(), "PYTHONUNBUFFERED": "1"})
    try:
        url = server.stdout.readline().split("listening on ")[1].split()[0]
        for _ in range(1200):
            try:
                if httpx.get(url + "/v1/health/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        cfg = tmp_path / "config.yaml"
        cfg.write_text(f"input: {src}\nshards: 3\nserver: {url}\ngamma: 4\nn_tokens: 6\n"
                       f"seed: 4\nthreads: 1\noutdir: out\nevspark: {EVSPARK_CMD}\n")
        p = subprocess.run([str(SNAKEMAKE), "-s", str(EXAMPLES / "Snakefile"), "--directory",
                            str(work), "--cores", "3", "--configfile", str(cfg)],
                           capture_output=True, text=True, env=env(), timeout=600)
    finally:
        server.kill()
        server.communicate()
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    whole = evspark("generate", src, "--model", model, "--gamma", 4, "-n", 6, "--seed", 4,
                    "--threads", 1, "-q", "--device", "cpu")
    assert (work / "out" / "generated.fa").read_text() == whole
