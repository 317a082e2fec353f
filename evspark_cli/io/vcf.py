"""Variants from a VCF or BCF (plain or bgzipped, read by pysam/htslib), checked against the
reference they are scored on.

Each ALT allele of a record is one `Variant`. What cannot be scored is skipped with a warning,
or refused with `strict` (one line naming the record): symbolic ALTs (`<DEL>`, `<*>`,
breakends), the spanning deletion `*`, a missing ALT (`.`), REF or ALT letters outside
A/C/G/T/N, a contig absent from the reference, a REF running past the contig's end, and a REF
that does not match the reference there (case ignored). A REF equal to its ALT is scored (delta
0) like any other allele.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from ..errors import InputError
from .indexed import Source
from .types import Variant

BASES = re.compile(r"^[ACGTNacgtn]+$")


@dataclass
class VariantsRead:
    """The variants to score and what was skipped (reason -> count)."""

    variants: list[Variant] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)


def _why_not(chrom: str, pos: int, ref: str, alt: str | None, lengths: dict[str, int],
             reference: Source) -> str | None:
    """Why this allele cannot be scored, or None."""
    if alt is None or alt == ".":
        return "no ALT allele"
    if alt == "*":
        return "a spanning deletion (*)"
    if alt.startswith("<") or "[" in alt or "]" in alt:
        return "a symbolic ALT"
    if not BASES.match(ref) or not BASES.match(alt):
        return "letters other than A, C, G, T, N"
    if chrom not in lengths:
        return "a contig absent from the reference"
    if pos < 1 or pos - 1 + len(ref) > lengths[chrom]:
        return "a REF past the contig's end"
    got = reference.fetch(chrom, pos, pos - 1 + len(ref))
    if got.upper() != ref.upper():
        return f"a REF that does not match the reference ({got})"
    return None


def iter_records(path: str) -> Iterator[tuple[str, int, str, str, tuple[str, ...] | None]]:
    """(chrom, pos, id, ref, alts) of each record, in file order."""
    import pysam

    pysam.set_verbosity(0)  # htslib's own warnings would bypass our one-line messages
    if not os.path.exists(path):
        raise InputError(f"{path}: no such file")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory, not a VCF or BCF file")
    try:
        vf = pysam.VariantFile(path)
    except PermissionError:
        raise InputError(f"{path}: permission denied") from None
    except (OSError, ValueError):
        raise InputError(f"{path}: not a VCF or BCF file (htslib could not read its "
                         "header)") from None
    with vf:
        try:
            for rec in vf:
                yield rec.chrom, rec.pos, rec.id or ".", rec.ref or "", rec.alts
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: a malformed VCF record: {e}") from None


def read_variants(path: str, reference: Source, strict: bool = False,
                  warn: Callable[[str], None] | None = None) -> VariantsRead:
    """The scorable ALT alleles of `path` against `reference` (io/fasta.open_reference); the
    others skipped with one warning per reason (or refused if `strict`)."""
    lengths = {name: reference.length(name) for name in reference.ids()}
    out = VariantsRead()
    for chrom, pos, vid, ref, alts in iter_records(path):
        for alt in alts or (None,):
            why = _why_not(chrom, pos, ref, alt, lengths, reference)
            if why is None:
                out.variants.append(Variant(chrom, pos, vid, ref, alt or ""))
                continue
            if strict:
                raise InputError(f"{path}: {chrom}:{pos} {ref}>{alt or '.'}: {why} (--strict)")
            out.skipped[why] = out.skipped.get(why, 0) + 1
    if warn is not None:
        for why, n in out.skipped.items():
            warn(f"{path}: {n} allele{'s' * (n != 1)} skipped: {why}")
    return out
