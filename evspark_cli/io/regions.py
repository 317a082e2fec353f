"""Where prompts come from besides whole records: region strings, BED files, a literal sequence.

Region strings follow samtools (htslib's region grammar), so a region a user copies from a
genome browser or a samtools command means the same thing here:

- `ID`, `ID:START`, `ID:START-END`, `ID:START-` and `ID:-END`; 1-based and inclusive; commas
  in numbers are ignored (`chr1:1,000-2,000`).
- A record whose name itself looks like a range (`chr1:5` next to `chr1`) makes the string
  ambiguous: that is an error naming both readings, and `{chr1:5}` (the record) or `{chr1}:5`
  (the range) says which is meant.
- The prompt's id is the region written the one canonical way, `ID:START-END` with the end
  filled in and no commas, or `ID` for a whole record. Random numbers are keyed by that id,
  so `chr1:1,001-2,000` and `chr1:1001-2000` continue identically, whoever extracted them.

BED files are 0-based and half-open: line `chr1 1000 2000` is `chr1:1001-2000`. The name
column, when present (and not "."), becomes the prompt's id; the random key stays the region
(`Prompt.key`), so a named BED line continues exactly like the same `--region`. Header lines are
those starting with `#` or whose first word is exactly `track` or `browser` (a contig named
`track1` is a region); coordinates are plain decimal digits (no sign, spaces, commas, `_` or
exponent), and an error names the file and line (`regions.bed line 3: ...`). A sixth column
`-` (strand) makes the prompt the region's reverse complement, id `chrom:START-END(-)`, as
`bedtools getfasta -s` and `samtools faidx -i` give it; `+` and `.` read the forward strand.
"""
from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import InputError
from .streams import fail, open_failure
from .types import Prompt, Region

__all__ = ["LITERAL_ID", "BedRegion", "parse_region", "candidate_names", "resolve_region",
           "read_bed", "name_bed_prompts"]

LITERAL_ID = "prompt"
"""The id of a `--prompt SEQUENCE` (and the name its random numbers are keyed by)."""

_NUMBER = r"[0-9][0-9,]*"
_COORDS = re.compile(
    rf"^(?:(?P<start>{_NUMBER})(?:-(?P<end>{_NUMBER})?)?|-(?P<only_end>{_NUMBER}))$")
_BED_HEADERS = ("track", "browser")  # first words of header lines (and "#...")
_BED_COORD = re.compile(r"[0-9]+|-[1-9][0-9]*")  # a sign only to say "start >= 0" of a negative one
_USAGE = "expected ID, ID:START-END, ID:START or {ID} (1-based, inclusive; e.g. chr1:1,000-2,000)"
_REGION = re.compile(r"^(?P<name>.+):(?P<start>[0-9][0-9,]*)(?:-(?P<end>[0-9][0-9,]*)?)?$")


@dataclass(frozen=True)
class BedRegion:
    """One BED line: the region as a samtools string (1-based, inclusive) and its name."""

    region: str  # "{chrom}:START-END": braces keep a chrom with ':' in it one name
    canonical: str  # "chrom:START-END" ("...(-)" on the reverse strand), the prompt's key
    name: str | None
    where: str  # "file.bed line 12", for messages
    chrom: str = ""
    start: int = 0  # 1-based, inclusive
    end: int = 0
    strand: str = "+"  # "-": the prompt is the region's reverse complement ("." reads as +)

    def to_read(self, tail: int | None) -> str:
        """The region whose bases make the prompt: on the reverse strand a tail of N bases is
        the reverse complement of the region's first N."""
        if self.strand != "-" or tail is None or self.end - self.start + 1 <= tail:
            return self.region
        return f"{{{self.chrom}}}:{self.start}-{self.start + tail - 1}"


def _fail(message: str) -> InputError:
    return InputError(" ".join(message.split()))


def _coords(text: str, region: str, circular: bool = False) -> tuple[int, int | None]:
    """START[-[END]] or -END -> (start, end or None for "to the end of the record"); with
    `circular`, START > END is a region across the origin (io/fasta.py reads it)."""
    m = _COORDS.match(text)
    if m is None:
        raise _fail(f"malformed region {region!r}: {_USAGE}")
    if m.group("only_end") is not None:
        start, end = 1, int(m.group("only_end").replace(",", ""))
    else:
        start = int(m.group("start").replace(",", ""))
        end = int(m.group("end").replace(",", "")) if m.group("end") else None
    if start < 1:
        raise _fail(f"region {region!r}: start must be >= 1 (coordinates are 1-based), "
                    f"got {start}")
    if end is not None and start > end and not circular:
        raise _fail(f"region {region!r}: start {start} is after end {end} (--circular reads "
                    "it across the origin of a circular record)")
    return start, end


def _range_split(text: str) -> tuple[str, str] | None:
    """`NAME:COORDS` split at the last ':' when what follows it is coordinates."""
    name, sep, coords = text.rpartition(":")
    if not sep or not name or _COORDS.match(coords) is None:
        return None
    return name, coords


def candidate_names(text: str) -> set[str]:
    """Every record name a region string could refer to (to know what to read from a stream
    before the ambiguity can be judged)."""
    if text.startswith("{") and "}" in text:
        return {text[1:text.index("}")]}
    names = {text}
    split = _range_split(text)
    if split is not None:
        names.add(split[0])
    return names


def resolve_region(text: str, is_record: Callable[[str], bool],
                   circular: bool = False) -> Region:
    """The region a samtools-style string names, given which record names exist (with
    `circular`, START > END is allowed: a region across the origin).

    Raises InputError for a malformed or ambiguous string; a name that matches no record is
    returned as is (the caller names the inputs it looked in).
    """
    if not isinstance(text, str) or not text or any(c.isspace() for c in text):
        raise _fail(f"malformed region {text!r}: {_USAGE} (no spaces)")
    if text.startswith("{"):
        close = text.find("}")
        if close <= 1:
            raise _fail(f"malformed region {text!r}: {{ID}} needs a name and a closing '}}'")
        name, rest = text[1:close], text[close + 1:]
        if not rest:
            return Region(text, name, None, None)
        if not rest.startswith(":"):
            raise _fail(f"malformed region {text!r}: after {{ID}} only :START-END may follow")
        start, end = _coords(rest[1:], text, circular)
        return Region(text, name, start, end)
    split = _range_split(text)
    whole = is_record(text)
    if whole and split is not None and is_record(split[0]):
        name, coords = split
        raise _fail(f"region {text!r} is ambiguous: it names record {text!r} and a range of "
                    f"record {name!r}; use {{{text}}} for the record or {{{name}}}:{coords} "
                    "for the range")
    if whole or split is None:
        if ":" in text and not whole:
            raise _fail(f"malformed region {text!r}: {_USAGE}")
        return Region(text, text, None, None)
    start, end = _coords(split[1], text, circular)
    return Region(text, split[0], start, end)


def parse_region(text: str) -> Region:
    """Parse `ID`, `ID:START-END` or `ID:START` alone, without knowing the records (commas
    allowed in numbers).

    An `ID` containing ':' that is not followed by valid coordinates is reported as malformed
    here; `resolve_region`, which knows the record names, is what reading regions uses.
    """
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise fail(f"malformed region {text!r}: expected ID, ID:START-END or ID:START (no spaces)")
    m = _REGION.match(text)
    if m is None:
        if ":" in text:
            raise fail(
                f"malformed region {text!r}: expected ID, ID:START-END or ID:START "
                "(1-based, inclusive; e.g. chr1:1,000-2,000)"
            )
        return Region(text, text, None, None)
    start_s = m.group("start").replace(",", "")
    end_g = m.group("end")
    if not start_s or (end_g is not None and not end_g.replace(",", "")):
        raise fail(f"malformed region {text!r}: coordinates must be numbers")
    start = int(start_s)
    end = int(end_g.replace(",", "")) if end_g is not None else None
    if start < 1:
        raise fail(f"region {text!r}: start must be >= 1 (coordinates are 1-based), got {start}")
    if end is not None and start > end:
        raise fail(f"region {text!r}: start {start} is after end {end}")
    return Region(text, m.group("name"), start, end)


# --------------------------------------------------------------------------- BED


def _bed_lines(path: str) -> Iterator[tuple[int, str]]:
    try:
        with open(path, "rb") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
        opener = gzip.open if gz else open
        with opener(path, "rt", encoding="utf-8-sig", newline=None) as f:  # type: ignore[operator]
            for lineno, line in enumerate(f, 1):
                yield lineno, line.rstrip("\n")
    except UnicodeDecodeError:
        raise _fail(f"{path}: not a text BED file (not UTF-8)") from None
    except OSError as e:
        raise open_failure(path, e, "BED", "read") from None
    except EOFError as e:  # a truncated gzip stream
        raise _fail(f"{path}: cannot read ({e})") from None


def read_bed(path: str) -> list[BedRegion]:
    """The regions of a BED file, in file order (BED3 or more columns; header, `track`,
    `browser`, comment and blank lines skipped)."""
    out: list[BedRegion] = []
    for lineno, line in _bed_lines(path):
        where = f"{path} line {lineno}"
        line = line.rstrip()  # trailing spaces or tabs end a line; they are no column
        if not line.strip() or line.startswith("#") or line.split()[0] in _BED_HEADERS:
            continue
        cols = line.split("\t") if "\t" in line else line.split()
        if len(cols) < 3:
            raise _fail(f"{where}: a BED line needs at least 3 columns (chrom, start, end), "
                        f"got {len(cols)}")
        chrom = cols[0].strip()
        # int() would also take ' 5', '+5', '1_0' and other scripts' digits: BED has digits
        if not (_BED_COORD.fullmatch(cols[1]) and _BED_COORD.fullmatch(cols[2])):
            raise _fail(f"{where}: start and end must be integers (digits only), got "
                        f"{cols[1]!r} and {cols[2]!r}")
        start0, end = int(cols[1]), int(cols[2])
        if not chrom or any(c.isspace() for c in chrom):
            raise _fail(f"{where}: empty or malformed chromosome name {chrom!r}")
        if start0 < 0 or end <= start0:
            raise _fail(f"{where}: BED start {start0} and end {end} do not make a region "
                        "(0-based, half-open: 0 <= start < end)")
        name = cols[3].strip() if len(cols) > 3 else ""
        if name and any(c.isspace() for c in name):
            raise _fail(f"{where}: name {name!r} has whitespace (it becomes a FASTA id)")
        strand = cols[5].strip() if len(cols) > 5 else "+"
        if strand not in ("+", "-", "."):
            raise _fail(f"{where}: strand (column 6) must be +, - or ., got {strand!r}")
        strand = "-" if strand == "-" else "+"
        canonical = f"{chrom}:{start0 + 1}-{end}" + ("(-)" if strand == "-" else "")
        out.append(BedRegion(f"{{{chrom}}}:{start0 + 1}-{end}", canonical,
                             name if name and name != "." else None, where, chrom, start0 + 1,
                             end, strand))
    if not out:
        raise _fail(f"{path}: no regions (only blank, comment, track or browser lines)")
    return out


def name_bed_prompts(prompts: list[Prompt], beds: list[BedRegion]) -> list[Prompt]:
    """Prompts read through `beds`' regions (`BedRegion.to_read`): a reverse-strand line's
    bases reverse-complemented (as `bedtools getfasta -s` and `samtools faidx -i` give them)
    with id `chrom:START-END(-)`; then renamed by the BED name column where there is one, the
    random key staying the region."""
    from dataclasses import replace

    from Bio.Seq import reverse_complement

    seen: dict[str, str] = {}
    out: list[Prompt] = []
    for p, b in zip(prompts, beds):
        if b.strand == "-":
            span = p.span or (b.chrom, b.start, b.end)
            p = replace(p, id=b.canonical, seq=reverse_complement(p.seq), span=span, strand="-")
        if b.name is None:
            out.append(p)
            continue
        if b.name in seen:
            raise _fail(f"{b.where}: name {b.name!r} is also used at {seen[b.name]}; names "
                        "become FASTA ids and must be unique")
        seen[b.name] = b.where
        out.append(replace(p, id=b.name, key=p.key or p.id))
    return out
