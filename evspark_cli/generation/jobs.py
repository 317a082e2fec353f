"""The one job builder: records x samples as decoder jobs, each with its random-number key.

Every path that decodes (`generate`, `generate_many`, `verify`, `bench`) builds its jobs here,
so they decode the same jobs: job (record, sample) draws its random numbers with key
(seed, record key, sample), where a record's key is a hash of the name it is keyed by
(`Prompt.random_key`: its id, or a named BED line's region), so output does not depend on record
order, sharding or batch size. The Python API may key a list of prompts by position instead
(`Record.key`), so that `generate_many(model, [p])[0]` equals `generate(model, p)`.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..decode.drafters.base import RngKey
from ..decode.jobs import Job
from ..errors import InputError
from ..io.types import Prompt
from ..model.tokenizer import tokenize
from .options import DecodeOptions
from .records import job_id


def record_key(name: str) -> int:
    """A stable random-number key per record name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:7], "big")


def prompt_ids(prompt: str | Sequence[int], vocab: int) -> tuple[int, ...]:
    """A prompt (letters or token ids) as token ids inside a vocabulary of `vocab`."""
    ids = tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise InputError("empty prompt")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InputError(f"prompt token {bad} is outside the model's vocabulary 0..{vocab - 1}")
    return tuple(ids)


@dataclass(frozen=True)
class Record:
    """One prompt a run continues: the base of its output ids, its token ids, its random-number
    key and, when it came from an input, the prompt (for headers and `include_prompt`)."""

    id: str
    tokens: tuple[int, ...]
    key: int
    prompt: Prompt | None = None

    @classmethod
    def named(cls, id: str, sequence: str | Sequence[int], vocab: int) -> Record:
        """A sequence keyed by its name, as the command line keys a record."""
        return cls(id, prompt_ids(sequence, vocab), record_key(id))

    @classmethod
    def of(cls, prompt: Prompt, vocab: int, id: str | None = None) -> Record:
        """A prompt read from an input, keyed by its `random_key`; `id` names its outputs
        (default: the prompt's id)."""
        return cls(prompt.id if id is None else id, prompt_ids(prompt.seq, vocab),
                   record_key(prompt.random_key), prompt)


def build_jobs(records: Iterable[Record], options: DecodeOptions,
               skip: set[str] | frozenset[str] = frozenset(),
               samples: range | None = None) -> list[Job]:
    """Every (record, sample) as a job, record by record and sample by sample, leaving out the
    output ids in `skip` (finished by an earlier run). `samples`: the sample indices to build
    (default: all `options.samples`). `index` is the job's place in the list."""
    out: list[Job] = []
    for r in records:
        for s in samples if samples is not None else range(options.samples):
            jid = job_id(r.id, s, options.samples)
            if jid not in skip:
                out.append(Job(len(out), r.tokens, options.max_new_tokens,
                               RngKey(options.seed, r.key, s), jid, r.id, s))
    return out
