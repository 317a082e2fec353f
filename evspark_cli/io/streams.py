"""Opening an input: plain, gzip, BGZF or stdin, decoded, and its lines read in bounded pieces.

Whatever parses the text downstream (io/fasta.py, through Biopython) sees only what passed
here: no NUL byte, no undecodable byte, no text before the first '>' header line, no
`bzip2`/`xz`/`zstd`/`zip` data; a byte-order mark is skipped and CR/CRLF line ends read as
LF (universal newlines), the same way on every path, stdin too. A line is handed on in pieces
of at most `PIECE` characters, so an endless line (`/dev/zero`, a stream without newlines) is
never read into memory whole. Every problem becomes one `InputError` line naming the file
and the line.
"""
from __future__ import annotations

import contextlib
import gzip
import io
import os
import stat
import sys
import zlib
from collections.abc import Iterator
from typing import IO

from ..errors import InputError, SettingError

__all__ = ["PIECE", "fail", "fail_setting", "open_binary", "probe", "CheckedLines", "open_lines"]

GZIP_MAGIC = b"\x1f\x8b"
_OTHER_COMPRESSION = {
    b"BZh": "bzip2",
    b"\xfd7zXZ\x00": "xz",
    b"\x28\xb5\x2f\xfd": "zstd",
    b"PK\x03\x04": "zip",
}
PIECE = 1 << 20
"""Characters read at a time: a longer line (a chromosome on one line) is read in pieces, so a
line is never held whole unless its record is kept whole."""


def fail(message: str) -> InputError:
    """An InputError whose message is guaranteed to be one line (the CLI prints it verbatim)."""
    return InputError(" ".join(message.split()) if "\n" in message or "\r" in message else message)


def fail_setting(before: str, setting: str, after: str = "") -> SettingError:
    """`fail` for a message that names a setting: `before`, the setting, `after`. The library
    shows its Python name (`prompt_tail`), the command line the option (`--prompt-tail`)."""
    def literal(text: str) -> str:
        return text.replace("{", "{{").replace("}", "}}")

    template = literal(before) + "{0}" + literal(after)
    if "\n" in template or "\r" in template:
        template = " ".join(template.split())
    return SettingError(template, setting)


def open_binary(path: str) -> IO[bytes]:
    """Open a path for reading, turning OS errors into InputError lines."""
    if os.path.isdir(path):
        raise fail(f"{path}: is a directory, not a FASTA file")
    try:
        return open(path, "rb")  # noqa: SIM115 - closed by the caller
    except OSError as e:
        raise open_failure(path, e, "FASTA", "open") from None


def open_failure(path: str, e: OSError, kind: str, doing: str) -> InputError:
    """The one line for an input file that cannot be opened or read (`kind`: "FASTA", "BED";
    `doing`: "open", "read")."""
    if isinstance(e, FileNotFoundError):
        return fail(f"{path}: no such file")
    if isinstance(e, IsADirectoryError):
        return fail(f"{path}: is a directory, not a {kind} file")
    if isinstance(e, PermissionError):
        return fail(f"{path}: permission denied")
    return fail(f"{path}: cannot {doing} ({e.strerror or e})")


def _sniff(head: bytes, path: str) -> str:
    """'plain', 'gzip' or 'bgzf' from magic bytes (never from the extension)."""
    if head[:2] == GZIP_MAGIC:
        # BGZF: gzip with FEXTRA and a 'BC' subfield first (SAM/BAM spec, section 4.1).
        if len(head) >= 16 and head[3] & 4 and head[12:14] == b"BC":
            return "bgzf"
        return "gzip"
    for magic, name in _OTHER_COMPRESSION.items():
        if head.startswith(magic):
            raise fail(f"{path}: {name}-compressed input is not supported "
                       "(use plain, gzip or bgzip)")
    return "plain"


def _read_head(f: IO[bytes], path: str) -> bytes:
    """Peek at the first bytes without consuming them (works on pipes too)."""
    try:
        peek = getattr(f, "peek", None)
        return bytes(peek(18)[:18]) if peek is not None else b""
    except (OSError, ValueError) as e:
        raise fail(f"{path}: cannot read ({getattr(e, 'strerror', None) or e})") from None


def probe(path: str) -> tuple[str, bool]:
    """(compression, regular file) of a path: 'plain', 'gzip' or 'bgzf' by its magic bytes, and
    whether it is a regular file (one that an index can describe)."""
    with open_binary(path) as f:
        kind = _sniff(_read_head(f, path), path)
        return kind, stat.S_ISREG(os.fstat(f.fileno()).st_mode)


def _text_stream(path: str, stack: contextlib.ExitStack) -> tuple[IO[str], bool]:
    """A text stream over a path or stdin ('-'), gunzipped when the magic bytes say so. Bytes
    are decoded as UTF-8 (a byte-order mark skipped) the same way on every path, stdin too."""
    if path == "-":
        stdin = sys.stdin
        if stdin is None:
            raise fail("-: standard input is not available")
        buf = getattr(stdin, "buffer", None)
        if buf is None:  # a text stream handed in (a notebook, a test): already decoded
            return stdin, False
        compressed = _read_head(buf, "-")[:2] == GZIP_MAGIC
        raw = gzip.GzipFile(fileobj=buf, mode="rb") if compressed else buf
        text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None)
        # detach on the way out: closing the wrapper would close the process's stdin
        stack.callback(lambda: text.detach() if not text.closed else None)
        return text, compressed
    raw = stack.enter_context(open_binary(path))
    kind = _sniff(_read_head(raw, path), path)
    if kind == "plain":
        return stack.enter_context(io.TextIOWrapper(raw, encoding="utf-8-sig", newline=None)), False
    gz = stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
    return stack.enter_context(io.TextIOWrapper(gz, encoding="utf-8-sig", newline=None)), True


class CheckedLines:
    """Yields the input's lines in pieces, checking what a lenient parser would accept.

    Lines come as `(piece, starts_line)` with at most `PIECE` characters per piece, never an
    empty piece, and the first piece that is not blank is a '>' header line (blank lines before
    it are skipped; any other text there is "not FASTA", which a parser that skips text before
    the first header would accept). The errors (not FASTA, NUL bytes, undecodable bytes,
    truncated gzip) name the file and the line; `lineno` is the line being read.
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
                piece = self.stream.readline(PIECE)
                if not piece:
                    return
                starts, at_start = at_start, piece.endswith("\n")
                if starts:
                    self.lineno += 1
                    if self.lineno == 1 and piece.startswith("\ufeff"):  # a BOM on a text stream
                        piece = piece[1:]
                if "\x00" in piece:
                    raise fail(f"{path}: NUL byte at line {self.lineno} "
                               "(binary file, not FASTA text)")
                if not self.started:
                    if not piece.strip():
                        continue
                    if not starts or piece[0] != ">":
                        snippet = piece.strip()[:20]
                        raise fail(
                            f"{path}: not FASTA: line {self.lineno} should start with '>' "
                            f"but starts with {snippet!r}"
                        )
                    self.started = True
                yield piece, starts
        except UnicodeDecodeError as e:
            byte = e.object[e.start] if e.start < len(e.object) else 0
            raise fail(
                f"{path}: not UTF-8 text (byte 0x{byte:02x} near line {self.lineno + 1}); "
                "binary or non-FASTA file"
            ) from e
        except (EOFError, zlib.error) as e:
            raise self._corrupt_gzip(e) from e
        except OSError as e:
            if self.compressed or isinstance(e, gzip.BadGzipFile):
                raise self._corrupt_gzip(e) from e
            raise fail(f"{path}: read error near line {self.lineno + 1} "
                       f"({e.strerror or e})") from e

    def _corrupt_gzip(self, e: BaseException) -> InputError:
        return fail(f"{self.path}: truncated or corrupt gzip data near line {self.lineno + 1} "
                    f"({e})")


def open_lines(path: str, stack: contextlib.ExitStack) -> CheckedLines:
    """The checked lines of a path or '-', open until `stack` closes."""
    try:
        stream, compressed = _text_stream(path, stack)
    except (OSError, EOFError, zlib.error) as e:  # gzip header problems surface on open
        raise fail(f"{path}: cannot read ({e})") from e
    return CheckedLines(stream, path, compressed)
