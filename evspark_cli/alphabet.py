"""The DNA alphabet in one place: the four bases, their token ids, IUPAC codes, complements, and
what happens to a code that is not one of the four bases (the `--iupac` policy).

A token is the byte of an upper-case letter (model/tokenizer.py), so the bases A, C, G, T are
the ids 65, 67, 71, 84: prompts, training windows and drafters all speak in these bytes.
"""
from __future__ import annotations

import numpy as np

BASES = "ACGT"
"""The four DNA bases, in token-id order (drafters propose only these)."""

BASE_IDS: tuple[int, ...] = tuple(BASES.encode())
"""Token ids of A, C, G, T: (65, 67, 71, 84)."""

IUPAC = "ACGTUNRYSWKMBDHV"
"""IUPAC nucleotide codes accepted in sequences (upper case; any case on input). Gaps ('-',
'.') and stops ('*') are not: a prompt is a sequence, not an alignment row or a protein."""

COMPLEMENT: dict[str, str] = {
    "A": "T", "T": "A", "C": "G", "G": "C", "R": "Y", "Y": "R", "K": "M", "M": "K",
    "B": "V", "V": "B", "D": "H", "H": "D", "S": "S", "W": "W", "N": "N", "U": "A",
}
"""Complement of every IUPAC code (S, W, N are their own; U, RNA's T, pairs with A)."""

AMBIGUOUS: dict[str, str] = {
    "N": "ACGT", "R": "AG", "Y": "CT", "S": "CG", "W": "AT", "K": "GT", "M": "AC",
    "B": "CGT", "D": "AGT", "H": "ACT", "V": "ACG",
}
"""The bases each ambiguity code stands for."""

RNA_TO_DNA = str.maketrans("Uu", "TT")
"""U is RNA's T: an RNA prompt is read as the DNA the model was trained on."""

IUPAC_POLICIES = ("keep", "error", "random")
"""What a prompt's ambiguity codes become. `keep`: their own byte tokens, as Evo 2 feeds them
(the model has seen N in genomes; the rarer codes it has barely seen); `error`: refused with the
record and position; `random`: one of the bases the code stands for, the same one for the same
record id and position in every run (a hash, not the sampling seed)."""


def _choice_tables() -> tuple[np.ndarray, np.ndarray]:
    counts = np.zeros(256, dtype=np.uint64)
    table = np.zeros((256, 4), dtype=np.uint8)
    for code, bases in AMBIGUOUS.items():
        counts[ord(code)] = len(bases)
        table[ord(code), : len(bases)] = np.frombuffer(bases.encode(), np.uint8)
    return counts, table


_COUNTS, _TABLE = _choice_tables()
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of each entry (uint64 wraps silently)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def resolve_ambiguous(seq: str, key: int, offset: int = 0) -> str:
    """`seq` (upper case) with every ambiguity code replaced by one of its bases, chosen by a hash
    of `key` (the record) and the 0-based position `offset + i`: a region or a streamed piece of a
    record gets the same bases as the whole record."""
    arr = np.frombuffer(seq.encode("ascii"), np.uint8).copy()
    idx = np.nonzero(_COUNTS[arr])[0]
    if idx.size == 0:
        return seq
    pos = idx.astype(np.uint64) + np.uint64(offset)
    with np.errstate(over="ignore"):
        h = _mix(pos * _GOLDEN + np.uint64(key & 0xFFFFFFFFFFFFFFFF))
    codes = arr[idx]
    arr[idx] = _TABLE[codes, (h % _COUNTS[codes]).astype(np.int64)]
    return arr.tobytes().decode("ascii")
