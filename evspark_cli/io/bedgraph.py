"""A scored record's per-base track as bedGraph: where the model is surprised, base by base.

One line per scored base (every base of a record but its first, which has no context):
`chrom start end value`, 0-based half-open, on the coordinates of the input (a region's record
and its positions, the forward strand for a reverse-strand region), sorted by position. The
value is the base's surprisal, -log2 p(base | the bases before it), in bits: 2 is what a
uniform guess over A/C/G/T costs, and low values are what the model predicted well.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TextIO

from .types import Prompt

__all__ = ["TRACK_LINE", "write_track"]

TRACK_LINE = ('track type=bedGraph name="evspark surprisal" description="-log2 p(base), bits, '
              'from evspark score"\n')


def write_track(out: TextIO, prompt: Prompt, per_base: Sequence[float]) -> None:
    """The lines of `prompt` (its `per_base[i]`: the log-likelihood, nats, of base i + 1)."""
    chrom, first, last = prompt.span or (prompt.id, 1, len(prompt.seq))
    # a region across the origin of a circular record (first > last) wraps at its length
    size = len(prompt.seq) + first - 1 - last if first > last else math.inf
    minus = prompt.strand == "-"
    scale = -1 / math.log(2)
    rows = []
    for i, ll in enumerate(per_base, 1):
        at = (last - 1 - i) if minus else (first - 1 + i)  # 0-based on the input's forward strand
        rows.append((int(at % size), ll * scale))
    rows.sort()
    out.writelines(f"{chrom}\t{at}\t{at + 1}\t{bits:.4f}\n" for at, bits in rows)
