"""`evspark verify`: native vs speculative decoding, token by token (eval/verify.py): greedy by
default, sampled under `--rule coupled`.

Exit 0 when no prompt has a non-tie divergence, 1 otherwise.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import List, Optional

import typer

from .app import command
from .common import PROMPT_OPTIONS, out_line, read_input, use_threads
from .options import (
    OUTPUT_PANEL,
    PERFORMANCE_PANEL,
    SAMPLING_PANEL,
    SPECULATION_PANEL,
    AlphabetOpt,
    CircularOpt,
    CompileOpt,
    DeviceOpt,
    DraftLengthOpt,
    DtypeOpt,
    GammaOpt,
    GraphsOpt,
    IupacOpt,
    MaxMemoryOpt,
    ModelOpt,
    QuietOpt,
    RegionOpt,
    RegionsOpt,
    RuleOpt,
    ShardOpt,
    StrictOpt,
    TailOpt,
    ThreadsOpt,
    TreeRowsOpt,
    option,
)
from .progress import Progress

EXAMPLE = """Example: check that the bundled drafter is lossless on the first 512 bases after
each region of a BED file, 256 tokens each, and keep a JSON report:

  evspark verify genome.fa --regions promoters.bed --prompt-tail 512 -n 256 --report v.json

and that sampled output (T = 1, top-k 4) equals native sampling of seed 7, token for token:

  evspark verify genome.fa --rule coupled --top-k 4 --seed 7"""


DrafterOpt = option("auto", "--drafter", help="Drafter to check (auto, dspark, kmer, identity or "
                    "a folder).", panel=SPECULATION_PANEL)
MaxNewTokensOpt = option(256, "-n", "--max-new-tokens", help="Tokens per prompt.",
                         panel=SAMPLING_PANEL)
TemperatureOpt = option(1.0, "--temperature", help="Sampling temperature of a sampled check "
                        "(with --rule coupled).", panel=SAMPLING_PANEL)
TopKOpt = option(1, "--top-k", help="1 checks greedy decoding; another k (0 = all) checks "
                 "sampled decoding, which needs --rule coupled.", panel=SAMPLING_PANEL)
TopPOpt = option(1.0, "--top-p", help="Nucleus of a sampled check.", panel=SAMPLING_PANEL)
SeedOpt = option(0, "--seed", help="Random seed of a sampled check.", panel=SAMPLING_PANEL)
RollbackOpt = option("slice", "--rollback", help="slice or replay.", panel=SPECULATION_PANEL)
ReportOpt = option(None, "--report", help="Write a JSON report here.", panel=OUTPUT_PANEL)
TieToleranceOpt = option(
    None, "--tie-tolerance", help="A divergence is a tie when the native top-1/top-2 logit gap "
    "there (for a sampled check, the gap of the perturbed scores times T) is below this. "
    "Default: 1e-3 for fp32 weights, 0.1 for bf16 (whose logits a step and a block round "
    "differently).", panel=OUTPUT_PANEL)
ForceDrafterOpt = option(False, "--force-drafter", help="Allow a mismatched drafter.",
                         panel=SPECULATION_PANEL)
VerifyBatchOpt = option(1, "--batch-size", "-b", help="Decode the prompts speculatively in "
                        "batches of this many rows, each compared with its own single-stream "
                        "native run.", panel=PERFORMANCE_PANEL)


@command(PROMPT_OPTIONS)
def verify(
    inputs: Optional[List[str]] = typer.Argument(None, metavar="[INPUT...]", help="FASTA prompts "
                                                 "(default: the bundled example prompts)."),
    model_dir: Optional[str] = ModelOpt,
    drafter: str = DrafterOpt,
    gamma: int = GammaOpt,
    max_new_tokens: int = MaxNewTokensOpt,
    temperature: float = TemperatureOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    seed: int = SeedOpt,
    rule: str = RuleOpt,
    draft_length: str = DraftLengthOpt,
    tree_rows: int = TreeRowsOpt,
    alphabet: str = AlphabetOpt,
    region: Optional[List[str]] = RegionOpt,
    regions: Optional[str] = RegionsOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    strict: bool = StrictOpt,
    circular: bool = CircularOpt,
    rollback: str = RollbackOpt,
    report: Optional[str] = ReportOpt,
    tie_tolerance: Optional[float] = TieToleranceOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    force_drafter: bool = ForceDrafterOpt,
    batch_size: int = VerifyBatchOpt,
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Native vs speculative decoding, token by token: greedy, or sampled (--rule coupled)."""
    import json
    import time

    from ..bundled import example_prompts
    from ..eval.provenance import provenance
    from ..eval.verify import VerifyOptions, verify_prompts
    from ..generation.options import DecodeOptions
    from ..generation.plan import model_and_drafter
    from ..io.writers import write_text_atomic
    from ..limits import context_cap, readable_config

    options = VerifyOptions(DecodeOptions(max_new_tokens, gamma, temperature, top_k, top_p, seed,
                                          rollback=rollback, rule=rule,
                                          draft_length=draft_length, alphabet=alphabet,
                                          tree_rows=tree_rows),
                            tie_tolerance, batch_size)
    inputs = inputs or [str(example_prompts())]
    _check_report(report, inputs, regions, model_dir, drafter)
    t0 = time.monotonic()
    config = readable_config(model_dir)
    prompts = read_input(inputs, region, regions, prompt_tail, shard, strict, iupac=iupac,
                         cap=context_cap(config), config=config, circular=circular).prompts
    used = use_threads(threads)
    with Progress("verify", "prompts", total=len(prompts), quiet=quiet) as prog:
        prog.update(status="loading the model")
        model, d = model_and_drafter(model_dir, prompts, options.decode, drafter, force_drafter,
                                     device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                                     compile=compile_cpu, max_memory=max_memory,
                                     config=config)
        prog.update(status="")
        result = verify_prompts(model, prompts, d, options, _counter(prog), options.batch_size,
                                max_memory)
    out_line("\n".join(result.table()))
    if report:
        write_text_atomic(report, json.dumps({"provenance": provenance(), **result.report()},
                                             indent=1))
    prog.summary(f"evspark: verify: {len(result.rows)} prompts, "
                 f"{sum(r['compared'] for r in result.rows):,} tokens compared, "
                 f"{result.ties} ties, {len(result.non_tie_divergences)} non-tie divergences, "
                 f"{time.monotonic() - t0:.1f} s, {used.describe()}")
    if result.non_tie_divergences:
        raise typer.Exit(1)


def _counter(prog: Progress) -> Callable[[dict], None]:
    """The per-prompt callback: advance the progress and keep the divergence count in it."""
    diverged = 0

    def row_done(row: dict) -> None:
        nonlocal diverged
        diverged += row["divergence"] is not None and not row["tie"]
        prog.advance()
        prog.milestone(f"{diverged} non-tie divergences")

    return row_done


def _check_report(report: Optional[str], inputs: List[str], regions: Optional[str],
                  model_dir: Optional[str], drafter: str) -> None:
    """A `--report` path that can be written and is none of the run's inputs."""
    if not report:
        return
    from ..io.writers import check_distinct_outputs, check_output_path
    from ..limits import run_inputs

    check_output_path(report)
    check_distinct_outputs(run_inputs(inputs, regions, model_dir, [drafter]),
                           [("--report", report)])
