"""What clients send and get back: pydantic models of the two generate APIs, and what a request
becomes for the engine (records and checked `DecodeOptions`, as the command line builds them).

NIM's Evo 2 API (`POST /biology/arc/evo2/generate`) takes its published field names and
defaults (num_tokens 100, temperature 0.7, top_k 3, top_p 0 = off); EvSpark's own
(`POST /v1/generate`) takes every setting of `evspark generate` with its defaults.
"""
from __future__ import annotations

import secrets
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .. import defaults
from ..decode.jobs import DecodeResult, Job
from ..errors import SettingError
from ..generation.jobs import Record, prompt_ids, record_key
from ..generation.options import DecodeOptions
from ..io.regions import LITERAL_ID

MAX_RECORD_ID = 1000
"""The longest record id a request may name (a FASTA id is a word, not a document)."""


class NimGenerate(BaseModel):
    """NIM's Evo 2 generate request (unknown fields are ignored, as NIM clients may send newer
    ones)."""

    model_config = ConfigDict(extra="ignore")
    sequence: str = Field(min_length=1)
    num_tokens: int | None = 100
    temperature: float | None = 0.7
    top_k: int | None = 3
    top_p: float | None = 0.0
    random_seed: int | None = None
    enable_logits: bool = False
    enable_sampled_probs: bool = False
    enable_elapsed_ms_per_token: bool = False

    def options(self) -> DecodeOptions:
        """NIM's settings as EvSpark's: top_p 0 (NIM's "off") is 1; no seed draws one."""
        top_p = self.top_p if self.top_p not in (None, 0, 0.0) else 1.0
        seed = self.random_seed if self.random_seed is not None else secrets.randbelow(2 ** 63)
        return DecodeOptions(max_new_tokens=100 if self.num_tokens is None else self.num_tokens,
                             temperature=0.7 if self.temperature is None else self.temperature,
                             top_k=3 if self.top_k is None else self.top_k, top_p=top_p,
                             seed=seed)

    def record(self, vocab: int) -> Record:
        """The sequence keyed as `evspark generate --prompt` keys it, so a seed gives the
        same tokens on both."""
        return Record(LITERAL_ID, prompt_ids(self.sequence, vocab, "sequence"),
                      record_key(LITERAL_ID))


MAX_OUTPUT_LAYERS = 64
"""The most layers one forward request may ask for."""


class NimForward(BaseModel):
    """NIM's Evo 2 forward request: a sequence and the layers whose outputs to return (unknown
    fields ignored)."""

    model_config = ConfigDict(extra="ignore")
    sequence: str = Field(min_length=1)
    output_layers: list[str] = Field(min_length=1, max_length=MAX_OUTPUT_LAYERS)

    def ids(self, vocab: int) -> list[int]:
        """The sequence's tokens, checked as `evspark generate --prompt` checks a prompt."""
        return prompt_ids(self.sequence, vocab, "sequence")


class RecordIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=MAX_RECORD_ID)
    sequence: str | list[int] = Field(min_length=1, description="Bases, or token ids")
    key: str | int | None = Field(None, description="What its random numbers are keyed by: a "
                                  "name (default: id; `evspark generate` keys a BED region by "
                                  "its name) or an integer key (the Python API's `record`)")
    samples: list[int] | None = Field(None, description="Only these sample indices (default: "
                                                          "0 .. samples-1)")


class Generate(BaseModel):
    """EvSpark's generate request: records, samples and every setting of `evspark generate`."""

    model_config = ConfigDict(extra="forbid")
    records: list[RecordIn] = Field(min_length=1)
    samples: int = defaults.SAMPLES
    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    gamma: int = defaults.GAMMA
    temperature: float = defaults.TEMPERATURE
    top_k: int = defaults.TOP_K
    top_p: float = defaults.TOP_P
    seed: int = defaults.SEED
    rule: str = defaults.RULE
    rollback: str = defaults.ROLLBACK
    draft_length: str = defaults.DRAFT_LENGTH
    alphabet: str = defaults.ALPHABET
    tree_rows: int = defaults.TREE_ROWS
    drafter: str | None = Field(None, description="A drafter the server serves (GET "
                                                  "/v1/models); default the server's own")
    stream: bool = False

    def options(self) -> DecodeOptions:
        return DecodeOptions(self.max_new_tokens, self.gamma, self.temperature, self.top_k,
                             self.top_p, self.seed, self.samples, self.rollback, self.rule,
                             self.draft_length, self.alphabet, self.tree_rows)

    def to_records(self, vocab: int) -> list[Record]:
        return [Record(r.id, prompt_ids(r.sequence, vocab, f"record {r.id!r}"), _key(r))
                for r in self.records]

    def sample_lists(self) -> list[list[int]] | None:
        """Each record's sample indices, when any record names them."""
        if all(r.samples is None for r in self.records):
            return None
        return [list(range(self.samples)) if r.samples is None else r.samples
                for r in self.records]


def _key(r: RecordIn) -> int:
    if isinstance(r.key, int):
        if not 0 <= r.key < 2 ** 63:
            raise SettingError("{0} must be in 0 .. 2**63-1, got " + str(r.key), "key")
        return r.key
    if r.key is not None and not 1 <= len(r.key) <= MAX_RECORD_ID:
        raise SettingError("{0} must be 1 to " + f"{MAX_RECORD_ID} characters", "key")
    return record_key(r.key if r.key is not None else r.id)


def token_times_ms(res: DecodeResult) -> list[float]:
    """Each token's share of the round that committed it, in milliseconds (a round's tokens
    arrive together; its time is split evenly among them)."""
    out: list[float] = []
    n0, t0 = 0, 0.0
    for n, t in res.progress:
        if n > n0:
            out += [round((t - t0) * 1000.0 / (n - n0), 3)] * (n - n0)
        n0, t0 = n, t
    return out


def output_json(job: Job, tokens: list[int] | None, text: str | None,
                stats: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    """One output of `POST /v1/generate`: its id, record, sample, tokens, sequence and stats
    row, or its error."""
    return {"id": job.label, "record": job.record, "sample": job.sample, "tokens": tokens,
            "sequence": text, "stats": stats, "error": error}
