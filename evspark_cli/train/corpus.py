"""FASTA corpus -> byte-token windows for training and distillation.

Why: the drafter is distilled on windows of real DNA that must never straddle two records (a
window across a contig boundary teaches a junction that does not exist), must see both strands
(the target is strand-symmetric in training), and must be reproducible from a generator state.
Records are read by io/fasta.py (the one FASTA reader: plain, gzip, BGZF; IUPAC letters checked
and upper-cased), one at a time; token ids are the bytes of the letters (alphabet.py). The
train/valid split is by file, exactly as the folders are.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np
import torch

from ..alphabet import COMPLEMENT as _COMPLEMENT_LETTERS
from ..errors import InputError
from ..io.fasta import iter_records

FASTA_SUFFIXES: tuple[str, ...] = (".fa", ".fasta", ".fna", ".fas", ".fa.gz", ".fasta.gz",
                                   ".fna.gz", ".fas.gz")


def _complement_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint8)  # bytes outside IUPAC map to themselves
    for a, b in _COMPLEMENT_LETTERS.items():
        table[ord(a)] = ord(b)
    return table


COMPLEMENT: np.ndarray = _complement_table()
"""Byte -> complement byte (A<->T, C<->G, R<->Y, K<->M, B<->V, D<->H; S, W, N fixed; U->A)."""
_COMPLEMENT_T = torch.from_numpy(COMPLEMENT.astype(np.int64))

SeqLike = Union[np.ndarray, torch.Tensor]


def reverse_complement(seq: SeqLike) -> SeqLike:
    """Reverse complement of byte tokens along the last dim (numpy uint8 or any int tensor)."""
    if isinstance(seq, torch.Tensor):
        return _COMPLEMENT_T.to(seq.device)[seq.flip(-1).long()].to(seq.dtype)
    return COMPLEMENT[np.asarray(seq, dtype=np.uint8)[..., ::-1]]


@dataclass(frozen=True)
class Record:
    """One FASTA record: id, description (the header after the id), file it came from, and its
    byte tokens (uint8)."""

    name: str
    description: str
    source: Path
    seq: np.ndarray = field(repr=False)

    def __len__(self) -> int:
        return int(self.seq.shape[0])


def read_fasta(path: str | os.PathLike[str]) -> list[Record]:
    """All records of one FASTA file (plain, gzip or BGZF) as byte tokens, read one at a time."""
    p = Path(path)
    return [Record(r.id, r.description, p, np.frombuffer(r.seq.encode("ascii"), np.uint8).copy())
            for r in iter_records(p)]


def fasta_files(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand a directory (its FASTA files, sorted by name) or a list of files/directories."""
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    out: list[Path] = []
    for item in items:
        p = Path(item)
        if p.is_dir():
            found = sorted(f for f in p.iterdir()
                           if f.is_file() and f.name.lower().endswith(FASTA_SUFFIXES))
            if not found:
                raise InputError(f"no FASTA files ({', '.join(FASTA_SUFFIXES)}) in {p}")
            out += found
        elif p.is_file():
            out.append(p)
        else:
            raise InputError(f"no such FASTA file or directory: {p}")
    return out


class Corpus:
    """Records held in memory as uint8 byte tokens (one flat buffer), with window sampling."""

    def __init__(self, records: Sequence[Record]) -> None:
        records = list(records)
        lengths = np.array([len(r) for r in records], dtype=np.int64)
        self.lengths: np.ndarray = lengths
        self._offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        flat = (np.concatenate([r.seq for r in records]).astype(np.uint8, copy=False) if records
                else np.zeros(0, np.uint8))
        self._flat = torch.from_numpy(flat)
        # records become views into the one flat buffer, so the corpus is held once in memory
        self.records: list[Record] = [
            Record(r.name, r.description, r.source, flat[a:b])
            for r, a, b in zip(records, self._offsets[:-1], self._offsets[1:])
        ]

    @classmethod
    def from_paths(cls, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
                   ) -> Corpus:
        """Load every record of the given FASTA files / directories (a directory = one split)."""
        return cls([rec for f in fasta_files(paths) for rec in read_fasta(f)])

    def __len__(self) -> int:
        return len(self.records)

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
