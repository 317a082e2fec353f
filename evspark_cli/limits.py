"""Limits a run is held to before any work: the model's context and the memory there is.

A prompt longer than the model's context is useless without `--prompt-tail`, so reading stops
there (`context_cap`) instead of holding an endless input in memory. Scoring tiles a record
into passes of `context + window` tokens: a pass longer than the model's context, or a run whose
passes or saved logits do not fit in memory, is refused up front (`score_windows`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import ModelError, SettingError
from .io.types import LengthCap
from .model.checkpoint import CONFIG, model_folder
from .model.config import ModelConfig
from .model.memory import FP32, MAX_MEMORY, Budget, prefill_bytes

DEFAULT_SCORE_SPAN = 8192
"""`score`'s default --context and --window, each at most half the model's context."""


def read_config(model_dir: str | Path | None) -> ModelConfig:
    """A model folder's checked config (None: the bundled target), without loading weights."""
    return ModelConfig.load(model_folder(model_dir) / CONFIG)


def readable_config(model_dir: str | Path | None) -> ModelConfig | None:
    """The model folder's config, read once before the inputs (a command hands it on to
    `load_model`); None when it cannot be read (loading reports why, after the inputs are
    checked)."""
    try:
        return read_config(model_dir)
    except ModelError:
        return None


def context_cap(config: ModelConfig | None) -> LengthCap | None:
    """The most bases of a prompt worth reading: the model's context (None: no config)."""
    return None if config is None else LengthCap(config.max_seqlen, "the model's context")


SCORE_BYTES_PER_BASE = 16
"""Memory a record costs while it is read and scored: its text, a copy while it is joined, and
its int64 token ids."""


def score_cap(budget: Budget) -> LengthCap | None:
    """The longest record `score` can hold in `budget` (None: no limit known)."""
    if budget.bytes is None:
        return None
    return LengthCap(budget.bytes // SCORE_BYTES_PER_BASE, f"what fits in {budget.source}")


def score_windows(cfg: ModelConfig, context: int | None, window: int | None,
                  lengths: Sequence[int], keep_logits: bool, budget: Budget) -> tuple[int, int]:
    """The (context, window) to score records of `lengths` with: None picks the default (8192,
    or half the model's context when that is less). Refused (SettingError / InputError): a
    context the model cannot see, passes longer than the model's context, and passes or saved
    logits that do not fit in `budget`."""
    limit = cfg.max_seqlen
    if context is None:
        context = min(DEFAULT_SCORE_SPAN, max(1, limit // 2))
    if window is None:
        window = min(DEFAULT_SCORE_SPAN, max(1, limit - context))
    if context >= limit:
        raise SettingError.of("context", f"{context:,}: a base can see at most {limit - 1:,} "
                                         f"earlier bases in the model's context of {limit:,}")
    longest = max(lengths, default=0)
    span = min(longest, context + window)
    if span > limit:
        raise SettingError("{0} " + f"{context:,}" + " + {1} " + f"{window:,}" + " make passes "
                           f"of {span:,} tokens over a {longest:,}-base record, more than the "
                           f"model's context of {limit:,}; lower {{1}}", "context", "window")
    need = prefill_bytes(cfg, span) + FP32 * span * cfg.vocab_size
    reason = budget.refusal_template(need, f"scoring passes of {span:,} tokens", slot=2)
    if reason is not None:
        raise SettingError("{0} and {1}: " + reason + "; lower them", "context", "window",
                           MAX_MEMORY)
    if keep_logits:
        saved = FP32 * cfg.vocab_size * sum(max(n - 1, 0) for n in lengths)
        reason = budget.refusal_template(saved, "keeping the logits of every position", slot=1)
        if reason is not None:
            raise SettingError("{0}: " + reason + "; score fewer or shorter records", "logits",
                               MAX_MEMORY)
    return context, window

