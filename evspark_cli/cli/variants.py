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

    variants: str | None
    reference: str | None
    output: str | None
    window: int | None
    reduce: str
    strict: bool
    resume: bool
    rc: bool = False
    mutagenesis: str | None = None  # ID:START-END: score every substitution of the region
    shard: str | None = None  # I/N: the sites (mutagenesis: positions) i with i mod N == I-1
    vcf_out: str | None = None  # also the input VCF with the scores as INFO fields


def _key(chrom: object, pos: object, ref: object, alt: object) -> tuple[str, str, str, str]:
    return str(chrom), str(pos), str(ref), str(alt)


def score_variants_command(run: VariantRun, model_dir: str | None, device: str, dtype: str,
                           threads: int, quiet: bool, max_memory: str | None) -> None:
    from ..eval.variants import VARIANT_COLUMNS, check_variant_settings
    from ..files import Output, check_distinct
    from ..io.fasta import open_reference
    from ..io.writers import PARTIAL_SUFFIX, StatsOutput, check_output_path
    from ..model.checkpoint import load_model

    what = "variants" if run.variants is not None else "mutagenesis"
    if run.reference is None:
        raise SettingError("{0} needs {1}: the FASTA the positions refer to", what, "reference")
    if run.mutagenesis is not None and run.rc:
        raise SettingError("{0} scores the forward strand only (no {1})", "mutagenesis", "rc")
    if run.vcf_out is not None and run.shard is not None:
        raise SettingError("{0} writes the whole VCF: score it without {1} (a shard's TSV "
                           "rows are merged with evspark merge)", "vcf_out", "shard")
    if run.shard is not None:
        from ..io.shard import parse_shard

        parse_shard(run.shard)
    window = DEFAULT_WINDOW if run.window is None else run.window
    check_variant_settings(window, run.reduce)
    check_output_path(run.output)
    if run.vcf_out is not None:
        check_output_path(run.vcf_out)
    check_distinct([p for p in (run.variants, run.reference) if p is not None],
                   [Output("--output", run.output, (PARTIAL_SUFFIX,)),
                    Output("--vcf-out", run.vcf_out, (PARTIAL_SUFFIX,))])
    reference = open_reference(run.reference)
    try:
        alleles, skipped, region = _alleles(run, reference, window)
        used = use_threads(threads)
        t0 = time.monotonic()
        with Progress("score", "variants", total=len(alleles), quiet=quiet) as prog:
            prog.update(status="loading the model")
            model = load_model(model_dir, device=device, dtype=dtype, max_memory=max_memory)
            prog.update(status="")
            with StatsOutput(run.output, VARIANT_COLUMNS, resume=run.resume) as rows:
                done = {_key(r["chrom"], r["pos"], r["ref"], r["alt"]) for r in rows.done_rows}
                todo = [v for v in alleles if _key(v.chrom, v.pos, v.ref, v.alt) not in done]
                prog.advance(len(alleles) - len(todo))
                every = list(rows.done_rows) if run.vcf_out is not None else []
                for part, scores in _scored(model, reference, run, window, todo, region):
                    for s in scores:
                        row = {k: (round(x, 6) if isinstance(x, float) else x)
                               for k, x in s.row().items()}
                        rows.write(row)
                        if run.vcf_out is not None:
                            every.append(row)
                    prog.advance(len(part))
                rows.finish()
            if run.vcf_out is not None:
                from ..io.vcf import write_annotated

                assert run.variants is not None
                prog.update(status=f"writing {run.vcf_out}")
                write_annotated(run.variants, run.vcf_out, _annotations(every))
    finally:
        reference.close()
    of = f" in shard {run.shard}" if run.shard else ""
    prog.summary(f"evspark: score: {len(alleles):,} alleles scored{of} ({len(todo):,} this run), "
                 f"{skipped:,} skipped, window {window:,} ({run.reduce}"
                 f"{', both strands' if run.rc else ''}), {time.monotonic() - t0:.1f} s, "
                 f"{used.describe()}")
    if not alleles and skipped:
        fail("no allele of the VCF could be scored (see the warnings above)", 1)


def _annotations(rows: list[dict]) -> dict[tuple[str, int, str, str], tuple[float, ...]]:
    """Score rows (this run's and a resumed partial's, whose values are strings) by allele."""
    return {(str(r["chrom"]), int(r["pos"]), str(r["ref"]), str(r["alt"])):
            tuple(float(r[k]) for k in ("ref_ll", "alt_ll", "delta")) for r in rows}


def _alleles(run: VariantRun, reference, window: int
             ) -> tuple[list, int, tuple[str, int, int] | None]:
    """The alleles to score, how many were skipped, and the mutagenesis region (if any), all
    checked before the model loads."""
    from ..errors import InputError
    from ..eval.variants import mutagenesis_window, saturation_variants
    from ..io.regions import parse_region
    from ..io.vcf import read_variants

    if run.variants is not None:
        got = read_variants(run.variants, reference, run.strict, warn=warn)
        return _shard(got.variants, run.shard), sum(got.skipped.values()), None
    assert run.mutagenesis is not None
    r = parse_region(run.mutagenesis)
    if r.start is None or r.end is None:
        raise SettingError.of("mutagenesis", f"needs ID:START-END, got {run.mutagenesis!r}",
                              sep=": ")
    if r.name not in reference.ids():
        raise InputError(f"--mutagenesis {run.mutagenesis}: no record {r.name!r} in "
                         f"{run.reference}")
    if r.end > reference.length(r.name):
        raise InputError(f"--mutagenesis {run.mutagenesis}: past the end of {r.name!r} "
                         f"({reference.length(r.name):,} bases)")
    mutagenesis_window(reference.length(r.name), r.start, r.end, window)  # the region fits
    return (_shard(saturation_variants(reference, r.name, r.start, r.end), run.shard), 0,
            (r.name, r.start, r.end))


def _shard(alleles: list, shard: str | None) -> list:
    """A shard's alleles: whole sites (a position's alleles), site i in shard i mod N + 1."""
    from ..eval.variants import consecutive_sites
    from ..io.shard import in_shard, parse_shard

    if shard is None:
        return alleles
    which = parse_shard(shard)
    return [v for i, site in enumerate(consecutive_sites(alleles)) if in_shard(i, which)
            for v in site]


def _scored(model, reference, run: VariantRun, window: int, todo: list,
            region: tuple[str, int, int] | None):
    """(alleles, their scores) as they finish: a VCF's sites a batched pass at a time; a
    mutagenesis region in one pass (the alleles a resumed partial already holds left out of
    what is written)."""
    from ..eval.variants import (
        consecutive_sites,
        score_mutagenesis,
        score_variants,
        site_chunks,
        site_rows,
    )

    if region is not None:
        if todo:
            yield todo, score_mutagenesis(model, reference, *region, window, run.reduce,
                                          only=todo)
        return
    for alleles in site_chunks(consecutive_sites(todo), site_rows(model.device)):
        yield alleles, score_variants(model, reference, alleles, window, run.reduce, rc=run.rc)
