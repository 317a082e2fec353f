"""Prompts from FASTA records: parsed by Biopython, held to EvSpark's alphabet and IUPAC policy.

Records are parsed by Biopython's `SimpleFastaParser`, run over the checked, bounded lines of
io/streams.py (which already refused binary data, bad encodings and text before the first
header). On top of it, EvSpark's policy: a record's id is its header's first word; its bases
must be IUPAC letters (any case: lower-case is soft-masking, upper-cased here; U is read as
T; `iupac` says what the ambiguity codes become, alphabet.py); empty records, empty headers
and duplicate ids are refused. Regions are read through io/indexed.py, their syntax is
io/regions.py's.

Every problem with the user's input becomes one `InputError` line that names the file, the record
and the position, because the CLI prints exactly that line and exits 2 (the CLI contract in docs/).
"""
from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Protocol

from .indexed import MemorySource, Source, open_source
from .regions import candidate_names, resolve_region
from .sequences import check_iupac, check_tail, clean, iupac_key
from .shard import in_shard, parse_shard, select_shard
from .streams import PIECE, CheckedLines, fail, open_lines
from .types import LengthCap, Prompt

__all__ = ["MAX_HEADER", "read_prompts", "iter_records"]

_WHITESPACE = str.maketrans("", "", " \t\r\n\v\f")
MAX_HEADER = 1 << 20
"""The longest header line read (1 Mi characters): anything longer is not a FASTA header."""


# --------------------------------------------------------------------------- parsing

# SimpleFastaParser holds a record whole and hands it over when the next header line comes. So
# that a record of any length reads in bounded memory, and every check fires when the input is
# read that far (not a record later), the parser reads the checked pieces with marker header
# lines added: `_PART` after every header and every `PIECE` bases (what follows it is more of
# the record's bases, handed over as soon as the next marker is read), `_END` where a record
# ends (the next header's first piece, or the end of the input). Their titles hold a NUL byte,
# which io/streams.py never lets through, so no header of the input can look like one.
_PART = "\x00"
_END = "\x00."
_GUARD = "\x00"
"""Added where the parser would misread a line of bases, dropped from what it hands over: before
one that starts with '>' (the rest of a long line, not a header) and after one that ends in
whitespace the parser would strip (NBSP, U+2028...: an invalid character here)."""


def _parser_lines(lines: CheckedLines) -> Iterator[str]:
    """The lines SimpleFastaParser reads: headers joined from their pieces (at most
    `MAX_HEADER` characters), a record's bases without whitespace as one line per batch of
    about `PIECE` bases (the parser joins lines one by one: fewer, longer ones read faster),
    and the marker lines."""
    header: list[str] | None = None  # pieces of a header line still being read
    bases: list[str] = []  # the batch being read, whitespace removed
    batch = 0  # its length
    for piece, starts in lines:
        if starts and piece.startswith(">"):
            if bases:
                yield _bases_line(bases)
                bases, batch = [], 0
            yield ">" + _END  # the record before ends here; the `_PART` after it makes the
            yield ">" + _PART  # parser hand the end over before the header is read
            header = [piece[1:]]
        elif header is not None:
            header.append(piece)
            if sum(map(len, header)) > MAX_HEADER:
                raise fail(f"{lines.path}: the header at line {lines.lineno} is longer than "
                           f"{MAX_HEADER:,} characters (not FASTA?)")
        else:
            text = piece.translate(_WHITESPACE)
            if text:
                bases.append(text)
                batch += len(text)
                if batch >= PIECE:
                    yield _bases_line(bases)
                    yield ">" + _PART
                    bases, batch = [], 0
        if header is not None and header[-1].endswith("\n"):
            yield ">" + "".join(header)
            yield ">" + _PART
            header = None
    if bases:
        yield _bases_line(bases)
    if header is not None:  # the input ends inside its last header line
        yield ">" + "".join(header)
        yield ">" + _PART
    yield ">" + _END


def _bases_line(pieces: list[str]) -> str:
    """Pieces of bases as one line the parser reads back unchanged (`_GUARD`)."""
    line = "".join(pieces)
    if line[0] == ">":
        line = _GUARD + line
    if line[-1].isspace():
        line += _GUARD
    return line


class _Sink(Protocol):
    """Where a record's sequence goes as it is read, a batch of bases (no whitespace) at a
    time."""

    def add(self, bases: str) -> None: ...

    def value(self) -> str: ...


class _Raw:
    """The whole sequence, whitespace removed, unchecked (regions check what they fetch)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, bases: str) -> None:
        self.parts.append(bases)

    def value(self) -> str:
        return "".join(self.parts)


class _Checked:
    """A record's bases checked and cleaned (`clean`) as they stream in, a batch of about
    `PIECE` bases at a time. With `tail`, only the last `tail` bases are kept, so a record of any
    length reads in bounded memory; without, a record longer than `cap` is refused as soon as
    it is."""

    def __init__(self, what: str, iupac: str, key: int, tail: int | None,
                 cap: LengthCap | None) -> None:
        self.what, self.iupac, self.key, self.tail, self.cap = what, iupac, key, tail, cap
        self.pending: list[str] = []
        self.pending_len = 0
        self.parts: deque[str] = deque()
        self.kept = 0
        self.seen = 0
        self.soft_masked = False  # lower-case bases seen (upper-cased by `clean`)

    def add(self, bases: str) -> None:
        self.pending.append(bases)
        self.pending_len += len(bases)
        if self.pending_len >= PIECE:
            self._flush()

    def _flush(self) -> None:
        text = "".join(self.pending)
        self.soft_masked = self.soft_masked or text != text.upper()
        bases = clean(text, self.what, self.seen, self.iupac, self.key)
        self.pending, self.pending_len = [], 0
        self.seen += len(bases)
        if self.tail is None and self.cap is not None and self.seen > self.cap.bases:
            raise self.cap.refusal(self.what)
        self.parts.append(bases)
        self.kept += len(bases)
        while self.tail is not None and self.kept - len(self.parts[0]) >= self.tail:
            self.kept -= len(self.parts.popleft())

    def value(self) -> str:
        self._flush()
        seq = "".join(self.parts)
        return seq[-self.tail:] if self.tail is not None else seq


def _records(path: str, sink: Callable[[str], _Sink | None]
             ) -> Iterator[tuple[str, str, str | None]]:
    """(id, description, sequence) for every record, the sequence as `sink(id)` collected it
    (None when it returned None: the record's bases are dropped as read); raises on
    structure."""
    from Bio.SeqIO.FastaIO import SimpleFastaParser  # lazy: Bio.SeqIO takes a while to import

    with contextlib.ExitStack() as stack:
        lines = open_lines(path, stack)
        n = 0
        record: tuple[str, str, _Sink | None] | None = None
        for title, bases in SimpleFastaParser(_parser_lines(lines)):
            if title == _PART:
                if bases and record is not None and record[2] is not None:
                    record[2].add(bases.replace(_GUARD, "") if _GUARD in bases else bases)
            elif title == _END:
                if record is not None:
                    yield _finished(record)
                record = None
            else:
                n += 1
                record = _start_record(path, n, title, sink)
        if n == 0:
            what = "is empty" if lines.lineno == 0 else "contains only blank lines"
            raise fail(f"{path}: {what}: no FASTA records")


def _start_record(path: str, n: int, title: str, sink: Callable[[str], _Sink | None]
                  ) -> tuple[str, str, _Sink | None]:
    parts = title.rstrip().split(None, 1)
    if not parts:
        raise fail(f"{path}: record #{n} has an empty header (no ID after '>')")
    rid = parts[0]
    return rid, parts[1].strip() if len(parts) > 1 else "", sink(rid)


def _finished(record: tuple[str, str, _Sink | None]) -> tuple[str, str, str | None]:
    rid, desc, sink = record
    return rid, desc, sink.value() if sink is not None else None


def _check_inputs(inputs: list[str]) -> None:
    """Input list sanity that needs no I/O: non-empty, stdin at most once."""
    if not inputs:
        raise fail("no input FASTA given")
    if sum(1 for p in inputs if p == "-") > 1:
        raise fail("'-' (standard input) can be given only once")


def _record_dup(rid: str, path: str, seen: dict[str, str]) -> None:
    """Duplicate ids would make outputs and --resume ambiguous, so they are an error."""
    if rid in seen:
        where = f"twice in {path}" if seen[rid] == path else f"in {seen[rid]} and in {path}"
        raise fail(f"duplicate record id {rid!r} ({where})")
    seen[rid] = path


class _Every:
    """Every record is wanted (a reference genome, whose contigs a VCF names later)."""

    def __contains__(self, rid: object) -> bool:
        return True


def open_reference(path: str, index_dir: str | None = None) -> Source:
    """A reference genome for random access: pyfaidx over a plain or BGZF file (its index in
    the per-user cache unless a fresh one sits beside it), else read once into memory."""
    return open_source(path, index_dir, lambda: _memory(path, _Every()))


def _memory(path: str, wanted: Container[str]) -> MemorySource:
    """An input read once into memory, keeping the `wanted` records' bases (unchecked: a region
    checks what it fetches) and refusing duplicate ids."""
    seen: dict[str, str] = {}

    def records() -> Iterator[tuple[str, str | None]]:
        for rid, _desc, seq in _records(path, lambda rid: _Raw() if rid in wanted else None):
            _record_dup(rid, path, seen)
            yield rid, seq

    return MemorySource(path, records())


def _read_regions(
    inputs: list[str], regions: list[str], tail: int | None, index_dir: str | None,
    iupac: str = "keep", cap: LengthCap | None = None,
    labels: Sequence[str | None] | None = None, only: tuple[int, int] | None = None,
    strands: Sequence[str] | None = None, samples: int = 1, circular: bool = False,
) -> list[Prompt]:
    """Extract the regions, in the order given, looking each record up across all inputs; with
    a tail, only the tail of each region is fetched. `labels[i]`, when not None, names region
    i in messages instead of `region 'TEXT'` (a BED file's line). Regions outside the shard
    `only` are checked but not held (`read_prompts`). `strands[i]` ("+"/"-") tells a region
    and its reverse complement apart, which may both be asked for (io/regions.py)."""
    texts = list(regions)
    names = list(labels or [])
    names += [None] * (len(texts) - len(names))
    sides = list(strands or []) + ["+"] * (len(texts) - len(strands or []))
    for t in texts:
        if not isinstance(t, str) or not t or any(c.isspace() for c in t):
            raise fail(f"malformed region {t!r}: expected ID, ID:START-END or ID:START "
                       "(no spaces)")
    wanted: set[str] = set().union(*(candidate_names(t) for t in texts))
    with contextlib.ExitStack() as stack:
        owner: dict[str, Source] = {}
        seen: dict[str, str] = {}
        for path in inputs:
            src = open_source(path, index_dir, lambda path=path: _memory(path, wanted))
            stack.callback(src.close)
            for rid in src.ids():
                _record_dup(rid, path, seen)
                owner[rid] = src
        prompts: list[Prompt] = []
        given: set[tuple[str, str]] = set()
        for index, (text, label, side) in enumerate(zip(texts, names, sides)):
            called = label or f"region {text!r}"
            ours = in_shard(index, only, samples)
            region = resolve_region(text, owner.__contains__, circular)
            src = owner.get(region.name)
            if src is None:
                more = f" (+{len(inputs) - 3} more)" if len(inputs) > 3 else ""
                shown = ", ".join(inputs[:3]) + more
                raise fail(f"{called}: no record {region.name!r} in {shown}")
            length = src.length(region.name)
            if length == 0:
                raise fail(f"record {region.name!r} in {src.path} is empty (no sequence)")
            if region.start is None:
                start, end = 1, length
                rid = region.name
            else:
                start = region.start
                end = region.end if region.end is not None else length
                if circular and start <= length < end:  # running past the end: wraps
                    end -= length
                    if end >= start:
                        raise fail(f"{called}: longer than the circular record "
                                   f"{region.name!r} ({length} bp) in {src.path}")
                if start > length or end > length:
                    bad = max(start, end)
                    hint = "" if circular else " (--circular wraps a region around the origin)"
                    raise fail(
                        f"{called}: position {bad} is past the end of record "
                        f"{region.name!r} ({length} bp) in {src.path}{hint}"
                    )
                rid = f"{region.name}:{start}-{end}"
            if (rid, side) in given:
                where = f"{label}: " if label else ""
                raise fail(f"{where}region {rid!r} is given more than once")
            given.add((rid, side))
            what = f"record {region.name!r} in {src.path}"
            if rid != region.name:
                what += f" (region {rid})"
            keep = tail if ours else 1  # another shard's region: only its last base is read
            size = (end - start + 1) % length or length  # a wrapped region: start > end
            if keep is None and cap is not None and size > cap.bases:
                raise cap.refusal(what)
            first = (end - min(size, keep or size)) % length + 1  # the first base kept
            raw = src.fetch(region.name, first, end) if first <= end else \
                src.fetch(region.name, first, length) + src.fetch(region.name, 1, end)
            seq = clean(raw, what, first - 1, iupac, iupac_key(region.name))
            if not seq:  # e.g. a record of blank lines that an index counted as bases
                raise fail(f"{what} is empty (no sequence)")
            if first <= end:
                first = end - len(seq) + 1
            span = None if (first, end) == (1, length) else (region.name, first, end)
            prompts.append(Prompt(rid, "", seq, f"{src.path}:{rid}", span=span,
                                  soft_masked=raw != raw.upper()))
        return prompts


# --------------------------------------------------------------------------- entry points


def iter_records(path: str | os.PathLike[str]) -> Iterator[Prompt]:
    """Every record of one FASTA input (plain, gzip, BGZF or '-'), validated and upper-cased,
    one at a time: a reader of whole genomes (training) holds one record's text at a time.

    Empty records are yielded (with an empty sequence); `read_prompts` refuses them.
    """
    path = os.fspath(path)
    made: dict[str, _Checked] = {}

    def sink(rid: str) -> _Checked:
        made[rid] = _Checked(f"record {rid!r} in {path}", "keep", 0, None, None)
        return made[rid]

    for rid, desc, seq in _records(path, sink):
        yield Prompt(rid, desc, seq or "", path, soft_masked=made.pop(rid).soft_masked)


def read_prompts(
    inputs: list[str],
    regions: list[str] | None = None,
    prompt_tail: int | None = None,
    index_dir: str | None = None,
    shard: str | tuple[int, int] | None = None,
    iupac: str = "keep",
    cap: LengthCap | None = None,
    keep_empty: bool = False,
    region_labels: Sequence[str | None] | None = None,
    only: str | tuple[int, int] | None = None,
    region_strands: Sequence[str] | None = None,
    samples: int = 1,
    circular: bool = False,
) -> list[Prompt]:
    """Read, validate and upper-case every record of every input (or only `regions`).

    Without regions, records come in input order; with regions, only the regions, in the order
    given, with id `ID:START-END` (or `ID` for a whole record) and an empty description.
    `prompt_tail` keeps the last N bases (streaming: only those are held); without it a record
    longer than `cap` is refused as soon as it is read that far. U becomes T and `iupac`
    (alphabet.py) says what the other ambiguity codes become. `shard` ("I/N") keeps the prompts
    with a job in the shard, each prompt having `samples` jobs (io/shard.py; one sample: every
    N-th prompt from the I-th); each prompt's `index` is its place before the shard. An empty
    record is an error, or with `keep_empty` a prompt with no bases (io/prompts.py skips them
    with a warning); io/regions.py has the region grammar. `region_labels[i]`, when given and
    not None, names region i in messages (`regions.bed line 3`). The prompts outside the shard
    `only` (default: `shard`) are checked as the others are but neither held nor held to
    `cap`, so a record too long for the model fails only the shard that decodes it. With
    `circular`, a region may run across the origin of its record (START > END, or an END past
    the record's end, as BED gives it). Raises
    InputError with a one-line message.
    """
    tail = check_tail(prompt_tail)
    check_iupac(iupac)
    shard_t = parse_shard(shard) if shard is not None else None
    only_t = parse_shard(only) if only is not None else shard_t
    inputs = [os.fspath(p) for p in inputs]  # Path objects are fine too
    _check_inputs(inputs)
    if regions:
        index = None if index_dir is None else os.fspath(index_dir)
        got = _read_regions(inputs, list(regions), tail, index, iupac, cap, region_labels,
                            only_t, region_strands, samples, circular)
        for i, p in enumerate(got):
            p.index = i
        return select_shard(got, shard_t, samples)
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for path in inputs:
        made: dict[str, _Checked] = {}

        def sink(rid: str, path: str = path) -> _Checked:
            ours = in_shard(len(prompts), only_t, samples)  # the index this record will have
            made[rid] = _Checked(f"record {rid!r} in {path}", iupac, iupac_key(rid),
                                 tail if ours else 1, cap if ours else None)
            return made[rid]

        for rid, desc, seq in _records(path, sink):
            if not seq and not keep_empty:
                raise fail(f"record {rid!r} in {path} is empty (no sequence)")
            _record_dup(rid, path, seen)
            checked = made.pop(rid)
            seq = seq or ""
            span = (rid, checked.seen - len(seq) + 1, checked.seen) \
                if len(seq) < checked.seen else None
            prompts.append(Prompt(rid, desc, seq, path, span=span,
                                  soft_masked=checked.soft_masked, index=len(prompts)))
    return select_shard(prompts, shard_t, samples)
