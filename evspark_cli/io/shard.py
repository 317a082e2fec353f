"""`--shard I/N`: split the prompts of one run across N independent processes or machines.

The split is round-robin by position: the item at 0-based index i (in input order, after regions
and before any --resume skipping) belongs to shard (i mod N) + 1. So the N shards of the same
input list are disjoint and together cover every item exactly once, each shard keeps the input
order, and shard sizes differ by at most one (long and short records interleave, which balances
the work better than contiguous blocks).
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TypeVar

from .streams import fail_setting

__all__ = ["in_shard", "parse_shard", "select_shard"]

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


def select_shard(items: Sequence[T], shard: tuple[int, int] | None) -> list[T]:
    """The items of a shard (I, N) from `parse_shard`: index i goes to shard (i mod N) + 1;
    None keeps everything."""
    if shard is None:
        return list(items)
    i, n = shard
    return list(items[i - 1 :: n])


def in_shard(index: int, shard: tuple[int, int] | None) -> bool:
    """Whether the item at 0-based `index` belongs to `shard` (None: every item does)."""
    return shard is None or index % shard[1] == shard[0] - 1
