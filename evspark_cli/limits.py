"""Limits a run is held to before any work: the model's context and the memory there is.

A prompt longer than the model's context is useless without `--prompt-tail`, so reading stops
there (`context_cap`) instead of holding an endless input in memory. Scoring tiles a record
into passes of `context + window` tokens: a pass longer than the model's context, or a run whose
passes or saved logits do not fit in memory, is refused up front (`score_windows`). And an
output must not overwrite anything the run reads: `run_inputs` lists it all (the FASTA files and
their indexes, the BED file, the model's and the drafter's folders) for `files.check_distinct`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .bundled import default_model_dir
from .errors import ModelError, SettingError
from .files import RunInput, folder_inputs
from .io.indexed import index_files
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
    return LengthCap(budget.bytes // SCORE_BYTES_PER_BASE, f"what fits in {budget.source}",
                     budget.setting)


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


def run_inputs(inputs: Sequence[str] | None, bed: str | None = None,
               model_dir: str | Path | None = None, drafters: Sequence[str | Path | None] = (),
               index_dir: str | None = None) -> list[RunInput]:
    """Every file a run reads, for the check that no output is one of them: each FASTA input
    with the index files a region read of it reads or builds, the BED file, every file of the
    model folder (None: the bundled target) and of each drafter's folder (a name such as
    `dspark` means the model's own drafter). What does not exist yet is reported where it is
    read; this only names files."""
    from .decode.drafters.registry import drafter_folder

    found: list[RunInput] = []
    for path in inputs or []:
        if path != "-":  # standard input: no file
            found += [path, *index_files(path, index_dir)]
    if bed is not None:
        found.append(bed)
    folder = model_path(model_dir)
    if folder is not None:
        found += folder_inputs(folder, f"in the model folder {folder}")
    for spec in drafters:
        d = drafter_folder(folder, spec)
        if d is not None:
            found += folder_inputs(d, f"in the drafter folder {d}")
    return found


def model_path(model_dir: str | Path | None) -> Path | None:
    """The folder `model_dir` names (None: the bundled target's), if there is one; unchecked
    (loading the model checks it)."""
    try:
        folder = Path(model_dir) if model_dir is not None else default_model_dir()
    except ModelError:  # no bundled model: loading it reports that
        return None
    return folder if folder.is_dir() else None
