"""Random access to the records of an input, for regions: pyfaidx where it can, else memory.

A regular plain or BGZF file is read through a pyfaidx index; stdin, plain gzip, pipes and
files pyfaidx cannot index (or whose bytes disagree with their index) are read once into
memory, keeping only the records asked for. Nothing here writes next to the user's files:
indexes go to a per-user cache directory (or `index_dir`) unless a fresh index already sits
next to the FASTA file.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import stat
import tempfile
import warnings
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..files import Input
from .streams import fail, probe

__all__ = ["Source", "MemorySource", "IndexedSource", "default_index_dir", "index_files",
           "open_source"]

_FINGERPRINT_BYTES = 1 << 16
_WHITESPACE = str.maketrans("", "", " \t\r\n\v\f")


class Source(Protocol):
    """Random access to the records of one input, for regions."""

    path: str

    def ids(self) -> list[str]: ...

    def length(self, name: str) -> int: ...

    def fetch(self, name: str, start: int, end: int) -> str: ...

    def close(self) -> None: ...


class MemorySource:
    """Stdin, plain gzip, pipes and files pyfaidx cannot index: read once, keep what is wanted.

    `records` gives every record's (id, sequence), the sequence None for a record not wanted."""

    def __init__(self, path: str, records: Iterable[tuple[str, str | None]]) -> None:
        self.path = path
        self._ids: list[str] = []
        self._seqs: dict[str, str] = {}
        for rid, seq in records:
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


class IndexedSource:
    """pyfaidx over a plain or BGZF file; falls back to `memory()` if the file disagrees with
    the index."""

    def __init__(self, path: str, faidx: Any, memory: Callable[[], Source]) -> None:
        self.path = path
        self._fa = faidx
        self._memory = memory
        self._fallback: Source | None = None

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
        self._fallback = self._memory()

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
        raise fail(f"index directory {index_dir}: cannot create it ({e.strerror or e})") from None
    if not os.path.isdir(index_dir):
        raise fail(f"index directory {index_dir}: not a directory")
    if not os.access(index_dir, os.W_OK | os.X_OK):
        raise fail(f"index directory {index_dir}: not writable")
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


def index_files(path: str, index_dir: str | None = None) -> list[Input]:
    """The index files a region read of `path` reads or may build: the `.fai` (and, for a name
    pyfaidx takes as BGZF, the `.gzi`) beside it, and its entry in `index_dir` when one is
    given. An output must not be one of them, whether or not it exists yet."""
    if path == "-":
        return []
    what = f"the index of {path}"
    found = [Input(path + ".fai", what, create=True)]
    if path.lower().endswith((".gz", ".bgz")):
        found.append(Input(path + ".gzi", what, create=True))
    if index_dir is not None and os.path.isfile(path):
        try:
            base = os.path.join(index_dir, _fingerprint(os.path.realpath(path),
                                                        os.stat(path)))
        except OSError:  # unreadable: reading it reports why
            return found
        found += [Input(base + ext + idx, what, create=True) for ext in (".fa", ".fa.gz")
                  for idx in ("", ".fai", ".gzi")]
    return found


def open_source(path: str, index_dir: str | None, memory: Callable[[], Source]) -> Source:
    """Indexed access when the input is a regular plain/BGZF file, else `memory()` (an
    in-memory copy, which the caller builds by reading the records)."""
    if path == "-":
        return memory()
    kind, regular = probe(path)
    if not regular or kind == "gzip":
        return memory()
    cache = _user_index_dir(index_dir) if index_dir is not None else default_index_dir()
    try:
        fa = _open_indexed(path, kind, cache)
    except OSError:
        fa = None
    if fa is None:
        return memory()
    return IndexedSource(path, fa, memory)
