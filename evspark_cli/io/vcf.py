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


ANNOTATIONS = (("EVSPARK_REF_LL", "the reference window's score (nats, as --reduce)"),
               ("EVSPARK_ALT_LL", "the alternative window's score (nats, as --reduce)"),
               ("EVSPARK_DELTA", "EVSPARK_ALT_LL - EVSPARK_REF_LL (nats)"))
"""INFO fields `write_annotated` adds, one value per ALT (Number=A; '.' where not scored)."""
AlleleKey = tuple[str, int, str, str]  # chrom, pos, ref, alt as the VCF writes them


def write_annotated(source: str, dest: str, scores: dict[AlleleKey, tuple[float, ...]],
                    command: str = "evspark score") -> int:
    """Copy the VCF/BCF `source` to `dest` with `ANNOTATIONS` added to each record's INFO
    (values of `scores`, keyed by chrom, pos, ref, alt; an ALT without a score gets '.'); BCF
    when dest ends in .bcf, bgzipped when in .gz, else plain. Written through `dest.partial`,
    renamed when complete. Returns the records written."""
    import pysam

    mode = "wb" if dest.endswith(".bcf") else "wz" if dest.endswith(".gz") else "w"
    tmp = dest + ".partial"
    n = 0
    try:
        pysam.set_verbosity(0)
        # htslib declares a tag a record uses undeclared as it reads the record, and
        # translating such a record to another header ends the process: read them all once,
        # then declare what that added in the reader's header before its records are read
        with pysam.VariantFile(source) as scan:
            if "END" not in scan.header.info:  # htslib writes END for symbolic alleles
                scan.header.info.add("END", 1, "Integer", "End position of the variant")
            for _ in scan:
                pass
            header = scan.header.copy()
            found = [str(r).rstrip("\n") for r in scan.header.records]
        for name, what in ANNOTATIONS:
            if name not in header.info:
                header.info.add(name, "A", "Float", f"{command}: {what}")
            elif (header.info[name].number, header.info[name].type) != ("A", "Float"):
                raise InputError(f"{source}: declares INFO {name} other than Number=A, "
                                 "Type=Float; it cannot hold the scores")
        with pysam.VariantFile(source) as vin, pysam.VariantFile(tmp, mode,
                                                                 header=header) as vout:
            have = {str(r).rstrip("\n") for r in vin.header.records}
            for line in found:
                if line not in have:
                    vin.header.add_line(line)
            for rec in vin:
                rec.translate(vout.header)
                got = [scores.get((rec.chrom, rec.pos, rec.ref or "", alt))
                       for alt in rec.alts or ()]
                for i, (name, _) in enumerate(ANNOTATIONS):
                    rec.info.pop(name, None)
                    if any(g is not None for g in got):
                        rec.info[name] = tuple(None if g is None else g[i] for g in got)
                vout.write(rec)
                n += 1
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return n
