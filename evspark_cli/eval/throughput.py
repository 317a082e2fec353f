"""Throughput: tokens per second of many generations, by batch size, native and speculative.

The workload is records x samples jobs (a record's samples share one prefill). Every mode runs
on the same jobs, and the modes are interleaved slice by slice in one process (a slice = a few
records with all their samples); within a slice, a batch size's native and speculative decoders
run at once in turns (decode/interleave.py), so every ratio is measured side by side on the
same machine state. Each mode's time is its decoder's own time, prefills included.

Two workloads: the prompt suite (prompts of similar length, `--throughput-samples` each) and,
with `mixed`, prompts of lengths spread over 64..16,384 bases with 1-4 samples each, cut from a
genome (`mixed_workload`): a user's contigs, genes and regions, where rows at very different
positions share a batch.

Besides speed, the section counts how often the batch size changed a token: every job's tokens at
each batch size against the same job in a batch of one (same seed, so they should be equal; a
batched product can round a float differently in the last place, which can flip a draw or a
greedy choice). Each rule (`residual`, `coupled`) gets its own modes; under `coupled` every
speculative job is also compared with the same job sampled natively in a batch of one, which
it must equal token for token.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

from ..decode.batch import BatchDecoder, JobList
from ..decode.drafters.base import Drafter
from ..decode.interleave import interleave, timed_run
from ..decode.jobs import Job
from ..decode.sampling import SamplerConfig
from ..generation.jobs import Record, build_jobs
from ..generation.options import DecodeOptions
from ..io.types import Prompt
from ..model.model import StripedHyena

SAMPLED = SamplerConfig(1.0, 4, 1.0)


@dataclass
class ThroughputConfig:
    records: int = 8
    samples: int = 4
    new_tokens: int = 64
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
    gamma: int = 12
    slices: int = 4  # the workload is cut into this many slices, each run by every mode in turn
    native_single: bool = True  # also single-stream native decoding (the usual baseline)
    rules: list[str] = field(default_factory=lambda: ["residual"])


MIXED_LENGTHS = (64, 16384)  # the mixed workload's shortest and longest prompt, bases
MIXED_SAMPLES = (1, 4)  # and its fewest and most samples per record


def mixed_lengths(records: int, lengths: tuple[int, int] = MIXED_LENGTHS,
                  seed: int = 0) -> list[int]:
    """`records` prompt lengths spaced evenly on a log scale over `lengths` (both ends
    included), in a shuffled order (a user's FASTA is not sorted by length)."""
    lo, hi = lengths
    if records == 1:
        return [lo]
    out = [round(math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * i / (records - 1)))
           for i in range(records)]
    random.Random(seed).shuffle(out)
    return out


def mixed_workload(source: Sequence[str], records: int, options: DecodeOptions, vocab: int,
                   lengths: tuple[int, int] = MIXED_LENGTHS,
                   samples: tuple[int, int] = MIXED_SAMPLES, seed: int = 0,
                   equal_length: int | None = None) -> list[Job]:
    """Jobs of `records` prompts of `mixed_lengths` (or all of `equal_length`), each cut at a
    random place of the `source` sequences joined end to end (repeated when shorter), with a
    number of samples drawn from `samples` per record: `options.max_new_tokens` tokens each.
    The same seed gives the same samples per record whatever the lengths, so the mixed and
    the equal-length workload have the same jobs and tokens."""
    text = "".join(source)
    if not text:
        raise ValueError("the mixed workload needs a non-empty source sequence")
    rnd = random.Random(seed)
    sizes = ([equal_length] * records if equal_length is not None
             else mixed_lengths(records, lengths, seed))
    jobs: list[Job] = []
    for i, n in enumerate(sizes):
        reps = -(-(n + 1) // len(text))
        tiled = text * max(1, reps + 1)
        start = rnd.randrange(0, len(tiled) - n)
        count = rnd.randint(*samples)
        rec = Record.named(f"mixed{i}_{n}", tiled[start: start + n], vocab)
        for j in build_jobs([rec], replace(options, samples=count)):
            jobs.append(replace(j, index=len(jobs)))
    return jobs


def mode_name(decoder: str, batch_size: int, rule: str) -> str:
    """`native/b8`, `speculative/b8` under the residual rule; `.../coupled` under coupled."""
    return f"{decoder}/b{batch_size}" + ("" if rule == "residual" else f"/{rule}")


def _modes(cfg: ThroughputConfig, drafter: Drafter | None
           ) -> list[tuple[str, Drafter | None, int, str]]:
    modes = []
    for rule in cfg.rules:
        for b in cfg.batch_sizes:
            if b > 1 or cfg.native_single or rule != "residual":
                modes.append((mode_name("native", b, rule), None, b, rule))
            if drafter is not None:
                modes.append((mode_name("speculative", b, rule), drafter, b, rule))
    return modes


def _paired(modes: list[tuple[str, Drafter | None, int, str]]
            ) -> list[list[tuple[str, Drafter | None, int, str]]]:
    """The modes grouped by (batch size, rule), in order: each group's decoders (native and
    speculative) run in turns. Groups, not every mode at once: a group holds at most two
    batches in memory, as `generate --compare-native` does."""
    groups: dict[tuple[int, str], list[tuple[str, Drafter | None, int, str]]] = {}
    for m in modes:
        groups.setdefault((m[2], m[3]), []).append(m)
    return list(groups.values())


def throughput_options(cfg: ThroughputConfig, sampler: SamplerConfig = SAMPLED
                       ) -> DecodeOptions:
    return DecodeOptions(cfg.new_tokens, cfg.gamma, sampler.temperature, sampler.top_k,
                         sampler.top_p, samples=cfg.samples)


def record_slices(jobs: list[Job], slices: int) -> list[list[Job]]:
    """`jobs` cut into about `slices` parts of whole records (a record's samples together)."""
    records: list[list[Job]] = []
    for j in jobs:
        if records and records[-1][0].rng.record == j.rng.record:
            records[-1].append(j)
        else:
            records.append([j])
    per = -(-len(records) // max(slices, 1))
    return [[j for r in records[i: i + per] for j in r] for i in range(0, len(records), per)]


def measure_throughput(model: StripedHyena, prompts: list[Prompt], drafter: Drafter | None,
                       cfg: ThroughputConfig, log: Callable[[str], None] = lambda m: None,
                       sampler: SamplerConfig = SAMPLED, jobs: list[Job] | None = None
                       ) -> dict[str, Any]:
    """Tokens/s of every (decoder, batch size, rule) on records x samples jobs (or `jobs`, e.g.
    `mixed_workload`'s), slice by slice; within a slice the native and speculative decoders of
    one batch size and rule run at once, in turns (decode/interleave.py), so their ratio is
    measured on one machine state. `sampler` gives the temperature, top-k and top-p, each
    rule of `cfg.rules` its rule."""
    if jobs is None:
        vocab = model.config.vocab_size
        jobs = build_jobs([Record.of(p, vocab) for p in prompts[: cfg.records]],
                          throughput_options(cfg, sampler))
    # no more rows than jobs: a larger batch decodes the same way, under a misleading name
    cfg = replace(cfg, batch_sizes=sorted({min(b, max(len(jobs), 1)) for b in cfg.batch_sizes}))
    slices = record_slices(jobs, cfg.slices)
    modes = _modes(cfg, drafter)
    seconds = {name: 0.0 for name, *_ in modes}
    tokens = {name: 0 for name, *_ in modes}
    rounds = {name: [0, 0, 0] for name, *_ in modes}  # committed, rounds, verified positions
    outputs: dict[str, dict[int, list[int]]] = {name: {} for name, *_ in modes}
    failed: dict[str, int] = {name: 0 for name, *_ in modes}
    for i, part in enumerate(slices):
        for group in _paired(modes):  # a batch size's native and speculative modes, in turns
            runs = [timed_run(lambda clock, d=d, b=b, rule=rule: BatchDecoder(
                model, replace(sampler, rule=rule), d, cfg.gamma if d is not None else 0,
                batch_size=b, clock=clock), JobList(iter(part))) for _, d, b, rule in group]
            interleave(runs)
            for (name, *_), run in zip(group, runs):
                seconds[name] += run.seconds
                for o in run.outcomes:
                    if o.result is None:
                        failed[name] += 1
                        continue
                    outputs[name][o.job.index] = o.result.tokens
                    tokens[name] += len(o.result.tokens)
                    rounds[name][0] += len(o.result.tokens)
                    rounds[name][1] += o.result.rounds
                    rounds[name][2] += o.result.verified
        log(f"throughput slice {i + 1}/{len(slices)}: " + ", ".join(
            f"{n} {tokens[n] / seconds[n]:.0f} tok/s" for n, *_ in modes if seconds[n]))
    rows = {}
    for name, d, b, rule in modes:
        decoder = "speculative" if d is not None else "native"
        rows[name] = {"decoder": decoder, "batch_size": b, "rule": rule, "tokens": tokens[name],
                      "seconds": round(seconds[name], 3),
                      "tokens_per_s": (round(tokens[name] / seconds[name], 1) if seconds[name]
                                       else None),
                      "tau": (round(rounds[name][0] / rounds[name][1], 3) if rounds[name][1]
                              else None),
                      "efficiency": (round(rounds[name][0] / rounds[name][2], 3)
                                     if rounds[name][2] else None),
                      "jobs_changed_vs_batch_1": _changed(outputs, name,
                                                          mode_name(decoder, 1, rule), b > 1),
                      "failed": failed[name]}
        if rule == "coupled" and d is not None:  # coupled: equal to native sampling itself
            rows[name]["jobs_differing_from_native"] = _changed(
                outputs, name, mode_name("native", 1, rule), True)
    lengths = sorted({len(j.prompt) for j in jobs})
    return {"config": cfg.__dict__ | {"jobs": len(jobs), "sampler": sampler.__dict__,
                                      "prompt_lengths": [lengths[0], lengths[-1]]},
            "modes": rows, "summary": _summary(rows)}


def _changed(outputs: dict[str, dict[int, list[int]]], name: str, against: str,
             compare: bool) -> int | None:
    """Jobs of mode `name` whose tokens differ from the same job in mode `against`."""
    base = outputs.get(against)
    if base is None or not compare:
        return None
    return sum(1 for j, t in outputs[name].items() if base.get(j) != t)


def _summary(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Speculative vs single-stream native and vs batched native at the same batch size, each
    against native decoding under the same rule (keys `b8`, and `b8/coupled` under coupled)."""
    base = rows.get("native/b1", {}).get("tokens_per_s")
    best = max((r for r in rows.values() if r["decoder"] == "speculative" and r["tokens_per_s"]
                and r["rule"] == "residual"), key=lambda r: r["tokens_per_s"], default=None)
    out: dict[str, Any] = {"native_single_tokens_per_s": base}
    for r in rows.values():
        if r["decoder"] != "speculative" or not r["tokens_per_s"]:
            continue
        single = rows.get(mode_name("native", 1, r["rule"]), {}).get("tokens_per_s")
        nat = rows.get(mode_name("native", r["batch_size"], r["rule"]), {}).get("tokens_per_s")
        out[mode_name("native", r["batch_size"], r["rule"]).split("/", 1)[1]] = {
            "vs_native_single": round(r["tokens_per_s"] / single, 3) if single else None,
            "vs_native_same_batch": round(r["tokens_per_s"] / nat, 3) if nat else None}
    if best is not None:
        out["best_speculative_batch_size"] = best["batch_size"]
    return out
