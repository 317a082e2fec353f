"""The Python API (docs/cli.md, "Python API"): `generate` and `generate_many` on a loaded model.

A small facade over the generation package: settings are checked once by `DecodeOptions`, jobs
come from the one job builder, and both calls are one `GenerationRun` (`generate` is a run of one
job), so the API decodes exactly what the command line decodes for the same record key.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from . import defaults
from .cpus import Threads, clamp_threads
from .decode.drafters.base import Drafter
from .decode.drafters.registry import resolve_drafter
from .decode.jobs import RoundReport
from .errors import GenerationError, at_least
from .eval.score import ScoreResult, check_logits_format, check_score_windows, score_record
from .eval.variants import VariantScore
from .generation.jobs import Record, build_jobs, check_job_count, prompt_ids
from .generation.options import DecodeOptions, check_context, check_gamma
from .generation.plan import plan_batch
from .generation.results import GenerateOutput
from .generation.run import GenerationRun
from .model.model import StripedHyena

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["GenerateOutput", "ScoreResult", "VariantScore", "generate", "generate_many", "score",
           "score_variants", "set_threads"]


def set_threads(threads: int) -> Threads:
    """CPU threads for torch: `threads`, or for 0 the CPUs this process may use (affinity,
    cgroup quota, scheduler variables: cpus.py), so a job never oversubscribes its allowance.
    A count above that is clamped to it (`Threads.clamped` says so): extra threads would only
    compete for the same cores, and a huge count crashes the OpenMP runtime. Returns what was
    set and why (the run's summary reports it)."""
    at_least("threads", threads, 0)
    import torch

    got = clamp_threads(threads)
    torch.set_num_threads(got.count)
    return got


def _run(model: StripedHyena, records: list[Record], options: DecodeOptions,
         drafter: str | Path | Drafter | None, force_drafter: bool, batch_size: int | None,
         max_memory: str | int | None, compare_native: bool = False,
         on_round: Callable[[RoundReport], None] | None = None,
         samples: range | None = None) -> list[GenerateOutput]:
    """Every (record, sample) of `records` decoded in one run: outputs in input order. Where
    jobs fail, a GenerationError carries the finished outputs and each failure (or, for one
    job alone, its own error is raised)."""
    d = resolve_drafter(model, drafter, force=force_drafter)
    check_gamma(d, options.largest_draft)
    for r in records:
        check_context(model.config, len(r.tokens), options.max_new_tokens, r.id)
    # every output is kept until the call returns: refused up front when they cannot all fit
    check_job_count(len(records), options.samples if samples is None else len(samples),
                    kept_tokens=options.max_new_tokens)
    jobs = build_jobs(records, options, samples=samples)
    run = GenerationRun(model, d, options,
                        plan_batch(model, jobs, options, d, batch_size, max_memory),
                        compare_native=compare_native, on_round=on_round)
    outs: list[GenerateOutput | None] = []
    errors: dict[int, Exception] = {}
    for i, o in enumerate(run.outcomes(jobs)):
        if o.error is not None:
            errors[i] = o.error
        outs.append(o.output)
    if errors and len(jobs) == 1:
        raise errors[0]
    if errors:
        raise GenerationError(outs, errors)
    return outs  # type: ignore[return-value]  # no job failed: every output is there


def generate(model: StripedHyena, prompt: str | Sequence[int],
             max_new_tokens: int = defaults.MAX_NEW_TOKENS,
             drafter: str | Path | Drafter | None = defaults.DRAFTER, gamma: int = defaults.GAMMA,
             temperature: float = defaults.TEMPERATURE, top_k: int = defaults.TOP_K,
             top_p: float = defaults.TOP_P, seed: int = defaults.SEED,
             rollback: str = defaults.ROLLBACK, record: int = 0, sample: int = 0,
             record_id: str = "prompt", compare_native: bool = False,
             force_drafter: bool = False, rule: str = defaults.RULE,
             draft_length: str = defaults.DRAFT_LENGTH,
             alphabet: str = defaults.ALPHABET,
             tree_rows: int = defaults.TREE_ROWS) -> GenerateOutput:
    """Continue `prompt` by `max_new_tokens` tokens; lossless whatever the drafter. `prompt`
    is checked as the command line checks `--prompt`: IUPAC letters in any case, upper-cased
    (U read as T, ambiguity codes kept), or a sequence of integer token ids; anything else is
    an InputError naming the position (generation/jobs.prompt_ids). `record` is the prompt's
    random-number key and `sample` its sample index (the same key gives the same tokens as
    `generate_many`); `compare_native` also decodes natively and fills the speedup columns.
    `rule="coupled"` draws tokens by Gumbel-max, so sampled output equals native sampling of the
    same seed token for token (decode/sampling.py); "residual" is lossless in distribution.
    `draft_length="confidence"` (greedy or coupled) verifies, each round, as many drafts as
    the drafter's confidence and the measured block cost make worth it (decode/schedule.py).
    `alphabet="acgt"` draws only A, C, G and T (on both paths: still lossless).
    `tree_rows=N` (greedy or coupled) verifies up to N alternative drafts beside the drafter's
    own in each round's pass (token trees, decode/tree.py; same output)."""
    options = DecodeOptions(max_new_tokens, gamma, temperature, top_k, top_p, seed,
                            rollback=rollback, rule=rule, draft_length=draft_length,
                            alphabet=alphabet, tree_rows=tree_rows)
    rec = Record(record_id, prompt_ids(prompt, model.config.vocab_size), record)
    return _run(model, [rec], options, drafter, force_drafter, 1 + tree_rows, None,
                compare_native,
                samples=range(sample, sample + 1))[0]


def generate_many(model: StripedHyena,
                  prompts: Sequence[str | Sequence[int]] | Mapping[str, str | Sequence[int]],
                  samples: int = defaults.SAMPLES, batch_size: int | None = None,
                  max_new_tokens: int = defaults.MAX_NEW_TOKENS,
                  drafter: str | Path | Drafter | None = defaults.DRAFTER,
                  gamma: int = defaults.GAMMA, temperature: float = defaults.TEMPERATURE,
                  top_k: int = defaults.TOP_K, top_p: float = defaults.TOP_P,
                  seed: int = defaults.SEED, rollback: str = defaults.ROLLBACK,
                  force_drafter: bool = False, max_memory: str | int | None = None,
                  on_round: Callable[[RoundReport], None] | None = None,
                  rule: str = defaults.RULE, draft_length: str = defaults.DRAFT_LENGTH,
                  alphabet: str = defaults.ALPHABET,
                  tree_rows: int = defaults.TREE_ROWS) -> list[GenerateOutput]:
    """Continue every prompt `samples` times, `batch_size` rows at a time (None: the device's
    default, fewer if memory is short): one output per (prompt, sample), in input order.

    `prompts` is a list (strings or token ids; prompt i is keyed by its index, so prompt 0,
    sample 0 gives what `generate(model, prompt)` gives) or a {record id: sequence} mapping (keyed
    by record id, as the command line keys a record); a single string is one prompt. Every
    prompt is checked as `generate` checks it (an InputError names `prompts[i]` or the record
    id). Lossless per row whatever the batch size. When some jobs fail (a non-finite logit,
    say), the others still run and a GenerationError is raised with every finished output
    (`error.outputs`, None where a job failed) and the failures (`error.errors`, by index)."""
    options = DecodeOptions(max_new_tokens, gamma, temperature, top_k, top_p, seed, samples,
                            rollback, rule, draft_length, alphabet, tree_rows)
    records = Record.listed(prompts, model.config.vocab_size)
    return _run(model, records, options, drafter, force_drafter, batch_size, max_memory,
                on_round=on_round)


def score(model: StripedHyena, prompt: str | Sequence[int], context: int | None = None,
          window: int | None = None, per_base: bool = False, keep_logits: bool = False,
          logits_columns: str = "all", logits_dtype: str = "float32",
          max_memory: str | int | None = None) -> ScoreResult:
    """Teacher-forced log-likelihood of `prompt`, as `evspark score` computes a record's row:
    bits per nucleotide, the total log-likelihood in nats over the scored positions (every base
    but the first), with `per_base` each of those bases' log-likelihood, with `keep_logits` the
    logits that predict them (`logits_columns` all or acgt, `logits_dtype`). `context` and
    `window` default as the command's do (8,192 each, within the model's context), and passes
    that would not fit in memory (or `max_memory`) are refused before any work."""
    from .limits import score_windows
    from .model.memory import run_budget

    check_score_windows(1 if context is None else context, 1 if window is None else window)
    check_logits_format(logits_columns, logits_dtype)
    ids = prompt_ids(prompt, model.config.vocab_size)
    budget = run_budget(model.device, max_memory, model.num_parameters() * 4)
    context, window = score_windows(model.config, context, window, [len(ids)], keep_logits,
                                    budget)
    import torch

    return score_record(model, torch.tensor(ids, dtype=torch.long), context, window,
                        keep_logits, per_base, logits_columns=logits_columns,
                        logits_dtype=logits_dtype)


def score_variants(model: StripedHyena, vcf: str, reference: str, window: int = 8192,
                   reduce: str = "mean", strict: bool = False, rc: bool = False,
                   rows: int | None = None) -> list[VariantScore]:
    """Variant effect scores of every scorable ALT allele of `vcf` (VCF or BCF, plain or
    bgzipped) against `reference` (a FASTA), as `evspark score --variants` computes them
    (docs/cli.md): each a `VariantScore` (`variant`, `ref_ll`, `alt_ll`, `delta`), in file
    order; `rc` averages each score with its reverse complement's; `rows`: windows a batched
    pass holds (default by device). Alleles that cannot be scored are skipped with a Python
    warning per reason (refused with InputError if `strict`)."""
    import warnings

    from .eval import variants as scoring
    from .io.fasta import open_reference
    from .io.vcf import read_variants

    scoring.check_variant_settings(window, reduce)
    ref = open_reference(reference)
    try:
        got = read_variants(vcf, ref, strict, warn=lambda m: warnings.warn(m, stacklevel=3))
        return scoring.score_variants(model, ref, got.variants, window, reduce, rc=rc,
                                      rows=rows)
    finally:
        ref.close()


def embed(model: StripedHyena, prompt: str | Sequence[int], layers: str | Sequence[str],
          pool: str = "mean", window: int | None = None, context: int | None = None,
          dtype: str = "float32", max_memory: str | int | None = None) -> dict[str, Tensor]:
    """The activations of `layers` (Evo 2's module names such as "blocks.28.mlp.l3" or
    EvSpark's such as "block.28.mlp", "final": `evspark info --layers`) over `prompt`, pooled
    as `evspark embed` pools them (`mean`, `last`, or `none` for every position), keyed by the
    module name: (D,) tensors, or (L, D) with `none`, in `dtype`. `window` and `context`
    default as the command's do (8,192 each, within the model's context); passes that would
    not fit in memory (or `max_memory`) are refused before any work."""
    import torch

    from .eval import embed as embedding
    from .model.memory import run_budget

    embedding.check_embed_settings(pool, dtype)
    window, context = embedding.embed_spans(model.config, window, context)
    names = embedding.resolve_layers(model, [layers] if isinstance(layers, str) else layers)
    ids = prompt_ids(prompt, model.config.vocab_size)
    budget = run_budget(model.device, max_memory, model.num_parameters() * 4)
    embedding.check_embed_memory(model, [len(ids)], len(names), pool, dtype, window, context,
                                 budget)
    return embedding.embed_record(model, torch.tensor(ids, dtype=torch.long), names, pool,
                                  window, context, dtype)
