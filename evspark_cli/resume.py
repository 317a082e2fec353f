"""What shapes a generated record, written into its FASTA header and checked on `--resume`.

A resumed run keeps the records an earlier run finished, so the final file is one run only if
every finished record was made exactly as this run would make it. Everything that changes a
record is therefore recorded in its header (`evspark key=value ...`): the model, drafter and
sampler settings, whether the prompt is included, the prompt tail and IUPAC policy, and a hash
of the prompt itself (which also covers the input's content and any region). The stats
`.partial` is checked the same way, row by row. How many rows decode together (a batch size) or
on which device never changes a record, so neither is recorded.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .api import STATS_COLUMNS, DecodeOptions, drafter_name
from .errors import InputError
from .io.writers import FastaOutput, StatsOutput

if TYPE_CHECKING:
    from .decode.drafters.base import Drafter
    from .io.fasta import Prompt


CONTINUATION = ".cont"
"""Output id suffix of a continuation."""
EXTENDED = ".ext"
"""Output id suffix of a prompt followed by its continuation (--include-prompt)."""


def job_id(base: str, sample: int, samples: int) -> str:
    """A record's output id from its base (`RunRecord.output_base`), with `_s{i}` when a prompt
    has several samples."""
    return f"{base}_s{sample}" if samples > 1 else base


def prompt_hash(seq: str) -> str:
    """A short hash of a prompt (what the model was given), for the record's header."""
    return hashlib.sha256(seq.encode("ascii", "replace")).hexdigest()[:16]


@dataclass(frozen=True)
class RecordJob:
    """One record a run writes: its id, sample index and prompt."""

    id: str
    sample: int
    prompt: Prompt


@dataclass(frozen=True)
class RunRecord:
    """The settings of a generate run, as its FASTA headers and stats rows record them."""

    model: str
    drafter: Drafter | None
    options: DecodeOptions
    include_prompt: bool = False
    prompt_tail: int | None = None
    iupac: str = "keep"

    @property
    def settings(self) -> dict[str, str]:
        """The `key=value` words every header of the run carries (before new_tokens)."""
        sampler = self.options.sampler
        return {"model": self.model, "drafter": drafter_name(self.drafter),
                "gamma": str(self.options.gamma), "temperature": f"{sampler.temperature:g}",
                "top_k": str(sampler.top_k), "top_p": f"{sampler.top_p:g}",
                "seed": str(self.options.seed),
                "include_prompt": "yes" if self.include_prompt else "no",
                "prompt_tail": str(self.prompt_tail) if self.prompt_tail else "none",
                "iupac": self.iupac}

    def output_base(self, prompt_id: str) -> str:
        """The output id of a prompt's records before any `_s{i}`: `{prompt id}.cont`, or
        `{prompt id}.ext` with --include-prompt (docs/cli.md, "Output ids")."""
        return prompt_id + (EXTENDED if self.include_prompt else CONTINUATION)

    def jobs(self, prompts: Sequence[Prompt]) -> list[RecordJob]:
        """Every record the run writes, in input order."""
        samples = self.options.samples
        return [RecordJob(job_id(self.output_base(p.id), s, samples), s, p)
                for p in prompts for s in range(samples)]

    def header(self, prompt: Prompt, new_tokens: int) -> str:
        """A record's FASTA description: `evspark key=value ... new_tokens=N prompt=WHERE`
        (`prompt=` the prompt's coordinates: ID, or RECORD:START-END)."""
        words = {**self.settings, "prompt_sha256": prompt_hash(prompt.seq),
                 "new_tokens": str(new_tokens), "prompt": prompt.coordinates}
        return " ".join(["evspark", *(f"{k}={v}" for k, v in words.items())])

    def stats_row(self, job: RecordJob) -> dict[str, Any]:
        """The stats columns of a job's row that do not depend on timing."""
        spec = self.drafter is not None
        return {"sample": job.sample, "prompt_len": len(job.prompt.seq),
                "new_tokens": self.options.max_new_tokens,
                "mode": "speculative" if spec else "native",
                "drafter": drafter_name(self.drafter),
                "gamma": self.options.gamma if spec else None}

    def open_outputs(self, prompts: Sequence[Prompt], output: str | None, stats: str | None,
                     line_width: int = 60, resume: bool = False
                     ) -> tuple[FastaOutput, StatsOutput | None]:
        """The FASTA and stats outputs of a run over `prompts`; resumed ones checked against
        this run (InputError naming the setting that differs). A run refused here leaves no
        new `.partial` behind."""
        jobs = self.jobs(prompts)
        fasta = FastaOutput(output, line_width=line_width, resume=resume)
        stat_out: StatsOutput | None = None
        try:
            want = dict(self.settings, new_tokens=str(self.options.max_new_tokens))
            fasta.check_resumed(want, {j.id: {"prompt_sha256": prompt_hash(j.prompt.seq)}
                                       for j in jobs})
            if stats:
                stat_out = StatsOutput(stats, STATS_COLUMNS, resume=resume)
                self._check_stats(fasta, stat_out, jobs)
            return fasta, stat_out
        except BaseException:
            if stat_out is not None:
                stat_out.discard()
            fasta.discard()
            raise

    def _check_stats(self, fasta: FastaOutput, stat_out: StatsOutput,
                     jobs: list[RecordJob]) -> None:
        stat_out.check_resumed({j.id: self.stats_row(j) for j in jobs})
        if fasta.done_ids and not stat_out.existed:
            raise InputError(f"--resume: {fasta.partial} has {len(fasta.done_ids)} finished "
                             f"records but there is no {stat_out.partial} (was the run started "
                             "without --stats?); rerun without --stats or delete the .partial")
