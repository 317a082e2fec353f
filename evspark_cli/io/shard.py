"""`--shard I/N`: split the jobs of one run across N independent processes or machines.

A run's jobs are its (record, sample) pairs in input order (after regions, before any --resume
skipping): job j = record r x samples + sample s. The split is round-robin: job j belongs to
shard (j mod N) + 1. So the N shards of a run are disjoint and together cover every job exactly
once, each keeps the input order, and their sizes differ by at most one (long and short records
interleave, which balances the work better than contiguous blocks); with one sample per record
a job is a record. A shard reads the records that have a job in it. `evspark merge` puts the
shards' outputs back in the order of the unsharded run (io/merge.py).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

from .streams import fail_setting

__all__ = ["in_shard", "job_in_shard", "parse_shard", "select_shard"]

T = TypeVar("T")
_SHARD = re.compile(r"\s*([0-9]+)\s*/\s*([0-9]+)\s*")


def parse_shard(spec: str | tuple[int, int]) -> tuple[int, int]:
    """`shard`: "I/N" (or an (I, N) pair) with 1 <= I <= N (1-based, like the shard names
    users see), checked."""
    if isinstance(spec, tuple) and len(spec) == 2 and all(isinstance(x, int) for x in spec):
        i, n = spec
        text = f"{i}/{n}"
    else:
        m = _SHARD.fullmatch(spec) if isinstance(spec, str) else None
        if m is None:
            raise fail_setting("", "shard", f" must look like I/N (e.g. 1/4), got {spec!r}")
        i, n, text = int(m.group(1)), int(m.group(2)), spec
    if n < 1 or not 1 <= i <= n:
        raise fail_setting("", "shard", f" {text}: need 1 <= I <= N (shards are numbered from 1)")
    return i, n


def select_shard(items: Sequence[T], shard: tuple[int, int] | None, samples: int = 1) -> list[T]:
    """The records of a shard (I, N) from `parse_shard`: those with a job in it, when each has
    `samples` jobs (`in_shard`); None keeps everything."""
    return [x for i, x in enumerate(items) if in_shard(i, shard, samples)]


def job_in_shard(record: int, sample: int, shard: tuple[int, int] | None,
                 samples: int = 1) -> bool:
    """Whether job (`record`, `sample`) of a run with `samples` per record (0-based indices)
    belongs to `shard` (None: every job does)."""
    return shard is None or (record * samples + sample) % shard[1] == shard[0] - 1


def in_shard(index: int, shard: tuple[int, int] | None, samples: int = 1) -> bool:
    """Whether the record at 0-based `index` has a job in `shard`, `samples` jobs a record."""
    samples = max(samples, 1)  # a count of 0 is refused with the other settings
    if shard is None or samples >= shard[1]:
        return True
    return any(job_in_shard(index, s, shard, samples) for s in range(samples))
