"""FASTA corpus -> byte-token windows for distillation and scoring.

Why: the drafter is distilled on windows of real DNA that must never straddle two records (a
window across a contig boundary teaches a junction that does not exist), must see both strands
(the target is strand-symmetric in training), and must be reproducible from a generator state.
Token ids are the bytes of the upper-cased letters (A=65, C=67, G=71, T=84, N=78; IUPAC codes
kept as their own bytes). The train/valid split is by file, exactly as the folders are.
"""
from __future__ import annotations

import gzip
import io
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO, Union

import numpy as np
import torch

from evspark_cli.errors import InputError

FASTA_SUFFIXES: tuple[str, ...] = (".fa", ".fasta", ".fna", ".fas", ".fa.gz", ".fasta.gz", ".fna.gz", ".fas.gz")
IUPAC: bytes = b"ACGTURYKMSWBDHVN"
"""Letters accepted in sequences (after upper-casing)."""

_PAIRS = {"A": "T", "C": "G", "R": "Y", "K": "M", "B": "V", "D": "H", "S": "S", "W": "W", "N": "N"}


def _complement_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint8)  # bytes outside IUPAC map to themselves
    for a, b in _PAIRS.items():
        table[ord(a)], table[ord(b)] = ord(b), ord(a)
    table[ord("U")] = ord("A")
    return table


COMPLEMENT: np.ndarray = _complement_table()
"""Byte -> complement byte (A<->T, C<->G, R<->Y, K<->M, B<->V, D<->H; S, W, N fixed; U->A)."""
_COMPLEMENT_T = torch.from_numpy(COMPLEMENT.astype(np.int64))
_VALID = np.zeros(256, dtype=bool)
_VALID[np.frombuffer(IUPAC, dtype=np.uint8)] = True

SeqLike = Union[np.ndarray, torch.Tensor]


def reverse_complement(seq: SeqLike) -> SeqLike:
    """Reverse complement of byte tokens along the last dim (numpy uint8 or any int tensor)."""
    if isinstance(seq, torch.Tensor):
        return _COMPLEMENT_T.to(seq.device)[seq.flip(-1).long()].to(seq.dtype)
    return COMPLEMENT[np.asarray(seq, dtype=np.uint8)[..., ::-1]]


def encode_sequence(text: str) -> np.ndarray:
    """Upper-cased letters as uint8 byte tokens; rejects anything that is not IUPAC."""
    try:
        raw = text.upper().encode("ascii")
    except UnicodeEncodeError as exc:
        raise InputError(f"non-ASCII character in sequence at position {exc.start}") from exc
    arr = np.frombuffer(raw, dtype=np.uint8).copy()
    bad = ~_VALID[arr]
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"{int(bad.sum())} non-IUPAC character(s) in sequence, first {chr(arr[pos])!r} at {pos + 1}"
        )
    return arr


@dataclass(frozen=True)
class Record:
    """One FASTA record: id, description, file it came from, and its byte tokens (uint8)."""

    name: str
    description: str
    source: Path
    seq: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return int(self.seq.shape[0])


def _open_text(path: Path) -> TextIO:
    """gzip (incl. BGZF, which is multi-member gzip) or plain text, chosen by magic bytes."""
    with path.open("rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="latin-1")
    return path.open("r", encoding="latin-1")  # lenient for headers; sequences are checked


def read_fasta(path: str | os.PathLike[str]) -> list[Record]:
    """All records of one FASTA file (plain, gzip or BGZF)."""
    from Bio import SeqIO  # lazy: the engine and its tests run where biopython is absent

    p = Path(path)
    records: list[Record] = []
    try:
        with _open_text(p) as handle:
            for rec in SeqIO.parse(handle, "fasta"):
                try:
                    seq = encode_sequence(str(rec.seq))
                except InputError as exc:
                    raise InputError(f"{p}: record {rec.id!r}: {exc}") from exc
                records.append(Record(rec.id, rec.description, p, seq))
    except (OSError, EOFError, ValueError) as exc:
        raise InputError(f"cannot read FASTA {p}: {exc}") from exc
    return records


def fasta_files(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand a directory (its FASTA files, sorted by name) or a list of files/directories."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.iterdir() if f.is_file() and f.name.lower().endswith(FASTA_SUFFIXES))
            if not found:
                raise InputError(f"no FASTA files ({', '.join(FASTA_SUFFIXES)}) in {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"no such FASTA file or directory: {p}")
    return out


class Corpus:
    """Records held in memory as uint8 byte tokens, with window sampling and eval tiling."""

    def __init__(self, records: Sequence[Record]) -> None:
        records = list(records)
        lengths = np.array([len(r) for r in records], dtype=np.int64)
        self.lengths: np.ndarray = lengths
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = np.concatenate([r.seq for r in records]).astype(np.uint8, copy=False) if records else np.zeros(0, np.uint8)
        self._flat = torch.from_numpy(flat)
        # records become views into the one flat buffer, so the corpus is held once in memory
        self.records: list[Record] = [
            Record(r.name, r.description, r.source, flat[a:b])
            for r, a, b in zip(records, self._offsets[:-1], self._offsets[1:])
        ]
        self._by_name = {r.name: i for i, r in enumerate(self.records)}

    @classmethod
    def from_paths(cls, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> Corpus:
        """Load every record of the given FASTA files / directories (a directory = one split)."""
        return cls([rec for f in fasta_files(paths) for rec in read_fasta(f)])

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, key: int | str) -> Record:
        return self.records[self._index(key)]

    def _index(self, key: int | str) -> int:
        if isinstance(key, str):
            if key not in self._by_name:
                raise KeyError(f"no record named {key!r}")
            return self._by_name[key]
        return range(len(self.records))[key]

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.records]

    @property
    def sources(self) -> list[Path]:
        return [r.source for r in self.records]

    @property
    def total_length(self) -> int:
        return int(self._offsets[-1])

    def sample_windows(
        self,
        batch_size: int,
        window: int,
        generator: torch.Generator,
        rc_prob: float = 0.5,
    ) -> torch.Tensor:
        """(batch_size, window + 1) int64 token windows, each inside one record.

        Start positions are uniform over all valid starts of all records (so records are
        weighted by their number of windows, i.e. by length); records shorter than window + 1
        are skipped. Each window is reverse-complemented with probability ``rc_prob``. The result
        depends only on the corpus and the generator state.
        """
        if batch_size < 1 or window < 1:
            raise ValueError("batch_size and window must be >= 1")
        if not 0.0 <= rc_prob <= 1.0:
            raise ValueError(f"rc_prob must be in [0, 1], got {rc_prob}")
        span = window + 1
        starts_per = np.maximum(self.lengths - span + 1, 0)
        total = int(starts_per.sum())
        if total == 0:
            raise ValueError(f"no record is at least window + 1 = {span} tokens long")
        cum = torch.from_numpy(np.cumsum(starts_per))
        u = torch.randint(total, (batch_size,), generator=generator, dtype=torch.int64)
        rec = torch.searchsorted(cum, u, right=True)
        before = torch.where(rec > 0, cum[(rec - 1).clamp(min=0)], torch.zeros_like(rec))
        start = torch.from_numpy(self._offsets)[rec] + (u - before)
        idx = start.unsqueeze(1) + torch.arange(span, dtype=torch.int64)
        out = self._flat[idx].long()
        flip = torch.rand(batch_size, generator=generator) < rc_prob
        if bool(flip.any()):
            out[flip] = reverse_complement(out[flip])  # type: ignore[assignment]
        return out

    def iter_eval_windows(
        self, record: int | str | Record, window: int, context: int
    ) -> Iterator[tuple[torch.Tensor, int]]:
        """:func:`iter_eval_windows` over one record of this corpus (by index, name or Record)."""
        rec = record if isinstance(record, Record) else self[record]
        return iter_eval_windows(rec, window, context)


def iter_eval_windows(
    record: Record | SeqLike, window: int, context: int
) -> Iterator[tuple[torch.Tensor, int]]:
    """Tile a record for scoring: yields ``(ids, n_scored_from)`` with ids int64 1-D.

    Position p (a target, predicted from tokens < p) is scored where ``j >= n_scored_from`` for
    ``ids[j]``. Every position 1..len-1 is scored exactly once (position 0 has no context); the
    first scored position of a chunk sees min(context, p) preceding tokens, later ones more.
    Chunks are at most ``context + window`` long and their scored spans step by ``window``.
    """
    if window < 1 or context < 1:
        # context >= 1: a causal LM predicts ids[j] from the logits at j - 1, so the first scored
        # token of a chunk needs at least its predecessor inside the chunk
        raise ValueError("window and context must be >= 1")
    seq = record.seq if isinstance(record, Record) else record
    ids = torch.as_tensor(np.asarray(seq) if not isinstance(seq, torch.Tensor) else seq).long()
    n = int(ids.shape[-1])
    for first in range(1, n, window):
        stop = min(first + window, n)
        begin = max(0, first - context)
        yield ids[begin:stop].clone(), first - begin
