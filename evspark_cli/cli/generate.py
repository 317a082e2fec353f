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
    BatchSizeOpt,
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
    from ..io.fasta import Prompt
    from ..io.writers import FastaOutput, StatsOutput
    from ..resume import RunRecord
    from ..runs import GenerationRun, JobOutcome, RunJob, RunSummary


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
    batch_size: Optional[int] = BatchSizeOpt,
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
    from ..resume import RunRecord, job_id
    from ..runs import GenerationRun, make_jobs, plan_batch

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
    with fasta, (stat_out if stat_out is not None else contextlib.nullcontext()):
        jobs = make_jobs([(p.id, p.seq) for p in prompts], options, model, skip=fasta.done_ids)
        batch = plan_batch(model, jobs, options, d, batch_size, max_memory)
        run = GenerationRun(model, d, options, batch, compare_native)
        order = [job_id(p.id, s, samples) for p in prompts for s in range(samples)]
        writer = _Writer(run, record, {p.id: p for p in prompts}, fasta, stat_out)
        writer.all(jobs, order, quiet)


class _Writer:
    """Writes a run's outcomes in input order; on any early exit, the records that finished
    out of order are written too (nothing finished is lost; `--resume` restores the order)."""

    def __init__(self, run: GenerationRun, record: RunRecord, prompts: dict[str, Prompt],
                 fasta: FastaOutput, stat_out: StatsOutput | None) -> None:
        self.run, self.record, self.prompts = run, record, prompts
        self.fasta, self.stat_out = fasta, stat_out
        self.failed: list[str] = []

    def all(self, jobs: list[RunJob], order: list[str], quiet: bool) -> None:
        """Write every job's outcome; `order`: every output id of the run (finished by an
        earlier run or not) in input order, the order the final files get."""
        total = len(jobs) * self.run.options.max_new_tokens
        with progress_bar(quiet, "generate", unit="tokens") as prog:
            task = prog.add_task("generate", total=total, note="")
            self.run.on_round = lambda r: prog.advance(task, r.tokens)
            try:
                for o in self.run.outcomes(jobs):
                    self.one(o)
                    prog.update(task, note=f"tau={self.run.summary.tau:.2f}"
                                if self.run.summary.tau else "")
            except BaseException:
                for o in sorted(getattr(self.run, "waiting", {}).values(),
                                key=lambda o: o.run_job.job.index):
                    self.one(o)
                raise
        if self.failed:
            if self.stat_out is not None:
                self.stat_out.close()
            fail(f"{len(self.failed)} of {len(jobs)} records failed "
                 f"({', '.join(self.failed[:5])}); the others are kept in the .partial files; "
                 "rerun with --resume", 1)
        self.fasta.finish(order)
        if self.stat_out is not None:
            self.stat_out.finish(order)
        if not quiet:
            say(summary_line(self.run.summary, len(jobs)))

    def one(self, o: JobOutcome) -> None:
        """Write one finished job (its stats row first), or report its failure."""
        from ..io.writers import fasta_letters

        rid = o.run_job.id
        if o.output is None:
            assert o.error is not None
            debug_traceback(o.error)
            say(f"evspark: error: record '{rid}' failed: {first_line(o.error)}")
            self.failed.append(rid)
            return
        out = o.output
        prompt = self.prompts[o.run_job.record_id]
        desc = self.record.header(prompt, len(out.tokens))
        text = fasta_letters(out.text)
        # stats row first: a record counts as done once it is in the FASTA, so an interrupt
        # between the two writes must not leave a done record without its row (a row without
        # its record is kept and not written twice on --resume)
        if self.stat_out is not None and rid not in self.stat_out.done_ids:
            self.stat_out.write(out.stats)
        self.fasta.write(rid, desc, (prompt.seq + text) if self.record.include_prompt else text)


def summary_line(s: RunSummary, jobs: int) -> str:
    """One line for the end of a run: what was done, how fast."""
    parts = [f"evspark: generated {s.jobs - s.failed} of {jobs} sequences", f"{s.tokens} tokens",
             f"{s.seconds:.1f} s", f"{s.tokens_per_s or 0:.0f} tokens/s", f"batch {s.batch_size}"]
    if s.tau:
        parts.append(f"tau {s.tau:.2f}")
    if s.speedup:
        parts.append(f"speedup {s.speedup:.2f}x over native decoding")
    return ", ".join(parts)
