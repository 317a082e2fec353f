"""`evspark verify`: greedy native vs greedy speculative decoding, token by token (eval/verify.py).

Exit 0 when no prompt has a non-tie divergence, 1 otherwise.
"""
from __future__ import annotations

from typing import List, Optional

import typer

from .app import command
from .options import (
    CompileOpt,
    DeviceOpt,
    DtypeOpt,
    GammaOpt,
    GraphsOpt,
    IupacOpt,
    MaxMemoryOpt,
    ModelOpt,
    QuietOpt,
    RegionOpt,
    ShardOpt,
    TailOpt,
    ThreadsOpt,
    progress_bar,
)


@command()
def verify(
    inputs: Optional[List[str]] = typer.Argument(None, metavar="[INPUT...]", help="FASTA prompts "
                                                 "(default: the bundled example prompts)."),
    model_dir: Optional[str] = ModelOpt,
    drafter: str = typer.Option("auto", "--drafter", help="Drafter to check (auto, dspark, kmer, "
                                "identity or a folder)."),
    gamma: int = GammaOpt,
    max_new_tokens: int = typer.Option(256, "-n", "--max-new-tokens", help="Tokens per prompt."),
    region: Optional[List[str]] = RegionOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    rollback: str = typer.Option("slice", "--rollback", help="slice or replay."),
    report: Optional[str] = typer.Option(None, "--report", help="Write a JSON report here."),
    tie_tolerance: Optional[float] = typer.Option(
        None, "--tie-tolerance", help="A divergence is a tie when the native top-1/top-2 logit "
        "gap there is below this. Default: 1e-3 for fp32 weights, 0.1 for bf16 (whose logits "
        "a step and a block round differently)."),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    force_drafter: bool = typer.Option(False, "--force-drafter", help="Allow a mismatched "
                                       "drafter."),
    batch_size: int = typer.Option(1, "--batch-size", "-b", help="Decode the prompts "
                                   "speculatively in batches of this many rows, each compared "
                                   "with its own single-stream native run."),
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Greedy native vs greedy speculative decoding, compared token by token (exit 1 on a
    non-tie divergence)."""
    import json

    from ..api import DecodeOptions, model_and_drafter, set_threads
    from ..bundled import example_prompts
    from ..eval.verify import VerifyOptions, verify_prompts
    from ..io.fasta import read_prompts
    from ..io.writers import check_distinct_outputs, check_output_path, write_text_atomic
    from ..limits import context_cap

    options = VerifyOptions(DecodeOptions(max_new_tokens, gamma, top_k=1, rollback=rollback),
                            tie_tolerance, batch_size)
    if report:
        check_output_path(report)
        check_distinct_outputs(inputs, [("--report", report)])
    prompts = read_prompts(inputs or [str(example_prompts())], region or None, prompt_tail,
                           shard=shard, iupac=iupac, cap=context_cap(model_dir))
    set_threads(threads)
    model, d = model_and_drafter(model_dir, prompts, options.decode, drafter, force_drafter,
                                 device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                                 compile=compile_cpu, max_memory=max_memory)
    with progress_bar(quiet, "verify") as prog:
        task = prog.add_task("verify", total=len(prompts), note="")
        result = verify_prompts(model, prompts, d, options, lambda row: prog.advance(task),
                                batch_size=options.batch_size)
    print("\n".join(result.table()))
    if report:
        write_text_atomic(report, json.dumps(result.report(), indent=1))
    if result.non_tie_divergences:
        raise typer.Exit(1)
