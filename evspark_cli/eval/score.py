"""Teacher-forced scoring: bits per nucleotide with a guaranteed amount of context."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..model.model import StripedHyena
from ..train.corpus import iter_eval_windows


@torch.inference_mode()
def score_sequence(model: StripedHyena, ids: Tensor, context: int, window: int,
                   keep_logits: bool = False, max_tokens: int | None = None
                   ) -> tuple[float, Tensor | None]:
    """Bits per nucleotide of ids (1-D); every scored base sees up to `context` earlier bases.

    The record is tiled into passes of context + window tokens (stateless forward, FFT filters);
    position 0 has no context and is not scored. With `keep_logits`, the fp32 logits that
    predict positions 1..L-1 are returned (shape (L-1, V)).
    """
    total, count = 0.0, 0
    parts: list[Tensor] = []
    for chunk, first in iter_eval_windows(ids, window, max(1, context)):
        logits = model(chunk[None].to(model.device))[0].float()
        pred = logits[first - 1:-1]
        tgt = chunk[first:].to(model.device)
        total += float(-torch.log_softmax(pred, dim=-1).gather(1, tgt[:, None]).sum())
        count += int(tgt.numel())
        if keep_logits:
            parts.append(pred.cpu())
        if max_tokens is not None and count >= max_tokens:
            break
    # a 1-base record has no scored position: nan, not a perfect 0.0 bits/nt
    bits = total / count / math.log(2) if count else float("nan")
    if keep_logits and not parts:
        parts.append(torch.empty(0, model.config.vocab_size))
    return bits, (torch.cat(parts) if keep_logits else None)
