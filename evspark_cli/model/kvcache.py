"""Where the KV rows live: per-row storage in size classes, or one dense tensor.

A batch's rows may sit at very different positions (a 60-base gene beside an 8 kb contig). If
every row had the longest row's capacity, one long prompt would cost every row its memory, and
each batch built or refilled would zero all of it. So by default (the *class* layout) each row
gets storage for its own need (its prompt, its new tokens and a block: the capacity its prefill
reserved), in a *shelf* of rows of one size class (the need rounded up to a power of two, at
least SIZE_CLASS_MIN): a shelf is one (slots, H, capacity, d_h) tensor whose live rows fill
slots 0..n-1, so attention reads a shelf's rows as one view and a batch attends in about one
call per size class (`calls`), not one per record. A row that leaves is replaced in its slot by
the shelf's last row (its live positions copied), and an empty shelf is freed: memory follows
the rows that are there.

The *dense* layout (a new cache, or one `reserve`d to a fixed capacity) is one shelf holding
every row in batch order: the fixed shapes a recorded CUDA graph replays (graphs.py), which a
GPU prefers anyway (it would rather attend over padded rows in one launch than launch per class).

Positions below a row's length belong to the states of that length; positions above are scratch,
kept finite (zeros, or what a later block wrote) because a ragged attention call reads them with
weight 0. `version` counts writes and `starts` remembers, per write, the first position written in
each row, so that a block or state whose rows a later write overwrote cannot be used (state.py).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Sequence, Union

import torch
from torch import Tensor

from .rows import Lengths, positions_index, row_index, same_position

NOT_WRITTEN = 1 << 62  # a write's start for a row it did not touch
WRITE_HISTORY = 4096  # writes remembered for staleness checks (older states count as stale)
SIZE_CLASS_MIN = 1024  # rows needing fewer positions share the smallest class
ROW_CALL_KEYS = 512  # what one more attention call costs, in keys attended (CPU, measured)


def size_class(need: int) -> int:
    """The size class of a row that needs `need` positions: a power of two >= SIZE_CLASS_MIN."""
    return max(SIZE_CLASS_MIN, 1 << max(0, need - 1).bit_length())


def shelf_capacity(need: int, have: int = 0) -> int:
    """A shelf's capacity for a row of `need` positions: rounded up to an eighth of its class
    (at most 12.5 % of padding), never below what the shelf already has."""
    step = size_class(need) // 8
    return max(have, -(-need // step) * step)


def by_class(needs: Sequence[int]) -> dict[int, list[int]]:
    """Needs grouped by size class."""
    classes: dict[int, list[int]] = {}
    for n in needs:
        classes.setdefault(size_class(n), []).append(n)
    return classes


def class_layout_bytes(needs: Sequence[int], per_position: int, uniform: bool = False
                       ) -> tuple[int, int]:
    """What the class layout holds for rows of these needs: (bytes of every shelf, the largest
    extra a shelf's growth holds for a moment, its old tensors beside the new). `uniform`: every
    row of the run needs the same positions, so the first batch's shelves are sized exactly
    (`_presize`) and later rows take finished rows' slots in place: no shelf ever grows.
    Otherwise as `Shelf` grows them: slots doubling, capacity the class's largest need rounded
    (`shelf_capacity`)."""
    if uniform:
        return len(needs) * max(needs, default=0) * per_position, 0
    held, growth = 0, 0
    for members in by_class(needs).values():
        slots = 1 << max(0, len(members) - 1).bit_length()
        cap = shelf_capacity(max(members))
        held += slots * cap * per_position
        growth = max(growth, slots // 2 * cap * per_position)
    return held, growth


class Shelf:
    """Rows of one size class: keys and values (slots, H, capacity, d_h), live rows in slots
    0..n-1, `rows[s]` the batch row in slot s. Slots at or past `used` have never been
    written (zeros)."""

    def __init__(self, slots: int, capacity: int, heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, size: int) -> None:
        self.k = torch.zeros(slots, heads, capacity, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)
        self.rows: list[int] = []
        self.used = 0
        self.size = size  # the size class (0: the dense shelf, which takes any row)

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def grow(self, slots: int, capacity: int) -> None:
        """At least `slots` slots (doubling) and `capacity` positions (one copy of the rows)."""
        have_slots = self.k.shape[0]
        new_slots = max(slots, 2 * have_slots) if slots > have_slots else have_slots
        if new_slots == have_slots and capacity <= self.capacity:
            return
        cap = max(capacity, self.capacity)
        n = len(self.rows)
        for name in ("k", "v"):
            old = getattr(self, name)
            new = old.new_zeros(new_slots, old.shape[1], cap, old.shape[3])
            new[:n, :, : old.shape[2]] = old[:n]
            setattr(self, name, new)
        self.used = n

    def take(self, row: int, capacity: int) -> int:
        """A slot for batch row `row` with room for `capacity` positions (scratch zeroed)."""
        slot = len(self.rows)
        self.grow(slot + 1, capacity)
        self.rows.append(row)
        if slot < self.used:  # a slot a departed row used: its leftovers go
            self.k[slot].zero_()
            self.v[slot].zero_()
        self.used = max(self.used, slot + 1)
        return slot

    def release(self, slot: int, last_length: int) -> int | None:
        """Free `slot`: the shelf's last row moves into it (its first `last_length` positions;
        the rest of the slot zeroed). The batch row that moved, or None."""
        last = len(self.rows) - 1
        moved = None
        if slot != last:
            n = last_length
            for t in (self.k, self.v):
                t[slot, :, :n] = t[last, :, :n]
                t[slot, :, n:] = 0
            moved = self.rows[last]
            self.rows[slot] = moved
        self.rows.pop()
        return moved


def _run_or_index(rows: list[int], device: torch.device) -> Union[slice, Tensor]:
    """Batch rows in slot order as a slice when they are a run (first, first + 1, ...), else
    as an index tensor."""
    first = rows[0]
    if rows[-1] - first == len(rows) - 1 and rows == list(range(first, first + len(rows))):
        return slice(first, first + len(rows))
    return row_index(rows, device)


@dataclass(frozen=True)
class AttentionCall:
    """Rows that attend in one call: `rows` (a slice or an index of batch rows), their keys
    and values up to the furthest row's block end, and each row's position."""

    rows: Union[slice, Tensor]
    keys: Tensor
    vals: Tensor
    t0: Lengths


class KVCache:
    """Rotated keys and values of a batch's rows (see the module docstring for the layouts).

    Head-major (H before positions) so that each head's live positions are one contiguous slab:
    a decode step's attention streams them once (2.8x faster at 262k context on CPU than a
    (B, L, H, d_h) layout)."""

    def __init__(self, batch: int, capacity: int, heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str) -> None:
        """A dense cache of `batch` empty rows of `capacity` positions."""
        self.heads, self.head_dim, self.dtype = heads, head_dim, dtype
        self.device = torch.device(device)
        self.dense = True
        shelf = Shelf(batch, capacity, heads, head_dim, dtype, device, 0)
        shelf.rows, shelf.used = list(range(batch)), batch
        self.shelves: list[Shelf] = [shelf]
        self.at: list[tuple[Shelf, int]] = [(shelf, b) for b in range(batch)]
        self.version = 0
        self.starts: deque[Lengths] = deque(maxlen=WRITE_HISTORY)  # by version - 1 (recent ones)

    def _like(self) -> "KVCache":
        """An empty class-layout cache of the same heads, dtype and device."""
        c = KVCache(0, 0, self.heads, self.head_dim, self.dtype, self.device)
        c.dense, c.shelves, c.at = False, [], []
        return c

    # ------------------------------------------------------------------ shape
    @property
    def batch(self) -> int:
        return len(self.at)

    @property
    def capacity(self) -> int:
        """Positions every row has room for (the dense capacity; the smallest row's otherwise)."""
        if self.dense:
            return self.shelves[0].capacity
        return min((s.capacity for s in self.shelves), default=0)

    @property
    def k(self) -> Tensor:
        """The dense layout's keys (B, H, capacity, d_h); a class layout has no single tensor."""
        return self._dense_shelf().k

    @property
    def v(self) -> Tensor:
        return self._dense_shelf().v

    def _dense_shelf(self) -> Shelf:
        if not self.dense:
            raise TypeError("a class-layout KV cache has no single tensor; reserve() makes one")
        return self.shelves[0]

    def row(self, b: int) -> tuple[Tensor, Tensor]:
        """Row b's keys and values (H, capacity of its shelf, d_h), as views."""
        shelf, slot = self.at[b]
        return shelf.k[slot], shelf.v[slot]

    def nbytes(self) -> int:
        """Bytes the cache holds (every shelf, free slots included)."""
        return sum(2 * s.k.numel() * s.k.element_size() for s in self.shelves)

    def bytes_per_position(self) -> int:
        """One row's keys and values at one position."""
        return 2 * self.heads * self.head_dim * torch.empty((), dtype=self.dtype).element_size()

    # ------------------------------------------------------------------ room
    def ensure(self, n: int) -> None:
        """Room for positions 0..n-1 in every row (doubling, so growth is amortised)."""
        self.fit((n,) * self.batch)

    def fit(self, ends: Lengths) -> None:
        """Room for positions 0..ends[b]-1 in each row b."""
        for shelf in self.shelves:
            need = max((ends[b] for b in shelf.rows), default=0)
            if need > shelf.capacity:
                shelf.grow(0, max(need, 2 * shelf.capacity) if self.dense else
                           shelf_capacity(need, 2 * shelf.capacity))

    def reserve(self, cap: int) -> None:
        """The dense layout with at least `cap` positions per row (the fixed shapes of a
        recorded graph): a class layout is copied into one tensor, a dense one grown."""
        if self.dense:
            if cap > self.capacity:
                self.shelves[0].grow(0, cap)
            return
        B = self.batch
        if self._batch_ordered(cap):  # already one tensor in batch order: no copy
            shelf = self.shelves[0]
            shelf.size, self.dense = 0, True
            return
        dense = Shelf(B, max([cap] + [s.capacity for s in self.shelves]), self.heads,
                      self.head_dim, self.dtype, self.device, 0)
        for b, (shelf, slot) in enumerate(self.at):
            dense.k[b, :, : shelf.capacity] = shelf.k[slot]
            dense.v[b, :, : shelf.capacity] = shelf.v[slot]
        dense.rows, dense.used = list(range(B)), B
        self.shelves, self.at, self.dense = [dense], [(dense, b) for b in range(B)], True

    def _batch_ordered(self, cap: int) -> bool:
        """One shelf of exactly the batch's rows, row b in slot b, with room for `cap`: the
        dense layout already (a new batch whose rows all share one capacity)."""
        if len(self.shelves) != 1:
            return False
        shelf = self.shelves[0]
        return (shelf.capacity >= cap and shelf.k.shape[0] == self.batch
                and all(s is shelf and slot == b for b, (s, slot) in enumerate(self.at)))

    # ------------------------------------------------------------------ writes and reads
    def write(self, t0: Lengths, k: Tensor, v: Tensor) -> int:
        """Store k, v (B, H, n, d_h) at positions t0[b]..t0[b]+n-1 of each row; the new
        version."""
        n = k.shape[2]
        self.fit(tuple(t + n for t in t0))
        for shelf, rows, ts in self._by_shelf(t0):
            m = len(ts)
            if rows is None:
                ks, vs = k, v
            elif isinstance(rows, slice):  # a run of batch rows: a view, no gather
                ks, vs = k[rows], v[rows]
            else:
                ks, vs = k.index_select(0, rows), v.index_select(0, rows)
            K, V = shelf.k[:m], shelf.v[:m]
            if same_position(ts):
                K[:, :, ts[0]: ts[0] + n] = ks
                V[:, :, ts[0]: ts[0] + n] = vs
                continue
            b, pos = positions_index(ts, n, k.device)
            K[b, :, pos] = ks.transpose(1, 2)
            V[b, :, pos] = vs.transpose(1, 2)
            for start, end in attention_groups(ts):
                if not same_position(ts[start:end]):
                    _clear_past_blocks(K, V, start, ts[start:end], n)
        return self.note_write(t0)

    def calls(self, t0: Lengths, n: int) -> list[AttentionCall]:
        """The attention calls of a block of n queries per row at positions t0: per shelf, its
        runs of rows at nearby positions (`attention_groups`)."""
        out = []
        for shelf, rows, ts in self._by_shelf(t0):
            for start, end in attention_groups(ts):
                hi = max(ts[start:end]) + n
                which: Union[slice, Tensor] = (
                    slice(start, end) if rows is None
                    else slice(rows.start + start, rows.start + end) if isinstance(rows, slice)
                    else rows[start:end])
                out.append(AttentionCall(which, shelf.k[start:end, :, :hi],
                                         shelf.v[start:end, :, :hi], ts[start:end]))
        return out

    def _by_shelf(self, t0: Lengths
                  ) -> list[tuple[Shelf, Union[slice, Tensor, None], Lengths]]:
        """Each shelf's live rows (None: every row in batch order; a slice: a run of batch
        rows in slot order, e.g. a batch whose rows share one size class, which then reads and
        writes its rows as views instead of gathering them every step) and their positions."""
        if self.dense:
            return [(self.shelves[0], None, t0)]
        live = [s for s in self.shelves if s.rows]
        if len(live) == 1 and live[0].rows == list(range(len(t0))):  # every row, in order
            return [(live[0], None, t0)]
        return [(s, _run_or_index(s.rows, self.device), tuple(t0[b] for b in s.rows))
                for s in live]

    def copy_block(self, source: Sequence[int], t0: Lengths, n: Lengths) -> int:
        """Row b's positions t0[b]..t0[b]+n[b]-1 become row source[b]'s (rows at one position:
        a token tree's branch rows taking the branch that verified longest); the new version."""
        starts = [NOT_WRITTEN] * self.batch
        for b, s in enumerate(source):
            if s == b:
                continue
            (dst, slot), (src, src_slot) = self.at[b], self.at[s]
            a, k = t0[b], n[b]
            dst.k[slot, :, a: a + k] = src.k[src_slot, :, a: a + k]
            dst.v[slot, :, a: a + k] = src.v[src_slot, :, a: a + k]
            starts[b] = a
        return self.note_write(tuple(starts))

    # ------------------------------------------------------------------ books
    def note_write(self, t0: Lengths) -> int:
        """Record that each row b was (re)written from t0[b] up; returns the new version."""
        self.version += 1
        self.starts.append(tuple(t0))
        return self.version

    def intact(self, lengths: Lengths, since: int) -> bool:
        """True when no write after version `since` touched a row below its length."""
        later = self.version - since
        if later == 0:
            return True
        if later > len(self.starts):
            return False  # older than the history kept: cannot vouch for it
        recent = list(self.starts)[len(self.starts) - later:]
        return all(s >= n for starts in recent for s, n in zip(starts, lengths))

    # ------------------------------------------------------------------ rows come and go
    def copy(self, rows: Sequence[int], lengths: Lengths, capacity: int | None = None
             ) -> "KVCache":
        """A new class-layout cache holding `rows` of this one (repeats allowed) up to their
        lengths, each with its own row's capacity (or `capacity`)."""
        c = self._like()
        c._presize([max(capacity or self.at[b][0].capacity, n) for b, n in zip(rows, lengths)])
        for b, n in zip(rows, lengths):
            c._append(self, b, n, capacity)
        return c

    @staticmethod
    def cat(parts: Sequence[tuple["KVCache", Sequence[int], Lengths]]) -> "KVCache":
        """One class-layout cache of the given rows of each (cache, rows, their lengths), in
        order (repeats fork a row). Shelves are sized for all of them first, so each row is
        copied once."""
        c = parts[0][0]._like()
        c._presize([max(cache.at[b][0].capacity, n) for cache, rows, lengths in parts
                    for b, n in zip(rows, lengths)])
        for cache, rows, lengths in parts:
            for b, n in zip(rows, lengths):
                c._append(cache, b, n, None)
        return c

    def append(self, parts: Sequence[tuple["KVCache", Sequence[int], Lengths]]) -> "KVCache":
        """The given rows of each (cache, rows, their lengths) added after this class-layout
        cache's rows, in place (repeats fork a row): the rows already here are not copied
        (shelves grow by doubling), so a row joining a running batch costs its own copy. Every
        earlier state of this cache keeps its rows; returns the cache itself."""
        assert not self.dense, "a dense cache's rows are its batch: cat() a new one"
        first = self.batch
        for cache, rows, lengths in parts:
            for b, n in zip(rows, lengths):
                self._append(cache, b, n, None)
        self.note_write((NOT_WRITTEN,) * first + (0,) * (self.batch - first))
        return self

    def _presize(self, needs: Sequence[int]) -> None:
        """Empty shelves with room for rows of these needs (a new batch's rows, before they
        are copied in)."""
        for size, members in by_class(needs).items():
            cap = max(members) if len(set(members)) == 1 else shelf_capacity(max(members))
            self.shelves.append(Shelf(len(members), cap, self.heads, self.head_dim, self.dtype,
                                      self.device, size))

    def _append(self, src: "KVCache", b: int, n: int, capacity: int | None) -> None:
        """A new last row holding src's row b up to position n."""
        src_shelf, src_slot = src.at[b]
        need = max(capacity or src_shelf.capacity, n)
        shelf, slot = self._place_row(self.batch, need)
        self.at.append((shelf, slot))
        _copy_row(shelf, slot, src_shelf, src_slot, n)

    def _place_row(self, row: int, need: int) -> tuple[Shelf, int]:
        """A zeroed slot for batch row `row` of `need` positions, in its class's shelf (the
        class layout: a dense cache's rows are its batch, placed by `put`)."""
        assert not self.dense
        size = size_class(need)
        shelf = next((s for s in self.shelves if s.size == size), None)
        if shelf is None:  # a new shelf: exactly this row's need (a clone holds no padding)
            shelf = Shelf(1, need, self.heads, self.head_dim, self.dtype,
                          self.device, size)
            self.shelves.append(shelf)
        cap = shelf.capacity if need <= shelf.capacity else shelf_capacity(need, shelf.capacity)
        return shelf, shelf.take(row, cap)

    def put(self, slots: Sequence[int], src: "KVCache", src_rows: Sequence[int],
            src_lengths: Lengths, lengths: Lengths) -> None:
        """Rows `slots` of this batch (whose rows are at `lengths`) become src's rows
        `src_rows` (repeats fork a row) up to `src_lengths`, in place."""
        lengths = list(lengths)
        for slot, b, n in zip(slots, src_rows, src_lengths):
            src_shelf, src_slot = src.at[b]
            if self.dense:
                shelf, at = self.at[slot]
                if n > shelf.capacity:
                    shelf.grow(0, max(n, src_shelf.capacity))
                _copy_row(shelf, at, src_shelf, src_slot, n)
                shelf.k[at, :, n:] = 0  # the previous row's leftovers: zero, like a new cache
                shelf.v[at, :, n:] = 0
            else:
                self._vacate(slot, lengths)
                shelf, at = self._place_row(slot, max(src_shelf.capacity, n))
                self.at[slot] = (shelf, at)
                _copy_row(shelf, at, src_shelf, src_slot, n)
            lengths[slot] = n
        starts = [NOT_WRITTEN] * self.batch
        for slot in slots:
            starts[slot] = 0
        self.note_write(tuple(starts))

    def _vacate(self, row: int, lengths: Sequence[int]) -> None:
        """Free row `row`'s slot in its shelf (the shelf's last row moves in; an empty shelf
        goes). The row keeps its place in `at` until the caller fills or drops it."""
        shelf, slot = self.at[row]
        last_row = shelf.rows[-1]
        moved = shelf.release(slot, lengths[last_row])
        if moved is not None:
            self.at[moved] = (shelf, slot)
        if not shelf.rows:
            self.shelves.remove(shelf)

    def remove(self, row: int, lengths: Lengths) -> "KVCache":
        """This cache without batch row `row` (its rows at `lengths`): the last row takes its
        number (dense: its place, its live positions copied). In place: every earlier state of
        this cache is stale afterwards; returns the cache itself."""
        last = self.batch - 1
        if self.dense:
            shelf = self.shelves[0]
            shelf.release(row, lengths[last])  # the last slot moves into `row`
            shelf.rows = list(range(last))
            shelf.k, shelf.v = shelf.k[:last], shelf.v[:last]  # a dense shelf is the batch
            shelf.used = min(shelf.used, last)
            self.at.pop()
        else:
            self._vacate(row, lengths)
            if row != last:
                shelf, slot = self.at[last]
                self.at[row] = (shelf, slot)
                shelf.rows[slot] = row
            self.at.pop()
        self.note_write((0,) * (last + 1))  # every earlier state of this cache is now stale
        return self


def _copy_row(dst: Shelf, slot: int, src: Shelf, src_slot: int, n: int) -> None:
    """Positions 0..n-1 of src's slot `src_slot` into dst's slot `slot`."""
    dst.k[slot, :, :n] = src.k[src_slot, :, :n]
    dst.v[slot, :, :n] = src.v[src_slot, :, :n]


def _clear_past_blocks(K: Tensor, V: Tensor, start: int, t0: Lengths, n: int) -> None:
    """Zero, in rows start.. of K and V (a group of rows that attend in one call), each row's
    positions from the end of its block to the end of the group's furthest row's: that call
    reads them with weight exactly 0, and 0 * (finite) is 0 where leftover NaN or inf (a failed
    row's) would not be. They are scratch of this write (no state of this or a later version may
    hold them)."""
    hi = max(t0) + n
    for b, t in enumerate(t0, start):  # each row's own range: no mask over the whole rectangle
        if t + n < hi:
            K[b, :, t + n: hi] = 0
            V[b, :, t + n: hi] = 0


def attention_groups(t0: Lengths) -> list[tuple[int, int]]:
    """Runs of consecutive rows [start, end) that attend in one call (attention.py).

    A run shares one call over its furthest row's keys, with the keys a row has not written
    masked, as long as the keys it wastes on the rows behind cost less than the calls it saves
    (a call costs about ROW_CALL_KEYS keys). Rows of one size class sit in one shelf and a
    record's samples in consecutive slots at nearby positions, so a batch attends in a few
    calls, where one call over every row would pay the longest prompt's keys for all of them."""
    groups, start, hi, total = [], 0, t0[0], t0[0]
    for b in range(1, len(t0) + 1):
        if b < len(t0):
            n, new_hi = b - start + 1, max(hi, t0[b])
            if n * new_hi - (total + t0[b]) <= ROW_CALL_KEYS * (n - 1):
                hi, total = new_hi, total + t0[b]
                continue
        groups.append((start, b))
        if b < len(t0):
            start, hi, total = b, t0[b], t0[b]
    return groups
