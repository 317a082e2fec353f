"""`evspark bench` (the evaluation protocol) on a tiny target with a tiny distilled drafter.

The quick preset is shrunk to tiny sizes (2 prompts x 16 tokens, TVD 1 prompt x 4 samples,
gamma sweep [2, 4], contexts [64, 128] cut from phiX174 plus one longer than the genome, a
64-token depth sweep) and the real command runs in this process. results.json must hold every
section (speed per drafter/mode/rollback with pooled speedups, greedy divergences, TVD rows with
their native-vs-native floor, the sweeps) and report.md their tables. A one-record --prompts
file is reported as one prompt; option values out of range are one error line.
"""
from __future__ import annotations

import copy
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import FAST, fasta_file, record, show  # noqa: E402
from tiny import (  # noqa: E402
    PHIX,
    one_line_error,
    run_cli,
    trained_tiny_dir,
)

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ROOT / "examples" / "prompts.fa"
TINY_QUICK = dict(n_prompts=3, new_tokens=24, gamma=4, tvd_prompts=1, tvd_samples=4, tvd_tokens=16,
                  gamma_sweep=[2, 4], gamma_sweep_prompts=2, contexts=[64, 128, 1_000_000],
                  context_tokens=16, depth_tokens=64, depth_window=16)
SPEED_KEYS = {"dspark-seed0/greedy/slice", "dspark-seed0/sampled/slice",
              "dspark-seed0/sampled/replay",
              "kmer/greedy/slice", "kmer/sampled/slice",
              "identity/greedy/slice", "identity/sampled/slice",
              "dspark-seed0/sampled-coupled/slice", "kmer/sampled-coupled/slice",
              "identity/sampled-coupled/slice"}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny target with a tiny distilled drafter bundled as drafters/seed0."""
    from evspark_cli.train.distill import CacheConfig, DistillConfig, DistillTrainer, build_cache

    tmp = tmp_path_factory.mktemp("bench")
    model = trained_tiny_dir(tmp / "t", steps=20)
    build_cache(CacheConfig(target=str(model), out_dir=str(tmp / "cache"), train=[str(PHIX)],
                            natural_windows=8, onpolicy_windows=4, window=128, onpolicy_prompt=64,
                            batch=4), log=lambda m: None)
    tr = DistillTrainer(DistillConfig(cache=str(tmp / "cache"), out_dir=str(tmp / "run"), steps=20,
                                      batch=8, gamma=4, width=32, layers=1, heads=2, prefix_len=16,
                                      warmup=2, log_every=10, ckpt_every=1000))
    tr.run()
    tr.export(model / "drafters" / "seed0")
    return model


@pytest.fixture(scope="module")
def bench_run(model_dir, tmp_path_factory):
    """`evspark bench --preset quick` with the quick preset shrunk to tiny sizes."""
    from evspark_cli.eval import bench

    out = tmp_path_factory.mktemp("bench-out") / "results"
    mp = pytest.MonkeyPatch()
    mp.setitem(bench.PRESETS, "quick", dict(TINY_QUICK))
    try:
        code, stdout, err = run_cli(["bench", "--model", model_dir, "--preset", "quick",
                                     "--prompts", PROMPTS, "-o", out, "--context-genome", PHIX,
                                     "--n-prompts", 2, "-n", 16, "--threads", 1])
    finally:
        mp.undo()
    assert code == 0, err
    assert err.splitlines()[-1].startswith("evspark: bench: preset quick, "), err
    assert re.match(r"evspark \[[\d: -]+\] bench: timing: ", err), err  # timestamped progress
    return out, json.loads(stdout), json.loads((out / "results.json").read_text()), err


def _finite_pos(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_results_json_has_every_section(bench_run, model_dir):
    out, stdout, res, log = bench_run
    for key in ("command", "config", "machine", "model", "parameters", "date", "drafters", "speed",
                "sampled_losslessness", "gamma_sweep", "context_sweep", "depth_sweep", "wall_s"):
        assert key in res, key
    assert res["command"].startswith("evspark bench") and "--preset quick" in res["command"]
    cfg = res["config"]
    assert cfg["n_prompts"] == 2 and cfg["new_tokens"] == 16  # command-line overrides
    assert cfg["tvd_samples"] == 4 and cfg["gamma_sweep"] == [2, 4]
    assert cfg["context_source"] == str(PHIX)
    assert res["drafters"] == ["dspark-seed0", "kmer", "identity"]
    assert res["machine"]["torch_threads"] == 1 and res["model"] == "tiny-test"
    assert stdout["out"] == str(out) and set(stdout["pooled_speedup"]) == SPEED_KEYS
    assert "speed greedy" in log and "tvd" in log  # progress went to stderr
    timing = res["timing"]  # the noise every speedup carries, and whether it is too much
    assert len(timing["native_repeats_s"]) == 3 and timing["spread"] >= 0
    assert timing["reliable"] == (timing["spread"] <= timing["limit"])
    assert stdout["timing_reliable"] == timing["reliable"]
    assert ("timings UNRELIABLE" in log) == (not timing["reliable"])

    # speed: every drafter x mode x rollback, pooled = total native / total speculative
    assert set(res["speed"]) == SPEED_KEYS
    for name, v in res["speed"].items():
        s, rows = v["summary"], v["rows"]
        assert len(rows) == 2 and s["prompts"] == 2
        assert all(r["tokens"] == 16 for r in rows)
        assert _finite_pos(s["pooled_speedup"])
        assert s["pooled_speedup"] == pytest.approx(sum(r["native_s"] for r in rows)
                                                    / sum(r["spec_s"] for r in rows))
        assert s["min_speedup"] <= s["median_speedup"] <= s["max_speedup"]
        assert s["tau"] >= 1 and len(s["conditional_acceptance"]) == 4
        assert all(a is None or 0 <= a <= 1 for a in s["conditional_acceptance"])
        assert round(s["pooled_speedup"], 3) == stdout["pooled_speedup"][name]
        assert 0 < s["efficiency"] <= 1  # committed tokens over verified positions
        key = "greedy" if "/greedy/" in name else "coupled" if "-coupled/" in name else None
        if key is not None:  # greedy and coupled runs: token by token equal to native
            non_tie = [r[key] for r in rows
                       if r[key]["divergence"] is not None and not r[key]["tie"]]
            assert non_tie == [], (name, non_tie)
            assert all(r[key]["compared"] == 16 for r in rows)
        else:
            assert all("coupled" not in r and "greedy" not in r for r in rows)
    # the distilled drafter gets drafts accepted on the target it was distilled from
    assert res["speed"]["dspark-seed0/greedy/slice"]["summary"]["tau"] > 1

    # sampled losslessness: TVD/KL against native, with the native-vs-native floor
    sl = res["sampled_losslessness"]
    assert sl["samples_per_set"] == 4 and sl["tokens_per_sample"] == 16 and len(sl["rows"]) == 1
    row = sl["rows"][0]
    for k in (1, 3):
        for what in ("spec", "floor"):
            assert 0 <= row[f"tvd{k}_{what}"] <= 1 and row[f"kl{k}_{what}"] >= 0
            assert sl["summary"][f"tvd{k}_{what}"] == row[f"tvd{k}_{what}"]
    assert 0 < row["complexity"] <= 1

    # sweeps
    assert [r["gamma"] for r in res["gamma_sweep"]] == [2, 4]
    assert all(_finite_pos(r["pooled_speedup"]) and r["tau"] >= 1 for r in res["gamma_sweep"])
    ctx = res["context_sweep"]
    assert [r["context"] for r in ctx] == [64, 128, 1_000_000]
    for r in ctx[:2]:
        assert "skipped" not in r and r["prefill_s"] >= 0 and _finite_pos(r["decode_speedup"])
        assert _finite_pos(r["end_to_end_speedup"]) and r["tau"] >= 1
        # decoding alone, both decoders from the same prefilled state
        assert r["decode_speedup"] == pytest.approx(r["native_s"] / r["spec_s"])
        assert _finite_pos(r["peak_rss_mib"]) and _finite_pos(r["state_mib"])
        assert r["prefill_tok_s"] == pytest.approx(r["context"] / r["prefill_s"])
    assert ctx[1]["state_mib"] > ctx[0]["state_mib"]  # the KV cache grows with the context
    assert "genome has only 5386 bases" in ctx[2]["skipped"]
    d = res["depth_sweep"]
    assert d["tokens"] == 64 and _finite_pos(d["speedup"]) and d["tau"] >= 1
    ends = [w["end_token"] for w in d["windows"]]
    assert len(ends) >= 2 and ends == sorted(ends) and ends[-1] == 64
    assert all(w["tau"] >= 1 for w in d["windows"])
    assert all(_finite_pos(w["speedup"]) and _finite_pos(w["native_tok_s"]) for w in d["windows"])
    assert [w["start_token"] for w in d["windows"]] == [0] + ends[:-1]


def test_report_md_has_the_tables(bench_run):
    out, _, res, _ = bench_run
    text = (out / "report.md").read_text()
    for heading in ("# EvSpark benchmark — tiny-test", "## Speed and greedy losslessness",
                    "## Sampled losslessness", "## Gamma sweep", "## Context sweep",
                    "## Depth sweep: 64 tokens"):
        assert heading in text, heading
    for name in SPEED_KEYS:
        line = next(ln for ln in text.splitlines() if ln.startswith(f"| {name} |"))
        assert f"{res['speed'][name]['summary']['pooled_speedup']:.2f}x" in line
        assert ("0 (ties" in line) == ("/greedy/" in line or "-coupled/" in line)
    assert "| 1-mer TVD |" in text and "| 3-mer KL |" in text
    assert "| 2 |" in text and "| 4 |" in text
    assert "| 64 |" in text and "| 128 |" in text and "| 1000000 | skipped" in text
    assert f"Command: `{res['command']}`" in text


def test_report_counts_non_tie_divergences(bench_run, tmp_path):
    from evspark_cli.eval.report import write_report

    _, _, res, _ = bench_run
    bad = copy.deepcopy(res)
    rows = bad["speed"]["kmer/greedy/slice"]["rows"]
    rows[0]["greedy"].update(divergence=3, tie=False)
    rows[1]["greedy"].update(divergence=5, tie=True)
    text = write_report(bad, tmp_path).read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("| kmer/greedy/slice |"))
    assert "| 1 (ties 1) |" in line


def test_bench_drafters_keeps_every_extra_folder(model_dir, tmp_path):
    """Two extra drafter folders are two entries (the second must not replace the first)."""
    from evspark_cli.eval.bench import BenchConfig, bench_drafters
    from evspark_cli.model.checkpoint import load_model

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(model_dir / "drafters" / "seed0", a)
    shutil.copytree(model_dir / "drafters" / "seed0", b)
    model = load_model(model_dir)
    ds = bench_drafters(model, BenchConfig(prompts=str(PROMPTS)), [str(a), str(b)])
    assert len(ds) == 5 and list(ds)[0] == "dspark-seed0" and {"kmer", "identity"} <= set(ds)
    extra = [n for n in ds if n not in ("dspark-seed0", "kmer", "identity")]
    assert len(extra) == 2 and all(n.startswith("dspark") for n in extra)
    assert ds[extra[0]] is not ds[extra[1]]


def test_context_sweep_skips_only_out_of_memory(model_dir, monkeypatch):
    """A context that does not fit is recorded as skipped; any other error is a bug and raises."""
    from evspark_cli.eval import bench
    from evspark_cli.model.checkpoint import load_model

    model = load_model(model_dir)
    cfg = bench.BenchConfig(prompts=str(PROMPTS), contexts=[64], context_source=str(PHIX),
                            context_tokens=4, gamma=2)
    for err in (MemoryError(), RuntimeError("DefaultCPUAllocator: can't allocate memory: 9 GB")):
        def fail(*a, e=err, **k):
            raise e

        monkeypatch.setattr(bench, "prefill_prompt", fail)
        rows = bench.context_sweep(model, bench.resolve_drafter(model, "kmer"), cfg, lambda m: None)
        assert rows[0]["context"] == 64 and rows[0]["skipped"].startswith("out of memory")
    monkeypatch.setattr(bench, "prefill_prompt",
                        lambda *a, **k: (_ for _ in ()).throw(RuntimeError("shape mismatch")))
    with pytest.raises(RuntimeError, match="shape mismatch"):
        bench.context_sweep(model, bench.resolve_drafter(model, "kmer"), cfg, lambda m: None)


# ------------------------------------------------------- the prompts it ran, bad option values


def test_bench_reports_the_prompts_it_ran(phix_model: Path, tmp_path: Path):
    one = fasta_file(tmp_path, "one.fa", ">p1\n" + "ACGTTGCA" * 8 + "\n")
    out = tmp_path / "bench"
    args = ["bench", "--model", phix_model, "--prompts", one, "-o", out, *FAST, "-n", 4, "--seeds",
            "0", "--baselines", "kmer", "--rollbacks", "slice", "--skip",
            "tvd,gamma,context,depth"]
    r = run_cli(args)
    assert r.code == 0, r.err
    report = (out / "report.md").read_text()
    record("hostile", "bench --prompts with 1 record", show(args, tmp_path, MODEL=phix_model), 0,
           re.search(r"\d+ prompts? x", report)[0] + " in report.md")
    assert "1 prompts x" in report or "1 prompt x" in report
    assert json.loads((out / "results.json").read_text())["config"]["n_prompts"] == 1


def test_bench_warns_when_its_timings_are_unreliable(phix_model, tmp_path, monkeypatch):
    """Native passes of one prompt that differ by more than 20 % (a busy machine) make bench
    say so, as generate --compare-native does, in its log and its report."""
    from evspark_cli.eval import bench as bench_mod

    noisy = {"native_repeats_s": [1.0, 1.1, 1.6], "spread": 0.55, "reliable": False,
             "limit": 0.2}
    monkeypatch.setattr(bench_mod, "timing_check", lambda *a: noisy)
    one = fasta_file(tmp_path, "one.fa", ">p1\n" + "ACGTTGCA" * 8 + "\n")
    out = tmp_path / "bench"
    r = run_cli(["bench", "--model", phix_model, "--prompts", one, "-o", out, *FAST, "-n", 4,
                 "--seeds", "0", "--baselines", "kmer", "--rollbacks", "slice", "--skip",
                 "tvd,gamma,context,depth,throughput,mixed"])
    assert r.code == 0, r.err
    assert "evspark: warning: timings UNRELIABLE: 3 native passes" in r.err
    assert "**UNRELIABLE**" in (out / "report.md").read_text()


@pytest.mark.parametrize("opt", [["-n", "0"], ["--n-prompts", "0"], ["-g", "0"],
                                 ["--gammas", "0,2"], ["--contexts", "-5"], ["--seeds", "-1"],
                                 ["--rules", "coupled,gumbel"], ["--rules", ""]])
def test_bench_values_out_of_range(tmp_path, opt):
    r = run_cli(["bench", "--model", tmp_path / "none", "-o", tmp_path / "out", *opt, "-q"])
    one_line_error(r, 2)


def test_bench_output_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    one_line_error(run_cli(["bench", "--model", tmp_path / "none", "-o", tmp_path / "afile", "-q"]),
                   2)
