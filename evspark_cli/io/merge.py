"""`evspark merge`: the outputs of a run's shards back into the output of the unsharded run.

A shard's FASTA headers end in `shard=I/N job=J` (generation/records.py): J is the record's place
in the unsharded run's (record, sample) order (io/shard.py). Merging the N shards' FASTA files
orders their records by J and drops those two words, which gives the bytes the unsharded run
writes. Shards of different runs are refused: another N, a shard given twice or missing, a
record twice, or any run-wide header word (model, drafter, sampler settings, seed...) that
differs. Stats files merge the same way by their `job` column; their timing columns are each
shard's own.
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from Bio.SeqIO.FastaIO import SimpleFastaParser

from ..errors import InputError
from .compressed import plain_name
from .writers import FastaOutput, StatsOutput

__all__ = ["MergedShards", "merge_fasta", "merge_stats", "merge_kind"]

RECORD_WORDS = ("prompt_sha256", "new_tokens", "prompt", "job")
"""Header words that belong to one record; every other word is the run's and must agree."""


@dataclass
class MergedShards:
    """What a merge wrote: how many files, shards and records."""

    files: int
    shards: int
    records: int


def _open_text(path: str) -> TextIO:
    """A shard output as text: plain, gzip or BGZF (read by its first bytes, not its name)."""
    try:
        with open(path, "rb") as f:
            magic = f.read(2)
        if magic == b"\x1f\x8b":
            return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
        return open(path, encoding="utf-8")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e})") from None


def merge_kind(path: str) -> str:
    """"fasta" or "stats": what a merge of files like `path` (an output name) writes."""
    ext = os.path.splitext(plain_name(path))[1].lower()
    return "stats" if ext in (".tsv", ".jsonl") else "fasta"


def _line_width(path: str) -> int | None:
    """The line width a shard's FASTA was written with: the first line of the first record
    that takes several lines (None when every record takes one line: any width, or none,
    writes those alike)."""
    with _open_text(path) as f:
        first, lines = None, 0
        try:
            head = next((ln for ln in f if ln.strip()), ">")
        except UnicodeDecodeError:
            head = ""
        if not head.startswith(">"):
            raise InputError(f"{path}: not a FASTA file (merge FASTA and stats files apart; "
                             "a .tsv/.jsonl --output merges stats)")
        for line in f:
            if line.startswith(">"):
                first, lines = None, 0
                continue
            lines += 1
            if lines == 1:
                first = len(line.rstrip("\n"))
            elif lines == 2 and first is not None:
                return first
    return None


def _words(path: str, title: str) -> tuple[str, str, dict[str, str]]:
    """(record id, description, its `key=value` words) of a header evspark generate wrote."""
    rid, _, desc = title.partition(" ")
    words = desc.split()
    if not words or words[0] != "evspark":
        raise InputError(f"{path}: record {rid!r} has a header evspark generate did not write")
    return rid, desc, dict(w.split("=", 1) for w in words[1:] if "=" in w)


def _shard_of(path: str, words: dict[str, str], rid: str) -> tuple[int, int, int]:
    """(I, N, J) from a record's `shard=I/N job=J`."""
    try:
        i, n = (int(x) for x in words["shard"].split("/"))
        j = int(words["job"])
    except (KeyError, ValueError):
        raise InputError(f"{path}: record {rid!r} is not from a shard (its header has no "
                         "shard=I/N job=J): merge the outputs of evspark generate --shard I/N"
                         ) from None
    if not (1 <= i <= n and j >= 0 and j % n == i - 1):
        raise InputError(f"{path}: record {rid!r} has shard={i}/{n} job={j}, which is not a "
                         "job of that shard")
    return i, n, j


def _strip(desc: str) -> str:
    """A shard record's description without its shard words: the unsharded run's."""
    return " ".join(w for w in desc.split() if not w.startswith(("shard=", "job=")))


def _check_shards(seen: dict[int, str], n: int) -> int:
    missing = [i for i in range(1, n + 1) if i not in seen]
    if missing:
        shown = ", ".join(f"{i}/{n}" for i in missing[:5])
        raise InputError(f"shard{'s' if len(missing) > 1 else ''} {shown} "
                         f"{'are' if len(missing) > 1 else 'is'} missing: give the outputs of "
                         f"all {n} shards")
    return n


def merge_fasta(paths: Sequence[str], output: str | None, index: bool = False,
                line_width: int | None = None) -> MergedShards:
    """Merge shard FASTA files into `output` (None: standard output), records in the unsharded
    run's order, written as generate writes (BGZF for a .gz name, `index` as its --index).
    `line_width`: the shards' (default: read from them)."""
    if not paths:
        raise InputError("no shard outputs to merge")
    records: dict[int, tuple[str, str, str]] = {}  # job -> (id, description, sequence)
    by_shard: dict[int, str] = {}  # I -> the file holding it
    run_words: dict[str, str] | None = None
    first_path, n_all = paths[0], None
    widths = {w for w in (_line_width(p) for p in paths) if w is not None}
    if len(widths) > 1:
        raise InputError(f"the shards were written with different line widths "
                         f"({', '.join(map(str, sorted(widths)))}): not one run")
    for path in paths:
        shard_here = None
        with _open_text(path) as f:
            try:
                for title, seq in SimpleFastaParser(f):
                    rid, desc, words = _words(path, title)
                    i, n, j = _shard_of(path, words, rid)
                    if n_all is not None and n != n_all:
                        raise InputError(f"{path}: record {rid!r} is from shard {i}/{n} of a run "
                                         f"split {n} ways, {first_path} from one split "
                                         f"{n_all} ways: shards of different runs")
                    shard_here, n_all = shard_here or i, n
                    if i != shard_here:
                        raise InputError(f"{path}: record {rid!r} is from shard {i}/{n}, the "
                                         f"file's first record from shard {shard_here}/{n}")
                    common = {k: v for k, v in words.items()
                              if k not in RECORD_WORDS and k != "shard"}
                    if run_words is None:
                        run_words = common
                    elif common != run_words:
                        key = next(k for k in sorted(set(common) | set(run_words))
                                   if common.get(k) != run_words.get(k))
                        raise InputError(f"{path}: record {rid!r} has {key}="
                                         f"{common.get(key, '(none)')}, {first_path} has "
                                         f"{key}={run_words.get(key, '(none)')}: shards of "
                                         "different runs")
                    if j in records:
                        raise InputError(f"{path}: record {rid!r} (job {j}) is also in "
                                         "another shard output")
                    records[j] = (rid, _strip(desc), seq)
            except UnicodeDecodeError:
                raise InputError(f"{path}: not a text FASTA file") from None
            except ValueError as e:  # Biopython: not FASTA
                raise InputError(f"{path}: not a FASTA file ({e})") from None
        if shard_here is None:
            continue  # an empty shard (fewer jobs than shards) says nothing
        if shard_here in by_shard:
            raise InputError(f"{path} and {by_shard[shard_here]} are both shard "
                             f"{shard_here}/{n_all}")
        by_shard[shard_here] = path
    if n_all is None:
        raise InputError("the shard outputs hold no record")
    # an empty shard output is fine only where the run has fewer jobs than shards
    if len(by_shard) < n_all and max(records) + 1 >= n_all:
        _check_shards(by_shard, n_all)
    width = line_width if line_width is not None else (widths.pop() if widths else 0)
    with FastaOutput(output, line_width=width, index=index) as out:
        for j in sorted(records):
            out.write(*records[j])
        out.finish()
    return MergedShards(len(paths), len(by_shard), len(records))


def _stats_rows(path: str) -> tuple[list[str], Iterator[dict[str, Any]], str]:
    """(columns, rows, format) of a stats file (TSV or JSONL, plain or compressed)."""
    fmt = "jsonl" if plain_name(path).lower().endswith(".jsonl") else "tsv"
    f = _open_text(path)
    if fmt == "tsv":
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        return list(reader.fieldnames or []), iter(reader), fmt
    rows = [json.loads(line) for line in f if line.strip()]
    return (list(rows[0]) if rows else []), iter(rows), fmt


def merge_stats(paths: Sequence[str], output: str | None) -> MergedShards:
    """Merge shard stats files into `output`, rows in the unsharded run's order (by `job`)."""
    if not paths:
        raise InputError("no shard outputs to merge")
    columns: list[str] | None = None
    rows: dict[int, dict[str, Any]] = {}
    fmt = "tsv"
    kept = ("seed", "mode", "drafter", "gamma", "rule", "batch")
    first: dict[str, Any] = {}
    for path in paths:
        try:
            cols, got, fmt_here = _stats_rows(path)
            for row in got:
                if "job" not in row or row["job"] in (None, ""):
                    raise InputError(f"{path}: no job column: merge the stats of evspark "
                                     "generate --shard I/N")
                if columns is None:
                    columns, fmt = cols, fmt_here
                    first = {k: row.get(k) for k in kept}
                elif cols != columns:
                    raise InputError(f"{path}: its columns differ from {paths[0]}'s")
                other = next((k for k in kept if k != "batch" and row.get(k) != first[k]), None)
                if other is not None:
                    raise InputError(f"{path}: {other}={row.get(other)}, {paths[0]} has "
                                     f"{other}={first[other]}: stats of different runs")
                j = int(row["job"])
                if j in rows:
                    raise InputError(f"{path}: the row of job {j} is also in another file")
                rows[j] = row
        except (ValueError, json.JSONDecodeError) as e:
            raise InputError(f"{path}: not a stats file of evspark generate ({e})") from None
    if columns is None:
        raise InputError("the stats files hold no row")
    with StatsOutput(output, columns, fmt=fmt if output in (None, "-") else None) as out:
        for j in sorted(rows):
            out.write(rows[j])
        out.finish()
    return MergedShards(len(paths), len(paths), len(rows))
