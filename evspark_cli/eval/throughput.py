"""Throughput: tokens per second of many generations, by batch size, native and speculative.

The workload is records x samples jobs (a record's samples share one prefill). Every mode runs
on the same jobs, and the modes are interleaved slice by slice in one process (a slice = a few
records with all their samples), so every ratio is measured side by side on the same machine
state. Each mode's time is the wall time of its decoder runs, prefills included.

Besides speed, the section counts how often the batch size changed a token: every job's tokens at
each batch size against the same job in a batch of one (same seed, so they should be equal; a
batched product can round a float differently in the last place, which can flip a draw or a
greedy choice).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..decode.batch import BatchDecoder
from ..decode.drafters.base import Drafter
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


def _modes(cfg: ThroughputConfig, drafter: Drafter | None) -> list[tuple[str, Drafter | None, int]]:
    modes = []
    for b in cfg.batch_sizes:
        if b > 1 or cfg.native_single:
            modes.append((f"native/b{b}", None, b))
        if drafter is not None:
            modes.append((f"speculative/b{b}", drafter, b))
    return modes


def measure_throughput(model: StripedHyena, prompts: list[Prompt], drafter: Drafter | None,
                       cfg: ThroughputConfig, log: Callable[[str], None] = lambda m: None,
                       sampler: SamplerConfig = SAMPLED) -> dict[str, Any]:
    """Tokens/s of every (decoder, batch size) on records x samples jobs, interleaved."""
    options = DecodeOptions(cfg.new_tokens, cfg.gamma, sampler.temperature, sampler.top_k,
                            sampler.top_p, samples=cfg.samples)
    vocab = model.config.vocab_size
    jobs = build_jobs([Record.of(p, vocab) for p in prompts[: cfg.records]], options)
    per_slice = -(-min(cfg.records, len(prompts)) // max(cfg.slices, 1)) * cfg.samples
    slices = [jobs[i: i + per_slice] for i in range(0, len(jobs), per_slice)]
    modes = _modes(cfg, drafter)
    seconds = {name: 0.0 for name, _, _ in modes}
    tokens = {name: 0 for name, _, _ in modes}
    rounds = {name: [0, 0] for name, _, _ in modes}  # committed, rounds (speculative)
    outputs: dict[str, dict[int, list[int]]] = {name: {} for name, _, _ in modes}
    failed: dict[str, int] = {name: 0 for name, _, _ in modes}
    for i, part in enumerate(slices):
        for name, d, b in modes:
            gamma = cfg.gamma if d is not None else 0
            t0 = time.perf_counter()
            for o in BatchDecoder(model, sampler, d, gamma, batch_size=b).run(part):
                if o.result is None:
                    failed[name] += 1
                    continue
                outputs[name][o.job.index] = o.result.tokens
                tokens[name] += len(o.result.tokens)
                rounds[name][0] += len(o.result.tokens)
                rounds[name][1] += o.result.rounds
            seconds[name] += time.perf_counter() - t0
        log(f"throughput slice {i + 1}/{len(slices)}: " + ", ".join(
            f"{n} {tokens[n] / seconds[n]:.0f} tok/s" for n, _, _ in modes if seconds[n]))
    rows = {}
    for name, d, b in modes:
        single = outputs.get(f"{name.split('/')[0]}/b1")
        changed = None
        if single is not None and b > 1:
            changed = sum(1 for j, t in outputs[name].items() if single.get(j) != t)
        secs, (committed, n_rounds) = seconds[name], rounds[name]
        rows[name] = {"decoder": name.split("/")[0], "batch_size": b, "tokens": tokens[name],
                      "seconds": round(secs, 3),
                      "tokens_per_s": round(tokens[name] / secs, 1) if secs else None,
                      "tau": round(committed / n_rounds, 3) if n_rounds else None,
                      "jobs_changed_vs_batch_1": changed, "failed": failed[name]}
    return {"config": cfg.__dict__ | {"jobs": len(jobs), "sampler": sampler.__dict__},
            "modes": rows, "summary": _summary(rows)}


def _summary(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Speculative vs single-stream native and vs batched native at the same batch size."""
    base = rows.get("native/b1", {}).get("tokens_per_s")
    best = max((r for r in rows.values() if r["decoder"] == "speculative" and r["tokens_per_s"]),
               key=lambda r: r["tokens_per_s"], default=None)
    out: dict[str, Any] = {"native_single_tokens_per_s": base}
    for r in rows.values():
        if r["decoder"] != "speculative" or not r["tokens_per_s"]:
            continue
        nat = rows.get(f"native/b{r['batch_size']}", {}).get("tokens_per_s")
        out[f"b{r['batch_size']}"] = {
            "vs_native_single": round(r["tokens_per_s"] / base, 3) if base else None,
            "vs_native_same_batch": round(r["tokens_per_s"] / nat, 3) if nat else None}
    if best is not None:
        out["best_speculative_batch_size"] = best["batch_size"]
    return out
