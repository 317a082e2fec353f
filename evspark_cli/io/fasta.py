"""Prompts from FASTA: plain, gzip, BGZF or stdin, whole records or samtools-style regions.

Every problem with the user's input becomes one `InputError` line that names the file, the record
and the position, because the CLI prints exactly that line and exits 2 (the CLI contract in docs/).
Nothing here writes next to the user's files: pyfaidx indexes go to a per-user cache directory
(or `index_dir`) unless a fresh index already sits next to the FASTA file.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import os
import re
import secrets
import stat
import sys
import tempfile
import warnings
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any, Protocol

from ..alphabet import IUPAC as _IUPAC_LETTERS
from ..alphabet import IUPAC_POLICIES, RNA_TO_DNA, resolve_ambiguous
from ..errors import InputError, SettingError
from .shard import parse_shard, select_shard

__all__ = ["IUPAC", "Prompt", "LengthCap", "read_prompts", "iter_records", "parse_region",
           "Region", "default_index_dir", "check_iupac"]

#: IUPAC nucleotide codes (any case on input; alphabet.py). Gaps ('-', '.') and stop ('*') are
#: rejected: a language-model prompt is a sequence, not an alignment row or a protein.
IUPAC: frozenset[str] = frozenset(_IUPAC_LETTERS)

_INVALID = re.compile("[^" + "".join(sorted(IUPAC | {c.lower() for c in IUPAC})) + "]")
_WHITESPACE = str.maketrans("", "", " \t\r\n\v\f")
_GZIP_MAGIC = b"\x1f\x8b"
_OTHER_COMPRESSION = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}
_AMBIGUOUS = re.compile("[^ACGT]")
_REGION = re.compile(r"^(?P<name>.+):(?P<start>[0-9][0-9,]*)(?:-(?P<end>[0-9][0-9,]*)?)?$")
_FINGERPRINT_BYTES = 1 << 16
_PIECE = 1 << 20
"""Characters read at a time: a longer line (a chromosome on one line) is read in pieces, so a
line is never held whole unless its record is kept whole."""
MAX_HEADER = 1 << 20
"""The longest header line read (1 Mi characters): anything longer is not a FASTA header."""


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

    @property
    def random_key(self) -> str:
        return self.key or self.id

    @property
    def coordinates(self) -> str:
        """Where the prompt's bases are: `ID` for a whole record, else `RECORD:START-END`."""
        return f"{self.span[0]}:{self.span[1]}-{self.span[2]}" if self.span else self.id


@dataclass(frozen=True)
class LengthCap:
    """The most bases of one record a run holds in memory, and why (said when refusing one)."""

    bases: int
    why: str  # "the model's context"

    def refusal(self, what: str) -> InputError:
        return InputError(f"{what} is longer than {self.why} ({self.bases:,} bases); use "
                          "--prompt-tail N")


@dataclass(frozen=True)
class Region:
    """A parsed `--region`: 1-based inclusive `start`..`end`; both None for the whole record."""

    text: str
    name: str
    start: int | None
    end: int | None  # None with a start: up to the end of the record (samtools `ID:START`)


def _fail(message: str) -> InputError:
    """An InputError whose message is guaranteed to be one line (the CLI prints it verbatim)."""
    return InputError(" ".join(message.split()) if "\n" in message or "\r" in message else message)


# --------------------------------------------------------------------------- validation


def _clean(seq: str, what: str, offset: int = 0, iupac: str = "keep", key: int = 0) -> str:
    """Validate letters, upper-case, U -> T, and apply the `iupac` policy (alphabet.py) to the
    ambiguity codes; positions are 1-based in record coordinates (`offset` bases precede
    `seq`), and `key` names the record for `random`."""
    m = _INVALID.search(seq)
    if m is not None:
        ch = m.group()
        pos = offset + m.start() + 1
        if ch == "\x00":
            raise _fail(f"{what}: NUL byte at position {pos} (binary data, not FASTA text)")
        if "\udc80" <= ch <= "\udcff":
            raise _fail(
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
        raise _fail(f"{what}: invalid character {ch!r} at position {pos}{hint}")
    seq = seq.upper().translate(RNA_TO_DNA)
    if iupac == "keep":
        return seq
    if iupac == "error":
        m = _AMBIGUOUS.search(seq)
        if m is not None:
            raise _fail(f"{what}: ambiguous base {m.group()!r} at position "
                        f"{offset + m.start() + 1} (--iupac error accepts only A, C, G, T)")
        return seq
    return resolve_ambiguous(seq, key, offset)


def check_iupac(iupac: str) -> str:
    """The `--iupac` policy must be one alphabet.py knows."""
    if iupac not in IUPAC_POLICIES:
        raise SettingError.of("iupac", f"must be {', '.join(IUPAC_POLICIES)}, got {iupac!r}")
    return iupac


def _record_key(name: str) -> int:
    """The key `--iupac random` hashes positions with: the record's name, nothing else."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8", "surrogatepass")).digest()[:8],
                          "big")


def _check_tail(prompt_tail: int | None) -> int | None:
    """`--prompt-tail` must be a positive int; bool is rejected because True == 1 is a bug."""
    if prompt_tail is None:
        return None
    if isinstance(prompt_tail, bool) or not isinstance(prompt_tail, int) or prompt_tail < 1:
        raise _fail(f"--prompt-tail must be an integer >= 1, got {prompt_tail!r}")
    return prompt_tail


# --------------------------------------------------------------------------- opening inputs


def _open_binary(path: str) -> IO[bytes]:
    """Open a path for reading, turning OS errors into InputError lines."""
    if os.path.isdir(path):
        raise _fail(f"{path}: is a directory, not a FASTA file")
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by the caller's ExitStack
    except FileNotFoundError:
        raise _fail(f"{path}: no such file") from None
    except IsADirectoryError:
        raise _fail(f"{path}: is a directory, not a FASTA file") from None
    except PermissionError:
        raise _fail(f"{path}: permission denied") from None
    except OSError as e:
        raise _fail(f"{path}: cannot open ({e.strerror or e})") from None


def _sniff(head: bytes, path: str) -> str:
    """'plain', 'gzip' or 'bgzf' from magic bytes (never from the extension)."""
    if head[:2] == _GZIP_MAGIC:
        # BGZF: gzip with FEXTRA and a 'BC' subfield first (SAM/BAM spec, section 4.1).
        if len(head) >= 16 and head[3] & 4 and head[12:14] == b"BC":
            return "bgzf"
        return "gzip"
    for magic, name in _OTHER_COMPRESSION.items():
        if head.startswith(magic):
            raise _fail(f"{path}: {name}-compressed input is not supported "
                        "(use plain, gzip or bgzip)")
    return "plain"


def _read_head(f: IO[bytes], path: str) -> bytes:
    """Peek at the first bytes without consuming them (works on pipes too)."""
    try:
        peek = getattr(f, "peek", None)
        return bytes(peek(18)[:18]) if peek is not None else b""
    except (OSError, ValueError) as e:
        raise _fail(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None


def _text_stream(path: str, stack: contextlib.ExitStack) -> tuple[IO[str], bool]:
    """A text stream over a path or stdin ('-'), gunzipped when the magic bytes say so. Bytes
    are decoded as UTF-8 (a byte-order mark skipped) the same way on every path, stdin too."""
    if path == "-":
        stdin = sys.stdin
        if stdin is None:
            raise _fail("-: standard input is not available")
        buf = getattr(stdin, "buffer", None)
        if buf is None:  # a text stream handed in (a notebook, a test): already decoded
            return stdin, False
        compressed = _read_head(buf, "-")[:2] == _GZIP_MAGIC
        raw = gzip.GzipFile(fileobj=buf, mode="rb") if compressed else buf
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None)
        # detach on the way out: closing the wrapper would close the process's stdin
        stack.callback(lambda: text.detach() if not text.closed else None)
        return text, compressed
    raw = stack.enter_context(_open_binary(path))
    kind = _sniff(_read_head(raw, path), path)
    if kind == "plain":
        return stack.enter_context(io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None)), False
    gz = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
    return stack.enter_context(io.TextIOWrapper(gz, encoding="utf-8-sig", newline=None)), True


class _LineCheck:
    """Yields the input's lines in pieces, checking what a lenient parser would accept.

    Lines come as `(piece, starts_line)` with at most `_PIECE` characters per piece, so an
    endless line (`/dev/zero`, a stream without newlines) is never read into memory whole; the
    errors (not FASTA, NUL bytes, undecodable bytes, truncated gzip) name the file and the line.
    """

    def __init__(self, stream: IO[str], path: str, compressed: bool) -> None:
        self.stream, self.path, self.compressed = stream, path, compressed
        self.lineno = 0
        self.started = False

    def __iter__(self) -> Iterator[tuple[str, bool]]:
        path = self.path
        at_start = True
        try:
            while True:
                piece = self.stream.readline(_PIECE)
                if not piece:
                    return
                starts, at_start = at_start, piece.endswith("\n")
                if starts:
                    self.lineno += 1
                    if self.lineno == 1 and piece.startswith("\ufeff"):  # a BOM on a text stream
                        piece = piece[1:]
                if "\x00" in piece:
                    raise _fail(f"{path}: NUL byte at line {self.lineno} "
                                "(binary file, not FASTA text)")
                if not self.started:
                    if not piece.strip():
                        continue
                    if not starts or piece[0] != ">":
                        snippet = piece.strip()[:20]
                        raise _fail(
                            f"{path}: not FASTA: line {self.lineno} should start with '>' "
                            f"but starts with {snippet!r}"
                        )
                    self.started = True
                yield piece, starts
        except UnicodeDecodeError as e:
            byte = e.object[e.start] if e.start < len(e.object) else 0
            raise _fail(
                f"{path}: not UTF-8 text (byte 0x{byte:02x} near line {self.lineno + 1}); "
                "binary or non-FASTA file"
            ) from e
        except (EOFError, zlib.error) as e:
            raise self._corrupt_gzip(e) from e
        except OSError as e:
            if self.compressed or isinstance(e, gzip.BadGzipFile):
                raise self._corrupt_gzip(e) from e
            raise _fail(f"{path}: read error near line {self.lineno + 1} "
                        f"({e.strerror or e})") from e

    def _corrupt_gzip(self, e: BaseException) -> InputError:
        return _fail(f"{self.path}: truncated or corrupt gzip data near line {self.lineno + 1} "
                     f"({e})")


class _Sink(Protocol):
    """Where a record's sequence goes as it is read, piece by piece."""

    def add(self, piece: str) -> None: ...

    def value(self) -> str: ...


class _Raw:
    """The whole sequence, whitespace removed, unchecked (regions check what they fetch)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def add(self, piece: str) -> None:
        self.parts.append(piece.translate(_WHITESPACE))

    def value(self) -> str:
        return "".join(self.parts)


class _Checked:
    """A record's bases checked and cleaned (`_clean`) as they stream in, a batch of about
    `_PIECE` bases at a time. With `tail`, only the last `tail` bases are kept, so a record of any
    length reads in bounded memory; without, a record longer than `cap` is refused as soon as
    it is."""

    def __init__(self, what: str, iupac: str, key: int, tail: int | None,
                 cap: LengthCap | None) -> None:
        self.what, self.iupac, self.key, self.tail, self.cap = what, iupac, key, tail, cap
        self.pending: list[str] = []
        self.pending_len = 0
        self.parts: deque[str] = deque()
        self.kept = 0
        self.seen = 0
        self.soft_masked = False  # lower-case bases seen (upper-cased by `_clean`)

    def add(self, piece: str) -> None:
        bases = piece.translate(_WHITESPACE)
        self.pending.append(bases)
        self.pending_len += len(bases)
        if self.pending_len >= _PIECE:
            self._flush()

    def _flush(self) -> None:
        text = "".join(self.pending)
        self.soft_masked = self.soft_masked or text != text.upper()
        bases = _clean(text, self.what, self.seen, self.iupac, self.key)
        self.pending, self.pending_len = [], 0
        self.seen += len(bases)
        if self.tail is None and self.cap is not None and self.seen > self.cap.bases:
            raise self.cap.refusal(self.what)
        self.parts.append(bases)
        self.kept += len(bases)
        while self.tail is not None and self.kept - len(self.parts[0]) >= self.tail:
            self.kept -= len(self.parts.popleft())

    def value(self) -> str:
        self._flush()
        seq = "".join(self.parts)
        return seq[-self.tail:] if self.tail is not None else seq


def _iter_records(path: str, sink: Callable[[str], _Sink | None]
                  ) -> Iterator[tuple[str, str, str | None]]:
    """(id, description, sequence) for every record, the sequence as `sink(id)` collected it
    (None when it returned None: the record is skipped unread); raises on structure."""
    with contextlib.ExitStack() as stack:
        try:
            stream, compressed = _text_stream(path, stack)
        except (OSError, EOFError, zlib.error) as e:  # gzip header problems surface on open
            raise _fail(f"{path}: cannot read ({e})") from e
        lines = _LineCheck(stream, path, compressed)
        n = 0
        header: list[str] | None = None  # pieces of a header line still being read
        record: tuple[str, str, _Sink | None] | None = None
        for piece, starts in lines:
            if starts and piece.startswith(">"):
                if record is not None:
                    yield _finished(record)
                record, header = None, [piece[1:]]
            elif header is not None:
                header.append(piece)
                if sum(map(len, header)) > MAX_HEADER:
                    raise _fail(f"{path}: the header at line {lines.lineno} is longer than "
                                f"{MAX_HEADER:,} characters (not FASTA?)")
            elif record is not None and record[2] is not None:
                record[2].add(piece)
            if header is not None and header[-1].endswith("\n"):
                n += 1
                record, header = _start_record(path, n, "".join(header), sink), None
        if header is not None:  # the file ends inside its last header line
            n += 1
            record = _start_record(path, n, "".join(header), sink)
        if record is not None:
            yield _finished(record)
        if n == 0:
            what = "is empty" if lines.lineno == 0 else "contains only blank lines"
            raise _fail(f"{path}: {what}: no FASTA records")


def _start_record(path: str, n: int, title: str, sink: Callable[[str], _Sink | None]
                  ) -> tuple[str, str, _Sink | None]:
    parts = title.rstrip().split(None, 1)
    if not parts:
        raise _fail(f"{path}: record #{n} has an empty header (no ID after '>')")
    rid = parts[0]
    return rid, parts[1].strip() if len(parts) > 1 else "", sink(rid)


def _finished(record: tuple[str, str, _Sink | None]) -> tuple[str, str, str | None]:
    rid, desc, sink = record
    return rid, desc, sink.value() if sink is not None else None


def _check_inputs(inputs: list[str]) -> None:
    """Input list sanity that needs no I/O: non-empty, stdin at most once."""
    if not inputs:
        raise _fail("no input FASTA given")
    if sum(1 for p in inputs if p == "-") > 1:
        raise _fail("'-' (standard input) can be given only once")


def _record_dup(rid: str, path: str, seen: dict[str, str]) -> None:
    """Duplicate ids would make outputs and --resume ambiguous, so they are an error."""
    if rid in seen:
        where = f"twice in {path}" if seen[rid] == path else f"in {seen[rid]} and in {path}"
        raise _fail(f"duplicate record id {rid!r} ({where})")
    seen[rid] = path


# --------------------------------------------------------------------------- regions


def parse_region(text: str) -> Region:
    """Parse `ID`, `ID:START-END` or `ID:START` (samtools syntax, commas allowed in numbers).

    An `ID` containing ':' that is not followed by valid coordinates is reported as malformed
    here; `read_prompts` first checks whether the whole text is a record id (samtools does too).
    """
    if not text or text != text.strip() or any(c.isspace() for c in text):
        raise _fail(f"malformed region {text!r}: expected ID, ID:START-END or ID:START (no spaces)")
    m = _REGION.match(text)
    if m is None:
        if ":" in text:
            raise _fail(
                f"malformed region {text!r}: expected ID, ID:START-END or ID:START "
                "(1-based, inclusive; e.g. chr1:1,000-2,000)"
            )
        return Region(text, text, None, None)
    start_s = m.group("start").replace(",", "")
    end_g = m.group("end")
    if not start_s or (end_g is not None and not end_g.replace(",", "")):
        raise _fail(f"malformed region {text!r}: coordinates must be numbers")
    start = int(start_s)
    end = int(end_g.replace(",", "")) if end_g is not None else None
    if start < 1:
        raise _fail(f"region {text!r}: start must be >= 1 (coordinates are 1-based), got {start}")
    if end is not None and start > end:
        raise _fail(f"region {text!r}: start {start} is after end {end}")
    return Region(text, m.group("name"), start, end)


class _Source(Protocol):
    """Random access to the records of one input, for regions."""

    path: str

    def ids(self) -> list[str]: ...

    def length(self, name: str) -> int: ...

    def fetch(self, name: str, start: int, end: int) -> str: ...

    def close(self) -> None: ...


class _MemorySource:
    """Stdin, plain gzip, pipes and files pyfaidx cannot index: read once, keep what is wanted."""

    def __init__(self, path: str, wanted: set[str]) -> None:
        self.path = path
        self._ids: list[str] = []
        self._seqs: dict[str, str] = {}
        seen: dict[str, str] = {}
        for rid, _desc, seq in _iter_records(path, lambda rid: _Raw() if rid in wanted else None):
            _record_dup(rid, path, seen)
            self._ids.append(rid)
            if seq is not None:
                self._seqs[rid] = seq

    def ids(self) -> list[str]:
        return self._ids

    def length(self, name: str) -> int:
        return len(self._seqs[name])

    def fetch(self, name: str, start: int, end: int) -> str:
        return self._seqs[name][start - 1 : end]

    def close(self) -> None:
        self._seqs.clear()


class _IndexedSource:
    """pyfaidx over a plain or BGZF file; falls back to memory if the file disagrees with the
    index."""

    def __init__(self, path: str, faidx: Any, wanted: set[str]) -> None:
        self.path = path
        self._fa = faidx
        self._wanted = wanted
        self._fallback: _MemorySource | None = None

    def ids(self) -> list[str]:
        if self._fallback is not None:
            return self._fallback.ids()
        return list(self._fa.index.keys())

    def length(self, name: str) -> int:
        if self._fallback is not None:
            return self._fallback.length(name)
        return int(self._fa.index[name].rlen)

    def fetch(self, name: str, start: int, end: int) -> str:
        if self._fallback is None:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    seq = self._fa.from_file(name, start, end)
            except Exception:  # noqa: BLE001 - any pyfaidx/zlib/decode problem: re-read plainly
                seq = None
            # Whitespace inside lines, a stale index or a header inside the range: pyfaidx's
            # coordinates cannot be trusted, so read the file the slow, validating way.
            if (
                isinstance(seq, str)
                and len(seq) == end - start + 1
                and ">" not in seq
                and seq.translate(_WHITESPACE) == seq
            ):
                return seq
            self._switch_to_memory()
        assert self._fallback is not None
        return self._fallback.fetch(name, start, end)

    def _switch_to_memory(self) -> None:
        self.close()
        self._fallback = _MemorySource(self.path, self._wanted)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._fa.close()


def default_index_dir() -> str | None:
    """Where .fai/.gzi indexes go when the user gave no `index_dir`: a per-user cache folder.

    `$XDG_CACHE_HOME/evspark/faidx` (default `~/.cache/...`), else a private folder in the
    system temp dir; None when neither is writable (regions are then read into memory).
    """
    candidates = []
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    candidates.append(os.path.join(xdg, "evspark", "faidx"))
    uid = os.getuid() if hasattr(os, "getuid") else 0
    candidates.append(os.path.join(tempfile.gettempdir(), f"evspark-{uid}", "faidx"))
    for d in candidates:
        try:
            os.makedirs(d, mode=0o700, exist_ok=True)
            st = os.stat(d)
            owned = not hasattr(os, "getuid") or st.st_uid == os.getuid()
            if stat.S_ISDIR(st.st_mode) and owned and os.access(d, os.W_OK | os.X_OK):
                return d
        except OSError:
            continue
    return None


def _user_index_dir(index_dir: str) -> str:
    """An explicit `index_dir` must be usable: failing silently would hide a typo."""
    try:
        os.makedirs(index_dir, exist_ok=True)
    except OSError as e:
        raise _fail(f"index directory {index_dir}: cannot create it ({e.strerror or e})") from None
    if not os.path.isdir(index_dir):
        raise _fail(f"index directory {index_dir}: not a directory")
    if not os.access(index_dir, os.W_OK | os.X_OK):
        raise _fail(f"index directory {index_dir}: not writable")
    return index_dir


def _fresh(index: str, st: os.stat_result) -> bool:
    try:
        return os.stat(index).st_mtime_ns >= st.st_mtime_ns
    except OSError:
        return False


def _fingerprint(real: str, st: os.stat_result) -> str:
    """Cache key: path, size, mtime, inode and the first/last 64 KiB (catches same-size
    rewrites)."""
    h = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\0".encode())
    with open(real, "rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))
        if st.st_size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, st.st_size - _FINGERPRINT_BYTES))
            h.update(f.read(_FINGERPRINT_BYTES))
    return h.hexdigest()[:32]


def _faidx(path: str, **kw: Any) -> Any:
    import pyfaidx  # lazy: only region reads pay for it

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return pyfaidx.Faidx(path, duplicate_action="stop", **kw)


def _open_indexed(path: str, kind: str, cache: str | None) -> Any | None:
    """A pyfaidx.Faidx for `path`, or None when indexing fails (the caller reads into memory).

    An existing fresh index next to the file is used read-only; otherwise the index is built in
    `cache` under a key derived from the file, via a symlink whose extension tells pyfaidx the
    real format (pyfaidx decides BGZF by the '.gz' extension, we decide by magic bytes).
    """
    real = os.path.realpath(path)
    st = os.stat(real)
    bgzf = kind == "bgzf"
    if path.lower().endswith((".gz", ".bgz")) == bgzf:  # pyfaidx decides by this name
        fai, gzi = path + ".fai", path + ".gzi"
        if _fresh(fai, st) and (not bgzf or _fresh(gzi, st)):
            try:
                return _faidx(path, rebuild=False, build_index=False)
            except Exception:  # noqa: BLE001 - a broken neighbour index: build our own
                pass
    if cache is None:
        return None
    base = os.path.join(cache, _fingerprint(real, st) + (".fa.gz" if bgzf else ".fa"))
    fai, gzi = base + ".fai", base + ".gzi"
    try:
        if os.path.realpath(base) != real:
            tmp_link = f"{base}.{secrets.token_hex(6)}.lnk"
            os.symlink(real, tmp_link)
            os.replace(tmp_link, base)
    except OSError:
        return None
    if os.path.exists(fai) and (not bgzf or os.path.exists(gzi)):
        try:
            return _faidx(base, indexname=fai, gzi_indexname=gzi, rebuild=False, build_index=False)
        except Exception:  # noqa: BLE001 - corrupt cache entry: rebuild below
            pass
    tmp = f"{base}.{os.getpid()}.{secrets.token_hex(6)}.tmp"
    try:
        fa = _faidx(base, indexname=tmp + ".fai", gzi_indexname=tmp + ".gzi")
        if bgzf:
            os.replace(tmp + ".gzi", gzi)
        os.replace(tmp + ".fai", fai)  # written last: its presence means the entry is complete
        return fa
    except Exception:  # noqa: BLE001 - unindexable (odd line lengths, corrupt BGZF...): memory
        return None
    finally:
        for leftover in (tmp + ".fai", tmp + ".gzi"):
            with contextlib.suppress(OSError):
                os.remove(leftover)


def _open_source(path: str, wanted: set[str], index_dir: str | None) -> _Source:
    """Indexed access when the input is a regular plain/BGZF file, else an in-memory copy."""
    if path == "-":
        return _MemorySource(path, wanted)
    with _open_binary(path) as f:
        kind = _sniff(_read_head(f, path), path)
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
    if not regular or kind == "gzip":
        return _MemorySource(path, wanted)
    cache = _user_index_dir(index_dir) if index_dir is not None else default_index_dir()
    try:
        fa = _open_indexed(path, kind, cache)
    except OSError:
        fa = None
    if fa is None:
        return _MemorySource(path, wanted)
    return _IndexedSource(path, fa, wanted)


def _read_regions(
    inputs: list[str], regions: list[str], tail: int | None, index_dir: str | None,
    iupac: str = "keep", cap: LengthCap | None = None,
) -> list[Prompt]:
    """Extract the regions, in the order given, looking each record up across all inputs; with
    a tail, only the tail of each region is fetched."""
    texts = list(regions)
    for t in texts:
        if not isinstance(t, str) or not t or any(c.isspace() for c in t):
            raise _fail(f"malformed region {t!r}: expected ID, ID:START-END or ID:START "
                        "(no spaces)")
    from .regions import candidate_names, resolve_region

    wanted: set[str] = set().union(*(candidate_names(t) for t in texts))
    with contextlib.ExitStack() as stack:
        owner: dict[str, _Source] = {}
        seen: dict[str, str] = {}
        for path in inputs:
            src = _open_source(path, wanted, index_dir)
            stack.callback(src.close)
            for rid in src.ids():
                _record_dup(rid, path, seen)
                owner[rid] = src
        prompts: list[Prompt] = []
        given: set[str] = set()
        for text in texts:
            region = resolve_region(text, owner.__contains__)
            src = owner.get(region.name)
            if src is None:
                more = f" (+{len(inputs) - 3} more)" if len(inputs) > 3 else ""
                shown = ", ".join(inputs[:3]) + more
                raise _fail(f"region {text!r}: no record {region.name!r} in {shown}")
            length = src.length(region.name)
            if length == 0:
                raise _fail(f"record {region.name!r} in {src.path} is empty (no sequence)")
            if region.start is None:
                start, end = 1, length
                rid = region.name
            else:
                start = region.start
                end = region.end if region.end is not None else length
                if start > length or end > length:
                    bad = max(start, end)
                    raise _fail(
                        f"region {text!r}: position {bad} is past the end of record "
                        f"{region.name!r} ({length} bp) in {src.path}"
                    )
                rid = f"{region.name}:{start}-{end}"
            if rid in given:
                raise _fail(f"region {rid!r} is given more than once")
            given.add(rid)
            what = f"record {region.name!r} in {src.path}"
            if rid != region.name:
                what += f" (region {rid})"
            first = max(start, end - tail + 1) if tail is not None else start
            if tail is None and cap is not None and end - start + 1 > cap.bases:
                raise cap.refusal(what)
            raw = src.fetch(region.name, first, end)
            seq = _clean(raw, what, first - 1, iupac, _record_key(region.name))
            if not seq:  # e.g. a record of blank lines that an index counted as bases
                raise _fail(f"{what} is empty (no sequence)")
            first = end - len(seq) + 1
            span = None if (first, end) == (1, length) else (region.name, first, end)
            prompts.append(Prompt(rid, "", seq, f"{src.path}:{rid}", span=span,
                                  soft_masked=raw != raw.upper()))
        return prompts


# --------------------------------------------------------------------------- entry points


def iter_records(path: str | os.PathLike[str]) -> Iterator[Prompt]:
    """Every record of one FASTA input (plain, gzip, BGZF or '-'), validated and upper-cased,
    one at a time: a reader of whole genomes (training) holds one record's text at a time.

    Empty records are yielded (with an empty sequence); `read_prompts` refuses them.
    """
    path = os.fspath(path)
    made: dict[str, _Checked] = {}

    def sink(rid: str) -> _Checked:
        made[rid] = _Checked(f"record {rid!r} in {path}", "keep", 0, None, None)
        return made[rid]

    for rid, desc, seq in _iter_records(path, sink):
        yield Prompt(rid, desc, seq or "", path, soft_masked=made.pop(rid).soft_masked)


def read_prompts(
    inputs: list[str],
    regions: list[str] | None = None,
    prompt_tail: int | None = None,
    index_dir: str | None = None,
    shard: str | tuple[int, int] | None = None,
    iupac: str = "keep",
    cap: LengthCap | None = None,
    keep_empty: bool = False,
) -> list[Prompt]:
    """Read, validate and upper-case every record of every input (or only `regions`).

    Without regions, records come in input order; with regions, only the regions, in the order
    given, with id `ID:START-END` (or `ID` for a whole record) and an empty description.
    `prompt_tail` keeps the last N bases (streaming: only those are held); without it a record
    longer than `cap` is refused as soon as it is read that far. U becomes T and `iupac`
    (alphabet.py) says what the other ambiguity codes become. `shard` ("I/N") keeps every N-th
    prompt from the I-th (io/shard.py). An empty record is an error, or with `keep_empty` a
    prompt with no bases (io/prompts.py skips them with a warning); io/regions.py has the
    region grammar. Raises InputError with a one-line message.
    """
    tail = _check_tail(prompt_tail)
    check_iupac(iupac)
    shard_t = parse_shard(shard) if shard is not None else None
    inputs = [os.fspath(p) for p in inputs]  # Path objects are fine too
    _check_inputs(inputs)
    if regions:
        index = None if index_dir is None else os.fspath(index_dir)
        return select_shard(_read_regions(inputs, list(regions), tail, index, iupac, cap),
                            shard_t)
    prompts: list[Prompt] = []
    seen: dict[str, str] = {}
    for path in inputs:
        made: dict[str, _Checked] = {}

        def sink(rid: str, path: str = path) -> _Checked:
            made[rid] = _Checked(f"record {rid!r} in {path}", iupac, _record_key(rid), tail, cap)
            return made[rid]

        for rid, desc, seq in _iter_records(path, sink):
            if not seq and not keep_empty:
                raise _fail(f"record {rid!r} in {path} is empty (no sequence)")
            _record_dup(rid, path, seen)
            checked = made.pop(rid)
            seq = seq or ""
            span = (rid, checked.seen - len(seq) + 1, checked.seen) \
                if len(seq) < checked.seen else None
            prompts.append(Prompt(rid, desc, seq, path, span=span,
                                  soft_masked=checked.soft_masked))
    return select_shard(prompts, shard_t)
