"""`evspark embed`: a named layer's activations per record (eval/embed.py, io/embeddings.py).

Records go to OUTPUT.partial as they finish; OUTPUT and its TSV index are written when every
record is done. A record that fails is reported and skipped, the others stay for `--resume`.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, List, Optional

import typer

from .. import defaults
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

if TYPE_CHECKING:
    from ..io.embeddings import EmbeddingOutput
    from ..io.types import Prompt
    from ..model.model import StripedHyena

EXAMPLE = """Example: the mean of Evo 2's favourite layer for every record, and the last
position of two layers of a region, as safetensors with a TSV index:

  evspark embed genes.fa --layer blocks.6.mlp.l3 -o genes.safetensors
  evspark embed ref.fa --region chr1:1-20000 --layer block.-1 --layer final --pool last \\
      -o region.safetensors"""




@command(PROMPT_OPTIONS)
def embed(
    inputs: List[str] = typer.Argument(..., metavar="INPUT...", help="FASTA files or '-'."),
    output: str = typer.Option(..., "-o", "--output", help=".safetensors (one tensor per "
                               "record, named by its id; ID/LAYER with several layers) or .npy "
                               "(one array, rows in index order)."),
    layer: List[str] = typer.Option(..., "--layer", "-l", help="A layer by Evo 2's module name "
                                    "(blocks.28.mlp.l3, blocks.28, norm) or EvSpark's (block.28, "
                                    "block.28.mlp, final); repeat for several. `evspark info "
                                    "--layers` lists them."),
    pool: str = option("mean", "--pool", help="mean (over the record), last (its last "
                       "position) or none (every position)."),
    index: Optional[str] = option(None, "--index", help="The TSV index (record_id length layer "
                                  "tensor first_row rows). Default: OUTPUT with .index.tsv."),
    embed_dtype: str = option("float32", "--embed-dtype", help="float32, float16 or bfloat16 "
                              "(safetensors only)."),
    window: Optional[int] = option(None, "--window", help="Positions embedded per pass "
                                   f"(default {defaults.EMBED_SPAN}, or what the context leaves "
                                   "of the model's); a longer record goes in windows."),
    context: Optional[int] = option(None, "--context", help="Each window's pass starts this "
                                    f"many bases earlier (default {defaults.EMBED_SPAN}, or half "
                                    "the model's context if less)."),
    model_dir: Optional[str] = ModelOpt,
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
    resume: bool = option(False, "--resume", help="Continue an interrupted run from "
                          "OUTPUT.partial (records already embedded there are kept)."),
    iupac: str = IupacOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Activations of named layers per record (embeddings), pooled, to safetensors or .npy."""
    from ..eval.embed import check_embed_settings, check_embed_windows
    from ..files import Output, check_distinct
    from ..io.embeddings import check_embedding_output, default_index
    from ..io.writers import PARTIAL_SUFFIX, check_output_path
    from ..limits import run_inputs
    from ..model.checkpoint import load_model

    check_embed_settings(pool, embed_dtype)
    check_embed_windows(window, context)
    check_embedding_output(output, embed_dtype)
    index = index or default_index(output)
    for path in (output, index):
        check_output_path(path)
    check_distinct(run_inputs(inputs, regions, model_dir),
                   [Output("--output", output, (PARTIAL_SUFFIX,)), Output("--index", index)])
    got = read_input(inputs, region, regions, prompt_tail, shard, strict, iupac=iupac,
                     circular=circular)
    used = use_threads(threads)
    t0 = time.monotonic()
    total = sum(len(p.seq) for p in got.prompts)
    with Progress("embed", "bases", total=total, quiet=quiet) as prog:
        prog.update(status="loading the model")
        model = load_model(model_dir, device=device, dtype=dtype, max_memory=max_memory)
        prog.update(status="")
        names, settings = _plan(model, layer, [len(p.seq) for p in got.prompts], pool,
                                embed_dtype, window, context, max_memory)
        failed = _embed_all(model, got.prompts, names, settings, output, index, resume, prog)
    n = len(got.prompts)
    skipped = f", {len(got.skipped)} empty records skipped" if got.skipped else ""
    prog.summary(f"evspark: embed: {n - len(failed)} of {n} records embedded ({', '.join(names)}"
                 f", {pool}), {total:,} bases in {time.monotonic() - t0:.1f} s, "
                 f"{used.describe()}{skipped}")
    if failed:
        fail(f"{len(failed)} of {n} records failed ({', '.join(failed[:5])}); the others are "
             f"kept in {output}{PARTIAL_SUFFIX}; rerun with --resume", 1)


def _plan(model: StripedHyena, layers: list[str], lengths: list[int], pool: str, dtype: str,
          window: int | None, context: int | None, max_memory: str | None
          ) -> tuple[list[str], dict]:
    """The layers' module names and the run's settings, its memory checked against what is
    left beside the loaded model."""
    from ..eval.embed import check_embed_memory, embed_settings, embed_spans, resolve_layers
    from ..model.memory import run_budget

    names = resolve_layers(model, layers)
    window, context = embed_spans(model.config, window, context)
    left = run_budget(model.device, max_memory, model.num_parameters() * 4)
    check_embed_memory(model, lengths, len(names), pool, dtype, window, context, left)
    return names, embed_settings(model, names, pool, dtype, window, context)


def _embed_all(model: StripedHyena, prompts: list[Prompt], names: list[str], settings: dict,
               output: str, index: str, resume: bool, prog: Progress) -> list[str]:
    """Embed every prompt into the partial; finish it when none failed. The failed ids."""
    from ..eval.embed import embed_record
    from ..io.embeddings import EmbeddingOutput
    from ..model.tokenizer import tokenize_tensor

    failed: list[str] = []
    out: EmbeddingOutput
    with EmbeddingOutput(output, index, settings, resume=resume) as out:
        for n, p in enumerate(prompts, 1):
            if p.id in out.done_ids:
                prog.advance(len(p.seq))
                continue
            start = prog.done
            try:
                got = embed_record(model, tokenize_tensor(p.seq), names, settings["pool"],
                                   settings["window"], settings["context"], settings["dtype"],
                                   on_window=lambda k: prog.update(start + k))
            except Exception as e:  # noqa: BLE001 - one bad record must not sink the rest
                debug_traceback()
                prog.say(f"evspark: error: record '{p.id}' failed: {first_line(e)}")
                failed.append(p.id)
                prog.update(start + len(p.seq))
                continue
            out.write(p.id, len(p.seq), got)
            prog.update(start + len(p.seq))
            prog.milestone(f"{n}/{len(prompts)} records")
        if not failed:
            out.finish([p.id for p in prompts])
    return failed
