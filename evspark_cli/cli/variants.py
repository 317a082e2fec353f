"""`evspark score --variants VCF --reference FASTA`: variant effect scores (eval/variants.py).

Rows go to OUTPUT.partial as sites finish (renamed when every variant is scored); `--resume`
keeps the alleles a partial already holds (by chrom, pos, ref and alt) and scores the rest.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..errors import SettingError
from .app import fail
from .common import use_threads, warn
from .progress import Progress

DEFAULT_WINDOW = 8192


@dataclass(frozen=True)
class VariantRun:
    """What `score --variants` was asked for."""

    variants: str
    reference: str | None
    output: str | None
    window: int | None
    reduce: str
    strict: bool
    resume: bool


def _key(chrom: object, pos: object, ref: object, alt: object) -> tuple[str, str, str, str]:
    return str(chrom), str(pos), str(ref), str(alt)


def score_variants_command(run: VariantRun, model_dir: str | None, device: str, dtype: str,
                           threads: int, quiet: bool, max_memory: str | None) -> None:
    from ..eval.variants import VARIANT_COLUMNS, check_variant_settings, score_variants
    from ..files import Output, check_distinct
    from ..io.fasta import open_reference
    from ..io.vcf import read_variants
    from ..io.writers import PARTIAL_SUFFIX, StatsOutput, check_output_path
    from ..model.checkpoint import load_model

    if run.reference is None:
        raise SettingError("{0} needs {1}: the FASTA the variants' positions refer to",
                           "variants", "reference")
    window = DEFAULT_WINDOW if run.window is None else run.window
    check_variant_settings(window, run.reduce)
    check_output_path(run.output)
    check_distinct([run.variants, run.reference],
                   [Output("--output", run.output, (PARTIAL_SUFFIX,))])
    reference = open_reference(run.reference)
    try:
        got = read_variants(run.variants, reference, run.strict, warn=warn)
        used = use_threads(threads)
        t0 = time.monotonic()
        with Progress("score", "variants", total=len(got.variants), quiet=quiet) as prog:
            prog.update(status="loading the model")
            model = load_model(model_dir, device=device, dtype=dtype, max_memory=max_memory)
            prog.update(status="")
            with StatsOutput(run.output, VARIANT_COLUMNS, resume=run.resume) as rows:
                done = {_key(r["chrom"], r["pos"], r["ref"], r["alt"]) for r in rows.done_rows}
                todo = [v for v in got.variants if _key(v.chrom, v.pos, v.ref, v.alt) not in done]
                prog.advance(len(got.variants) - len(todo))
                for site in _by_site(todo):
                    for s in score_variants(model, reference, site, window, run.reduce):
                        rows.write({k: (round(x, 6) if isinstance(x, float) else x)
                                    for k, x in s.row().items()})
                    prog.advance(len(site))
                rows.finish()
    finally:
        reference.close()
    skipped = sum(got.skipped.values())
    prog.summary(f"evspark: score: {len(got.variants):,} alleles scored "
                 f"({len(todo):,} this run), {skipped:,} skipped, window {window:,} "
                 f"({run.reduce}), {time.monotonic() - t0:.1f} s, {used.describe()}")
    if not got.variants and skipped:
        fail("no allele of the VCF could be scored (see the warnings above)", 1)


def _by_site(variants: list) -> list[list]:
    """Consecutive alleles at one position go together (they share a reference window)."""
    out: list[list] = []
    for v in variants:
        if out and (out[-1][0].chrom, out[-1][0].pos) == (v.chrom, v.pos):
            out[-1].append(v)
        else:
            out.append([v])
    return out
