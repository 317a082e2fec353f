"""The KV cache's class layout (kvcache.py): rows in size-class shelves hold what a dense cache
holds, through every way rows come and go, in the memory the estimate says."""
from __future__ import annotations

import random

import pytest
import torch

from evspark_cli.model.kvcache import (
    KVCache,
    class_layout_bytes,
    shelf_capacity,
    size_class,
)

H, DH = 2, 4


def _row_cache(need: int, length: int, seed: int) -> KVCache:
    """A one-row dense cache of `need` positions holding random keys up to `length`."""
    g = torch.Generator().manual_seed(seed)
    c = KVCache(1, need, H, DH, torch.float32, "cpu")
    c.write((0,), torch.randn(1, H, length, DH, generator=g), torch.randn(1, H, length, DH,
                                                                          generator=g))
    return c


def _live(cache: KVCache, lengths) -> list[torch.Tensor]:
    return [cache.row(b)[0][:, :n].clone() for b, n in enumerate(lengths)]


def test_size_classes():
    assert size_class(1) == size_class(1024) == 1024
    assert size_class(1025) == 2048
    assert size_class(8461) == 16384
    assert shelf_capacity(8461) == 10240  # an eighth of the class: 2048-position steps
    assert shelf_capacity(300) == 384
    assert shelf_capacity(300, have=1000) == 1000


def test_rows_of_different_needs_live_in_their_own_shelves():
    needs = [300, 5000, 320, 9000, 5100]
    parts = [(_row_cache(n, n // 2, i), (n // 2,)) for i, n in enumerate(needs)]
    cache = KVCache.cat([(c, [0], n) for c, n in parts])
    assert not cache.dense and cache.batch == 5
    assert sorted(s.size for s in cache.shelves) == [1024, 8192, 16384]
    for b, (src, (n,)) in enumerate(parts):
        assert torch.equal(cache.row(b)[0][:, :n], src.row(0)[0][:, :n])
    # a dense cache would hold every row at the longest need
    dense_bytes = len(needs) * max(needs) * cache.bytes_per_position()
    assert cache.nbytes() < 0.6 * dense_bytes


@pytest.mark.parametrize("seed", range(4))
def test_rows_coming_and_going_keep_every_live_position(seed):
    """Random joins (put into finished slots), removals and block writes at ragged positions:
    the class layout and the dense layout hold the same live positions in every row."""
    rnd = random.Random(seed)
    needs = [rnd.choice([40, 700, 1500, 3000]) for _ in range(6)]
    rows = [_row_cache(n, n // 3, 10 * seed + i) for i, n in enumerate(needs)]
    lengths = [n // 3 for n in needs]
    classes = KVCache.cat([(c, [0], (n,)) for c, n in zip(rows, lengths)])
    dense = KVCache.cat([(c, [0], (n,)) for c, n in zip(rows, lengths)])
    dense.reserve(max(needs) + 64)
    assert dense.dense
    g = torch.Generator().manual_seed(seed)
    for step in range(30):
        op = rnd.random()
        B = classes.batch
        if op < 0.3 and B > 1:
            row = rnd.randrange(B)
            classes.remove(row, tuple(lengths))
            dense.remove(row, tuple(lengths))
            last = lengths.pop()
            if row < len(lengths):
                lengths[row] = last
        elif op < 0.6:
            need = rnd.choice([50, 900, 2500])
            new = _row_cache(need, need // 2, 1000 + step)
            slot = rnd.randrange(B)
            classes.put([slot], new, [0], (need // 2,), tuple(lengths))
            dense.put([slot], new, [0], (need // 2,), tuple(lengths))
            lengths[slot] = need // 2
        else:
            n = rnd.choice([1, 5, 13])
            k = torch.randn(B, H, n, DH, generator=g)
            v = torch.randn(B, H, n, DH, generator=g)
            classes.write(tuple(lengths), k, v)
            dense.write(tuple(lengths), k, v)
            lengths = [t + rnd.randint(1, n) for t in lengths]
        for b, (a, d) in enumerate(zip(_live(classes, lengths), _live(dense, lengths))):
            assert torch.equal(a, d), f"step {step}: row {b} differs"
        for shelf in classes.shelves:  # every shelf's live rows fill its first slots
            assert shelf.rows and all(classes.at[r] == (shelf, s) for s, r in
                                      enumerate(shelf.rows))


def test_the_estimate_is_what_the_shelves_hold():
    """`class_layout_bytes` (the memory check's) equals the bytes of a cache built from rows of
    those needs, and the ragged attention calls cover every row once."""
    needs = [300, 320, 5000, 9000, 5100, 700, 1500, 2100, 64]
    cache = KVCache.cat([(_row_cache(n, n // 2, i), [0], (n // 2,))
                         for i, n in enumerate(needs)])
    held, growth = class_layout_bytes(needs, cache.bytes_per_position())
    assert cache.nbytes() <= held
    assert held - cache.nbytes() <= growth  # free slots of shelves that doubled, at most
    t0 = tuple(n // 2 for n in needs)
    rows = []
    for call in cache.calls(t0, 1):
        rows += call.rows.tolist() if isinstance(call.rows, torch.Tensor) else \
            list(range(call.rows.start, call.rows.stop))
    assert sorted(rows) == list(range(len(needs)))


def test_a_batch_of_rows_of_one_capacity_becomes_dense_without_a_copy():
    """The dense layout (GPU, graphs) of a new batch whose rows share one capacity is the
    shelf they were copied into: `reserve` adopts it instead of copying every row again (which
    held the batch twice at its start); rows of other capacities are still copied."""
    parts = [(_row_cache(600, 100 + i, i), [0], (100 + i,)) for i in range(3)]
    cache = KVCache.cat(parts)
    keys = cache.shelves[0].k
    cache.reserve(600)
    assert cache.dense and cache.k is keys and cache.capacity == 600
    for b, (src, _, (n,)) in enumerate(parts):
        assert torch.equal(cache.row(b)[0][:, :n], src.row(0)[0][:, :n])
    mixed = KVCache.cat([(_row_cache(600, 10, 0), [0], (10,)), (_row_cache(2000, 10, 1), [0],
                                                                 (10,))])
    assert len(mixed.shelves) == 2  # two size classes
    mixed.reserve(2000)
    assert mixed.dense and len(mixed.shelves) == 1 and mixed.capacity == 2000


def test_a_class_layout_batch_is_not_the_whole_batch_estimate_twice():
    """Rows that all need the same positions: the estimate is exactly their bytes (first
    batch sized exactly, later rows in finished rows' slots), with no growth."""
    needs = [2141] * 5
    cache = KVCache.cat([(_row_cache(n, 7, i), [0], (7,)) for i, n in enumerate(needs)])
    held, growth = class_layout_bytes(needs, cache.bytes_per_position(), uniform=True)
    assert (held, growth) == (cache.nbytes(), 0)


def test_rows_in_batch_order_are_read_and_written_as_views():
    """A class-layout batch whose rows sit in one shelf in batch order attends and writes as
    the dense layout does (no index tensor: a decode step must not gather its rows); a run of
    batch rows in another shelf is a slice; only rows out of order need an index."""
    same = KVCache.cat([(_row_cache(300, 100, i), [0], (100,)) for i in range(3)])
    assert not same.dense and len(same.shelves) == 1
    assert same._by_shelf((100, 100, 100))[0][1] is None
    calls = same.calls((100, 100, 100), 1)
    assert len(calls) == 1 and calls[0].rows == slice(0, 3)
    mixed = KVCache.cat([(_row_cache(n, 100, i), [0], (100,))
                         for i, n in enumerate([300, 300, 5000, 5000, 300])])
    by = {s.size: rows for s, rows, _ in mixed._by_shelf((100,) * 5)}
    assert by[8192] == slice(2, 4)
    assert torch.equal(by[1024], torch.tensor([0, 1, 4]))
    # a write through the slice and the index puts each row's keys in its own place
    g = torch.Generator().manual_seed(9)
    k, v = torch.randn(5, H, 1, DH, generator=g), torch.randn(5, H, 1, DH, generator=g)
    mixed.write((100,) * 5, k, v)
    for b in range(5):
        assert torch.equal(mixed.row(b)[0][:, 100], k[b, :, 0])
        assert torch.equal(mixed.row(b)[1][:, 100], v[b, :, 0])
