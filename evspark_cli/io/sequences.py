"""A sequence's letters under EvSpark's alphabet and IUPAC policy, wherever it comes from (a
FASTA record, a region, `--prompt`, the Python API).

Bases must be IUPAC nucleotide letters in any case (lower case is soft-masking, upper-cased
here; U is read as T); `iupac` says what the ambiguity codes become (alphabet.py). A problem is
one `InputError` line naming the sequence and the 1-based position.
"""
from __future__ import annotations

import hashlib
import re

from ..alphabet import IUPAC as _IUPAC_LETTERS
from ..alphabet import IUPAC_POLICIES, RNA_TO_DNA, resolve_ambiguous
from ..errors import SettingError
from .streams import fail, fail_setting

#: IUPAC nucleotide codes (any case on input; alphabet.py). Gaps ('-', '.') and stop ('*') are
#: rejected: a language-model prompt is a sequence, not an alignment row or a protein.
IUPAC: frozenset[str] = frozenset(_IUPAC_LETTERS)

_INVALID = re.compile("[^" + "".join(sorted(IUPAC | {c.lower() for c in IUPAC})) + "]")
_AMBIGUOUS = re.compile("[^ACGT]")


def clean(seq: str, what: str, offset: int = 0, iupac: str = "keep", key: int = 0) -> str:
    """`seq` (whitespace already removed) checked and made a prompt's bases: letters validated,
    upper-cased, U -> T, and the `iupac` policy (alphabet.py) applied to the ambiguity codes.
    `what` names the sequence in messages ("record 'x' in f.fa"); positions are 1-based in
    record coordinates (`offset` bases precede `seq`), and `key` (`iupac_key`) names the
    record for `random`."""
    m = _INVALID.search(seq)
    if m is not None:
        ch = m.group()
        pos = offset + m.start() + 1
        if ch == "\x00":
            raise fail(f"{what}: NUL byte at position {pos} (binary data, not FASTA text)")
        if "\udc80" <= ch <= "\udcff":
            raise fail(
                f"{what}: undecodable byte 0x{ord(ch) - 0xDC00:02x} at position {pos} "
                "(not UTF-8 text; binary file?)"
            )
        hint = ""
        if ch in "-.":
            hint = " (alignment gaps are not accepted)"
        elif ch == "*":
            hint = " (stop codons are not accepted: this is a protein or translated sequence?)"
        elif ch.isspace():
            hint = " (whitespace inside a sequence line)"
        raise fail(f"{what}: invalid character {ch!r} at position {pos}{hint}")
    seq = seq.upper().translate(RNA_TO_DNA)
    if iupac == "keep":
        return seq
    if iupac == "error":
        m = _AMBIGUOUS.search(seq)
        if m is not None:
            raise fail_setting(f"{what}: ambiguous base {m.group()!r} at position "
                               f"{offset + m.start() + 1} (", "iupac",
                               " error accepts only A, C, G, T)")
        return seq
    return resolve_ambiguous(seq, key, offset)


def check_iupac(iupac: str) -> str:
    """The `iupac` policy must be one alphabet.py knows."""
    if iupac not in IUPAC_POLICIES:
        raise SettingError.of("iupac", f"must be {', '.join(IUPAC_POLICIES)}, got {iupac!r}")
    return iupac


def iupac_key(name: str) -> int:
    """The key `iupac="random"` hashes positions with: the record's name, nothing else."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()[:8],
                          "big")


def check_tail(prompt_tail: int | None) -> int | None:
    """`prompt_tail` must be a positive int; bool is rejected because True == 1 is a bug."""
    if prompt_tail is None:
        return None
    if isinstance(prompt_tail, bool) or not isinstance(prompt_tail, int) or prompt_tail < 1:
        raise SettingError.of("prompt_tail", f"must be an integer >= 1, got {prompt_tail!r}")
    return prompt_tail
