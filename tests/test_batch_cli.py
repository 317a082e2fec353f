"""Batched generation as users run it: `generate --batch-size`, `verify --batch-size`,
`bench`'s throughput section and `evs.generate_many`.

The batch size changes speed, never output: the same seed writes the same FASTA (and the same
stats but for timings) with any batch size, with samples, shards and resumed runs; a batch that
cannot fit in memory is refused up front, naming the largest that fits.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_cli import gen, ok, plant_prefill_fault, records_text, split_fasta  # noqa: E402
from tiny import at_round, phix_genome, run_cli, trained_tiny_dir  # noqa: E402

TIMING = ("wall_s", "tokens_per_s", "native_wall_s", "native_tokens_per_s", "speedup",
          "decode_s", "prefill_s")
BATCH = ("verified_positions", "efficiency", "batch")  # a block spans its round's longest draft


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    import torch

    torch.set_num_threads(1)
    return trained_tiny_dir(tmp_path_factory.mktemp("model"), steps=20)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    g = phix_genome()
    recs = {f"r{i}": g[i * 700: i * 700 + n] for i, n in enumerate((3, 90, 47, 130, 33, 71, 12))}
    path = tmp_path_factory.mktemp("in") / "in.fa"
    path.write_text(records_text(recs))
    return path


def _stats_without_timings(path: Path) -> list[list[str]]:
    lines = [ln.split("\t") for ln in path.read_text().splitlines()]
    keep = [i for i, c in enumerate(lines[0]) if c not in TIMING + BATCH]
    return [[row[i] for i in keep] for row in lines]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--greedy"], ["--drafter", "none"],
                                   ["--drafter", "identity", "--gamma", "3"]],
                         ids=["kmer", "greedy", "native", "identity"])
def test_batch_size_does_not_change_the_output(tmp_path, model, src, extra):
    """Records x 3 samples of different lengths, batch sizes 1, 4 and 32: identical FASTA and
    identical stats but for the timing columns."""
    ref_fa, ref_tsv = None, None
    for b in (1, 4, 32):
        fa, tsv = tmp_path / f"b{b}.fa", tmp_path / f"b{b}.tsv"
        ok(gen(model, src, "-n", 21, "--samples", 3, "--seed", 7, "--batch-size", b,
               "-o", fa, "--stats", tsv, *extra))
        if ref_fa is None:
            ref_fa, ref_tsv = fa.read_bytes(), _stats_without_timings(tsv)
            ids = list(split_fasta(fa.read_text()))[:4]
            assert ids == ["r0.cont_s0", "r0.cont_s1", "r0.cont_s2", "r1.cont_s0"]
            continue
        assert fa.read_bytes() == ref_fa, b
        assert _stats_without_timings(tsv) == ref_tsv, b


def test_shards_of_a_batched_run_recombine(tmp_path, model, src):
    whole = ok(gen(model, src, "-n", 9, "--samples", 2, "--batch-size", 5)).out
    parts = [tmp_path / f"part{i}.fa" for i in (1, 2, 3)]
    for i, part in enumerate(parts, 1):
        ok(gen(model, src, "-n", 9, "--samples", 2, "--batch-size", 3, "--shard", f"{i}/3",
               "-o", part))
    assert ok(["merge", *parts, "-q"]).out == whole


def test_interrupted_batched_run_resumes_to_the_uninterrupted_file(tmp_path, model, src,
                                                                   monkeypatch):
    """An interrupt in the middle of a batched run keeps every finished record (those that
    finished out of input order too); --resume redoes only the rest and the final file equals
    an uninterrupted run byte for byte."""

    opts = ["-n", 30, "--samples", 2, "--seed", 3, "--batch-size", 4]
    ref = tmp_path / "ref.fa"
    ok(gen(model, src, "-o", ref, *opts))
    out = tmp_path / "out.fa"
    restore = at_round(monkeypatch, 12)
    r = run_cli(gen(model, src, "-o", out, *opts))
    assert r.code == 130 and "Traceback" not in r.err
    done = list(split_fasta(Path(f"{out}.partial").read_text()))
    assert 0 < len(done) < 14
    restore()
    ok(gen(model, src, "-o", out, "--resume", *opts))
    assert out.read_bytes() == ref.read_bytes()


def test_a_batch_that_does_not_fit_is_refused_naming_the_largest(tmp_path, model, src,
                                                                 monkeypatch):
    import re

    # the tiny model: ~0.8 MB of state per row, so 32 rows (~52 MB with transients) do not fit
    # in 40 MB, and some do; the limit counts what this process holds
    monkeypatch.setenv("EVSPARK_MAX_MEMORY", held_plus(40 << 20))
    r = run_cli(gen(model, src, "-n", 3000, "--samples", 8, "--batch-size", 32))
    err = r.err.strip().splitlines()
    assert r.code == 2 and len(err) == 1, r.err
    m = re.search(r"the largest batch that fits is (\d+) \(--batch-size \1\)", err[0])
    assert m and 0 < int(m.group(1)) < 32, err[0]
    # without --batch-size the device's default (32 on a CPU) shrinks to what fits instead
    import evspark_cli as evs
    from evspark_cli.generation.jobs import Record, build_jobs
    from evspark_cli.generation.options import DecodeOptions
    from evspark_cli.generation.plan import plan_batch

    m_ = evs.load_model(model)
    opts = DecodeOptions(3000, samples=8)
    jobs = build_jobs([Record.named("r", "ACGT" * 30, m_.config.vocab_size)], opts)
    # the same room beyond what this process holds now (loading the model here added to it)
    monkeypatch.setenv("EVSPARK_MAX_MEMORY", held_plus(40 << 20))
    assert plan_batch(m_, jobs, opts, None, None) == min(int(m.group(1)), 8)
    monkeypatch.delenv("EVSPARK_MAX_MEMORY")
    assert plan_batch(m_, jobs, opts, None, None) == 8  # no more rows than jobs


@pytest.mark.parametrize("args,memory", [(["-n", 4, "-b", 0], None), (["-n", 4, "-b", -1], None),
                                         (["-n", 3000, "--samples", 8, "-b", 32], 30 << 20)],
                         ids=["zero", "negative", "too-big-for-memory"])
def test_a_refused_batch_size_leaves_no_partial(tmp_path, model, src, monkeypatch, args,
                                                memory):
    """The batch size (and the memory it needs) is checked before the outputs are opened: a
    refused run leaves no `.partial` that the next run would refuse as an interrupted run's."""
    out, stats = tmp_path / "o.fa", tmp_path / "o.tsv"
    if memory is not None:
        monkeypatch.setenv("EVSPARK_MAX_MEMORY", held_plus(memory))
    r = run_cli(gen(model, src, *args, "-o", out, "--stats", stats))
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1, r.err
    assert "--batch-size" in r.err, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], r.err
    monkeypatch.delenv("EVSPARK_MAX_MEMORY", raising=False)
    ok(gen(model, src, "-n", 4, "-b", 2, "-o", out, "--stats", stats))  # a plain rerun works
    assert out.exists() and stats.exists()


def test_an_absurd_batch_size_is_clamped_before_allocation(tmp_path, model, src):
    """`verify -b 1000000000` decodes with as many rows as there are jobs (the decoder's free
    slots are a range, not a list of a billion numbers)."""
    r = run_cli(["verify", src, "--model", model, "-n", 4, "--drafter", "kmer", "--gamma", 3,
                 "--batch-size", 1000000000, "--threads", 1, "-q"])
    assert r.code == 0, r.err
    assert "non_tie_divergences=0" in r.out


def test_verify_checks_its_batch_against_memory(tmp_path, model, src, monkeypatch):
    """`verify -b N` plans its batch as `generate` does: one that does not fit in the memory
    limit is refused before any decoding, naming the largest that fits."""
    import evspark_cli as evs
    from evspark_cli.decode.drafters.registry import resolve_drafter
    from evspark_cli.generation.jobs import Record, build_jobs
    from evspark_cli.generation.options import DecodeOptions
    from evspark_cli.generation.plan import memory_inputs
    from evspark_cli.io.fasta import read_prompts
    from evspark_cli.model.memory import run_memory

    m = evs.load_model(model)
    opts = DecodeOptions(3000, gamma=3)
    jobs = build_jobs([Record.of(p, m.config.vocab_size) for p in read_prompts([str(src)])],
                      opts)
    context, block, needs = memory_inputs(m, jobs, opts, resolve_drafter(m, "kmer"))
    three = run_memory(m.config, torch_float32(), torch_float32(), context, block, 3,
                       with_parameters=False, needs=needs, chunk=m.prefill_chunk()).total(3)
    monkeypatch.setenv("EVSPARK_MAX_MEMORY", held_plus(three))  # about 3 of its 7 rows fit
    r = run_cli(["verify", src, "--model", model, "-n", 3000, "--drafter", "kmer", "--gamma", 3,
                 "--batch-size", 32, "--threads", 1, "-q"])
    err = r.err.strip().splitlines()
    assert r.code == 2 and len(err) == 1, r.err
    got = re.search(r"the largest batch that fits is (\d+) \(--batch-size \1\)", err[0])
    assert got and 1 <= int(got.group(1)) < 7, err[0]


def test_a_default_batch_that_does_not_fit_is_lowered_with_a_warning(tmp_path, model, src,
                                                                      monkeypatch):
    import evspark_cli as evs
    from evspark_cli.model.memory import run_memory

    m = evs.load_model(model)
    context = 130 + 4 + 13 + 16  # about the longest prompt + -n + a verification block
    est = run_memory(m.config, torch_float32(), torch_float32(), context, 13, 3,
                     with_parameters=False)
    monkeypatch.setenv("EVSPARK_MAX_MEMORY", held_plus(est.total(3)))
    out = tmp_path / "o.fa"
    r = run_cli(gen(model, src, "-n", 4, "--samples", 8, "-o", out))
    assert r.code == 0, r.err
    warning = [ln for ln in r.err.splitlines() if "batch size lowered" in ln]
    import re

    m_ = re.fullmatch(r"evspark: warning: batch size lowered to (\d+) \(from 32\) to fit in "
                      r"memory", warning[0]) if len(warning) == 1 else None
    assert m_ and 1 <= int(m_.group(1)) < 8, r.err  # about 3 rows' state fit
    ref = tmp_path / "ref.fa"
    # the reference run is about the bytes, not the limit (which this process's growth since
    # the first run would eat into: the runs are in-process)
    monkeypatch.delenv("EVSPARK_MAX_MEMORY")
    ok(gen(model, src, "-n", 4, "--samples", 8, "--batch-size", 1, "-o", ref))
    assert out.read_bytes() == ref.read_bytes()


def held_plus(nbytes: int) -> str:
    """A memory limit of `nbytes` beyond what this process holds now (which a fixed limit
    counts: these runs are in-process)."""
    from evspark_cli.model.memory import process_bytes

    return str(process_bytes() + nbytes)


def torch_float32():
    import torch

    return torch.float32


def test_bad_batch_sizes_are_usage_errors(model, src):
    for bad in ("0", "-3"):
        r = run_cli(gen(model, src, "-n", 4, "--batch-size", bad))
        assert r.code == 2 and "--batch-size" in r.err and len(r.err.strip().splitlines()) == 1


def test_verify_batched_against_single_stream_native(tmp_path, model, src):
    report = tmp_path / "v.json"
    r = ok(["verify", src, "--model", model, "--drafter", "kmer", "-n", 24, "--gamma", 5,
            "--batch-size", 3, "--threads", 1, "-q", "--report", report])
    assert "non_tie_divergences=0" in r.out and "batch_size=3" in r.out
    rep = json.loads(report.read_text())
    assert rep["batch_size"] == 3 and len(rep["rows"]) == 7
    assert all(row["divergence"] is None for row in rep["rows"])


def test_generate_many_is_generate_for_each_prompt_and_sample(model):
    import evspark_cli as evs

    m = evs.load_model(model)
    prompts = ["ACGTTAGCAGGCTTAC", "GGGCATTAGCAAT", "T"]
    outs = evs.generate_many(m, prompts, samples=2, batch_size=3, max_new_tokens=17, gamma=4,
                             drafter="kmer", seed=11)
    assert len(outs) == 6
    for i, p in enumerate(prompts):
        for s in range(2):
            want = evs.generate(m, p, max_new_tokens=17, gamma=4, drafter="kmer", seed=11,
                                record=i, sample=s)
            assert outs[2 * i + s].tokens == want.tokens, (i, s)
    # a mapping keys records by id, as the command line does
    by_id = evs.generate_many(m, {"a": prompts[0]}, max_new_tokens=5, drafter="kmer")
    assert by_id[0].stats["record_id"] == "a"


def test_generate_many_keeps_the_finished_outputs_when_a_job_fails(model, monkeypatch):
    """One failing record does not discard the others: GenerationError carries every finished
    output (the same tokens as a run without the failure) and the failure by its index."""
    import evspark_cli as evs
    from evspark_cli.errors import GenerationError

    m = evs.load_model(model)
    prompts = {"a": "ACGTTAGCAGGC", "b": "GGGCATTAGC", "c": "TTGACA"}
    kw = dict(samples=2, batch_size=2, max_new_tokens=9, drafter="kmer", gamma=3, seed=4)
    clean = evs.generate_many(m, prompts, **kw)
    plant_prefill_fault(monkeypatch, "b")
    with pytest.raises(GenerationError, match=r"2 of 6 outputs failed \(the first, output 2: "
                                              r"planted fault\)") as got:
        evs.generate_many(m, prompts, **kw)
    err = got.value
    assert sorted(err.errors) == [2, 3] and err.exit_code == 1
    assert [o is None for o in err.outputs] == [False, False, True, True, False, False]
    assert [o.tokens for o in err.outputs if o is not None] == [
        o.tokens for i, o in enumerate(clean) if i not in (2, 3)]


def test_bench_throughput_section(tmp_path, model, src):
    out = tmp_path / "bench"
    r = ok(["bench", "--model", model, "--prompts", src, "--skip",
            "speed,tvd,gamma,context,depth", "--n-prompts", 3, "--samples", 2,
            "--throughput-tokens", 12, "--batch-sizes", "1,4", "--batch-size", 2,
            "--threads", 1, "-q", "-o", out])
    res = json.loads((out / "results.json").read_text())["throughput"]
    assert set(res["modes"]) == {f"{d}/b{b}{r}" for d in ("native", "speculative")
                                 for b in (1, 2, 4) for r in ("", "/coupled")}
    assert all(m["tokens"] == 3 * 2 * 12 for m in res["modes"].values())
    assert all(m["jobs_changed_vs_batch_1"] == 0 for m in res["modes"].values()
               if m["batch_size"] > 1)
    coupled = [m for m in res["modes"].values() if m["rule"] == "coupled"
               and m["decoder"] == "speculative"]
    assert len(coupled) == 3 and all(m["jobs_differing_from_native"] == 0 for m in coupled)
    assert all(0 < m["efficiency"] <= 1 for m in res["modes"].values())
    assert set(res["summary"]) >= {"b2", "b4", "b2/coupled", "b4/coupled"}
    mixed = res["mixed"]  # prompts of 64..2048 bases, 1-4 samples each: the same modes
    assert set(mixed["modes"]) == set(res["modes"]) and mixed["config"]["prompt_lengths"] == [
        64, 2048]
    assert all(m["jobs_changed_vs_batch_1"] == 0 for m in mixed["modes"].values()
               if m["batch_size"] > 1)
    assert all(m["jobs_differing_from_native"] == 0 for m in mixed["modes"].values()
               if m["rule"] == "coupled" and m["decoder"] == "speculative")
    assert "## Throughput on mixed prompt lengths" in (out / "report.md").read_text()
    assert res["headline_batch_size"] == 2
    report = (out / "report.md").read_text()
    assert "## Throughput" in report and "| speculative | coupled | 4 |" in report
    assert json.loads(r.out)["throughput_tokens_per_s"]
