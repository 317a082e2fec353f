"""The values the input layer hands out: prompts, the length cap, parsed regions.

No I/O here, and of the rest of `io/` only the message helper of io/streams.py, so every
module may import these.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import SettingError
from .streams import fail_setting

__all__ = ["Prompt", "LengthCap", "Region"]


@dataclass
class Prompt:
    """One prompt: a whole record or a region of one, validated and upper-cased."""

    id: str
    description: str
    seq: str
    source: str  # the input path ('-' for stdin), plus ':REGION' when read through a region
    # --- where the bases came from (io/regions.py, output headers, warnings)
    key: str = ""  # the name its random numbers are keyed by when not `id` (a named BED line)
    span: tuple[str, int, int] | None = None  # (record, start, end), 1-based inclusive, when
    #                                           `seq` is not the whole record `id`
    soft_masked: bool = False  # the input had lower-case bases (upper-cased here)
    strand: str = "+"  # "-": `seq` is the reverse complement of the bases at `span`
    index: int = 0  # its place among the run's prompts before --shard: which jobs a shard holds

    @property
    def random_key(self) -> str:
        return self.key or self.id

    @property
    def coordinates(self) -> str:
        """Where the prompt's bases are: `ID` for a whole record, else `RECORD:START-END`,
        with `(-)` for the reverse strand."""
        where = f"{self.span[0]}:{self.span[1]}-{self.span[2]}" if self.span else self.id
        return where + ("(-)" if self.strand == "-" else "")


@dataclass(frozen=True)
class LengthCap:
    """The most bases of one record a run holds in memory, and why (said when refusing one)."""

    bases: int
    why: str  # "the model's context"
    setting: str | None = None  # a setting `why` names by its Python name (`max_memory`)

    def refusal(self, what: str) -> SettingError:
        """`what` is too long: the fix is the `prompt_tail` setting (`--prompt-tail N`)."""
        if self.setting is None:
            return fail_setting(f"{what} is longer than {self.why} ({self.bases:,} bases); use ",
                                "prompt_tail", " N")
        before, _, after = self.why.partition(self.setting)
        text = (f"{what} is longer than {before}", f"{after} ({self.bases:,} bases); use ")
        return SettingError(_literal(text[0]) + "{1}" + _literal(text[1]) + "{0} N",
                            "prompt_tail", self.setting)


def _literal(text: str) -> str:
    return text.replace("{", "{{").replace("}", "}}")


@dataclass(frozen=True)
class Region:
    """A parsed `--region`: 1-based inclusive `start`..`end`; both None for the whole record."""

    text: str
    name: str
    start: int | None
    end: int | None  # None with a start: up to the end of the record (samtools `ID:START`)


@dataclass(frozen=True)
class Variant:
    """One ALT allele of a VCF record (1-based `pos`, REF and ALT as written)."""

    chrom: str
    pos: int
    id: str
    ref: str
    alt: str
