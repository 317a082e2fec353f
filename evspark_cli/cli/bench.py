"""`evspark bench`: the evaluation protocol into results.json and report.md (eval/bench.py)."""
from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, List, Optional

import typer

from .app import command, say
from .common import out_line, use_threads, warn
from .options import CompileOpt, MaxMemoryOpt, ModelOpt, QuietOpt, ThreadsOpt
from .progress import Progress

if TYPE_CHECKING:
    from ..eval.bench import BenchConfig

EXAMPLE = """Example: the quick protocol on your own prompts with 2 threads, report in bench-quick/
(results.json, report.md):

  evspark bench --preset quick --prompts my_prompts.fa -t 2 -o bench-quick"""

# BenchConfig fields whose option has another name
OPTIONS = {"new_tokens": "--max-new-tokens", "gamma_sweep": "--gammas", "depth_tokens": "--depth",
           "rollback_modes": "--rollbacks", "out_dir": "--output",
           "throughput_samples": "--samples", "throughput_records": "--n-prompts"}


@command(OPTIONS)
def bench(
    model_dir: Optional[str] = ModelOpt,
    preset: str = typer.Option("quick", "--preset", help="quick (minutes) or full (the whole "
                               "protocol: 48 prompts x 1024 tokens x 3 drafter seeds)."),
    prompts: Optional[str] = typer.Option(None, "--prompts", help="Prompt FASTA (default: the "
                                          "48-prompt suite in ../shared/data/prompts.fa, else "
                                          "examples/prompts.fa)."),
    out: str = typer.Option("bench-results", "-o", "--output", help="Folder for results.json, "
                            "report.md and plots."),
    context_genome: Optional[str] = typer.Option(None, "--context-genome", help="FASTA whose "
                                                 "first record provides the long-context "
                                                 "prompts."),
    n_prompts: Optional[int] = typer.Option(None, "--n-prompts", help="Override the preset."),
    new_tokens: Optional[int] = typer.Option(None, "-n", "--max-new-tokens", help="Override the "
                                             "preset."),
    seeds: Optional[str] = typer.Option(None, "--seeds", help="Drafter seeds, e.g. 0,1,2."),
    gamma: Optional[int] = typer.Option(None, "--gamma", "-g", help="Override the preset."),
    drafter: Optional[List[str]] = typer.Option(None, "--drafter", help="Extra drafter folder(s) "
                                                "to benchmark."),
    baselines: Optional[str] = typer.Option(None, "--baselines", help="Comma list of baseline "
                                            "drafters (default kmer,identity; '' for none)."),
    rollbacks: Optional[str] = typer.Option(None, "--rollbacks", help="Comma list: "
                                            "slice,replay."),
    rules: Optional[str] = typer.Option(None, "--rules", "--rule", help="Comma list of the "
                                        "rules sampled runs use: residual,coupled (default "
                                        "both, side by side)."),
    skip: Optional[str] = typer.Option(None, "--skip", help="Sections to skip: "
                                       "speed,tvd,gamma,context,depth,throughput,mixed."),
    gammas: Optional[str] = typer.Option(None, "--gammas", help="Gamma sweep, e.g. "
                                         "1,2,4,8,12,16."),
    contexts: Optional[str] = typer.Option(None, "--contexts", help="Context sweep lengths, e.g. "
                                           "1024,8192,32768."),
    depth: Optional[int] = typer.Option(None, "--depth", help="Depth sweep: tokens of one long "
                                        "generation (0 = skip)."),
    batch_size: Optional[int] = typer.Option(None, "--batch-size", "-b", help="Throughput: "
                                             "the headline batch size (default: the device's, "
                                             "32 on a CPU)."),
    batch_sizes: Optional[str] = typer.Option(None, "--batch-sizes", help="Throughput: the "
                                              "batch sizes to measure, e.g. 1,4,8,16,32."),
    samples: Optional[int] = typer.Option(None, "--samples", help="Throughput: samples per "
                                          "record (quick 4, full 8)."),
    throughput_tokens: Optional[int] = typer.Option(None, "--throughput-tokens", help="Throughput: "
                                                    "new tokens per sample (quick 64, full "
                                                    "512)."),
    compile_cpu: bool = CompileOpt,
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """The evaluation protocol: speedup, acceptance, losslessness and sweeps, into a report."""
    import json

    from ..eval.bench import bench_config, bench_drafters, check_output_dir, run_bench
    from ..model.checkpoint import load_model

    used = use_threads(threads)
    t0 = time.monotonic()
    cfg = bench_config(preset, prompts, n_prompts=n_prompts, new_tokens=new_tokens, gamma=gamma,
                       seeds=seeds, context_genome=context_genome, baselines=baselines,
                       rollbacks=rollbacks, skip=skip, gammas=gammas, contexts=contexts,
                       depth=depth, batch_sizes=batch_sizes, batch_size=batch_size,
                       samples=samples, throughput_tokens=throughput_tokens, rules=rules)
    check_output_dir(out)
    _check_bench_files(cfg, out, model_dir, drafter or [])
    model = load_model(model_dir, device="auto", compile=compile_cpu, max_memory=max_memory)
    drafters = bench_drafters(model, cfg, drafter)
    with Progress("bench", "results", quiet=quiet) as prog:
        res = run_bench(model, cfg, out, " ".join(["evspark"] + sys.argv[1:]), drafters,
                        log=prog.log)
    timing = res["timing"]
    if not timing["reliable"]:
        warn(f"timings UNRELIABLE: {len(timing['native_repeats_s'])} native passes of the same "
             f"prompt differed by {100 * timing['spread']:.0f}% (more than "
             f"{100 * timing['limit']:.0f}%: a busy machine?); rerun on an idle one or with "
             "fewer --threads")
    out_line(json.dumps(_summary(res, out), indent=1))
    prog.summary(f"evspark: bench: preset {preset}, {len(res['speed'])} speed settings, "
                 f"{time.monotonic() - t0:.1f} s, {used.describe()}; report in {out}")


def _summary(res: dict, out: str) -> dict:
    """What `bench` prints: the pooled speedups and the throughput sections' tokens/s."""
    head = {k: round(v["summary"]["pooled_speedup"], 3) for k, v in res["speed"].items()}
    summary: dict = {"out": out, "pooled_speedup": head,
                     "timing_reliable": res["timing"]["reliable"]}
    t = res.get("throughput")
    if t:
        summary["throughput_tokens_per_s"] = {k: v["tokens_per_s"] for k, v in
                                              t["modes"].items()}
        if t.get("mixed"):
            summary["mixed_tokens_per_s"] = {k: v["tokens_per_s"] for k, v in
                                             t["mixed"]["modes"].items()}
    return summary


def _check_bench_files(cfg: BenchConfig, out: str, model_dir: str | None,
                       drafters: list[str]) -> None:
    """Before any work: the report files must not overwrite an input (the prompts, the model's
    and the drafters' folders: the seeds' drafters and `--drafter` folders), and a prompt file
    with fewer records than asked is benchmarked (and reported) as the records it has."""
    from pathlib import Path

    from ..decode.drafters.registry import drafter_dir
    from ..files import Output, check_distinct
    from ..io.fasta import read_prompts
    from ..limits import model_path, run_inputs

    fasta = [cfg.prompts] + ([cfg.context_source] if cfg.context_source else [])
    seeds = [drafter_dir(model_path(model_dir), s) for s in cfg.seeds]
    inputs = run_inputs(fasta, model_dir=model_dir, drafters=[*drafters, *seeds])
    check_distinct(inputs, [Output("--output", str(Path(out) / name), (".tmp",))
                            for name in ("results.json", "report.md")])
    count = len(read_prompts([cfg.prompts]))
    if count < cfg.n_prompts:
        say(f"evspark: {cfg.prompts} has {count} record(s): benchmarking {count} prompt(s), "
            f"not {cfg.n_prompts}")
        cfg.n_prompts = count
