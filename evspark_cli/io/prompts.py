"""What a command reads as prompts: records, regions (`--region`, `--regions FILE.bed`) or one
literal sequence (`--prompt`), with what a user should hear about them.

Inputs that look wrong but are legal are used and reported, one warning line per kind: a
prompt made only of N (the model continues unknown bases), lower-case (soft-masked) bases
that were upper-cased. An empty record in a multi-record file is skipped with a warning and
counted in the run's summary; with `strict` it is an error (exit 2), as is a run left with no
prompt at all. A region asked for by name that is empty stays an error: it was asked for.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..errors import InputError, SettingError
from .fasta import read_prompts
from .regions import LITERAL_ID, name_bed_prompts, read_bed
from .sequences import clean, iupac_key
from .shard import parse_shard, select_shard
from .streams import fail_setting
from .types import LengthCap, Prompt

__all__ = ["Prompts", "literal_prompt", "load_prompts"]

_SHOWN = 3  # ids named in a warning line before "..."


@dataclass
class Prompts:
    """The prompts of a run, the empty records left out, and the warnings to print."""

    prompts: list[Prompt]
    skipped: list[str] = field(default_factory=list)  # ids of empty records
    warnings: list[str] = field(default_factory=list)


def _ids(ids: Sequence[str]) -> str:
    shown = ", ".join(ids[:_SHOWN])
    return shown + (f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def literal_prompt(seq: str, prompt_tail: int | None = None, iupac: str = "keep") -> Prompt:
    """`--prompt ACGT...`: one prompt with id `prompt` (io/regions.LITERAL_ID)."""
    if not isinstance(seq, str) or not seq.strip():
        raise SettingError("{0}: empty sequence", "literal")
    raw = seq.strip()
    bases = clean(raw, "--prompt", 0, iupac, iupac_key(LITERAL_ID))
    kept = bases[-prompt_tail:] if prompt_tail else bases
    span = (LITERAL_ID, len(bases) - len(kept) + 1, len(bases)) if len(kept) < len(bases) else None
    return Prompt(LITERAL_ID, "", kept, "--prompt", span=span, soft_masked=not raw.isupper())


def load_prompts(inputs: Sequence[str] | None, regions: Sequence[str] | None = None,
                 bed: str | None = None, literal: str | Sequence[str] | None = None,
                 prompt_tail: int | None = None, shard: str | None = None,
                 strict: bool = False, index_dir: str | None = None, iupac: str = "keep",
                 cap: LengthCap | None = None, samples: int = 1,
                 circular: bool = False) -> Prompts:
    """Every prompt of a run, in order: the `regions` then the BED file's regions when either
    is given, else every record; or the `literal` sequence alone. See the module docstring for
    warnings, empty records and `strict`; `iupac` and `cap` as for `fasta.read_prompts`.
    `literal` may be a list of what a repeated option gave: more than one is refused (none
    would be silently dropped). `shard` splits the run's (prompt, sample) jobs, `samples` a
    prompt (io/shard.py): the prompts kept are those with a job in it. With `circular`, a
    region may run across the origin of its record (io/fasta.py)."""
    inputs = list(inputs or [])
    literal = _one_literal(literal)
    if literal is not None:
        if inputs or regions or bed:
            raise SettingError("{0} takes the place of INPUT, {1} and {2}; give one or the "
                               "other", "literal", "regions", "bed")
        prompts = select_shard([literal_prompt(literal, prompt_tail, iupac)],
                               parse_shard(shard) if shard is not None else None, samples)
        return _checked(Prompts(prompts), shard)
    if not inputs:
        raise SettingError("no input: give FASTA files (or '-' for stdin), or {0} SEQUENCE",
                           "literal")
    beds = read_bed(bed) if bed is not None else []
    wanted = list(regions or []) + [b.to_read(prompt_tail) for b in beds]
    if wanted:
        labels = [None] * (len(wanted) - len(beds)) + [b.where for b in beds]
        got = read_prompts(inputs, wanted, prompt_tail, index_dir=index_dir, iupac=iupac,
                           cap=cap, region_labels=labels, only=shard,
                           region_strands=["+"] * (len(wanted) - len(beds))
                           + [b.strand for b in beds], samples=samples, circular=circular)
        n_plain = len(wanted) - len(beds)
        got = got[:n_plain] + name_bed_prompts(got[n_plain:], beds)
        _unique(got)
        for i, p in enumerate(got):
            p.index = i
        return _checked(Prompts(select_shard(got, parse_shard(shard) if shard else None,
                                             samples)), shard)
    got = read_prompts(inputs, None, prompt_tail, shard=shard, keep_empty=True, iupac=iupac,
                       cap=cap, samples=samples)
    empty = [p for p in got if not p.seq]
    if empty:
        first = f"record {empty[0].id!r} in {empty[0].source} is empty (no sequence)"
        if strict:
            more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
            raise fail_setting(f"{first}{more}; ", "strict", " refuses empty records")
        if len(empty) == len(got) and shard is None:  # a shard may hold only empty records
            raise InputError(first if len(got) == 1 else f"{first}, as is every record: "
                             "nothing to do")
    out = Prompts([p for p in got if p.seq], skipped=[p.id for p in empty])
    empty = out.skipped
    if empty:
        out.warnings.append(f"skipped {_plural(len(empty), 'empty record')} ({_ids(empty)}); "
                            "--strict makes this an error")
    return _checked(out, shard)


def _one_literal(literal: str | Sequence[str] | None) -> str | None:
    """The literal sequence, when the option that gives it was given at most once."""
    if literal is None or isinstance(literal, str):
        return literal
    given = list(literal)
    if len(given) > 1:
        raise SettingError(f"{{0}} is given {len(given)} times; it takes one sequence (put "
                           "several prompts in a FASTA file)", "literal")
    return given[0] if given else None


def _unique(prompts: list[Prompt]) -> None:
    """Ids become FASTA ids: a BED name equal to another prompt's id would be ambiguous."""
    seen: set[str] = set()
    for p in prompts:
        if p.id in seen:
            raise InputError(f"prompt id {p.id!r} is given twice (a BED name and a region?)")
        seen.add(p.id)


def _checked(out: Prompts, shard: str | None) -> Prompts:
    """The warnings about legal but suspicious prompts. A run with no prompt is an error, unless
    it is a shard of a list shorter than the number of shards (a workflow's extra shard writes
    empty outputs and the gather step still works)."""
    if not out.prompts:
        if shard is None:
            raise InputError("no prompt to process")
        out.warnings.append(f"shard {shard} holds no non-empty record: its outputs are empty")
    only_n = [p.id for p in out.prompts if set(p.seq) <= {"N"}]
    if only_n:
        out.warnings.append(f"{_plural(len(only_n), 'prompt')} made only of N (unknown bases): "
                            f"{_ids(only_n)}; the model continues them anyway")
    masked = [p.id for p in out.prompts if p.soft_masked]
    if masked:
        out.warnings.append(f"{_plural(len(masked), 'prompt')} had lower-case (soft-masked) "
                            f"bases, read as upper case: {_ids(masked)}")
    return out
