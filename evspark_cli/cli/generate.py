"""`evspark generate`: continue each record (or region) and write the continuations as FASTA.

Records are written as they finish, to OUTPUT.partial (renamed when every record is done): a
record that fails is reported and skipped, the others stay for `--resume`.
"""
from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, List, Optional

import typer

from .app import command, debug_traceback, fail, first_line, say
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

if TYPE_CHECKING:  # the CLI imports the engine lazily (a fast --help)
    from ..api import DecodeOptions
    from ..decode.drafters.base import Drafter
    from ..io.fasta import Prompt
    from ..io.writers import FastaOutput, StatsOutput
    from ..model.model import StripedHyena
    from ..resume import RunRecord


@command()
def generate(
    inputs: List[str] = typer.Argument(..., metavar="INPUT...", help="FASTA files (plain, gzip, "
                                       "BGZF); '-' reads FASTA from stdin."),
    output: Optional[str] = typer.Option(None, "-o", "--output", help="FASTA of generated "
                                         "sequences (default stdout); written atomically."),
    stats: Optional[str] = typer.Option(None, "--stats", help="Per-record statistics, .tsv or "
                                        ".jsonl."),
    model_dir: Optional[str] = ModelOpt,
    drafter: str = typer.Option("auto", "--drafter", help="auto (the model's bundled drafter), "
                                "dspark, kmer, identity, none (native decoding) or a drafter "
                                "folder."),
    gamma: int = GammaOpt,
    max_new_tokens: int = typer.Option(1024, "-n", "--max-new-tokens", help="Tokens per record."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature (0 = "
                                      "greedy)."),
    top_k: int = typer.Option(4, "--top-k", help="Keep the k most likely tokens (1 = greedy, 0 = "
                              "all)."),
    top_p: float = typer.Option(1.0, "--top-p", help="Nucleus sampling inside the kept tokens."),
    greedy: bool = typer.Option(False, "--greedy", help="Same as --top-k 1."),
    seed: int = typer.Option(0, "--seed", help="Random seed; the same seed reproduces a run."),
    samples: int = typer.Option(1, "--samples", help="Continuations per record (ids get _s{i})."),
    compare_native: bool = typer.Option(False, "--compare-native", help="Also decode natively in "
                                        "the same process and report the speedup."),
    rollback: str = typer.Option("slice", "--rollback", help="slice (per-position state) or "
                                 "replay (snapshot-and-replay baseline)."),
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    line_width: int = typer.Option(60, "--line-width", help="FASTA line width (0 = one line)."),
    include_prompt: bool = typer.Option(False, "--include-prompt", help="Prepend the prompt."),
    region: Optional[List[str]] = RegionOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    resume: bool = typer.Option(False, "--resume", help="Continue an interrupted run from "
                                "OUTPUT.partial."),
    force_drafter: bool = typer.Option(False, "--force-drafter", help="Use a drafter distilled "
                                       "from another target anyway."),
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Continue each record (or region) and write the continuations as FASTA."""
    from ..api import DecodeOptions, model_and_drafter, set_threads
    from ..io.fasta import read_prompts
    from ..io.writers import check_distinct_outputs, check_output_path
    from ..limits import context_cap
    from ..resume import RunRecord

    options = DecodeOptions(max_new_tokens, gamma, temperature, 1 if greedy else top_k, top_p,
                            seed, samples, rollback)
    for path in (output, stats):
        check_output_path(path)
    check_distinct_outputs(inputs, [("--output", output), ("--stats", stats)])
    prompts = read_prompts(inputs, region or None, prompt_tail, shard=shard, iupac=iupac,
                           cap=context_cap(model_dir))
    set_threads(threads)
    model, d = model_and_drafter(model_dir, prompts, options, drafter, force_drafter,
                                 device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                                 compile=compile_cpu, max_memory=max_memory)
    record = RunRecord(model.config.model_name, d, options, include_prompt, prompt_tail, iupac)
    fasta, stat_out = record.open_outputs(prompts, output, stats, line_width, resume)
    run = _Run(model, d, options, record, compare_native)
    run.all(prompts, fasta, stat_out, quiet)


class _Run:
    """One generate run: every (record, sample) job through the engine, into the outputs."""

    def __init__(self, model: StripedHyena, drafter: Drafter | None, options: DecodeOptions,
                 record: RunRecord, compare_native: bool) -> None:
        self.model, self.drafter, self.options = model, drafter, options
        self.record = record
        self.include_prompt, self.compare_native = record.include_prompt, compare_native

    def all(self, prompts: list[Prompt], fasta: FastaOutput, stat_out: StatsOutput | None,
            quiet: bool) -> None:
        from ..resume import job_id

        samples = self.options.samples
        jobs = [(p, s) for p in prompts for s in range(samples)]
        failed: list[str] = []
        # both files are closed on any exit (an interrupt included): a leaked descriptor would
        # keep its lock and make an in-process --resume fail with "another process is writing it"
        with fasta, (stat_out if stat_out is not None else contextlib.nullcontext()):
            with progress_bar(quiet, "generate") as prog:
                task = prog.add_task("generate", total=len(jobs), note="")
                for p, s in jobs:
                    rid = job_id(p.id, s, samples)
                    if rid in fasta.done_ids:  # finished by the run this one resumes
                        prog.advance(task)
                        continue
                    note = self.one(p, s, rid, fasta, stat_out)
                    if note is None:
                        failed.append(rid)
                        prog.advance(task)
                    else:
                        prog.update(task, advance=1, note=note)
            if failed:
                if stat_out is not None:
                    stat_out.close()
                fail(f"{len(failed)} of {len(jobs)} records failed ({', '.join(failed[:5])}); the "
                     f"others are kept in the .partial files; rerun with --resume", 1)
            fasta.finish()
            if stat_out is not None:
                stat_out.finish()

    def one(self, p: Prompt, sample: int, rid: str, fasta: FastaOutput,
            stat_out: StatsOutput | None) -> str | None:
        """Generate and write one job; a progress note (its tau), or None when it failed."""
        from .. import api
        from ..io.writers import fasta_letters
        from ..model.tokenizer import tokenize

        try:
            out = api.continue_prompt(self.model, tokenize(p.seq), self.options, self.drafter,
                                      record=api.record_key(p.id), sample=sample, record_id=rid,
                                      compare_native=self.compare_native)
        except Exception as e:  # noqa: BLE001 - one bad record must not sink the rest
            debug_traceback()
            say(f"evspark: error: record '{rid}' failed: {first_line(e)}")
            return None
        desc = self.record.header(p, len(out.tokens))
        text = fasta_letters(out.text)
        # stats row first: a record counts as done once it is in the FASTA, so an interrupt
        # between the two writes must not leave a done record without its row (a row without
        # its record is kept and not written twice on --resume)
        if stat_out is not None and rid not in stat_out.done_ids:
            stat_out.write(out.stats)
        fasta.write(rid, desc, (p.seq + text) if self.include_prompt else text)
        tau = out.stats.get("tau")
        return f"tau={tau:.2f}" if tau else ""
