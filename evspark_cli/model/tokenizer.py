"""Byte-level tokenizer, compatible with Evo 2's CharLevelTokenizer(512).

A token is the UTF-8 byte of a letter (A=65, C=67, G=71, T=84: alphabet.py); the vocabulary is
padded to 512.
"""
from __future__ import annotations

from typing import Iterable

import torch

VOCAB_SIZE = 512


def tokenize(seq: str) -> list[int]:
    """Letters to ids (one id per byte)."""
    return list(seq.encode("utf-8"))


def tokenize_tensor(seq: str) -> torch.Tensor:
    return torch.tensor(tokenize(seq), dtype=torch.long)


def detokenize(ids: Iterable[int]) -> str:
    """Ids to text the way Evo 2 prints them: ids < 32 become spaces, others chr(id)."""
    return "".join(chr(min(max(int(i), 32), VOCAB_SIZE)) if int(i) >= 32 else " " for i in ids)
