"""Where a batched run's time goes on prompts of mixed lengths, against equal-length prompts.

    python benchmarks/mixed_profile.py --out benchmarks/results/mixed_profile.json
    python benchmarks/mixed_profile.py --records 4 --samples 1 --tokens 8 --lengths 64,256 \
        --out /tmp/m.json                                               # a smoke run

Two workloads of the same jobs and tokens: `--records` prompts cut from a real genome at lengths
spread over `--lengths` (a user's contigs, genes and regions), and the same number of prompts
of one length (`--equal-length`), each `--samples` times, `--tokens` tokens per job, sampled
(T=1, top-k 4), through the batched decoder at `--batch-size` rows and at batch 1. For each run:
tokens/s; for the batched runs also where the time went, per Python section (prefill, drafting, the verification
pass, the acceptance rule, commit and the drafter's bookkeeping, rows joining and leaving) and
per operator class (projections, attention, Hyena convolutions and recurrences, state copies,
element-wise work) from torch.profiler. The sections are timed by wrapping the decoder's and
the model's methods in `record_function` ranges; nothing in the engine changes.

The mixed set also runs at the batch size with its records ordered longest prompt first
(`mixed/b32/longest-first`), against input order: whether a queue ordered by length pays.
Each run also reports its tokens/s without its prefills (`decode_tokens_per_s`), the peak
resident memory it added (`peak_rss_mib`, sampled every 5 ms, against the `generate` memory
check's estimate for that batch, `estimate_mib`), and, with `--native`, single-stream native
decoding of one sample per record (the same prompts and tokens per job), from which the whole
run's speedup over single-stream native decoding of all its jobs is derived (the record's
prefill once, its decoding per sample: native decoding's cost per token does not depend on the
sample).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from evspark_cli.decode import batch as batch_mod  # noqa: E402
from evspark_cli.decode.drafters.registry import resolve_drafter  # noqa: E402
from evspark_cli.eval.provenance import provenance  # noqa: E402
from evspark_cli.generation.jobs import Record, build_jobs  # noqa: E402
from evspark_cli.generation.options import DecodeOptions  # noqa: E402
from evspark_cli.generation.run import GenerationRun  # noqa: E402
from evspark_cli.io.fasta import read_prompts  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402
from evspark_cli.model.model import StripedHyena  # noqa: E402

OPERATOR_CLASSES = [  # (class, substrings of aten operator names), first match wins
    ("projections", ("linear", "addmm", "mm", "bmm", "matmul")),
    ("attention", ("scaled_dot_product", "flash_attention", "softmax")),
    ("hyena", ("conv1d", "convolution", "fft", "cumsum", "exp", "pow")),
    ("state copies", ("cat", "copy_", "index", "select", "slice", "clone", "stack", "narrow",
                      "gather", "scatter", "empty", "zeros", "fill_", "contiguous", "to")),
    ("element-wise", ("add", "mul", "sub", "div", "gelu", "silu", "sigmoid", "norm", "rsqrt",
                      "mean", "sum", "where", "clamp", "neg", "sqrt", "max", "min", "sort",
                      "topk", "searchsorted", "eq", "lt", "gt", "masked")),
]

SECTIONS = {  # record_function name -> (owner, attribute) wrapped; "in a round" ones only count
    #            inside a round (the model's extend also runs prefill chunks)
    "prefill": (batch_mod.BatchDecoder, "_prefilled", False),
    "rows join": (batch_mod.BatchDecoder, "_join", False),
    "rows leave": (batch_mod.BatchDecoder, "_remove", False),
    "round": (batch_mod.BatchDecoder, "_round", False),
    "verification pass": (StripedHyena, "extend", True),
    "acceptance rule": (batch_mod, "decide_rows", True),
    "sampler": (batch_mod, "sampler_probs", True),
}
"""A round's time not in its verification pass, acceptance rule or sampler is the drafting and
the per-row bookkeeping (`drafting and rows` in the result)."""

def find_genome() -> Path | None:
    shared = Path(os.environ.get("EVSPARK_SHARED", ROOT.parent / "shared"))
    for name in ("ecoli_K12_MG1655.fa.gz", "kpneumoniae_HS11286.fa.gz"):
        p = shared / "data" / "train" / name
        if p.is_file():
            return p
    return None


def cut_prompts(genome: str, lengths: list[int], seed: int) -> list[tuple[str, str]]:
    """(id, sequence) at the given lengths, from random places of `genome`."""
    rnd = random.Random(seed)
    out = []
    for i, n in enumerate(lengths):
        start = rnd.randrange(0, max(1, len(genome) - n))
        out.append((f"p{i}_{n}", genome[start: start + n]))
    return out


@contextlib.contextmanager
def sections():
    """Wrap the decoder's phases in record_function ranges (restored on exit)."""
    saved = []
    state = {"in_round": False}
    for label, (owner, name, round_only) in SECTIONS.items():
        real = vars(owner)[name]

        def wrapped(*args, _real=real, _label=label, _round_only=round_only, **kwargs):
            if _round_only and not state["in_round"]:
                return _real(*args, **kwargs)
            outer = state["in_round"]
            state["in_round"] = outer or _label == "round"
            try:
                with record_function(_label):
                    return _real(*args, **kwargs)
            finally:
                state["in_round"] = outer

        saved.append((owner, name, real))
        setattr(owner, name, wrapped)
    try:
        yield
    finally:
        for owner, name, real in saved:
            setattr(owner, name, real)


def classify(name: str) -> str:
    low = name.lower()
    for cls, keys in OPERATOR_CLASSES:
        if any(k in low for k in keys):
            return cls
    return "other"


def rss() -> int:
    """This process's resident memory, bytes."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def peak_rss():
    """The peak resident memory while the block runs, above what it was before (a list that
    holds it once the block ends)."""
    base, peak, stop = rss(), [0], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], rss() - base)
            time.sleep(0.005)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield peak
    finally:
        stop.set()
        t.join()


def estimate(model, drafter, jobs, options: DecodeOptions, batch: int) -> int:
    """What `generate`'s memory check estimates for this batch (model excluded)."""
    from evspark_cli.generation.plan import memory_inputs
    from evspark_cli.model.memory import run_memory

    context, block, needs = memory_inputs(model, jobs, options, drafter)
    dtype = next(model.parameters()).dtype
    est = run_memory(model.config, dtype, dtype, context, block, batch, with_parameters=False,
                     needs=needs, chunk=model.prefill_chunk())
    return est.total(min(batch, len(jobs)))


def one_run(model, drafter, records: list[Record], options: DecodeOptions, batch: int,
            with_profile: bool) -> dict:
    jobs = build_jobs(records, options)
    run = GenerationRun(model, drafter, options, batch)
    prof_ctx = (profile(activities=[ProfilerActivity.CPU]) if with_profile
                else contextlib.nullcontext())
    t0 = time.perf_counter()
    with peak_rss() as peak, sections(), prof_ctx as prof:
        outs = list(run.outcomes(jobs))
    seconds = time.perf_counter() - t0
    tokens = sum(len(o.output.tokens) for o in outs if o.output is not None)
    prefill = sum(o.output.result.prefill_s for o in outs if o.output)
    row = {"batch": batch, "jobs": len(jobs), "tokens": tokens, "seconds": round(seconds, 3),
           "tokens_per_s": round(tokens / seconds, 1), "prefill_s": round(prefill, 3),
           "decode_tokens_per_s": round(tokens / max(seconds - prefill, 1e-9), 1),
           "peak_rss_mib": round(peak[0] / 2**20, 1),
           "estimate_mib": round(estimate(model, drafter, jobs, options, batch) / 2**20, 1)}
    if prof is not None:
        by_section: dict[str, float] = {}
        by_class: dict[str, float] = defaultdict(float)
        for ev in prof.key_averages():
            if ev.key in SECTIONS:
                by_section[ev.key] = ev.cpu_time_total / 1e6
            elif ev.key.startswith("aten::"):
                by_class[classify(ev.key)] += ev.self_cpu_time_total / 1e6
        total = sum(by_class.values())
        inside = sum(by_section.get(k, 0.0) for k in ("verification pass", "acceptance rule",
                                                        "sampler"))
        by_section["drafting and rows"] = max(0.0, by_section.get("round", 0.0) - inside)
        row["sections_s"] = {k: round(v, 3) for k, v in by_section.items()}
        row["operator_classes_s"] = {k: round(v, 3) for k, v in sorted(
            by_class.items(), key=lambda kv: -kv[1])}
        row["operator_share"] = {k: round(v / total, 3) for k, v in by_class.items()} if total \
            else {}
        # time spent in Python around the operators: the round minus its operators' self time
        row["python_and_dispatch_s"] = round(max(0.0, seconds - total), 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="64,128,256,512,1024,2048,4096,8192",
                    help="prompt lengths, cycled over the records")
    ap.add_argument("--equal-length", type=int, default=1000)
    ap.add_argument("--records", type=int, default=16)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=12)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-profile", action="store_true", help="timings only (no profiler cost)")
    ap.add_argument("--native", action="store_true",
                    help="also single-stream native decoding of one sample per record")
    ap.add_argument("--out")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    lengths = [int(x) for x in a.lengths.split(",")]
    wanted = [lengths[i % len(lengths)] for i in range(a.records)]
    path = find_genome()
    if path is not None:
        genome = "".join(p.seq for p in read_prompts([str(path)]))
    else:  # no shared data: a random genome (the timings do not depend on the letters much)
        rnd = random.Random(0)
        genome = "".join(rnd.choice("ACGT") for _ in range(max(wanted) * 4 + 10_000))
    model = load_model()
    drafter = resolve_drafter(model, "auto")
    options = DecodeOptions(a.tokens, a.gamma, 1.0, 4, 1.0, seed=0, samples=a.samples)
    vocab = model.config.vocab_size
    warm = [Record.named(f"w{b}", genome[:200], vocab) for b in range(2)]  # untimed warm-up
    one_run(model, drafter, warm, DecodeOptions(16, a.gamma, samples=2), 4, False)
    sets = {"mixed": cut_prompts(genome, wanted, 1),
            "equal": cut_prompts(genome, [a.equal_length] * a.records, 2)}
    result: dict = {"config": {**vars(a), "genome": str(path) if path else "random",
                               "mixed_lengths": wanted}, "runs": {}}
    for name, prompts in sets.items():
        records = [Record.named(i, s, vocab) for i, s in prompts]
        for batch in (a.batch_size, 1):
            # batch 1 is timed without the profiler: its many small operators would fill memory
            # with events (and it is the reference for the speed, not the subject of the profile)
            row = one_run(model, drafter, records, options, batch, False)
            if not a.no_profile and batch > 1:  # the breakdown from a second, profiled run
                # (the profiler slows a run down: the timings above are from a run without it)
                prof = one_run(model, drafter, records, options, batch, True)
                row["profiled"] = {k: prof[k] for k in ("seconds", "sections_s",
                                                         "operator_classes_s", "operator_share",
                                                         "python_and_dispatch_s")}
            result["runs"][f"{name}/b{batch}"] = row
            print(f"{name} batch {batch}: {row['tokens_per_s']} tok/s "
                  f"({row['tokens']} tokens in {row['seconds']} s, prefill "
                  f"{row['prefill_s']} s)", flush=True)
    runs = result["runs"]
    b = a.batch_size
    # the queue ordered by prompt length, longest first (a batch of rows of similar lengths,
    # long prefills while the batch is full, short rows in the tail), against input order
    ordered = sorted(sets["mixed"], key=lambda p: -len(p[1]))
    records = [Record.named(i, s, vocab) for i, s in ordered]
    runs[f"mixed/b{b}/longest-first"] = one_run(model, drafter, records, options, b, False)
    print(f"mixed batch {b}, longest first: "
          f"{runs[f'mixed/b{b}/longest-first']['tokens_per_s']} tok/s", flush=True)
    if a.native:  # one sample per record, natively, at batch 1
        one = DecodeOptions(a.tokens, a.gamma, 1.0, 4, 1.0, seed=0, samples=1)
        for name, prompts in sets.items():
            records = [Record.named(i, s, vocab) for i, s in prompts]
            row = one_run(model, None, records, one, 1, False)
            decode_s = row["seconds"] - row["prefill_s"]
            # every job of the run: the records' prefills once, each sample's decoding
            row["all_jobs_seconds"] = round(row["prefill_s"] + a.samples * decode_s, 3)
            runs[f"{name}/native-b1"] = row
            print(f"{name} native batch 1: {row['tokens_per_s']} tok/s", flush=True)
    result["summary"] = {
        "mixed_batch_gain": round(runs[f"mixed/b{b}"]["tokens_per_s"]
                                  / runs["mixed/b1"]["tokens_per_s"], 3),
        "equal_batch_gain": round(runs[f"equal/b{b}"]["tokens_per_s"]
                                  / runs["equal/b1"]["tokens_per_s"], 3),
        "mixed_over_equal_at_batch": round(runs[f"mixed/b{b}"]["tokens_per_s"]
                                           / runs[f"equal/b{b}"]["tokens_per_s"], 3),
        "mixed_over_equal_decoding_only": round(
            runs[f"mixed/b{b}"]["decode_tokens_per_s"]
            / runs[f"equal/b{b}"]["decode_tokens_per_s"], 3),
        "mixed_peak_over_estimate": round(runs[f"mixed/b{b}"]["peak_rss_mib"]
                                          / runs[f"mixed/b{b}"]["estimate_mib"], 3),
        "mixed_longest_first_over_input_order": round(
            runs[f"mixed/b{b}/longest-first"]["tokens_per_s"] / runs[f"mixed/b{b}"]["tokens_per_s"],
            3)}
    if a.native:
        for name in sets:
            result["summary"][f"{name}_over_single_stream_native"] = round(
                runs[f"{name}/native-b1"]["all_jobs_seconds"] / runs[f"{name}/b{b}"]["seconds"],
                3)
    print(json.dumps(result["summary"]), flush=True)
    result["provenance"] = provenance(" ".join(sys.argv))
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
