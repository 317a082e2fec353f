"""`evspark score`: teacher-forced log-likelihood per record (eval/score.py).

Rows are written as records finish, to OUTPUT.partial (renamed when every record is done): a
record that fails is reported and skipped, and the others stay for `--resume`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

import typer

from ..errors import SettingError
from .app import command, debug_traceback, fail, first_line
from .common import PROMPT_OPTIONS, read_input, use_threads
from .options import (
    CircularOpt,
    DeviceOpt,
    DtypeOpt,
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
    option,
)
from .progress import Progress
from .variants import VariantRun

if TYPE_CHECKING:  # the CLI imports the engine lazily (a fast --help)
    from ..io.types import Prompt
    from ..model.model import StripedHyena

EXAMPLE = """Example: bits per nucleotide of every contig of an assembly, each base seeing at
least 8,192 bases of context, as a TSV:

  evspark score assembly.fa.gz --context 8192 -o bits.tsv"""


ContextOpt = typer.Option(None, "--context", help="Each scored base sees at least this many "
                          "preceding bases (where the record has them). Default: 8192, or half "
                          "the model's context if less.")
WindowOpt = typer.Option(None, "--window", help="Bases scored per forward pass. Default: 8192, "
                         "or what the context leaves of the model's context if less. With "
                         "--variants: the window's length (default 8192).")
VariantsOpt = option(None, "--variants", help="Score the variants of this VCF or BCF (plain "
                     "or bgzipped) against --reference instead of records: chrom pos id ref alt "
                     "ref_ll alt_ll delta, each window --window bases (default 8192).")
ReferenceOpt = option(None, "--reference", help="With --variants: the FASTA (plain or BGZF) "
                      "the variants' positions refer to.")
ReduceOpt = option("mean", "--reduce", help="With --variants: a window's log-likelihood "
                   "reduced as the mean over its bases (Evo 2's) or the sum.")
MutagenesisOpt = option(None, "--mutagenesis", help="With --reference: in-silico saturation "
                        "mutagenesis of ID:START-END (every base to the three others), in one "
                        "--window that holds the region.")
VcfOutOpt = option(None, "--vcf-out", help="With --variants: also write the VCF with each "
                  "ALT's scores as INFO EVSPARK_REF_LL, EVSPARK_ALT_LL, EVSPARK_DELTA "
                  "(.bcf: BCF, .gz: bgzipped, else plain).")
RcOpt = option(False, "--rc", help="With --variants: each score the mean of the window's and "
               "its reverse complement's.")


def _variants(inputs: list[str] | None, run: VariantRun, *rest) -> None:
    """`score --variants` or `--mutagenesis`: the records' options do not apply, and INPUT is
    not read."""
    from .variants import score_variants_command

    if run.vcf_out is not None and run.variants is None:
        raise SettingError("{0} annotates the VCF of {1}", "vcf_out", "variants")
    if run.variants is None and run.mutagenesis is None:
        raise SettingError("give INPUT... (FASTA records to score) or {0} with {1}",
                           "variants", "reference")
    if run.variants is not None and run.mutagenesis is not None:
        raise SettingError("{0} and {1} are two runs: give one", "variants", "mutagenesis")
    what = "variants" if run.variants is not None else "mutagenesis"
    if inputs:
        raise SettingError("{0} scores against {1}: give no INPUT", what, "reference")
    score_variants_command(run, *rest)


@command(PROMPT_OPTIONS)
def score(
    inputs: Optional[List[str]] = typer.Argument(None, metavar="[INPUT]...",
                                                 help="FASTA files or '-'."),
    model_dir: Optional[str] = ModelOpt,
    output: Optional[str] = typer.Option(None, "-o", "--output", help="TSV (default stdout)."),
    logits: Optional[str] = typer.Option(None, "--logits", help="Also save the logits of every "
                                         "scored position (.safetensors, one tensor per "
                                         "record)."),
    logits_columns: str = option("all", "--logits-columns", help="all (every vocabulary "
                                 "entry) or acgt (A, C, G, T: 128x smaller)."),
    logits_dtype: str = option("float32", "--logits-dtype", help="float32, float16 or "
                               "bfloat16."),
    bedgraph: Optional[str] = option(None, "--bedgraph", help="Also write each base's "
                                     "surprisal (bits) as a bedGraph track."),
    context: Optional[int] = ContextOpt,
    window: Optional[int] = WindowOpt,
    region: Optional[List[str]] = RegionOpt,
    regions: Optional[str] = RegionsOpt,
    prompt_tail: Optional[int] = TailOpt,
    shard: Optional[str] = ShardOpt,
    strict: bool = StrictOpt,
    circular: bool = CircularOpt,
    device: str = DeviceOpt,
    dtype: str = DtypeOpt,
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    resume: bool = typer.Option(False, "--resume", metavar="", help="Continue an interrupted "
                                "run from OUTPUT.partial (records already scored there are "
                                "kept)."),
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
    variants: Optional[str] = VariantsOpt,
    reference: Optional[str] = ReferenceOpt,
    reduce: str = ReduceOpt,
    rc: bool = RcOpt,
    mutagenesis: Optional[str] = MutagenesisOpt,
    vcf_out: Optional[str] = VcfOutOpt,
) -> None:
    """Teacher-forced log-likelihood per record, or variant effect scores (--variants)."""
    if variants or mutagenesis or vcf_out or not inputs:
        return _variants(inputs, VariantRun(variants, reference, output, window, reduce, strict,
                                            resume, rc, mutagenesis, shard, vcf_out), model_dir,
                         device, dtype, threads, quiet, max_memory)
    from ..eval.score import check_logits_format, check_score_windows
    from ..limits import run_inputs, score_cap, score_windows
    from ..model.checkpoint import load_model, resolve_device
    from ..model.memory import memory_budget, run_budget

    check_score_windows(1 if context is None else context, 1 if window is None else window)
    check_logits_format(logits_columns, logits_dtype)
    _check_outputs(run_inputs(inputs, regions, model_dir), output, logits, bedgraph)
    budget = memory_budget(resolve_device(device), max_memory)
    got = read_input(inputs, region, regions, prompt_tail, shard, strict, iupac=iupac,
                     cap=score_cap(budget), circular=circular)
    used = use_threads(threads)
    t0 = time.monotonic()
    with Progress("score", "bases", total=sum(len(p.seq) for p in got.prompts),
                  quiet=quiet) as prog:
        prog.update(status="loading the model")
        model = load_model(model_dir, device=device, dtype=dtype, max_memory=max_memory)
        prog.update(status="")
        left = run_budget(model.device, max_memory, model.num_parameters() * 4)
        context, window = score_windows(model.config, context, window,
                                        [len(p.seq) for p in got.prompts], bool(logits), left)
        extras = Extras(logits, logits_columns, logits_dtype, bedgraph)
        try:
            failed, partial = _score_all(model, got.prompts, context, window, output, extras,
                                         resume, prog)
        except _Failed as e:
            failed, partial = e.failed, e.partial
    n = len(got.prompts)
    skipped = f", {len(got.skipped)} empty records skipped" if got.skipped else ""
    prog.summary(f"evspark: score: {n - len(failed)} of {n} records scored, "
                 f"{sum(len(p.seq) for p in got.prompts):,} bases in "
                 f"{time.monotonic() - t0:.1f} s, {used.describe()}{skipped}")
    if failed:
        kept = f"kept in {partial}; rerun with --resume" if partial else "printed"
        fail(f"{len(failed)} of {n} records failed ({', '.join(failed[:5])}); the others are "
             f"{kept}", 1)


def _check_outputs(inputs: list, output: str | None, logits: str | None,
                   bedgraph: str | None) -> None:
    """Before any work: the outputs can be written, none is an input or another's file."""
    from ..files import Output, check_distinct
    from ..io.writers import PARTIAL_SUFFIX, check_output_path

    for path in (output, logits, bedgraph):
        check_output_path(path)
    check_distinct(inputs, [Output("--output", output, (PARTIAL_SUFFIX,)),
                            Output("--logits", logits), Output("--bedgraph", bedgraph)])


@dataclass(frozen=True)
class Extras:
    """What a score run writes beside its rows: logits (which columns, what dtype), a track."""

    logits: str | None
    columns: str
    dtype: str
    bedgraph: str | None


def _score_all(model: StripedHyena, prompts: list[Prompt], context: int, window: int,
               output: str | None, extras: Extras, resume: bool, prog: Progress
               ) -> tuple[list[str], str | None]:
    """Score every prompt (rows written as they finish): the ids of the records that failed
    (each reported as it fails) and, if any did, the .partial that keeps the others. The
    logits and the track are written when every record is scored (a resumed run scores the
    finished records again for them)."""
    import contextlib

    import torch

    from ..eval import score as scoring
    from ..files import atomic_path
    from ..io.bedgraph import TRACK_LINE, write_track
    from ..io.compressed import plain_name
    from ..io.writers import StatsOutput
    from ..model.tokenizer import tokenize_tensor

    fmt = "jsonl" if output and plain_name(output).lower().endswith(".jsonl") else "tsv"
    saved: dict[str, torch.Tensor] = {}
    failed: list[str] = []
    again = bool(extras.logits or extras.bedgraph)  # a resumed record is scored again for them
    with contextlib.ExitStack() as stack:
        rows = stack.enter_context(StatsOutput(output, scoring.SCORE_COLUMNS, resume=resume,
                                               fmt=fmt))
        track = None
        if extras.bedgraph:
            tmp = stack.enter_context(atomic_path(extras.bedgraph))
            track = stack.enter_context(open(tmp, "w"))
            track.write(TRACK_LINE)
        for n, p in enumerate(prompts, 1):
            done = p.id in rows.done_ids
            if done and not again:  # resumed: its row is in the partial already
                prog.advance(len(p.seq))
                continue
            start = prog.done
            try:
                got = scoring.score_record(model, tokenize_tensor(p.seq), context, window,
                                           keep_logits=bool(extras.logits),
                                           per_base=track is not None,
                                           on_window=lambda k: prog.update(start + k),
                                           logits_columns=extras.columns,
                                           logits_dtype=extras.dtype)
            except Exception as e:  # noqa: BLE001 - one bad record must not sink the rest
                debug_traceback()
                prog.say(f"evspark: error: record '{p.id}' failed: {first_line(e)}")
                failed.append(p.id)
                prog.update(start + len(p.seq))
                continue
            if not done:
                rows.write({"record_id": p.id, "length": len(p.seq),
                            "bits_per_nt": round(got.bits_per_nt, 4),
                            "total_ll": round(got.total_ll, 4), "scored": got.scored})
            if got.logits is not None:
                saved[p.id] = got.logits
            if track is not None and got.per_base is not None:
                write_track(track, p, got.per_base.tolist())
            prog.update(start + len(p.seq))  # position 0 is not scored but is done
            prog.milestone(f"{n}/{len(prompts)} records")
        if failed:
            rows.close()
            raise _Failed(failed, rows.partial)
        if extras.logits:
            from safetensors.torch import save_file

            with atomic_path(extras.logits) as tmp_logits:
                save_file({k: v.contiguous() for k, v in saved.items()}, tmp_logits)
        if track is not None:
            track.close()  # renamed into place as the stack unwinds
        rows.finish()
    return failed, None


class _Failed(Exception):
    """Some records failed: the track is not renamed into place (the stack unwinds on it)."""

    def __init__(self, failed: list[str], partial: str | None) -> None:
        super().__init__(failed)
        self.failed, self.partial = failed, partial
