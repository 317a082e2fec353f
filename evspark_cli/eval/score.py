"""Teacher-forced scoring: bits per nucleotide with a guaranteed amount of context.

Scoring and validation during training (train/pretrain.py) both come here; this module needs
nothing from training, so the packages do not import each other in a loop.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import SettingError
from ..model.model import StripedHyena

SCORE_COLUMNS = ("record_id", "length", "bits_per_nt", "total_ll", "scored")
"""Columns of `evspark score` (TSV or JSONL): `total_ll` is the record's log-likelihood in nats
(the sum over its `scored` positions, every base but the first); columns added later go
last."""
LOGITS_COLUMNS = ("all", "acgt")
"""What `--logits` keeps of each position: every vocabulary entry, or A, C, G, T (in that order)."""
LOGITS_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ScoreResult:
    """One record scored: bits per nucleotide, total log-likelihood (nats) over the scored
    positions, and on request the logits that predict them and each one's log-likelihood."""

    bits_per_nt: float
    total_ll: float
    scored: int
    logits: Tensor | None = None  # (scored, V), or (scored, 4) for A/C/G/T columns
    per_base: Tensor | None = None  # (scored,) log-likelihood of each scored base, nats


def check_logits_format(columns: str, dtype: str) -> None:
    """`--logits-columns` and `--logits-dtype`, checked before any work."""
    if columns not in LOGITS_COLUMNS:
        raise SettingError.of("logits_columns", f"must be {' or '.join(LOGITS_COLUMNS)}, got "
                                                f"{columns!r}")
    if dtype not in LOGITS_DTYPES:
        raise SettingError.of("logits_dtype", f"must be {', '.join(LOGITS_DTYPES)}, got "
                                              f"{dtype!r}")


def check_score_windows(context: int, window: int) -> None:
    """Each scored base sees `context` earlier bases; `window` bases are scored per pass."""
    if context < 1 or window < 1:
        raise SettingError("{0} and {1} must be >= 1", "context", "window")


def iter_eval_windows(seq: np.ndarray | Tensor, window: int, context: int
                      ) -> Iterator[tuple[Tensor, int]]:
    """Tile a sequence of token ids for scoring: yields ``(ids, n_scored_from)``, ids int64 1-D.

    Position p (a target, predicted from tokens < p) is scored where ``j >= n_scored_from`` for
    ``ids[j]``. Every position 1..len-1 is scored exactly once (position 0 has no context); the
    first scored position of a chunk sees min(context, p) preceding tokens, later ones more.
    Chunks are at most ``context + window`` long and their scored spans step by ``window``.
    """
    if window < 1 or context < 1:
        # context >= 1: a causal LM predicts ids[j] from the logits at j - 1, so the first scored
        # token of a chunk needs at least its predecessor inside the chunk
        raise ValueError("window and context must be >= 1")
    ids = torch.as_tensor(seq if isinstance(seq, Tensor) else np.asarray(seq)).long()
    n = int(ids.shape[-1])
    for first in range(1, n, window):
        stop = min(first + window, n)
        begin = max(0, first - context)
        yield ids[begin:stop].clone(), first - begin


@torch.inference_mode()
def score_sequence(model: StripedHyena, ids: Tensor, context: int, window: int,
                   keep_logits: bool = False, max_tokens: int | None = None,
                   on_window: Callable[[int], None] | None = None
                   ) -> tuple[float, Tensor | None]:
    """Bits per nucleotide of ids (1-D); every scored base sees up to `context` earlier bases.

    The record is tiled into passes of context + window tokens (stateless forward, FFT filters);
    position 0 has no context and is not scored. With `keep_logits`, the fp32 logits that
    predict positions 1..L-1 are returned (shape (L-1, V)). `on_window(scored)` is told the
    bases scored so far after each pass, so that a long record shows progress inside it.
    """
    got = score_record(model, ids, context, window, keep_logits, max_tokens=max_tokens,
                       on_window=on_window)
    return got.bits_per_nt, got.logits


@torch.inference_mode()
def score_record(model: StripedHyena, ids: Tensor, context: int, window: int,
                 keep_logits: bool = False, per_base: bool = False,
                 max_tokens: int | None = None, on_window: Callable[[int], None] | None = None,
                 logits_columns: str = "all", logits_dtype: str = "float32") -> ScoreResult:
    """`score_sequence`, with the total log-likelihood and, on request, each scored base's
    log-likelihood (`per_base`) and the logits kept as `logits_columns` and `logits_dtype`
    say (A/C/G/T columns: the entries of those four byte tokens)."""
    total, count = 0.0, 0
    parts: list[Tensor] = []
    bases: list[Tensor] = []
    keep = list(b"ACGT") if logits_columns == "acgt" else None
    for chunk, first in iter_eval_windows(ids, window, max(1, context)):
        logits = model(chunk[None].to(model.device))[0].float()
        pred = logits[first - 1:-1]
        tgt = chunk[first:].to(model.device)
        ll = torch.log_softmax(pred, dim=-1).gather(1, tgt[:, None])[:, 0]
        total += float(-ll.sum())
        count += int(tgt.numel())
        if on_window is not None:
            on_window(count)
        if keep_logits:
            kept = pred[:, keep] if keep is not None else pred
            parts.append(kept.to(LOGITS_DTYPES[logits_dtype]).cpu())
        if per_base:
            bases.append(ll.double().cpu())
        if max_tokens is not None and count >= max_tokens:
            break
    # a 1-base record has no scored position: nan, not a perfect 0.0 bits/nt
    bits = total / count / math.log(2) if count else float("nan")
    width = 4 if keep is not None else model.config.vocab_size
    lg = None
    if keep_logits:
        lg = torch.cat(parts) if parts else torch.empty(0, width,
                                                        dtype=LOGITS_DTYPES[logits_dtype])
    pb = (torch.cat(bases) if bases else torch.empty(0, dtype=torch.float64)) if per_base \
        else None
    return ScoreResult(bits, 0.0 - total, count, lg, pb)  # (0.0 - 0.0 is 0, not -0)
