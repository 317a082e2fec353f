"""Outputs by extension: `.gz`/`.bgz` files are written as BGZF, with the indexes samtools reads.

BGZF (blocked gzip) is a valid gzip stream (`zcat` reads it) made of independent blocks of at
most 64 KiB, so `samtools faidx` and pyfaidx can seek in it; its `.gzi` lists where each block
starts in the compressed and in the plain stream, and a FASTA's `.fai` gives every record's
offset in the plain stream. Outputs are still written through a plain-text `.partial` (one
record at a time, resumable, readable); only the finished file is compressed (writers.py).
"""
from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from Bio import bgzf

__all__ = ["COMPRESSED_SUFFIXES", "is_compressed", "plain_name", "write_bgzf", "gzi_bytes",
           "fai_text"]

COMPRESSED_SUFFIXES = (".gz", ".bgz")
_BLOCK = 65280  # plain bytes per block, as bgzip uses (a block must stay under 64 KiB compressed)


def is_compressed(path: str | None) -> bool:
    """Whether an output named `path` is written compressed (BGZF)."""
    return bool(path) and path.lower().endswith(COMPRESSED_SUFFIXES)  # type: ignore[union-attr]


def plain_name(path: str) -> str:
    """`path` without its compression suffix (`stats.tsv.gz` -> `stats.tsv`)."""
    for suffix in COMPRESSED_SUFFIXES:
        if path.lower().endswith(suffix):
            return path[: -len(suffix)]
    return path


def write_bgzf(fd: int, data: bytes) -> list[tuple[int, int]]:
    """Write `data` to the open file `fd` as BGZF (ending with the EOF block samtools checks);
    returns the `.gzi` entries: (compressed, plain) offsets of every block after the first."""
    entries: list[tuple[int, int]] = []
    with os.fdopen(os.dup(fd), "wb") as raw:
        writer = bgzf.BgzfWriter(fileobj=raw)
        for start in range(0, len(data), _BLOCK):
            if start:
                entries.append((raw.tell(), start))
            writer.write(data[start: start + _BLOCK])
            writer.flush()
        writer.close()  # writes the EOF block and closes `raw` (a duplicate of fd)
    return entries


def gzi_bytes(entries: Sequence[tuple[int, int]]) -> bytes:
    """The `.gzi` file of a BGZF stream (htslib's layout: a count, then offset pairs, all
    little-endian uint64)."""
    return struct.pack(f"<Q{2 * len(entries)}Q", len(entries),
                       *(v for pair in entries for v in pair))


def fai_text(data: bytes) -> str:
    """The `.fai` of FASTA bytes as FastaOutput writes them (every line of a record but its
    last the same length): name, length, offset of the first base, bases and bytes per line."""
    rows: list[str] = []
    pos, n = 0, len(data)
    while pos < n:
        end = data.index(b"\n", pos)
        name = data[pos + 1: end].split(None, 1)[0].decode("utf-8")
        start = pos = end + 1
        length, line_bases = 0, 0
        while pos < n and data[pos: pos + 1] != b">":
            end = data.index(b"\n", pos)
            line_bases = line_bases or end - pos
            length += end - pos
            pos = end + 1
        line_bytes = line_bases + 1 if line_bases else 0  # an empty record: 0 and 0, as samtools
        rows.append(f"{name}\t{length}\t{start}\t{line_bases}\t{line_bytes}\n")
    return "".join(rows)
