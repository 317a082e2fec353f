"""`evspark generate`: continue each record (or region) and write the continuations as FASTA.

The run itself is the generation package's (options, jobs, run loop, ordered outputs); this
module parses the options, shows progress and maps errors to exit codes. Output ids, headers
and the `.partial`/`--resume` rules: generation/records.py and generation/outputs.py.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional

from .app import command, debug_traceback, fail, first_line
from .common import PROMPT_OPTIONS, read_input, use_threads, warn
from .generate_options import (
    ApiKeyFileOpt,
    CompareNativeOpt,
    DrafterOpt,
    ForceDrafterOpt,
    GreedyOpt,
    IncludePromptOpt,
    IndexOpt,
    InputsArg,
    LineWidthOpt,
    MaxNewTokensOpt,
    OutputOpt,
    PromptOpt,
    ResumeOpt,
    RollbackOpt,
    SamplesOpt,
    SeedOpt,
    ServerOpt,
    StatsOpt,
    TemperatureOpt,
    TopKOpt,
    TopPOpt,
)
from .meter import GenerationMeter, prefill_work, summary_line
from .options import (
    AlphabetOpt,
    BatchSizeOpt,
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
)
from .progress import Progress

if TYPE_CHECKING:  # the CLI imports the engine lazily (a fast --help)
    from ..decode.jobs import Job
    from ..generation.options import DecodeOptions
    from ..generation.records import RecordScheme
    from ..generation.run import DecodingRun, GenerationRun
    from ..io.types import Prompt
    from ..model.config import ModelConfig

EXAMPLE = """Example: continue two regions of a genome by 2,048 bases, 4 samples each, with
progress on the terminal and a summary at the end:

  evspark generate genome.fa.gz --region chr1:1,000,001-1,004,000 --region chrM \\
      -n 2048 --samples 4 --seed 7 -o cont.fa --stats cont.tsv

Output ids: chr1:1000001-1004000.cont_s0 ... chrM.cont_s3 (see docs/cli.md)."""


@command(PROMPT_OPTIONS)
def generate(
    inputs: Optional[List[str]] = InputsArg,
    region: Optional[List[str]] = RegionOpt,
    regions: Optional[str] = RegionsOpt,
    prompt: Optional[List[str]] = PromptOpt,  # a list, so a repeated --prompt is refused
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    strict: bool = StrictOpt,
    circular: bool = CircularOpt,
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
    rule: str = RuleOpt,
    draft_length: str = DraftLengthOpt,
    tree_rows: int = TreeRowsOpt,
    alphabet: str = AlphabetOpt,
    rollback: str = RollbackOpt,
    force_drafter: bool = ForceDrafterOpt,
    compare_native: bool = CompareNativeOpt,
    output: Optional[str] = OutputOpt,
    stats: Optional[str] = StatsOpt,
    line_width: int = LineWidthOpt,
    index: bool = IndexOpt,
    include_prompt: bool = IncludePromptOpt,
    resume: bool = ResumeOpt,
    quiet: bool = QuietOpt,
    batch_size: Optional[int] = BatchSizeOpt,
    threads: int = ThreadsOpt,
    cuda_graphs: bool = GraphsOpt,
    compile_cpu: bool = CompileOpt,
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    server: Optional[str] = ServerOpt,
    api_key_file: Optional[str] = ApiKeyFileOpt,
) -> None:
    """Continue each record (or region) and write the continuations as FASTA."""
    from ..limits import context_cap

    t0 = time.monotonic()
    _check_server_options(server, api_key_file, model=model_dir, device=device != "auto",
                          dtype=dtype != "auto", batch_size=batch_size, max_memory=max_memory,
                          compare_native=compare_native, force_drafter=force_drafter,
                          compile=compile_cpu)
    _check_outputs(inputs, regions, model_dir, drafter, server, output, stats, index)
    remote, config = _model_source(server, api_key_file, model_dir)
    got = read_input(inputs, region, regions, prompt_tail, shard, strict, prompt or None, iupac,
                     context_cap(config), samples, config, circular)
    # the bar shows before torch is imported (a second or two): a run says what it does at once
    with Progress("generate", "tokens", quiet=quiet) as prog:
        prog.update(status="loading the model" if remote is None else "")
        from ..generation.options import DecodeOptions
        from ..generation.records import RecordScheme
        from ..serve.remote import remote_run

        options = DecodeOptions(max_new_tokens, gamma, temperature, 1 if greedy else top_k, top_p,
                                seed, samples, rollback, rule, draft_length, alphabet, tree_rows)
        used = use_threads(threads)
        run, model_name = (_local_run(model_dir, got.prompts, options, drafter, force_drafter,
                                      device, dtype, cuda_graphs, compile_cpu, max_memory,
                                      config, compare_native) if remote is None
                           else remote_run(*remote, got.prompts, options, drafter))
        scheme = RecordScheme(model_name, run.drafter_label, options, include_prompt,
                              prompt_tail, iupac, _split(shard))
        jobs, failed = _decode(scheme, run, got.prompts, prog, output, stats, (line_width, index),
                               resume, batch_size, max_memory)
    own = len(scheme.output_ids(got.prompts))  # the run's jobs (all, or a shard's)
    prog.summary(summary_line(run.summary, len(got.prompts), samples, time.monotonic() - t0, used,
                              resumed=own - len(jobs), skipped=len(got.skipped),
                              shard=(shard, own) if shard else None))
    _exit_if_failed(failed, len(jobs), samples, output)


def _exit_if_failed(failed: list[str], jobs: int, samples: int, output: str | None) -> None:
    """With failed sequences, exit 1 saying which and where the others are."""
    if not failed:
        return
    what = "record" if samples == 1 else "sequence"  # a job: one sample of a record
    fail(f"{len(failed)} of {jobs} {what}{'s' if jobs != 1 else ''} failed "
         f"({', '.join(failed[:5])}); {_kept(output)}", 1)


def _check_outputs(inputs: list[str] | None, regions: str | None, model_dir: str | None,
                   drafter: str, server: str | None, output: str | None, stats: str | None,
                   index: bool) -> None:
    """Before any work: the outputs can be written, none is an input or another's file (with
    --server, no model file is read here)."""
    from ..io.writers import check_distinct_outputs, check_fasta_index, check_output_path
    from ..limits import run_inputs

    inputs = run_inputs(inputs, regions, model_dir, [drafter] if server is None else [])

    for path in (output, stats):
        check_output_path(path)
    outputs = [("--output", "-" if output is None else output), ("--stats", stats)]
    check_distinct_outputs(inputs, outputs + check_fasta_index(output, index))


def _kept(output: str | None) -> str:
    """Where a run with failed records left the others, and how to go on: a run to standard
    output has written them and cannot be resumed (its stats partial must go before a rerun)."""
    from ..io.writers import kept_partials

    if output not in (None, "-"):
        return "the others are kept in the .partial files; rerun with --resume"
    stuck = kept_partials(resumable=False)
    rows = f" (their stats rows in {', '.join(stuck)}: delete it before a rerun)" if stuck else ""
    return f"the others were written to standard output{rows}"


def _check_server_options(server: str | None, api_key_file: str | None,
                          **local: object) -> None:
    """With --server the server's model, device and batch decode: refuse the options (given:
    not None or False) that would choose them here; --api-key-file is for --server only."""
    if server is None:
        if api_key_file is not None:
            raise _setting("api_key_file", "is for --server")
        return
    for name, value in local.items():
        if value not in (None, False):
            raise _setting(name, "chooses the local model or device; with --server the "
                           "server's decode (drop it)")


def _setting(name: str, why: str) -> Exception:
    from ..errors import SettingError

    return SettingError("{0} " + why, name)


def _model_source(server: str | None, api_key_file: str | None, model_dir: str | None
                  ) -> tuple[tuple | None, ModelConfig | None]:
    """Where the run decodes: the server's client with what it serves (a server that cannot
    be reached is a one-line error before any input is read), or None here; and the model's
    config for reading the inputs."""
    from ..limits import readable_config
    from ..model.config import ModelConfig
    from ..serve.client import Client, read_api_key

    if server is None:
        return None, readable_config(model_dir)
    client = Client(server, api_key=read_api_key(api_key_file))
    info = client.models()
    return (client, info), ModelConfig.from_dict(info["config"])


def _split(shard: str | None) -> tuple[int, int] | None:
    """The run's --shard I/N (a shard 1/1 is the whole run: None)."""
    from ..io.shard import parse_shard

    split = parse_shard(shard) if shard else None
    return split if split and split[1] > 1 else None


def _local_run(model_dir: str | None, prompts: list[Prompt], options: DecodeOptions,
               drafter: str, force_drafter: bool, device: str, dtype: str, cuda_graphs: bool,
               compile_cpu: bool, max_memory: str | None, config: ModelConfig | None,
               compare_native: bool) -> tuple[GenerationRun, str]:
    """The model and drafter loaded here (prompts checked against them), as a run."""
    from ..generation.plan import model_and_drafter
    from ..generation.run import GenerationRun

    model, d = model_and_drafter(model_dir, prompts, options, drafter, force_drafter,
                                 device=device, dtype=dtype, cuda_graphs=cuda_graphs,
                                 compile=compile_cpu, max_memory=max_memory, config=config)
    return GenerationRun(model, d, options, compare_native=compare_native), \
        model.config.model_name


def _decode(scheme: RecordScheme, run: DecodingRun, prompts: list[Prompt],
            prog: Progress, output: str | None, stats: str | None, layout: tuple[int, bool],
            resume: bool, batch_size: int | None, max_memory: str | None
            ) -> tuple[list[Job], list[str]]:
    """Decode every (prompt, sample) an earlier run did not finish and write it: the jobs it
    decoded and the output ids that failed. `layout`: the FASTA's line width and whether it
    gets an index."""
    from ..errors import ServerLost
    from ..generation.jobs import Record, build_jobs
    from ..generation.outputs import OrderedWriter, closing, open_outputs

    config = run.config
    records = [Record.of(p, config.vocab_size, scheme.output_base(p)) for p in prompts]
    # the batch size is checked (and against memory) before any output is opened, so a refused
    # run leaves no .partial; with every job, which a resumed run's fewer jobs only make easier
    every_job = build_jobs(records, scheme.options, shard=scheme.shard)
    run.plan(every_job, batch_size, max_memory)
    outputs = open_outputs(scheme, prompts, output, stats, *layout, resume=resume)
    with closing(outputs):
        jobs = build_jobs(records, scheme.options, skip=outputs.done_ids, shard=scheme.shard)
        if len(jobs) < len(every_job):  # resumed: planned again for the rows still to decode
            run.plan(jobs, batch_size, max_memory)
        lowered = run.lowered_from(jobs) if batch_size is None else None
        if lowered is not None:
            warn(f"batch size lowered to {run.batch_size} (from {lowered}) to fit in memory")
        meter = GenerationMeter(prog, run.passes(jobs), len(jobs), prefill_work(config),
                                names={r.id: p.id for r, p in zip(records, prompts)})
        run.observer = meter
        prog.update(status="")

        def failure(job: Job, error: Exception) -> None:
            debug_traceback(error)
            prog.say(f"evspark: error: record '{job.label}' failed: {first_line(error)}")

        writer = OrderedWriter(scheme, outputs, {r.id: p for r, p in zip(records, prompts)},
                               on_failure=failure, on_written=lambda o: meter.record_done())
        try:
            writer.write_all(run.outcomes(jobs), run.unsent)
        except ServerLost as e:  # say what was kept
            raise ServerLost(f"{first_line(e)}; {_kept(output)}") from None
    return jobs, writer.failed
