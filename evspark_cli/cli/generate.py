"""`evspark generate`: continue each record (or region) and write the continuations as FASTA.

Records are written as they finish, to OUTPUT.partial (renamed when every record is done): a
record that fails is reported and skipped, the others stay for `--resume`.

Output ids say what a record holds (stable; docs/cli.md): `{prompt id}.cont` for a
continuation, `{prompt id}.ext` with --include-prompt (the prompt followed by its
continuation), then `_s{i}` when --samples > 1. The header's description records the settings
and `prompt=` the prompt's coordinates (`ID` for a whole record, `RECORD:START-END` for a
region or a --prompt-tail). The random numbers stay keyed by the prompt's id (the region as
normalised), never by the output id, so a run is reproducible however it is named.
"""
from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, List, Optional

from .app import command, debug_traceback, fail, first_line
from .common import read_input, use_threads, warn
from .generate_options import (
    CompareNativeOpt,
    DrafterOpt,
    ForceDrafterOpt,
    GreedyOpt,
    IncludePromptOpt,
    InputsArg,
    LineWidthOpt,
    MaxNewTokensOpt,
    OutputOpt,
    PromptOpt,
    ResumeOpt,
    RollbackOpt,
    SamplesOpt,
    SeedOpt,
    StatsOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
)
from .meter import GenerationMeter, prefill_work, summary_line
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
    RegionsOpt,
    ShardOpt,
    StrictOpt,
    TailOpt,
    ThreadsOpt,
)
from .progress import Progress

if TYPE_CHECKING:  # the CLI imports the engine lazily (a fast --help)
    from ..io.fasta import Prompt
    from ..io.writers import FastaOutput, StatsOutput
    from ..resume import RunRecord
    from ..runs import GenerationRun, JobOutcome, RunJob

EXAMPLE = """Example: continue two regions of a genome by 2,048 bases, 4 samples each, with
progress on the terminal and a summary at the end:

  evspark generate genome.fa.gz --region chr1:1,000,001-1,004,000 --region chrM \\
      -n 2048 --samples 4 --seed 7 -o cont.fa --stats cont.tsv

Output ids: chr1:1000001-1004000.cont_s0 ... chrM.cont_s3 (see docs/cli.md)."""


@command()
def generate(
    inputs: Optional[List[str]] = InputsArg,
    region: Optional[List[str]] = RegionOpt,
    regions: Optional[str] = RegionsOpt,
    prompt: Optional[str] = PromptOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    strict: bool = StrictOpt,
    model_dir: Optional[str] = ModelOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    max_new_tokens: int = MaxNewTokensOpt,
    temperature: float = TemperatureOpt,
    top_k: int = TopKOpt,
    top_p: float = TopPOpt,
    greedy: bool = GreedyOpt,
    seed: int = SeedOpt,
    samples: int = SamplesOpt,
    drafter: str = DrafterOpt,
    gamma: int = GammaOpt,
    rollback: str = RollbackOpt,
    force_drafter: bool = ForceDrafterOpt,
    compare_native: bool = CompareNativeOpt,
    output: Optional[str] = OutputOpt,
    stats: Optional[str] = StatsOpt,
    line_width: int = LineWidthOpt,
    include_prompt: bool = IncludePromptOpt,
    resume: bool = ResumeOpt,
    quiet: bool = QuietOpt,
    batch_size: Optional[int] = BatchSizeOpt,
    threads: int = ThreadsOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Continue each record (or region) and write the continuations as FASTA."""
    from ..io.writers import check_distinct_outputs, check_output_path
    from ..limits import context_cap

    t0 = time.monotonic()
    for path in (output, stats):
        check_output_path(path)
    check_distinct_outputs(inputs, [("--output", output), ("--stats", stats)])
    got = read_input(inputs, region, regions, prompt_tail, shard, strict, literal=prompt,
                     iupac=iupac, cap=context_cap(model_dir))
    prompts = got.prompts
    # the bar shows before torch is imported (a second or two): a run says what it does at once
    with Progress("generate", "tokens", quiet=quiet) as prog:
        prog.update(status="loading the model")
        from ..api import DecodeOptions, model_and_drafter
        from ..resume import RunRecord
        from ..runs import GenerationRun

        options = DecodeOptions(max_new_tokens, gamma, temperature, 1 if greedy else top_k,
                                top_p, seed, samples, rollback)
        used = use_threads(threads)
        model, d = model_and_drafter(model_dir, prompts, options, drafter, force_drafter,
                                     device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                                     compile=compile_cpu, max_memory=max_memory)
        record = RunRecord(model.config.model_name, d, options, include_prompt, prompt_tail,
                           iupac)
        fasta, stat_out = record.open_outputs(prompts, output, stats, line_width, resume)
        order = [j.id for j in record.jobs(prompts)]
        with fasta, (stat_out if stat_out is not None else contextlib.nullcontext()):
            run = GenerationRun(model, d, options, compare_native=compare_native)
            writer = _Writer(run, record, fasta, stat_out, prompts, prog)
            jobs = writer.decode(batch_size, order, max_memory)
    prog.summary(summary_line(run.summary, len(prompts), samples, time.monotonic() - t0, used,
                              resumed=len(order) - len(jobs), skipped=len(got.skipped)))
    if writer.failed:
        fail(f"{len(writer.failed)} of {len(jobs)} records failed "
             f"({', '.join(writer.failed[:5])}); the others are kept in the .partial files; "
             "rerun with --resume", 1)


class _Writer:
    """Writes a run's outcomes in input order; on any early exit, the records that finished
    out of order are written too (nothing finished is lost; `--resume` restores the order)."""

    def __init__(self, run: GenerationRun, record: RunRecord, fasta: FastaOutput,
                 stat_out: StatsOutput | None, prompts: list[Prompt], progress: Progress) -> None:
        """`prompts`: the run's prompts, each named by the base of its output ids
        (`RunRecord.output_base`)."""
        self.run, self.record = run, record
        self.fasta, self.stat_out = fasta, stat_out
        self.prompts = {record.output_base(p.id): p for p in prompts}
        self.progress = progress
        self.failed: list[str] = []

    def decode(self, batch_size: int | None, order: list[str],
               max_memory: str | None = None) -> list[RunJob]:
        """Decode every (prompt, sample) not finished by an earlier run, write each outcome,
        and when none failed give the files their names with their records in `order` (every
        output id of the run, in input order). The jobs decoded."""
        from ..api import record_key
        from ..runs import default_batch_size, make_jobs, plan_batch

        run, prompts, opts = self.run, list(self.prompts.values()), self.run.options
        jobs = make_jobs(list(zip(self.prompts, (p.seq for p in prompts))), opts, run.model,
                         skip=self.fasta.done_ids,
                         key=lambda i, _base: record_key(prompts[i].random_key))
        run.batch_size = plan_batch(run.model, jobs, opts, run.drafter, batch_size, max_memory)
        wanted = min(default_batch_size(run.model.device), len(jobs))
        if batch_size is None and run.batch_size < wanted:
            warn(f"batch size lowered to {run.batch_size} (from {wanted}) to fit in memory")
        self.meter = GenerationMeter(self.progress, run.passes(jobs), len(jobs),
                                     prefill_work(run.model.config))
        run.observer = self.meter
        self.progress.update(status="")
        self.all(jobs)
        if not self.failed:
            self.fasta.finish(order)
            if self.stat_out is not None:
                self.stat_out.finish(order)
        elif self.stat_out is not None:
            self.stat_out.close()
        return jobs

    def all(self, jobs: list[RunJob]) -> None:
        """Write every job's outcome (failures are reported and collected in `failed`)."""
        try:
            for o in self.run.outcomes(jobs):
                self.one(o)
        except BaseException:
            for o in sorted(getattr(self.run, "waiting", {}).values(),
                            key=lambda o: o.run_job.job.index):
                self.one(o)
            raise

    def one(self, o: JobOutcome) -> None:
        """Write one finished job (its stats row first), or report its failure."""
        from ..io.writers import fasta_letters

        rid = o.run_job.id
        self.meter.record_done()
        if o.output is None:
            assert o.error is not None
            debug_traceback(o.error)
            self.progress.say(f"evspark: error: record '{rid}' failed: {first_line(o.error)}")
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

