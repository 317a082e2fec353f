"""Inference state and the rollback protocol: extend k tokens, then commit any prefix j per row.

StripedHyena 2 has three classes of inference state (docs/state-protocol.md):

| class       | held by                   | extend(k)                     | commit(j)              |
|-------------|---------------------------|-------------------------------|------------------------|
| FIR window  | featurizer (K=3), SE, MR  | one buffer [window ; inputs]  | K-1 columns ending at j|
| modal state | Hyena-LI, sigma (B, D, S) | all k states sigma_1..sigma_k | pick sigma_j           |
| KV cache    | attention, preallocated   | write t0..t0+k-1 of each row  | length := t0 + j       |

`model.extend(state, ids)` returns a :class:`Block` holding one *pending* object per layer. The
pending objects keep exactly what the verification pass computed anyway, so
``block.commit(j)`` builds the state after the first j tokens **without recomputing anything**:
no second target pass, no snapshot. A decode step is ``extend`` with k = 1 and ``commit(1)``.

A state is a batch of B independent rows (sequences). Rows may sit at different positions
(`InferenceState.lengths`): prompts of different lengths, rows that accepted different numbers of
drafts. ``commit(j)`` takes one j for all rows or one per row; FIR windows and modal states then
take each row's own slice, and the KV cache keeps a length per row (attention masks the rows a
row has not written). Rows are added to and removed from a live batch with ``select``, ``cat``,
``append``, ``place`` and ``remove`` (the batched decoder's continuous batching); each is a
method of every layer-state class, so the model and the graph runner never switch on state types.

States are immutable values, except the KV cache rows past a row's length, which are scratch
space shared by a state and the blocks extended from it. A block is therefore valid until the
next ``extend`` that writes to the same cache; committing a stale block raises. ``append``,
``place`` and ``remove`` reuse the batch's KV caches in place: the state they are called on is
stale after them. ``clone()`` gives an independent deep copy (the snapshot-and-replay
baseline). Where a cache keeps its rows (each row in a shelf of its size class, or one dense
tensor for recorded graphs) is `kvcache.py`'s concern; the protocol above is the same for both.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Protocol, Sequence, Union

import torch
from torch import Tensor

from .kvcache import (  # noqa: F401 - re-exported: the cache's storage lives in kvcache.py
    ROW_CALL_KEYS,
    KVCache,
    attention_groups,
)
from .rows import Lengths, positions_index, row_index, same_position  # noqa: F401

RowCommit = Union[int, Sequence[int], Tensor]  # one j for every row, or one per row


def as_lengths(j: RowCommit, batch: int) -> Lengths:
    """`j` (an int, a sequence or a 1-d tensor) as one int per row."""
    if isinstance(j, Tensor):
        j = j.tolist()
    if isinstance(j, int):
        return (int(j),) * batch
    out = tuple(j) if all(type(x) is int for x in j) else tuple(int(x) for x in j)
    if len(out) != batch:
        raise ValueError(f"commit needs one length per row: {len(out)} for {batch} rows")
    return out


def put_rows(t: Tensor, slots: Sequence[int], src: Tensor) -> Tensor:
    """A copy of t (B, ...) whose rows `slots` are src's rows, in order."""
    out = t.clone()
    out[row_index(slots, t.device)] = src.to(t.dtype)
    return out


def swap_remove(t: Tensor, row: int) -> Tensor:
    """t without `row`: the last row takes its place (a copy; these tensors are small)."""
    last = t.shape[0] - 1
    keep = list(range(last))
    if row != last:
        keep[row] = last
    return t.index_select(0, row_index(keep, t.device))


# ----------------------------------------------------------------------------------------- FIR


@dataclass(frozen=True)
class FIRWindow:
    """The last K-1 inputs of a causal FIR filter, oldest first: (B, C, K-1), zeros before t=0."""

    buf: Tensor
    label = "inner_fir"  # its name in `InferenceState.tensors()` as a Hyena layer's inner state

    def widen(self, x: Tensor) -> Tensor:
        """[window ; block inputs] as one buffer of K-1+k columns: the block's convolution input."""
        return torch.cat([self.buf, x.to(self.buf.dtype)], dim=-1)

    def clone(self) -> "FIRWindow":
        return FIRWindow(self.buf.clone())

    def fixed(self) -> list[Tensor]:
        return [self.buf]

    def with_fixed(self, it: Iterator[Tensor]) -> "FIRWindow":
        return FIRWindow(next(it))

    def pending_from(self, it: Iterator[Tensor]) -> "FIRPending":
        """The pending state whose widened buffer is the next tensor of `it` (a replayed graph's
        outputs)."""
        return FIRPending(next(it), self.buf.shape[-1])

    def select(self, rows: Sequence[int]) -> "FIRWindow":
        return FIRWindow(self.buf.index_select(0, row_index(rows, self.buf.device)))

    def place(self, slots: Sequence[int], other: "FIRWindow", rows: Sequence[int] | None = None
              ) -> "FIRWindow":
        src = other.buf if rows is None else other.select(rows).buf
        return FIRWindow(put_rows(self.buf, slots, src))

    def remove(self, row: int) -> "FIRWindow":
        return FIRWindow(swap_remove(self.buf, row))

    @staticmethod
    def cat(parts: Sequence[tuple["FIRWindow", Sequence[int]]]) -> "FIRWindow":
        return FIRWindow(torch.cat([p.select(rows).buf for p, rows in parts]))


@dataclass
class FIRPending:
    """A widened buffer from `extend`; the window after j tokens is the slice ending at column j."""

    widened: Tensor  # (B, C, K-1+k)
    width: int  # K - 1

    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> FIRWindow:
        if source is not None:  # each row takes its source row's window
            return self.commit(j).select(source)
        if same_position(j):
            w = self.widened[..., j[0]: j[0] + self.width]
            # a view for verification blocks; a copy when a long (prefill) buffer would stay pinned
            return FIRWindow(w.clone() if self.widened.shape[-1] > 2 * self.width + 64 else w)
        B, C, _ = self.widened.shape
        cols = row_index(j, self.widened.device)[:, None] + torch.arange(self.width,
                                                                    device=self.widened.device)
        by_position = self.widened.transpose(1, 2)
        if by_position.is_contiguous():  # a verification block's buffer: whole rows of C
            # channels per position, and a window the next block reads the same way
            rows = torch.arange(B, device=self.widened.device)[:, None]
            return FIRWindow(by_position[rows, cols].transpose(1, 2))
        return FIRWindow(self.widened.gather(-1, cols[:, None, :].expand(B, C, self.width)))

    def outputs(self) -> list[Tensor]:
        return [self.widened]


# --------------------------------------------------------------------------------------- modal


@dataclass(frozen=True)
class ModalState:
    """Hyena-LI modal state sigma (B, D, S), fp32: sigma_t = p * sigma_{t-1} + w_t per mode."""

    sigma: Tensor
    label = "iir_modal"

    def clone(self) -> "ModalState":
        return ModalState(self.sigma.clone())

    def fixed(self) -> list[Tensor]:
        return [self.sigma]

    def with_fixed(self, it: Iterator[Tensor]) -> "ModalState":
        return ModalState(next(it))

    def pending_from(self, it: Iterator[Tensor]) -> "ModalSigmas":
        """The pending state whose per-position states are the next tensor of `it`."""
        return ModalSigmas(next(it))

    def select(self, rows: Sequence[int]) -> "ModalState":
        return ModalState(self.sigma.index_select(0, row_index(rows, self.sigma.device)))

    def place(self, slots: Sequence[int], other: "ModalState", rows: Sequence[int] | None = None
              ) -> "ModalState":
        src = other.sigma if rows is None else other.select(rows).sigma
        return ModalState(put_rows(self.sigma, slots, src))

    def remove(self, row: int) -> "ModalState":
        return ModalState(swap_remove(self.sigma, row))

    @staticmethod
    def cat(parts: Sequence[tuple["ModalState", Sequence[int]]]) -> "ModalState":
        return ModalState(torch.cat([p.select(rows).sigma for p, rows in parts]))


@dataclass
class ModalSigmas:
    """A short block's modal states at every position, sigma_1..sigma_k (decode steps,
    verification blocks): `extend` computes them because the outputs need them, and commit(j)
    picks sigma_j for each row."""

    sigmas: Tensor  # (B, D, S, k)

    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> ModalState:
        if source is not None:
            return self.commit(j).select(source)
        if same_position(j):
            return ModalState(self.sigmas[..., j[0] - 1])
        rows = torch.arange(len(j), device=self.sigmas.device)
        return ModalState(self.sigmas[rows, :, :, row_index(j, self.sigmas.device) - 1])

    def outputs(self) -> list[Tensor]:
        return [self.sigmas]


@dataclass
class ModalInputs:
    """A long block's (a prefill chunk's) start state and inputs: its outputs come from an FFT,
    which forms no per-position state, so commit(j) forms
    sigma_j = p^j sigma_0 + sum_{i<=j} p^(j-i) w_i."""

    sigma0: Tensor  # (B, D, S)
    w: Tensor  # (B, D, k) fp32
    log_poles: Tensor  # (D, S) fp32

    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> ModalState:
        if source is not None:
            return self.commit(j).select(source)
        if same_position(j):
            return ModalState(modal_state_after(self.sigma0, self.w[..., : j[0]], self.log_poles))
        return ModalState(torch.cat([
            modal_state_after(self.sigma0[b: b + 1], self.w[b: b + 1, :, :jb], self.log_poles)
            for b, jb in enumerate(j)]))

    def outputs(self) -> list[Tensor]:
        raise TypeError("a long block has no per-position modal states (graphs record only "
                        "short blocks)")


ModalPending = Union[ModalSigmas, ModalInputs]  # a Hyena-LI layer's pending state


POWER_STEP = 128  # pole_powers' split of an exponent: j = a * POWER_STEP + r


def pole_powers(log_poles: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """p^j for j < n as two factors, p^r (D, S, c) for r < c and p^(a c) (D, S, A) for a < A
    (c = POWER_STEP, A = ceil(n / c)): p^(a c + r) is their product. A sum over n positions
    weighted by powers of the poles then takes D S (c + A) exponentials instead of D S n (a
    third of an 8k prefill's time when formed whole)."""
    c = POWER_STEP
    A = -(-n // c)
    r = torch.arange(c, device=log_poles.device, dtype=torch.float32)
    a = torch.arange(A, device=log_poles.device, dtype=torch.float32) * c
    return torch.exp(log_poles[..., None] * r), torch.exp(log_poles[..., None] * a)


def modal_state_after(sigma0: Tensor, w: Tensor, log_poles: Tensor) -> Tensor:
    """sigma after feeding w (B, D, n): p^n sigma0 + sum_i p^(n-1-i) w_i.

    The newest input is weighed by p^0: with j = n-1-i = a c + r (`pole_powers`), the inputs
    reversed and cut into A rows of c, the sum is sum_a p^(a c) sum_r p^r w[a, r]."""
    B, D, n = w.shape
    if n == 0:
        return sigma0
    low, high = pole_powers(log_poles, n)
    c, A = low.shape[-1], high.shape[-1]
    rev = torch.nn.functional.pad(w.flip(-1), (0, A * c - n)).view(B, D, A, c)
    inner = torch.einsum("dsr,bdar->bdsa", low, rev)  # (B, D, S, A)
    return sigma0 * torch.exp(log_poles * n) + (inner * high).sum(-1)


# ------------------------------------------------------------------------------------ KV cache


class StaleBlockError(RuntimeError):
    """A block or state whose KV rows a later extend (of another branch) overwrote."""


@dataclass(frozen=True)
class KVState:
    cache: KVCache
    lengths: Lengths
    version: int = 0  # cache version when this state was made

    def clone(self) -> "KVState":
        return KVState(self.cache.copy(range(self.cache.batch), self.lengths), self.lengths, 0)

    def check(self) -> None:
        """Refuse a state whose rows a sibling branch has overwritten since it was committed."""
        if not self.cache.intact(self.lengths, self.version):
            raise StaleBlockError("this state's KV rows were overwritten by another branch; "
                                  "extend a clone() to explore several branches")

    def fixed(self) -> list[Tensor]:
        return []

    def with_fixed(self, it: Iterator[Tensor]) -> "KVState":
        return self

    def kv_bytes_per_token(self) -> int:
        return self.cache.bytes_per_position()

    def caches(self) -> list[KVCache]:
        return [self.cache]

    def pending_from(self, it: Iterator[Tensor], t0: Lengths) -> "KVPending":
        """A replayed graph wrote rows t0.. of this cache: its pending, with the books kept."""
        return KVPending(self.cache, t0, self.cache.note_write(t0))

    def static_pending(self) -> "KVStaticWrite":
        """What the static form (a recorded graph) leaves for this layer: rows written at device
        positions, whose books the runner keeps (`pending_from`)."""
        return KVStaticWrite(self.cache)

    def named(self, name: str) -> dict[str, Tensor]:
        """Keys and values up to the lengths in vortex's cache layout (B, L, H, d_h); rows at
        different positions padded with zeros."""
        n = max(self.lengths)
        if self.cache.dense:
            k, v = self.cache.k[:, :, :n], self.cache.v[:, :, :n]
        else:  # views for one row (tests perturb them in place), a copy for several
            rows = [self.cache.row(b) for b in range(self.cache.batch)]
            if len(rows) == 1:
                k, v = rows[0][0][None, :, :n], rows[0][1][None, :, :n]
            else:
                k = torch.stack([kb[:, :n] for kb, _ in rows])
                v = torch.stack([vb[:, :n] for _, vb in rows])
        if not same_position(self.lengths):
            own = row_index(self.lengths, k.device)[:, None]
            keep = torch.arange(n, device=k.device)[None, :] < own
            k, v = k * keep[:, None, :, None], v * keep[:, None, :, None]
        return {f"{name}.k": k.transpose(1, 2), f"{name}.v": v.transpose(1, 2)}

    def select(self, rows: Sequence[int]) -> "KVState":
        lengths = tuple(self.lengths[r] for r in rows)
        return KVState(self.cache.copy(rows, lengths), lengths, 0)

    def place(self, slots: Sequence[int], other: "KVState", rows: Sequence[int] | None = None
              ) -> "KVState":
        rows = range(other.cache.batch) if rows is None else rows
        src_lengths = tuple(other.lengths[r] for r in rows)
        self.cache.put(slots, other.cache, rows, src_lengths, self.lengths)
        lengths = list(self.lengths)
        for slot, n in zip(slots, src_lengths):
            lengths[slot] = n
        return KVState(self.cache, tuple(lengths), self.cache.version)

    def remove(self, row: int) -> "KVState":
        lengths = list(self.lengths)
        last = lengths.pop()
        if row < len(lengths):
            lengths[row] = last
        cache = self.cache.remove(row, self.lengths)
        return KVState(cache, tuple(lengths), cache.version)

    def append(self, parts: Sequence[tuple["KVState", Sequence[int]]]) -> "KVState":
        chosen = [(p.cache, rows, tuple(p.lengths[r] for r in rows)) for p, rows in parts]
        lengths = self.lengths + tuple(n for _, _, ns in chosen for n in ns)
        if self.cache.dense:  # one tensor in batch order: a new one
            return KVState.cat([(self, range(len(self.lengths))), *parts])
        cache = self.cache.append(chosen)
        return KVState(cache, lengths, cache.version)

    @staticmethod
    def cat(parts: Sequence[tuple["KVState", Sequence[int]]]) -> "KVState":
        chosen = [(p.cache, rows, tuple(p.lengths[r] for r in rows)) for p, rows in parts]
        cache = KVCache.cat(chosen)
        return KVState(cache, tuple(n for _, _, ns in chosen for n in ns), 0)


@dataclass
class KVPending:
    """A block's KV rows, written at rows t0.. of each row as cache version `version`."""

    cache: KVCache
    t0: Lengths
    version: int

    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> KVState:
        if self.cache.version != self.version:
            raise StaleBlockError("this block's KV rows were overwritten by a later extend")
        version = self.version
        if source is not None and any(s != b for b, s in enumerate(source)):
            # the block's keys and values of each row's source row, over the row's own
            version = self.cache.copy_block(source, self.t0, j)
        return KVState(self.cache, tuple([t + n for t, n in zip(self.t0, j)]), version)

    def outputs(self) -> list[Tensor]:
        return []


@dataclass
class KVStaticWrite:
    """The KV rows a static-form pass (a recorded graph) wrote at device positions. The pass
    cannot count the write, so this is never committed: the graph runner builds the block from
    the state it replayed on (`InferenceState.block_from`, `KVState.pending_from`), keeping the
    cache's books itself."""

    cache: KVCache

    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> KVState:
        raise TypeError("a static-form block commits through InferenceState.block_from")

    def outputs(self) -> list[Tensor]:
        return []


# ------------------------------------------------------------------------------- whole model


@dataclass(frozen=True)
class HyenaState:
    feat: FIRWindow  # featurizer window over the 3D projection channels
    inner: Union[FIRWindow, ModalState]  # SE/MR window of w = k*v, or the LI modal state

    def clone(self) -> "HyenaState":
        return HyenaState(self.feat.clone(), self.inner.clone())

    def fixed(self) -> list[Tensor]:
        return self.feat.fixed() + self.inner.fixed()

    def with_fixed(self, it: Iterator[Tensor]) -> "HyenaState":
        return HyenaState(self.feat.with_fixed(it), self.inner.with_fixed(it))

    def check(self) -> None:
        pass

    def kv_bytes_per_token(self) -> int:
        return 0

    def caches(self) -> list[KVCache]:
        return []

    def pending_from(self, it: Iterator[Tensor], t0: Lengths) -> "HyenaPending":
        return HyenaPending(self.feat.pending_from(it), self.inner.pending_from(it))

    def named(self, name: str) -> dict[str, Tensor]:
        return {f"{name}.featurizer_fir": self.feat.fixed()[0],
                f"{name}.{self.inner.label}": self.inner.fixed()[0]}

    def select(self, rows: Sequence[int]) -> "HyenaState":
        return HyenaState(self.feat.select(rows), self.inner.select(rows))

    def place(self, slots: Sequence[int], other: "HyenaState", rows: Sequence[int] | None = None
              ) -> "HyenaState":
        return HyenaState(self.feat.place(slots, other.feat, rows),
                          self.inner.place(slots, other.inner, rows))  # type: ignore[arg-type]

    def remove(self, row: int) -> "HyenaState":
        return HyenaState(self.feat.remove(row), self.inner.remove(row))

    def append(self, parts: Sequence[tuple["HyenaState", Sequence[int]]]) -> "HyenaState":
        """Windows and modal states are a few numbers per row: one new tensor each."""
        return HyenaState.cat([(self, range(self.feat.buf.shape[0])), *parts])

    @staticmethod
    def cat(parts: Sequence[tuple["HyenaState", Sequence[int]]]) -> "HyenaState":
        inner = type(parts[0][0].inner).cat(  # type: ignore[arg-type]
            [(p.inner, rows) for p, rows in parts])
        return HyenaState(FIRWindow.cat([(p.feat, rows) for p, rows in parts]), inner)


@dataclass
class HyenaPending:
    feat: FIRPending
    inner: Union[FIRPending, ModalPending]

    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> HyenaState:
        return HyenaState(self.feat.commit(j, source), self.inner.commit(j, source))

    def outputs(self) -> list[Tensor]:
        return self.feat.outputs() + self.inner.outputs()


class LayerState(Protocol):
    """What every layer's state offers (FIR/modal `HyenaState`, attention `KVState`)."""

    def clone(self) -> "LayerState": ...
    def check(self) -> None: ...
    def fixed(self) -> list[Tensor]: ...  # fixed-size tensors (windows, modal states), in order
    def with_fixed(self, it: Iterator[Tensor]) -> "LayerState": ...
    def select(self, rows: Sequence[int]) -> "LayerState": ...
    def place(self, slots: Sequence[int], other, rows: Sequence[int] | None = None
              ) -> "LayerState": ...
    def remove(self, row: int) -> "LayerState": ...
    def append(self, parts: Sequence[tuple[Any, Sequence[int]]]) -> "LayerState": ...
    def kv_bytes_per_token(self) -> int: ...
    def caches(self) -> list[KVCache]: ...
    def pending_from(self, it: Iterator[Tensor], t0: Lengths) -> "LayerPending": ...
    def named(self, name: str) -> dict[str, Tensor]: ...  # live tensors by checkpoint-style name


class LayerPending(Protocol):
    def commit(self, j: Lengths, source: Sequence[int] | None = None) -> LayerState: ...
    def outputs(self) -> list[Tensor]: ...  # per-position tensors of the pass (none for KV)


@dataclass(frozen=True)
class InferenceState:
    """Everything a batch of sequences needs to continue: one entry per layer, a length per row."""

    layers: tuple[LayerState, ...]
    lengths: Lengths

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def seqlen(self) -> int:
        """The position of every row (rows at different positions: use `lengths`)."""
        if not same_position(self.lengths):
            raise ValueError(f"rows are at different positions {self.lengths}; use .lengths")
        return self.lengths[0]

    def check(self) -> None:
        """Raise StaleBlockError when a later write overwrote rows this state still needs."""
        for s in self.layers:
            s.check()

    def clone(self) -> "InferenceState":
        """An independent deep copy (the snapshot-and-replay baseline)."""
        return InferenceState(tuple(s.clone() for s in self.layers), self.lengths)

    def fixed(self) -> list[Tensor]:
        """The fixed-size tensors of every layer (what a recorded graph copies in), in order."""
        return [t for s in self.layers for t in s.fixed()]

    def caches(self) -> list[KVCache]:
        """The KV caches of the attention layers, in layer order."""
        return [c for s in self.layers for c in s.caches()]

    def block_from(self, outputs: Sequence[Tensor], k: int) -> "Block":
        """The block of an `extend(k)` from this state that a replayed graph (or compiled form)
        computed: `outputs` are its per-position tensors in `Block.outputs()` order."""
        it = iter(outputs)
        pendings = tuple(s.pending_from(it, self.lengths) for s in self.layers)
        return Block(pendings, self.lengths, k)

    def with_fixed(self, tensors: Sequence[Tensor], lengths: Lengths | None = None
                   ) -> "InferenceState":
        """The same state with its fixed-size tensors replaced by `tensors` (KV caches shared)."""
        it = iter(tensors)
        return InferenceState(tuple(s.with_fixed(it) for s in self.layers),
                              self.lengths if lengths is None else lengths)

    def select(self, rows: Sequence[int]) -> "InferenceState":
        """A new state of the given rows, in order (repeats fork a row: K samples of a prompt)."""
        if not rows:
            raise ValueError("select needs at least one row")
        return InferenceState(tuple(s.select(rows) for s in self.layers),
                              tuple(self.lengths[r] for r in rows))

    def place(self, slots: Sequence[int], other: "InferenceState",
              rows: Sequence[int] | None = None) -> "InferenceState":
        """Put `other`'s rows (or its `rows`, repeats forking a row) into rows `slots` of this
        batch (KV caches written in place: this state is stale afterwards, the rows not in
        `slots` keep their values)."""
        chosen = range(other.batch) if rows is None else rows
        if len(slots) != len(chosen):
            raise ValueError(f"place: {len(slots)} slots for {len(chosen)} rows")
        lengths = list(self.lengths)
        for slot, r in zip(slots, chosen):
            lengths[slot] = other.lengths[r]
        return InferenceState(tuple(s.place(slots, o, rows)
                                    for s, o in zip(self.layers, other.layers)), tuple(lengths))

    def remove(self, row: int) -> "InferenceState":
        """This batch without `row`; the last row moves into its place (KV moved in place: this
        state is stale afterwards)."""
        if not 0 <= row < self.batch or self.batch == 1:
            raise ValueError(f"remove({row}) from a batch of {self.batch}")
        lengths = list(self.lengths)
        last = lengths.pop()
        if row < len(lengths):
            lengths[row] = last
        return InferenceState(tuple(s.remove(row) for s in self.layers), tuple(lengths))

    def append(self, parts: Sequence[tuple["InferenceState", Sequence[int]]]
               ) -> "InferenceState":
        """This batch with the given rows of each state added after its rows (repeats fork a
        row): `gather` with this batch first, except that KV caches grow in place, so a row
        joining a running batch (a server's new request) copies itself, not the batch. This
        state's KV caches are shared with the result: use the result from here on."""
        layers = tuple(s.append([(p.layers[i], rows) for p, rows in parts])
                       for i, s in enumerate(self.layers))
        return InferenceState(layers, self.lengths + tuple(p.lengths[r] for p, rows in parts
                                                           for r in rows))

    @staticmethod
    def cat(states: Sequence["InferenceState"]) -> "InferenceState":
        """One batch of all rows of `states`, in order (new KV caches)."""
        return InferenceState.gather([(s, range(s.batch)) for s in states])

    @staticmethod
    def gather(parts: Sequence[tuple["InferenceState", Sequence[int]]]) -> "InferenceState":
        """One batch of the given rows of each state, in order (repeats fork a row; new KV
        caches, each row copied once: `cat` of `select`s without the intermediate copies)."""
        layers = tuple(type(first).cat([(s.layers[i], rows) for s, rows in parts])  # type: ignore[attr-defined]
                       for i, first in enumerate(parts[0][0].layers))
        return InferenceState(layers, tuple(s.lengths[r] for s, rows in parts for r in rows))

    def tensors(self) -> dict[str, Tensor]:
        """Named live tensors, e.g. for tests and byte counts (KV truncated to the lengths;
        rows at different positions are padded with zeros)."""
        out: dict[str, Tensor] = {}
        for i, s in enumerate(self.layers):
            out.update(s.named(f"layer{i}"))
        return out

    def nbytes(self) -> dict[str, int]:
        """Fixed bytes (FIR windows + modal states) and KV bytes per token, per sequence."""
        fixed = sum(t[0].numel() * t.element_size() for t in self.fixed())
        kv = sum(s.kv_bytes_per_token() for s in self.layers)
        return {"fixed": fixed, "kv_per_token": kv, "total": fixed + kv * max(self.lengths)}


@dataclass
class Block:
    """The result of extending a state by k tokens; `commit(j)` is the rollback."""

    pendings: tuple[LayerPending, ...]
    lengths0: Lengths
    k: int

    @property
    def seqlen0(self) -> int:
        """The position of every row before the block (rows at different positions: lengths0)."""
        if not same_position(self.lengths0):
            raise ValueError(f"rows are at different positions {self.lengths0}; use .lengths0")
        return self.lengths0[0]

    def commit(self, j: RowCommit, source: Sequence[int] | None = None) -> InferenceState:
        """The state after the first j tokens of the block (1 <= j <= k; one j for every row or
        one per row), by slicing only.

        `source[b]` (a token tree's rows, all at one position): row b keeps the first j[b]
        tokens of block row source[b] instead of its own, a sibling branch that verified
        longer; its FIR windows and modal states are that row's slices and its KV cache gets
        that row's j[b] new keys and values (copied: the positions before the block are
        shared already). Default: every row its own."""
        if type(j) is int:  # one j for every row (a decode step, a uniform batch)
            if not 1 <= j <= self.k:
                raise ValueError(f"commit({j}) outside 1..{self.k}")
            js = (j,) * len(self.lengths0)
        else:
            js = as_lengths(j, len(self.lengths0))
            if min(js) < 1 or max(js) > self.k:
                bad = min(js) if min(js) < 1 else max(js)
                raise ValueError(f"commit({bad}) outside 1..{self.k}")
        if source is None:
            return InferenceState(tuple([p.commit(js) for p in self.pendings]),
                                  tuple([t + n for t, n in zip(self.lengths0, js)]))
        if len(source) != len(js) or any(
                not 0 <= s < len(js) or js[s] != n or self.lengths0[s] != self.lengths0[b]
                for b, (s, n) in enumerate(zip(source, js))):
            raise ValueError("commit from source rows needs, per row, a source row at the same "
                             "position committing the same j")
        src = tuple(source)
        return InferenceState(tuple([p.commit(js, src) for p in self.pendings]),
                              tuple([t + n for t, n in zip(self.lengths0, js)]))

    def outputs(self) -> list[Tensor]:
        """The per-position tensors of every layer (what a recorded graph produces), in order."""
        return [t for p in self.pendings for t in p.outputs()]
