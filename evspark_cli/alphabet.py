"""The DNA alphabet in one place: the four bases, their token ids, IUPAC codes, complements.

A token is the byte of an upper-case letter (model/tokenizer.py), so the bases A, C, G, T are
the ids 65, 67, 71, 84: prompts, training windows and drafters all speak in these bytes.
"""
from __future__ import annotations

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
