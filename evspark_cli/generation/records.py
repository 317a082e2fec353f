"""How a run names its records and what their FASTA headers record.

Output ids say what a record holds (stable; docs/cli.md): `{prompt id}.cont` for a
continuation, `{prompt id}.ext` with `include_prompt` (the prompt followed by its continuation),
then `_s{i}` when a prompt has several samples. The Python API names records by the ids it is
given, without a suffix.

Everything that changes a record is recorded in its header (`evspark key=value ...`): the model,
drafter and sampler settings, whether the prompt is included, the prompt tail and IUPAC policy,
and a hash of the prompt itself (which also covers the input's content and any region), so a
resumed run can refuse records another run made (generation/outputs.py). How many rows decode
together or on which device never changes a record, so neither is recorded.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ..io.shard import job_in_shard
from ..io.types import Prompt
from .options import DecodeOptions

CONTINUATION = ".cont"
"""Output id suffix of a continuation."""
EXTENDED = ".ext"
"""Output id suffix of a prompt followed by its continuation (include_prompt)."""


def job_id(base: str, sample: int, samples: int) -> str:
    """A job's output id from its record's base, with `_s{i}` when a prompt has several
    samples."""
    return f"{base}_s{sample}" if samples > 1 else base


def prompt_hash(seq: str) -> str:
    """A short hash of a prompt (what the model was given), for the record's header."""
    return hashlib.sha256(seq.encode("ascii", "replace")).hexdigest()[:16]


LATER_WORDS = {"rule": "residual"}
"""Header words added after the first release (written last), with the value a header without
one stands for: `--resume` of an older `.partial` reads it so."""
OPTIONAL_WORDS = {"alphabet": "all", "shard": "none"}
"""Run-wide words a header carries only when they are not their default (the default is what a
header without one stands for): `alphabet=acgt`, and a shard's `shard=I/N`, after which comes
the record's `job=J`, its place in the unsharded run (what `evspark merge` orders by and
removes along with `shard=`)."""


@dataclass(frozen=True)
class RecordScheme:
    """The settings of a generate run, as its output ids, FASTA headers and stats rows record
    them."""

    model: str
    drafter: str  # its name (`drafter_name`): `none` for native decoding
    options: DecodeOptions
    include_prompt: bool = False
    prompt_tail: int | None = None
    iupac: str = "keep"
    shard: tuple[int, int] | None = None  # --shard I/N: the run decodes that shard's jobs only

    @property
    def settings(self) -> dict[str, str]:
        """The `key=value` words every header of the run carries (`shard` only in a shard)."""
        sampler = self.options.sampler
        return {"model": self.model, "drafter": self.drafter,
                "gamma": str(self.options.gamma), "temperature": f"{sampler.temperature:g}",
                "top_k": str(sampler.top_k), "top_p": f"{sampler.top_p:g}",
                "seed": str(self.options.seed),
                "include_prompt": "yes" if self.include_prompt else "no",
                "prompt_tail": str(self.prompt_tail) if self.prompt_tail else "none",
                "iupac": self.iupac, "rule": sampler.rule,
                **({"alphabet": sampler.alphabet} if sampler.alphabet != "all" else {}),
                **({"shard": f"{self.shard[0]}/{self.shard[1]}"} if self.shard else {})}

    def job_index(self, prompt: Prompt, sample: int) -> int:
        """A job's place in the unsharded run's order (io/shard.py)."""
        return prompt.index * self.options.samples + sample

    def holds(self, prompt: Prompt, sample: int) -> bool:
        """Whether the run decodes job (prompt, sample): every job, or its shard's."""
        return job_in_shard(prompt.index, sample, self.shard, self.options.samples)

    def output_base(self, prompt: Prompt) -> str:
        """The output id of a prompt's records before any `_s{i}`: `{prompt id}.cont`, or
        `{prompt id}.ext` with include_prompt (docs/cli.md, "Output ids")."""
        return prompt.id + (EXTENDED if self.include_prompt else CONTINUATION)

    def output_ids(self, prompts: list[Prompt]) -> list[str]:
        """Every output id of the run's jobs over `prompts`, in input order."""
        return [job_id(self.output_base(p), s, self.options.samples) for p, s in self.jobs(prompts)]

    def jobs(self, prompts: list[Prompt]) -> list[tuple[Prompt, int]]:
        """The run's (prompt, sample) jobs over `prompts`, in input order (a shard's only)."""
        return [(p, s) for p in prompts for s in range(self.options.samples) if self.holds(p, s)]

    def record_words(self, prompt: Prompt, sample: int) -> dict[str, str]:
        """The header words of one record that no other record shares (`new_tokens` aside)."""
        words = {"prompt_sha256": prompt_hash(prompt.seq)}
        if self.shard:
            words["job"] = str(self.job_index(prompt, sample))
        return words

    def header(self, prompt: Prompt, sample: int, new_tokens: int) -> str:
        """A record's FASTA description: `evspark key=value ... new_tokens=N prompt=WHERE
        rule=RULE` (`prompt=` the prompt's coordinates: ID, or RECORD:START-END), then
        `alphabet=acgt` when sampling was restricted, and in a shard `shard=I/N job=J` last.
        Words added after the first release go last, so a parser of the older headers still
        reads them."""
        later = {k: self.settings[k] for k in (*LATER_WORDS, *OPTIONAL_WORDS)
                 if k in self.settings}
        own = self.record_words(prompt, sample)
        words = {**{k: v for k, v in self.settings.items() if k not in later},
                 "prompt_sha256": own.pop("prompt_sha256"),
                 "new_tokens": str(new_tokens), "prompt": prompt.coordinates, **later, **own}
        return " ".join(["evspark", *(f"{k}={v}" for k, v in words.items())])

    def record_text(self, prompt: Prompt, letters: str) -> str:
        """What a record's sequence holds: the continuation, after the prompt if included."""
        return prompt.seq + letters if self.include_prompt else letters

    def input_columns(self, prompt: Prompt, sample: int) -> dict[str, Any]:
        """The stats columns that say where a job's prompt came from: the input's id for it,
        its coordinates, the seed and the job's place in the run (io/shard.py)."""
        return {"input_id": prompt.id, "region": prompt.coordinates, "seed": self.options.seed,
                "job": self.job_index(prompt, sample)}

    def stats_row(self, prompt: Prompt, sample: int) -> dict[str, Any]:
        """The stats columns of a job's row that do not depend on timing."""
        spec = self.drafter != "none"
        return {**self.input_columns(prompt, sample), "sample": sample,
                "prompt_len": len(prompt.seq),
                "new_tokens": self.options.max_new_tokens,
                "mode": "speculative" if spec else "native",
                "drafter": self.drafter,
                "gamma": self.options.gamma if spec else None}
