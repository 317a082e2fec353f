"""The evaluation protocol (`evspark bench`): speed, losslessness and sweeps, as rerunnable code.

Native and speculative decoding run interleaved in one process on the same prompt, warm, with the
same threads, so a speedup is always a ratio measured side by side. Everything measured goes to
`results.json` (raw figures, machine, versions, command); `report.md` summarises it with plots
when matplotlib is installed (`pip install evspark[bench]`).
"""
from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from .. import bundled
from ..decode.batch import ROLLBACKS
from ..decode.drafters.base import RngKey
from ..decode.drafters.registry import bundled_drafter_dir, drafter_name, resolve_drafter
from ..decode.jobs import DecodeResult, largest_draft, row_reserve
from ..decode.native import decode_native
from ..decode.prefill import Prefilled, prefill_prompt
from ..decode.sampling import GREEDY, RULES, SamplerConfig
from ..decode.speculative import decode_speculative
from ..errors import SettingError, at_least
from ..generation.options import MAX_NEW_TOKENS, MAX_SAMPLES, at_most, check_gamma
from ..generation.results import speedup
from ..io.fasta import read_prompts
from ..io.types import Prompt
from ..model.model import StripedHyena
from .compare import compare_greedy, default_tie_tolerance, side_by_side
from .provenance import machine_info, provenance

SAMPLED = SamplerConfig(1.0, 4, 1.0)


def sampled_mode(rule: str) -> tuple[str, SamplerConfig]:
    """The speed section's name and sampler of sampled decoding (T = 1, top-k 4) under a rule:
    `sampled` is the residual rule (the name results have always had), `sampled-coupled` the
    coupled one, whose runs are also compared with native sampling token for token."""
    return ("sampled" if rule == "residual" else f"sampled-{rule}",
            SamplerConfig(1.0, 4, 1.0, rule))


@dataclass
class BenchConfig:
    prompts: str
    preset: str = "quick"
    n_prompts: int = 8
    new_tokens: int = 256
    gamma: int = 12
    seeds: list[int] = field(default_factory=lambda: [0])
    baselines: list[str] = field(default_factory=lambda: ["kmer", "identity"])
    rollback_modes: list[str] = field(default_factory=lambda: ["slice", "replay"])
    rules: list[str] = field(default_factory=lambda: list(RULES))  # sampled runs under each
    repeats: int = 1
    tie_tolerance: float | None = None  # None: compare.default_tie_tolerance of the model's dtype
    tvd_prompts: int = 4
    tvd_samples: int = 32
    tvd_tokens: int = 32
    gamma_sweep: list[int] = field(default_factory=lambda: [4, 8, 12])
    gamma_sweep_prompts: int = 4
    contexts: list[int] = field(default_factory=lambda: [1024, 8192])
    context_source: str = ""
    context_tokens: int = 128
    depth_tokens: int = 0  # 0 = skip the depth sweep
    depth_window: int = 1024
    throughput_records: int = 8  # throughput: records x samples jobs of throughput_tokens each
    throughput_samples: int = 4
    throughput_tokens: int = 64
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
    batch_size: int | None = None  # the headline batch (None: the device's default), measured too
    mixed_records: int = 4  # throughput on mixed prompt lengths: records, 1-4 samples each
    mixed_lengths: list[int] = field(default_factory=lambda: [64, 2048])  # shortest, longest
    skip: list[str] = field(default_factory=list)  # sections not to run (SECTIONS)

    def validate(self) -> BenchConfig:
        """Refuse values that cannot run, naming the setting (one line, before any work)."""
        at_least("n_prompts", self.n_prompts, 1)
        at_least("new_tokens", self.new_tokens, 1)
        at_least("gamma", self.gamma, 1)
        at_least("throughput_records", self.throughput_records, 1)
        at_least("throughput_samples", self.throughput_samples, 1)
        at_least("throughput_tokens", self.throughput_tokens, 1)
        for name in ("throughput_samples", "tvd_samples"):
            at_most(name, getattr(self, name), MAX_SAMPLES, "continuations of one record")
        for name in ("new_tokens", "tvd_tokens", "context_tokens", "depth_tokens",
                     "throughput_tokens"):
            at_most(name, getattr(self, name), MAX_NEW_TOKENS, "no model's context is that long")
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes) or (
                self.batch_size is not None and self.batch_size < 1):
            raise SettingError("{0} and {1} take integers >= 1", "batch_sizes", "batch_size")
        if any(g < 1 for g in self.gamma_sweep) or any(c < 1 for c in self.contexts):
            raise SettingError("{0} and {1} take integers >= 1", "gamma_sweep", "contexts")
        if len(self.mixed_lengths) != 2 or not 1 <= self.mixed_lengths[0] <= self.mixed_lengths[1]:
            raise SettingError.of("mixed_lengths", f"must be two lengths lo <= hi, got "
                                                   f"{self.mixed_lengths}")
        if any(x < 0 for x in self.seeds) or self.depth_tokens < 0:
            raise SettingError("{0} and {1} must be >= 0", "seeds", "depth_tokens")
        if self.mixed_records < 0:
            raise SettingError.of("mixed_records", f"must be >= 0, got {self.mixed_records}")
        if not self.rollback_modes or set(self.rollback_modes) - set(ROLLBACKS):
            raise SettingError.of("rollback_modes", f"must list slice and/or replay, got "
                                                    f"{','.join(self.rollback_modes)!r}")
        if not self.rules or set(self.rules) - set(RULES) or len(set(self.rules)) < len(
                self.rules):
            raise SettingError.of("rules", f"must list {' and/or '.join(RULES)}, got "
                                           f"{','.join(self.rules)!r}")
        bad = set(self.skip) - set(SECTIONS)
        if bad:
            raise SettingError.of("skip", f"unknown section(s) {', '.join(sorted(bad))}", ": ")
        return self


SECTIONS = ("speed", "tvd", "gamma", "context", "depth", "throughput", "mixed")
"""Sections that `skip` can leave out."""

PRESETS: dict[str, dict[str, Any]] = {
    "quick": {},
    "full": dict(n_prompts=48, new_tokens=1024, seeds=[0, 1, 2], repeats=1, tvd_prompts=24,
                 tvd_samples=32, tvd_tokens=48, gamma_sweep=[1, 2, 4, 8, 12, 16],
                 gamma_sweep_prompts=12, contexts=[1024, 8192, 32768, 131072, 262144],
                 context_tokens=256, depth_tokens=32768, throughput_records=48,
                 throughput_samples=8, throughput_tokens=512, batch_sizes=[1, 4, 8, 16, 32],
                 mixed_records=24, mixed_lengths=[64, 16384]),
}


def default_prompts() -> Path:
    """The 48-prompt suite `shared/data/prompts.fa` ($EVSPARK_SHARED, else `../shared` from the
    working folder) when it is there, else the bundled example prompts."""
    shared = Path(os.environ.get("EVSPARK_SHARED") or Path("..", "shared"))
    suite = shared / "data" / "prompts.fa"
    return suite.resolve() if suite.is_file() else bundled.example_prompts()


def _ints(text: str, error: SettingError) -> list[int]:
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise error from None


def bench_config(preset: str = "quick", prompts: str | None = None, *,
                 n_prompts: int | None = None, new_tokens: int | None = None,
                 gamma: int | None = None, seeds: str | None = None,
                 context_genome: str | None = None, baselines: str | None = None,
                 rollbacks: str | None = None, skip: str | None = None,
                 gammas: str | None = None, contexts: str | None = None,
                 depth: int | None = None, batch_sizes: str | None = None,
                 batch_size: int | None = None, samples: int | None = None,
                 throughput_tokens: int | None = None, rules: str | None = None
                 ) -> BenchConfig:
    """A preset with overrides, as `evspark bench` takes them (comma lists as text), checked.

    None keeps the preset's value; `baselines=""` means no baseline drafter.
    """
    if preset not in PRESETS:
        raise SettingError.of("preset", f"must be one of {', '.join(PRESETS)}, got {preset!r}")
    cfg = BenchConfig(prompts=str(prompts or default_prompts()), preset=preset,
                      **PRESETS[preset])
    for name, value in (("n_prompts", n_prompts), ("throughput_records", n_prompts),
                        ("new_tokens", new_tokens), ("gamma", gamma),
                        ("depth_tokens", depth), ("batch_size", batch_size),
                        ("throughput_samples", samples),
                        ("throughput_tokens", throughput_tokens)):
        if value is not None:
            setattr(cfg, name, value)
    if seeds:
        cfg.seeds = _ints(seeds, SettingError.of("seeds", f"must look like 0,1,2, got {seeds!r}"))
    cfg.context_source = context_genome or ""
    if baselines is not None:
        cfg.baselines = [b for b in baselines.split(",") if b]
    if rollbacks is not None:
        cfg.rollback_modes = [r for r in rollbacks.split(",") if r]
    if rules is not None:
        cfg.rules = [r for r in rules.split(",") if r]
    not_ints = SettingError("{0} and {1} take comma-separated integers", "gamma_sweep",
                            "contexts")
    if gammas:
        cfg.gamma_sweep = _ints(gammas, not_ints)
    if batch_sizes:
        cfg.batch_sizes = _ints(batch_sizes, SettingError.of(
            "batch_sizes", f"takes comma-separated integers, got {batch_sizes!r}"))
    if contexts:
        cfg.contexts = _ints(contexts, not_ints)
    if skip:
        cfg.skip = [x for x in skip.split(",") if x]
    return cfg.validate()


def check_output_dir(out: str | Path) -> None:
    """The results folder may exist, but must not be a file."""
    if Path(out).exists() and not Path(out).is_dir():
        raise SettingError.of("out_dir", f"{out} is a file, not a folder")


def _ids(p: Prompt) -> list[int]:
    return list(p.seq.encode())


def _run_pair(model: StripedHyena, p: Prompt, drafter: Any, new_tokens: int,
              sampler: SamplerConfig, gamma: int, key: RngKey
              ) -> tuple[DecodeResult, DecodeResult]:
    """Native, then speculative decoding of one prompt (slice rollback), side by side."""
    _, _, nat, spec = next(side_by_side(model, p, new_tokens, sampler, key, {"d": drafter}, gamma,
                                        track_margins=True))
    return nat, spec


def _summ(rows: list[dict]) -> dict[str, Any]:
    nat = sum(r["native_s"] for r in rows)
    spec = sum(r["spec_s"] for r in rows)
    sp = sorted(r["native_s"] / r["spec_s"] for r in rows)
    acc = sum(r["accepted"] for r in rows)
    rounds = sum(r["rounds"] for r in rows)
    trials = [sum(x) for x in zip(*[r["position_trials"] for r in rows])]
    accepts = [sum(x) for x in zip(*[r["position_accepts"] for r in rows])]
    tokens = sum(r["tokens"] for r in rows)  # the same jobs on both sides
    verified = sum(r.get("verified", 0) for r in rows)
    return {"pooled_speedup": speedup(nat, tokens, spec, tokens), "min_speedup": sp[0],
            "median_speedup": sp[len(sp) // 2], "max_speedup": sp[-1],
            "tau": (acc + rounds) / rounds if rounds else None,
            "efficiency": tokens / verified if verified else None,
            "native_s": nat, "spec_s": spec, "draft_s": sum(r["draft_s"] for r in rows),
            "verify_s": sum(r["verify_s"] for r in rows), "rounds": rounds,
            "native_step_s": nat / sum(r["tokens"] for r in rows),
            "conditional_acceptance": [a / t if t else None for a, t in zip(accepts, trials)],
            "prompts": len(rows)}


def speed_and_greedy(model: StripedHyena, prompts: list[Prompt], drafters: dict[str, Any],
                     cfg: BenchConfig, log: Callable[[str], None]) -> dict[str, Any]:
    """Per prompt and mode: one native run, then every drafter (and rollback) right after it.

    Interleaving per prompt keeps the comparison warm and fair; each speculative run is divided
    by the native time of the same prompt measured moments before it.
    """
    rows: dict[str, list[dict]] = {}
    first_dspark = next((n for n in drafters if n.startswith("dspark")), None)
    tie_tol = cfg.tie_tolerance
    if tie_tol is None:
        tie_tol = default_tie_tolerance(next(model.parameters()).dtype)
    for mode, sampler in [("greedy", GREEDY)] + [sampled_mode(r) for r in cfg.rules]:
        compared = mode == "greedy" or sampler.coupled  # token by token against native

        def rollbacks(name: str, mode: str = mode) -> list[str]:
            # the snapshot-and-replay baseline for the main drafter, on residual sampled runs
            sampled_main = mode == "sampled" and name == first_dspark
            return cfg.rollback_modes if sampled_main else cfg.rollback_modes[:1]

        for i, p in enumerate(prompts):
            for r in range(cfg.repeats):
                for dname, rb, nat, spec in side_by_side(
                        model, p, cfg.new_tokens, sampler, RngKey(0, i, r), drafters, cfg.gamma,
                        rollbacks, track_margins=compared):
                    row = {"prompt": p.id, "repeat": r, "tokens": len(nat.tokens),
                           "native_s": nat.wall_s, "spec_s": spec.wall_s,
                           "rounds": spec.rounds, "accepted": sum(spec.accepted),
                           "draft_s": spec.draft_s, "verify_s": spec.verify_s,
                           "position_trials": spec.position_trials,
                           "position_accepts": spec.position_accepts, "tau": spec.tau,
                           "verified": spec.verified}
                    if compared:  # the key says what was compared: greedy, or coupled sampling
                        row["greedy" if mode == "greedy" else "coupled"] = compare_greedy(
                            p.id, nat, spec, tie_tol)
                    rows.setdefault(f"{dname}/{mode}/{rb}", []).append(row)
            log(f"speed {mode} {p.id}: " + ", ".join(
                f"{n.split('/')[0]}/{n.split('/')[2]} {v[-1]['native_s'] / v[-1]['spec_s']:.2f}x"
                for n, v in rows.items() if f"/{mode}/" in n))
    out = {}
    for name, rs in rows.items():
        s = _summ(rs)
        out[name] = {"summary": s, "rows": rs}
        log(f"speed {name}: pooled speedup {s['pooled_speedup']:.2f}x, tau {s['tau']:.2f}")
    return out


def _kmer_counts(seqs: list[list[int]], k: int) -> Counter:
    c: Counter = Counter()
    for s in seqs:
        for i in range(len(s) - k + 1):
            c[tuple(s[i: i + k])] += 1
    return c


def tvd_kl(a: Counter, b: Counter) -> tuple[float, float]:
    keys = set(a) | set(b)
    na, nb = sum(a.values()), sum(b.values())
    tvd = 0.5 * sum(abs(a[x] / na - b[x] / nb) for x in keys)
    kl = 0.0
    for x in keys:  # KL(a || b) with add-0.5 smoothing
        pa = (a[x] + 0.5) / (na + 0.5 * len(keys))
        pb = (b[x] + 0.5) / (nb + 0.5 * len(keys))
        kl += pa * math.log(pa / pb)
    return tvd, kl


def complexity(seq: str, k: int = 3) -> float:
    """Distinct k-mers over possible ones in the prompt tail: low for repeats/low complexity."""
    tail = seq[-256:]
    n = max(1, len(tail) - k + 1)
    return len({tail[i: i + k] for i in range(n)}) / min(4 ** k, n)


def sampled_losslessness(model: StripedHyena, prompts: list[Prompt], drafter: Any, cfg: BenchConfig,
                         log: Callable[[str], None]) -> dict[str, Any]:
    """TVD/KL of speculative vs native samples against the native-vs-native floor at matched N."""
    rows = []
    prefix = drafter.prefix_len
    for i, p in enumerate(prompts[: cfg.tvd_prompts]):
        sets: dict[str, list[list[int]]] = {"native_a": [], "native_b": [], "spec": []}
        reserve = row_reserve(cfg.tvd_tokens, largest_draft(cfg.gamma, cfg.tvd_tokens))
        pf = prefill_prompt(model, _ids(p), reserve, prefix)  # shared
        for s in range(cfg.tvd_samples):
            sets["native_a"].append(decode_native(model, _ids(p), cfg.tvd_tokens, SAMPLED,
                                                  RngKey(1, i, s), prefilled=pf).tokens)
            sets["native_b"].append(decode_native(model, _ids(p), cfg.tvd_tokens, SAMPLED,
                                                  RngKey(2, i, s), prefilled=pf).tokens)
            sets["spec"].append(decode_speculative(model, _ids(p), cfg.tvd_tokens, SAMPLED, drafter,
                                                   cfg.gamma, RngKey(3, i, s),
                                                   prefilled=pf).tokens)
        row: dict[str, Any] = {"prompt": p.id, "complexity": round(complexity(p.seq), 3)}
        for k in (1, 3):
            ca, cb, cs = (_kmer_counts(sets[n], k) for n in ("native_a", "native_b", "spec"))
            row[f"tvd{k}_spec"], row[f"kl{k}_spec"] = tvd_kl(cs, ca)
            row[f"tvd{k}_floor"], row[f"kl{k}_floor"] = tvd_kl(cb, ca)
        rows.append(row)
        log(f"tvd {p.id}: 3-mer spec {row['tvd3_spec']:.3f} vs floor {row['tvd3_floor']:.3f}")
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    summ = {k: mean(k) for k in rows[0] if k.startswith(("tvd", "kl"))} if rows else {}
    return {"summary": summ, "rows": rows, "samples_per_set": cfg.tvd_samples,
            "tokens_per_sample": cfg.tvd_tokens}


def gamma_sweep(model: StripedHyena, prompts: list[Prompt], drafter: Any, cfg: BenchConfig,
                log: Callable[[str], None]) -> list[dict[str, Any]]:
    out = []
    for g in cfg.gamma_sweep:
        rows = []
        for i, p in enumerate(prompts[: cfg.gamma_sweep_prompts]):
            nat, spec = _run_pair(model, p, drafter, cfg.new_tokens, SAMPLED, g, RngKey(4, i, 0))
            rows.append({"native_s": nat.wall_s, "spec_s": spec.wall_s, "rounds": spec.rounds,
                         "accepted": sum(spec.accepted)})
        nat_s = sum(r["native_s"] for r in rows)
        spec_s = sum(r["spec_s"] for r in rows)
        rounds = sum(r["rounds"] for r in rows)
        row = {"gamma": g, "pooled_speedup": nat_s / spec_s,
               "tau": (sum(r["accepted"] for r in rows) + rounds) / rounds}
        log(f"gamma {g}: speedup {row['pooled_speedup']:.2f}x tau {row['tau']:.2f}")
        out.append(row)
    return out


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024 if sys.platform == "darwin" else 1024)


def _out_of_memory(e: BaseException) -> bool:
    """Allocation failures: MemoryError, torch.OutOfMemoryError (CUDA) or the CPU allocator's
    RuntimeError; any other error is a bug and must not be reported as a skipped context."""
    oom = getattr(torch, "OutOfMemoryError", MemoryError)
    return isinstance(e, (MemoryError, oom)) or "can't allocate memory" in str(e)


def context_sweep(model: StripedHyena, drafter: Any, cfg: BenchConfig,
                  log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Prompts of growing length cut from a whole genome: prefill cost, then decoding speed.

    Each prompt is prefilled once (timed, with the process's peak memory after it); native and
    speculative decoding then both start from clones of that state, so the speedup is decoding
    alone, measured side by side.
    """
    if not cfg.context_source:
        return []
    genome = read_prompts([cfg.context_source])[0].seq
    prefix = drafter.prefix_len
    out = []
    for L in cfg.contexts:
        if L > len(genome):
            out.append({"context": L, "skipped": f"genome has only {len(genome)} bases"})
            continue
        ids = list(genome[:L].encode())
        try:
            reserve = row_reserve(cfg.context_tokens, largest_draft(cfg.gamma,
                                                                    cfg.context_tokens))
            pf: Prefilled = prefill_prompt(model, ids, reserve, prefix)
            rss = peak_rss_mib()
            key = RngKey(5, L, 0)
            _, _, nat, spec = next(side_by_side(
                model, Prompt(f"ctx{L}", "", genome[:L], cfg.context_source), cfg.context_tokens,
                SAMPLED, key, {"d": drafter}, cfg.gamma, prefilled=pf))
        except (MemoryError, RuntimeError) as e:
            if not _out_of_memory(e):
                raise
            why = (str(e).splitlines() or [type(e).__name__])[0][:200]
            out.append({"context": L, "skipped": f"out of memory: {why}"})
            log(f"context {L}: {out[-1]['skipped']}")
            continue
        row = {"context": L, "prefill_s": pf.seconds, "prefill_tok_s": L / pf.seconds,
               "peak_rss_mib": rss, "state_mib": pf.state.nbytes()["total"] / 2**20,
               "native_s": nat.wall_s, "spec_s": spec.wall_s, "tokens": cfg.context_tokens,
               "native_tok_s": cfg.context_tokens / nat.wall_s,
               "decode_speedup": nat.wall_s / spec.wall_s, "tau": spec.tau,
               "end_to_end_speedup": (pf.seconds + nat.wall_s) / (pf.seconds + spec.wall_s)}
        del pf
        log(f"context {L}: prefill {row['prefill_s']:.1f}s (peak RSS {rss:.0f} MiB), native "
            f"{row['native_tok_s']:.0f} tok/s, decode speedup {row['decode_speedup']:.2f}x "
            f"tau {spec.tau:.2f}")
        out.append(row)
    return out


def depth_sweep(model: StripedHyena, prompt: Prompt, drafter: Any, cfg: BenchConfig,
                log: Callable[[str], None]) -> dict[str, Any]:
    """One long generation natively and speculatively; tau and speedup per window of tokens."""
    if cfg.depth_tokens <= 0:
        return {}
    nat, spec = _run_pair(model, prompt, drafter, cfg.depth_tokens, SAMPLED, cfg.gamma,
                          RngKey(6, 0, 0))
    windows = []
    edges = list(range(cfg.depth_window, cfg.depth_tokens, cfg.depth_window)) + [cfg.depth_tokens]
    start = 0
    for end in edges:
        t_nat = time_to(nat, end) - time_to(nat, start)
        t_spec = time_to(spec, end) - time_to(spec, start)
        rounds = [(a, n) for a, n in zip(spec.accepted, _round_ends(spec)) if start < n <= end]
        tau = (sum(a for a, _ in rounds) + len(rounds)) / len(rounds) if rounds else None
        windows.append({"start_token": start, "end_token": end, "tau": tau,
                        "speedup": t_nat / t_spec if t_spec > 0 else None,
                        "native_tok_s": (end - start) / t_nat if t_nat > 0 else None})
        start = end
    log(f"depth {cfg.depth_tokens}: speedup {nat.wall_s / spec.wall_s:.2f}x, tau {spec.tau:.2f}")
    return {"tokens": cfg.depth_tokens, "window": cfg.depth_window, "prompt": prompt.id,
            "speedup": nat.wall_s / spec.wall_s, "windows": windows, "tau": spec.tau,
            "native_s": nat.wall_s, "spec_s": spec.wall_s}


def _round_ends(res: DecodeResult) -> list[int]:
    return [n for n, _ in res.progress]


def time_to(res: DecodeResult, n: int) -> float:
    """Seconds (from the decoder's start) until at least n tokens had been emitted; 0 for n = 0."""
    if n <= 0:
        return res.prefill_s
    for done, t in res.progress:
        if done >= n:
            return t
    return res.wall_s


def throughput(model: StripedHyena, drafter: Any, cfg: BenchConfig,
               log: Callable[[str], None]) -> dict[str, Any]:
    """Tokens/s by batch size, native and speculative, on records x samples (eval/throughput)."""
    from ..generation.options import default_batch_size
    from .throughput import (
        ThroughputConfig,
        measure_throughput,
        mixed_workload,
        throughput_options,
    )

    prompts = read_prompts([cfg.prompts])[: cfg.throughput_records]
    jobs = max(1, len(prompts) * cfg.throughput_samples)  # no more rows than jobs: a
    # larger batch decodes the same way, under a misleading name
    headline = min(cfg.batch_size or default_batch_size(model.device), jobs)
    sizes = sorted({min(b, jobs) for b in cfg.batch_sizes} | {headline, 1})
    tcfg = ThroughputConfig(records=len(prompts), samples=cfg.throughput_samples,
                            new_tokens=cfg.throughput_tokens, batch_sizes=sizes, gamma=cfg.gamma,
                            rules=list(cfg.rules))
    out = measure_throughput(model, prompts, drafter, tcfg, log)
    out["headline_batch_size"] = headline
    if "mixed" not in cfg.skip and cfg.mixed_records:
        # a user's contigs and genes: lengths over mixed_lengths, 1-4 samples, from the long
        # context genome when there is one (else the prompts joined end to end)
        source = read_prompts([cfg.context_source or cfg.prompts])
        lo, hi = cfg.mixed_lengths
        mixed_jobs = mixed_workload([p.seq for p in source], cfg.mixed_records,
                                    throughput_options(tcfg), model.config.vocab_size, (lo, hi))
        mixed = measure_throughput(model, [], drafter, tcfg, lambda m: log("mixed " + m),
                                   jobs=mixed_jobs)
        mixed["headline_batch_size"] = min(headline, len(mixed_jobs))
        out["mixed"] = mixed
    return out


def bench_drafters(model: StripedHyena, cfg: BenchConfig, extra: list[str] | None = None
                   ) -> dict[str, Any]:
    ds: dict[str, Any] = {}
    for s in cfg.seeds:
        folder = bundled_drafter_dir(model, s)
        if folder is not None:
            ds[f"dspark-seed{s}"] = resolve_drafter(model, folder)
    for b in (extra or []) + cfg.baselines:
        d = resolve_drafter(model, b)
        name = b if b in ("kmer", "identity") else drafter_name(d)
        if name not in ("kmer", "identity"):  # several extra folders: one entry each
            base, i = name, 1
            while name in ds:
                i += 1
                name = f"{base}-{i}"
        ds[name] = d
    for d in ds.values():  # before any work: a gamma a drafter has no slots for
        for g in {cfg.gamma, *([] if "gamma" in cfg.skip else cfg.gamma_sweep)}:
            check_gamma(d, g)
    return ds


def check_bench_tokens(model: StripedHyena, cfg: BenchConfig) -> None:
    """Before any work: the new tokens of every section that runs must fit in the model's
    context beside that section's longest prompt (each row reserves its cache for them), refused
    naming the setting that asks for them."""
    limit = model.config.max_seqlen
    prompts = read_prompts([cfg.prompts])

    def longest(n: int) -> int:
        return max((len(p.seq) for p in prompts[:n]), default=0)

    runs = {"speed": ("new_tokens", cfg.new_tokens, longest(cfg.n_prompts)),
            "gamma": ("new_tokens", cfg.new_tokens, longest(min(cfg.n_prompts,
                                                                cfg.gamma_sweep_prompts))),
            "tvd": ("tvd_tokens", cfg.tvd_tokens, longest(min(cfg.n_prompts, cfg.tvd_prompts))),
            "depth": ("depth_tokens", cfg.depth_tokens, longest(1)),
            "throughput": ("throughput_tokens", cfg.throughput_tokens,
                           longest(cfg.throughput_records)),
            "mixed": ("throughput_tokens", cfg.throughput_tokens, cfg.mixed_lengths[1]),
            "context": ("context_tokens", cfg.context_tokens, 1)}
    skipped = set(cfg.skip) | ({"mixed"} if "throughput" in cfg.skip or not cfg.mixed_records
                               else set()) | (set() if cfg.context_source else {"context"})
    for section, (name, tokens, prompt) in runs.items():
        if section in skipped or tokens == 0 or prompt + tokens <= limit:
            continue
        raise SettingError("{0} " + f"{tokens:,}: a prompt of {prompt:,} bases (the {section} "
                           f"section) and that many new tokens exceed the model's context of "
                           f"{limit:,}", name)


TIMING_REPEATS = 3
"""Native passes of the first prompt that tell whether the machine times steadily."""


def timing_check(model: StripedHyena, prompt: Prompt, new_tokens: int,
                 log: Callable[[str], None]) -> dict[str, Any]:
    """The same native pass timed TIMING_REPEATS times: their spread, (max - min) / median,
    is the noise every speedup of the run carries; above SPREAD_LIMIT (generate's rule for
    --compare-native) the run's timings are flagged unreliable."""
    from ..generation.run import SPREAD_LIMIT

    times = sorted(decode_native(model, _ids(prompt), new_tokens, GREEDY).wall_s
                   for _ in range(TIMING_REPEATS))
    spread = (times[-1] - times[0]) / times[len(times) // 2]
    out = {"native_repeats_s": times, "spread": spread, "reliable": spread <= SPREAD_LIMIT,
           "limit": SPREAD_LIMIT}
    log(f"timing: {TIMING_REPEATS} native passes of {prompt.id}, spread {100 * spread:.0f}%")
    return out


def run_bench(model: StripedHyena, cfg: BenchConfig, out_dir: str | Path, command: str,
              drafters: dict[str, Any] | None = None, log: Callable[[str], None] = print) -> dict:
    check_bench_tokens(model, cfg)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    prompts = read_prompts([cfg.prompts])[: cfg.n_prompts]
    drafters = drafters or bench_drafters(model, cfg)
    main = next((d for n, d in drafters.items() if n.startswith("dspark")),
                next(iter(drafters.values())))
    t0 = time.time()
    res: dict[str, Any] = {"provenance": provenance(command), "command": command,
                           "config": asdict(cfg), "machine": machine_info(),
                           "model": model.config.model_name, "parameters": model.num_parameters(),
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           "drafters": list(drafters)}
    skip = set(cfg.skip)
    res["timing"] = timing_check(model, prompts[0], min(cfg.new_tokens, 256), log)
    res["speed"] = {} if "speed" in skip else speed_and_greedy(model, prompts, drafters, cfg, log)
    res["sampled_losslessness"] = ({} if "tvd" in skip
                                   else sampled_losslessness(model, prompts, main, cfg, log))
    res["gamma_sweep"] = [] if "gamma" in skip else gamma_sweep(model, prompts, main, cfg, log)
    res["context_sweep"] = [] if "context" in skip else context_sweep(model, main, cfg, log)
    res["depth_sweep"] = {} if "depth" in skip else depth_sweep(model, prompts[0], main, cfg, log)
    res["throughput"] = {} if "throughput" in skip else throughput(model, main, cfg, log)
    res["wall_s"] = time.time() - t0
    (out / "results.json").write_text(json.dumps(res, indent=1))
    from .report import write_report

    write_report(res, out)
    return res
