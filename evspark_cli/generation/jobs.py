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
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ..decode.drafters.base import RngKey
from ..decode.jobs import Job
from ..errors import InputError, SettingError
from ..io.sequences import clean
from ..io.shard import job_in_shard
from ..io.types import Prompt
from ..model.tokenizer import tokenize
from .options import DecodeOptions
from .records import job_id


def record_key(name: str) -> int:
    """A stable random-number key per record name."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:7], "big")


_KINDS = "a string of bases or a sequence of token ids"


def prompt_ids(prompt: str | Sequence[int], vocab: int, what: str = "prompt") -> tuple[int, ...]:
    """A prompt as token ids inside a vocabulary of `vocab`, checked as the command line checks
    a `--prompt`: letters are IUPAC nucleotide codes in any case (surrounding whitespace
    dropped), upper-cased, U read as T, ambiguity codes kept (io/fasta.clean, policy "keep");
    or a sequence of integer token ids, used as they are. Anything else, an empty prompt, a
    letter outside the alphabet or an id outside the vocabulary is an InputError naming
    `what` (and the 1-based position)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise InputError(f"{what}: empty sequence")
        ids = tokenize(clean(prompt.strip(), what))
    elif prompt is None or isinstance(prompt, (Mapping, set, frozenset, bytes, bytearray)) \
            or not isinstance(prompt, Iterable):
        raise InputError(f"{what} must be {_KINDS}, got {type(prompt).__name__}")
    else:
        ids = []
        for i, t in enumerate(prompt, 1):
            try:
                if isinstance(t, bool):
                    raise TypeError
                ids.append(operator.index(t))
            except TypeError:
                raise InputError(f"{what}: token {i} is not an integer token id "
                                 f"({type(t).__name__}); a prompt is {_KINDS}") from None
    return _in_vocabulary(ids, vocab, what)


def _in_vocabulary(ids: Sequence[int], vocab: int, what: str) -> tuple[int, ...]:
    """`ids`, refused when empty or when an id is outside a vocabulary of `vocab`."""
    if not ids:
        raise InputError(f"{what}: empty sequence")
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InputError(f"{what}: token {bad} is outside the model's vocabulary "
                         f"0..{vocab - 1}")
    return tuple(ids)


@dataclass(frozen=True)
class Record:
    """One prompt a run continues: the base of its output ids, its token ids, its random-number
    key and, when it came from an input, the prompt (for headers and `include_prompt`)."""

    id: str
    tokens: tuple[int, ...]
    key: int
    prompt: Prompt | None = None
    position: int = 0  # its place among the run's records before --shard (io/shard.py)

    @classmethod
    def named(cls, id: str, sequence: str | Sequence[int], vocab: int) -> Record:
        """A sequence (checked by `prompt_ids`) keyed by its name, as the command line keys a
        record."""
        if not isinstance(id, str) or not id:
            raise InputError(f"a prompt's id must be a non-empty string, got {id!r}")
        return cls(id, prompt_ids(sequence, vocab, f"prompt {id!r}"), record_key(id))

    @classmethod
    def listed(cls, prompts: str | Sequence[str | Sequence[int]]
               | Mapping[str, str | Sequence[int]], vocab: int) -> list[Record]:
        """The Python API's prompts (`generate_many`): a {record id: sequence} mapping, keyed
        by record id; or a list, prompt i keyed by its index (id `prompt{i}`). A string is one
        prompt, not a list of one-letter prompts. Each sequence is checked by `prompt_ids`."""
        if isinstance(prompts, str):
            prompts = [prompts]
        if isinstance(prompts, Mapping):
            return [cls.named(rid, p, vocab) for rid, p in prompts.items()]
        if prompts is None or isinstance(prompts, (set, frozenset, bytes, bytearray)) \
                or not isinstance(prompts, Iterable):
            raise InputError("prompts must be a list of prompts (each a string of bases or a "
                             "sequence of token ids) or a {record id: prompt} mapping, got "
                             f"{type(prompts).__name__}")
        out: list[Record] = []
        for i, p in enumerate(prompts):
            if isinstance(p, int):
                raise InputError(f"prompts[{i}] must be {_KINDS}, got int (a list of token ids "
                                 "is one prompt: pass [ids])")
            out.append(cls(f"prompt{i}", prompt_ids(p, vocab, f"prompts[{i}]"), i))
        return out

    @classmethod
    def of(cls, prompt: Prompt, vocab: int, id: str | None = None) -> Record:
        """A prompt read from an input, keyed by its `random_key`; `id` names its outputs
        (default: the prompt's id). Its bases were checked when it was read (io/), so they are
        only tokenized here."""
        return cls(prompt.id if id is None else id,
                   _in_vocabulary(tokenize(prompt.seq), vocab, f"record {prompt.id!r}"),
                   record_key(prompt.random_key), prompt, prompt.index)


JOB_BYTES = 1024
"""Memory one job costs while a run holds it: the Job with its random-number key and output id
(about 360 bytes), its entries in the batch plan and the run's passes, rounded up."""
OUTPUT_BYTES, OUTPUT_TOKEN_BYTES = 8 << 10, 112
"""Memory one finished output costs while a caller keeps it (`generate_many` returns them all):
its stats row and decode record, and per token its id, letter and round bookkeeping (measured
about 8.4 KiB + 107 bytes a token)."""
_CHECKED_BELOW = 64 << 20  # bookkeeping this small is not worth reading the memory limits for


def check_job_count(records: int, samples: int, kept_tokens: int | None = None) -> None:
    """Refuse (SettingError naming `samples`) `records` x `samples` jobs whose bookkeeping
    alone (and, with `kept_tokens`, their outputs of that many tokens kept to the end) would not
    fit in the memory there is: before a single job is built."""
    from ..model.memory import available_bytes, gib

    jobs = records * samples
    per_job = JOB_BYTES + (0 if kept_tokens is None
                           else OUTPUT_BYTES + OUTPUT_TOKEN_BYTES * kept_tokens)
    need = jobs * per_job
    if need <= _CHECKED_BELOW:
        return
    room = available_bytes("cpu")
    if room is None or need <= room:
        return
    what = "their outputs need" if kept_tokens is not None else "their bookkeeping alone needs"
    raise SettingError(f"{records:,} record{'s' if records != 1 else ''} x {{0}} {samples:,} "
                       f"are {jobs:,} sequences; {what} about {gib(need)} of memory, "
                       f"{gib(room)} is available; use fewer {{0}} or records", "samples")


def build_jobs(records: Iterable[Record], options: DecodeOptions,
               skip: set[str] | frozenset[str] = frozenset(),
               samples: range | None = None, shard: tuple[int, int] | None = None) -> list[Job]:
    """Every (record, sample) as a job, record by record and sample by sample, leaving out the
    output ids in `skip` (finished by an earlier run) and, with `shard` (I, N), the jobs of the
    other shards (io/shard.py, by each record's `position`). `samples`: the sample indices to
    build (default: all `options.samples`). `index` is the job's place in the list. Refused
    before any is built when their bookkeeping would not fit in memory (`check_job_count`)."""
    listed = list(records)
    indices = samples if samples is not None else range(options.samples)
    check_job_count(len(listed), len(indices))
    out: list[Job] = []
    for r in listed:
        for s in indices:
            jid = job_id(r.id, s, options.samples)
            if jid not in skip and job_in_shard(r.position, s, shard, options.samples):
                out.append(Job(len(out), r.tokens, options.max_new_tokens,
                               RngKey(options.seed, r.key, s), jid, r.id, s))
    return out
