"""Row bookkeeping shared by the state classes and the KV cache: lengths and row indices."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

Lengths = tuple[int, ...]  # tokens fed so far, one per row


def same_position(lengths: Lengths) -> bool:
    """Every row at the same position (the common case: one fast path per operation)."""
    return lengths.count(lengths[0]) == len(lengths)


def row_index(rows: Sequence[int], device: torch.device) -> Tensor:
    """Row numbers as an int64 index tensor on `device`."""
    return torch.as_tensor(list(rows), dtype=torch.long, device=device)


def positions_index(t0: Lengths, k: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """(rows (B, 1), positions (B, k)) indexing positions t0[b]..t0[b]+k-1 of each row."""
    start = row_index(t0, device)
    return (torch.arange(len(t0), device=device)[:, None],
            start[:, None] + torch.arange(k, device=device))
