"""What a run needs before it starts: the model and drafter, checked against the run's prompts
and settings, and a batch size whose state fits in memory."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..decode.batch import dense_layout
from ..decode.drafters.base import Drafter
from ..decode.drafters.registry import resolve_drafter
from ..decode.jobs import Job
from ..errors import SettingError
from ..io.types import Prompt
from ..model.memory import check_batch_fits, largest_batch, process_bytes, run_budget, run_memory
from ..model.model import StripedHyena
from .options import DecodeOptions, check_context, check_gamma, default_batch_size


def model_and_drafter(model_dir: str | Path | None, prompts: Sequence[Prompt],
                      options: DecodeOptions, drafter: str | Path | Drafter | None = "auto",
                      force_drafter: bool = False, **load: Any
                      ) -> tuple[StripedHyena, Drafter | None]:
    """The model (`load_model` keywords in `load`) and the drafter for a run over `prompts`,
    with every prompt's length and the draft length checked against them before any work."""
    from ..model.checkpoint import load_model

    model = load_model(model_dir, **load)
    for p in prompts:
        check_context(model.config, len(p.seq), options.max_new_tokens, p.id)
    d = resolve_drafter(model, drafter, force=force_drafter, max_memory=load.get("max_memory"))
    check_gamma(d, options.largest_draft)
    return model, d


def plan_batch(model: StripedHyena, jobs: Sequence[Job], options: DecodeOptions,
               drafter: Drafter | None, batch_size: int | None,
               max_memory: str | int | None = None, decoders: int = 1) -> int:
    """The batch size of a run: `batch_size`, or the device's default when None; either way one
    whose state fits in the memory available at the run's longest context (a default shrinks to
    fit; a batch size the user asked for that does not fit is refused, naming the largest that
    does). `decoders`: how many such batches are held at once (2 with compare_native, whose
    native and speculative passes run in turns)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise SettingError.of("batch_size", f"must be an integer >= 1, got {batch_size!r}")
    want = batch_size or default_batch_size(model.device)
    rows = max(1, min(want, len(jobs) * (1 + options.tree_rows)))  # branch rows: free rows
    context, block, needs = memory_inputs(model, jobs, options, drafter)
    if needs is not None:
        needs = needs * decoders
    weights = next(model.parameters()).dtype
    loaded = sum(p.numel() * p.element_size() for p in model.parameters())
    budget = run_budget(model.device, max_memory, loaded)
    if batch_size is None and budget.bytes is not None:
        fits = largest_batch(model.config, weights, weights, context, block, budget.bytes,
                             needs=needs, chunk=model.prefill_chunk()) // decoders
        rows = max(1, min(rows, fits))
    check_batch_fits(model.config, weights, weights, rows, context, block, budget, needs=needs,
                     chunk=model.prefill_chunk(), decoders=decoders)
    return rows


def memory_inputs(model: StripedHyena, jobs: Sequence[Job], options: DecodeOptions,
                  drafter: Drafter | None) -> tuple[int, int, list[int] | None]:
    """What the memory estimate of a run takes: the longest row's context, the verification
    block, and each job's KV positions when rows live in size classes (a CPU run; None in the
    dense layout, where every row is at the longest context)."""
    speculative = drafter is not None
    longest = max((len(j.prompt) for j in jobs), default=1)
    context = options.row_capacity(longest, speculative) + 1  # + the block's anchor
    needs = None if dense_layout(model) else [  # a branch row holds its job's positions
        options.row_capacity(len(j.prompt), speculative) + 1 for j in jobs
        for _ in range(1 + (options.tree_rows if speculative else 0))]
    return context, options.block(speculative), needs


def peak_estimate(model: StripedHyena, jobs: Sequence[Job], options: DecodeOptions,
                  drafter: Drafter | None, rows: int) -> int:
    """The most memory this process should hold while it decodes `jobs` `rows` at a time
    (bytes): what it holds now and the run's rows and transients, as the batch check counts
    them (model/memory.py). benchmarks/memory_check.py measures it against the peak."""
    context, block, needs = memory_inputs(model, jobs, options, drafter)
    weights = next(model.parameters()).dtype
    est = run_memory(model.config, weights, weights, context, block, rows,
                     with_parameters=model.device.type != "cpu", needs=needs,
                     chunk=model.prefill_chunk())
    return (process_bytes() if model.device.type == "cpu" else 0) + est.total(rows)
