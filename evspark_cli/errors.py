"""Errors users see: one line, a documented exit code, no traceback.

Exit codes (cli.md): 0 success; 1 a verification found a non-tie divergence or a run failed;
2 usage errors and bad input; 3 model errors (missing, corrupt or mismatched checkpoint).
"""
from __future__ import annotations


class EvsparkError(Exception):
    """Base class: carries the exit code the CLI returns for it."""

    exit_code: int = 1


class InputError(EvsparkError):
    """Bad user input: unreadable file, malformed FASTA, bad region, bad option value."""

    exit_code = 2


class ModelError(EvsparkError):
    """Missing, corrupt or mismatched model or drafter checkpoint."""

    exit_code = 3


class RunError(EvsparkError):
    """A run that started and failed (e.g. non-finite logits in a record)."""

    exit_code = 1
