"""Errors users see: one line, a documented exit code, no traceback.

Exit codes (the CLI contract in docs/): 0 success; 1 a verification found a non-tie divergence
or a run failed; 2 usage errors and bad input; 3 model errors (missing, corrupt or mismatched
checkpoint).
"""
from __future__ import annotations

import re
from typing import Callable, TypeVar

_E = TypeVar("_E", bound="EvsparkError")


class EvsparkError(Exception):
    """Base class: carries the exit code the CLI returns for it.

    A message may name settings (`resume`, `max_memory`...) by their Python names: then it is
    a `template` holding `{0}`, `{1}`... where `settings` go, and the command line shows it with
    the option the user typed instead (`render`: `--resume`, `--max-memory`). Without settings
    the message is plain text, braces included.
    """

    exit_code: int = 1

    def __init__(self, message: object = "", *settings: str) -> None:
        self.settings: tuple[str, ...] = settings
        if settings:
            self.template = str(message)
            super().__init__(self.template.format(*settings))
        else:
            self.template = literal(str(message))
            super().__init__(message)

    @classmethod
    def of(cls: type[_E], setting: str, problem: str, sep: str = " ") -> _E:
        """`{setting}{sep}{problem}`, e.g. SettingError.of("gamma", "must be >= 1, got 0")."""
        return cls("{0}" + sep + literal(problem), setting)

    def render(self, name: Callable[[str], str]) -> str:
        """The message with each setting written as `name(setting)`."""
        return self.template.format(*(name(s) for s in self.settings))


class InputError(EvsparkError):
    """Bad user input: unreadable file, malformed FASTA, bad region, bad option value."""

    exit_code = 2


class SettingError(InputError):
    """A bad value of one or more named settings (`gamma`, `max_new_tokens`...).

    The library checks each value once and names it by its Python name; the command line shows
    the same message with the option the user typed instead (`--gamma`, `--max-new-tokens`).
    `template` holds `{0}`, `{1}`... where the names go; it is always a template, with no
    settings too (`{{` for a brace).
    """

    def __init__(self, template: str, *settings: str) -> None:
        Exception.__init__(self, template.format(*settings))
        self.template, self.settings = template, settings


class ModelError(EvsparkError):
    """Missing, corrupt or mismatched model or drafter checkpoint."""

    exit_code = 3


class RunError(EvsparkError):
    """A run that started and failed (e.g. non-finite logits in a record)."""

    exit_code = 1


class ServerLost(RunError):
    """`generate --server`: the server went away mid-run (the records it finished are kept)."""


class GenerationError(RunError):
    """Some outputs of an API call failed: `outputs` holds every output in input order, None
    where its job failed, and `errors` the failures by that index, so the finished outputs are
    never lost with the failed ones. The message names how many failed and the first error."""

    def __init__(self, outputs: list, errors: dict[int, Exception]) -> None:
        first = min(errors)
        n = len(errors)
        super().__init__(f"{n} of {len(outputs)} output{'s' if len(outputs) != 1 else ''} "
                         f"failed (the first, output {first}: {errors[first]}); the others are "
                         "in this error's outputs")
        self.outputs, self.errors = outputs, errors


class StdoutError(RunError):
    """Standard output refused the data (a full disk, an I/O error: exit 1, like any output
    failing mid-run). A reader that went away is not one: that stays a BrokenPipeError, which
    the command line ends quietly (exit 141)."""


def literal(text: str) -> str:
    """`text` as a template that formats to itself (its braces doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


def at_least(setting: str, value: int | float, low: int | float) -> None:
    """Refuse `value < low` as `{setting} must be >= {low}, got {value}`."""
    if value < low:
        raise SettingError.of(setting, f"must be >= {low}, got {value}")


_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def printable(text: str) -> str:
    """`text` safe for a terminal and one line: control characters (an ANSI escape in a record
    id, a newline) and undecodable bytes become `\\xNN` escapes instead of acting."""
    def escape(m: re.Match[str]) -> str:
        c = ord(m.group())
        if 0xDC80 <= c <= 0xDCFF:  # a byte that was not UTF-8 (surrogateescape)
            return f"\\x{c - 0xDC00:02x}"
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _CONTROL.sub(escape, text)
