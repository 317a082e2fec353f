"""Crash-safe outputs: records go to `OUTPUT.partial` as they complete, `finish()` renames it.

Generation is slow, so nothing finished may be lost: each record is one write + flush + fsync,
an interrupted run leaves only `OUTPUT.partial` (never a half `OUTPUT`), and `resume=True` keeps
its complete records and reports their ids so the caller skips them. Setup problems (missing or
read-only directory, a stale partial) are `InputError` (exit 2); an I/O failure in the middle of
a run (disk full) is `RunError` (exit 1).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..errors import InputError, RunError, SettingError, literal
from ..files import Output, RunInput, atomic_path, check_distinct, write_stdout
from .compressed import fai_text, gzi_bytes, is_compressed, plain_name, write_bgzf

try:  # POSIX: refuse two processes appending to the same partial file
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["check_output_path", "check_distinct_outputs", "check_fasta_index", "fasta_letters",
           "write_text_atomic", "atomic_path", "FastaOutput", "StatsOutput", "PARTIAL_SUFFIX",
           "kept_partials", "forget_partials"]

PARTIAL_SUFFIX = ".partial"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_UNFINISHED: dict[str, bool] = {}
"""Partial files this process created or resumed, not yet renamed: whether --resume can continue
each (not the stats of a run whose FASTA went to standard output)."""


def forget_partials() -> None:
    """Start a new command: `kept_partials` reports only the files opened from now on."""
    _UNFINISHED.clear()


def kept_partials(resumable: bool | None = None) -> list[str]:
    """The `.partial` files this process started or resumed that are still there (unfinished):
    what an interrupted or failed run can tell the user to resume; with `resumable`, only
    those that --resume can (True) or cannot (False) continue."""
    return sorted(p for p, ok in _UNFINISHED.items()
                  if os.path.lexists(p) and resumable in (None, ok))
_T = TypeVar("_T", bound="_PartialOutput")
_SEQ_OK = re.compile(rb"[A-Za-z*.\-]+")
_SEQ_OK_STR = re.compile(r"[A-Za-z*.\-]*")


def _is_stdout(path: str | None) -> bool:
    return path is None or path == "-"


def check_output_path(path: str | None) -> None:
    """Fail before any work if OUTPUT cannot be written (the CLI calls this up front).

    Checks that the folder exists and is writable (the partial file and the rename both live
    there), and that OUTPUT is not a directory or a device/FIFO (which the rename would replace).
    """
    if _is_stdout(path):
        return
    assert path is not None
    if not path:
        raise InputError("empty output path (use '-' for standard output)")
    if os.path.isdir(path):
        raise InputError(f"{path}: is a directory; give an output file name")
    if os.path.lexists(path):
        try:
            mode = os.stat(path).st_mode
        except OSError:
            mode = stat.S_IFREG  # a dangling symlink: the rename replaces it
        if not stat.S_ISREG(mode):
            raise InputError(f"{path}: not a regular file (use '-' for standard output)")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(parent):
        raise InputError(f"{path}: output directory {parent} does not exist")
    if not os.path.isdir(parent):
        raise InputError(f"{path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{path}: output directory {parent} is not writable")


def check_fasta_index(path: str | None, index: bool) -> list[tuple[str, str | None]]:
    """The index files (option, path) a FASTA output named `path` gets with `index`, for
    `check_distinct_outputs`; an index of standard output is refused."""
    if not index:
        return []
    if _is_stdout(path):
        raise SettingError.of("index", "needs an output file (-o): standard output has no index")
    assert path is not None
    return [("--index", path + ".fai")] + ([("--index", path + ".gzi")]
                                           if is_compressed(path) else [])


def check_distinct_outputs(inputs: Sequence[RunInput] | None,
                           outputs: Sequence[tuple[str, str | None]]) -> None:
    """Outputs (option, path), each written through `PATH.partial`, must not be an input (it
    would be overwritten) nor each other, nor another's `.partial`: compared by file identity
    (files.py), so another path to the same file is caught too. Nor may two be standard output
    (path '-': pass '-' for an output that goes there by default), which would interleave
    them."""
    on_stdout = [opt for opt, path in outputs if path == "-"]
    if len(on_stdout) > 1:
        raise InputError(f"{' and '.join(on_stdout)} would both write to standard output "
                         "(interleaved); give all but one of them a file")
    check_distinct(inputs, [Output(opt, path, (PARTIAL_SUFFIX,)) for opt, path in outputs])


def write_text_atomic(path: str, text: str) -> None:
    """A small output (a JSON report) written whole or not at all."""
    with atomic_path(path) as tmp:
        Path(tmp).write_text(text)


def fasta_letters(text: str) -> str:
    """Generated tokens as FASTA letters: anything that is not a letter (a model can emit any of
    its 512 ids) is written as N, so the output always parses."""
    return "".join(c if ("A" <= c <= "Z" or "a" <= c <= "z") else "N" for c in text)


class _PartialOutput:
    """The shared protocol: create or resume `PATH.partial`, append records durably, rename.

    Subclasses provide `_preamble()` (text written once at the top of a new file) and
    `_scan(data)` (how many leading bytes of an existing partial are complete records, and
    their ids), and call `_emit(text, record_id)` once per record.
    """

    def __init__(self, path: str | None, resume: bool = False, resumable: bool = True,
                 index: bool = False) -> None:
        """`resumable=False`: the run's other output goes to standard output, so no --resume
        can continue this one; a partial it left is refused as such (delete it). `index`:
        also write the `.fai` (and `.gzi`) of the finished file (a FASTA)."""
        self.path: str | None = None if _is_stdout(path) else path
        self.compressed = is_compressed(self.path)  # a .gz/.bgz name: the file is BGZF
        self.index = index  # write OUTPUT.fai (and OUTPUT.gzi when compressed): FASTA only
        self.resumable = resumable
        self.partial: str | None = None
        self.done_ids: set[str] = set()
        self.existed = False  # True when this run continues a partial another run left
        self._fd: int | None = None
        self._ident: tuple[int, int] | None = None  # (device, inode) of the partial this run holds
        self._finished = False
        if self.path is None:
            if resume:
                raise SettingError.of("resume", "needs an output file: standard output cannot be "
                                                "resumed")
            return
        check_output_path(self.path)
        self.partial = self.path + PARTIAL_SUFFIX
        try:
            st = os.lstat(self.partial)
        except FileNotFoundError:
            self._create()
            return
        except OSError as e:
            raise InputError(f"{self.partial}: cannot inspect it ({e.strerror or e})") from None
        self._refuse_odd(st)
        holder = _lock_holder(self.partial)
        if holder is not None:
            raise self._in_use(holder)
        if not self.resumable:
            raise InputError(f"{self.partial} exists (left by an interrupted run); a run "
                             "writing to standard output cannot resume it: delete it to rerun")
        if not resume:
            raise SettingError(f"{literal(self.partial)} exists (left by an interrupted run): "
                               "pass {0} to continue it, or delete it", "resume")
        self.existed = True
        self._resume()

    # -- subclass hooks
    def _preamble(self) -> str:
        return ""

    def _scan(self, data: bytes) -> tuple[int, list[str]]:
        raise NotImplementedError

    def _rewrites(self) -> bool:
        """Whether OUTPUT is written from the partial (`_publish`) rather than renamed from it."""
        return self.compressed or self.index

    # -- file handling
    def _refuse_odd(self, st: os.stat_result) -> None:
        """Only a regular file is a partial: a symlink is never followed (it could point at any
        file, which the run would truncate and rename away)."""
        if stat.S_ISLNK(st.st_mode):
            raise InputError(f"{self.partial} is a symbolic link; refusing to follow it "
                             "(delete it to start over)")
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{self.partial}: is a directory; remove it")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{self.partial}: not a regular file; remove it")

    def _in_use(self, holder: int) -> InputError:
        who = f"process {holder}" if holder > 0 else "another process"
        return InputError(f"{self.partial} is in use by {who} (a run writing {self.path}); "
                          "wait for it to finish or stop it")

    def _open(self, flags: int) -> None:
        """Open the partial without following a symlink, lock it, and remember which file it
        is (`finish` renames it only if the name still holds this file)."""
        assert self.partial is not None
        self._fd = os.open(self.partial, flags | _NOFOLLOW, 0o666)
        st = os.fstat(self._fd)
        if not stat.S_ISREG(st.st_mode):
            self.close()
            raise InputError(f"{self.partial}: not a regular file; remove it")
        self._ident = (st.st_dev, st.st_ino)
        if fcntl is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                self.close()
                raise self._in_use(_holder_of(st)) from None
        _UNFINISHED[os.path.abspath(self.partial)] = self.resumable

    def _create(self) -> None:
        assert self.partial is not None
        try:
            self._open(os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND)
        except FileExistsError:
            holder = _lock_holder(self.partial)
            if holder is not None:
                raise self._in_use(holder) from None
            raise SettingError(f"{literal(self.partial)} appeared while starting (another run?); "
                               "pass {0} to continue it, or delete it", "resume") from None
        except OSError as e:
            raise InputError(f"{self.partial}: cannot create ({e.strerror or e})") from None
        if self._preamble():
            self._write_bytes(self._preamble().encode("utf-8"))

    def _resume(self) -> None:
        assert self.partial is not None
        try:
            self._open(os.O_RDWR | os.O_APPEND)
        except OSError as e:
            if os.path.islink(self.partial):
                raise InputError(f"{self.partial} is a symbolic link; refusing to follow it "
                                 "(delete it to start over)") from None
            raise InputError(f"{self.partial}: cannot open to resume ({e.strerror or e})") from None
        assert self._fd is not None
        try:
            data = _read_all(self._fd)
        except OSError as e:
            self.close()
            raise InputError(f"{self.partial}: cannot read to resume ({e.strerror or e})") from None
        try:
            keep, ids = self._scan(data)
        except InputError:
            self.close()
            raise
        try:
            if keep < len(data):
                os.ftruncate(self._fd, keep)
                os.fsync(self._fd)
        except OSError as e:
            self.close()
            raise InputError(f"{self.partial}: cannot truncate its incomplete tail "
                             f"({e.strerror or e})") from None
        self.done_ids.update(ids)
        if keep == 0 and self._preamble():
            self._write_bytes(self._preamble().encode("utf-8"))

    def _write_bytes(self, data: bytes) -> None:
        """One record = one write (looping only on short writes) + fsync, so a crash rarely
        tears it."""
        assert self._fd is not None
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
            os.fsync(self._fd)
        except OSError as e:
            raise RunError(f"{self.partial}: write failed ({e.strerror or e})") from None

    def _emit(self, text: str | bytes, record_id: str) -> None:
        """One record: text (on standard output too) or, for a binary partial, bytes."""
        if self._finished:
            raise ValueError("output already finished")
        if self.path is None:
            assert isinstance(text, str)
            write_stdout(text)
        else:
            if self._fd is None:
                raise ValueError("output is closed")
            self._write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
        self.done_ids.add(record_id)

    def finish(self, order: Sequence[str] | None = None) -> None:
        """Success: rename the partial onto OUTPUT (atomic on POSIX). Call it explicitly.

        Only if `PATH.partial` is still the file this run wrote: one deleted or replaced under
        a live run (another run started on it) is never renamed, and this run's records are
        saved beside it instead (RunError, exit 1). `order`: the record ids in the order the
        output should have them. Records written out of that order (finished while an earlier
        one was still running when a run stopped, or redone by `--resume` after a failure) are
        put back in it first, so a resumed run gives the file an uninterrupted one would
        have."""
        if self._finished:
            return
        if self.path is None:
            write_stdout("")
            self._finished = True
            return
        assert self.partial is not None
        if self._fd is None:
            raise ValueError("output is closed")
        try:
            os.fsync(self._fd)
            if not self._still_ours():
                raise self._lost()
            if self._rewrites():
                self._publish(order)
                os.unlink(self.partial)  # its records are in OUTPUT
            elif order is not None and self._reorder(order):
                os.unlink(self.partial)  # its records are in OUTPUT, in order
            else:
                os.replace(self.partial, self.path)
        except OSError as e:
            raise RunError(f"{self.path}: cannot move {self.partial} into place "
                           f"({e.strerror or e})") from None
        finally:
            self.close()
        self._finished = True
        _UNFINISHED.pop(os.path.abspath(self.partial), None)
        try:  # make the rename itself durable
            dfd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass

    def _ordered(self, data: bytes, order: Sequence[str] | None) -> bytes | None:
        """The partial's bytes with its records in `order` (ids not in it keep their place after
        those that are); None when they already are in that order."""
        if order is None:
            return None
        records = self._records(data)
        rank = {rid: i for i, rid in enumerate(order)}
        now = [rid for rid, _, _ in records]
        wanted = sorted(now, key=lambda rid: (rank.get(rid, len(rank)), now.index(rid)))
        if wanted == now:
            return None
        spans = {rid: data[a:b] for rid, a, b in records}
        head = data[: records[0][1]] if records else data
        return head + b"".join(spans[rid] for rid in wanted)

    def _reorder(self, order: Sequence[str]) -> bool:
        """Write OUTPUT from the partial with its records in `order`; False when they already
        are in that order (the partial can simply be renamed)."""
        assert self.partial is not None and self.path is not None
        with open(self.partial, "rb") as f:
            data = self._ordered(f.read(), order)
        if data is None:
            return False
        _replace_with(self.path, lambda fd: _write_all(fd, data))
        return True

    def _publish(self, order: Sequence[str] | None) -> None:
        """Write OUTPUT from the partial, records in `order`: BGZF for a compressed name, then
        the indexes asked for (written after OUTPUT, so that they are never older than it)."""
        assert self.partial is not None and self.path is not None
        with open(self.partial, "rb") as f:
            data = f.read()
        data = self._ordered(data, order) or data
        blocks: list[tuple[int, int]] = []
        if self.compressed:
            _replace_with(self.path, lambda fd: blocks.extend(write_bgzf(fd, data)))
        else:
            _replace_with(self.path, lambda fd: _write_all(fd, data))
        if self.index:
            fai = fai_text(data).encode("utf-8")
            _replace_with(self.path + ".fai", lambda fd: _write_all(fd, fai))
            if self.compressed:
                gzi = gzi_bytes(blocks)
                _replace_with(self.path + ".gzi", lambda fd: _write_all(fd, gzi))

    def _records(self, data: bytes) -> list[tuple[str, int, int]]:
        """(id, start, end) of every record in a complete partial's bytes, in file order."""
        raise NotImplementedError

    def _still_ours(self) -> bool:
        assert self.partial is not None
        try:
            st = os.lstat(self.partial)
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == self._ident

    def _lost(self) -> RunError:
        """The partial was deleted or replaced under this run: save what this run wrote (still
        readable through its descriptor) to a new file beside it, never over anything."""
        assert self._fd is not None and self.partial is not None
        rescue = f"{self.partial}.{os.getpid()}"
        why = f"{self.partial} was deleted or replaced while this run was writing it"
        try:
            data = _read_all(self._fd)
            fd = os.open(rescue, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            return RunError(f"{why}; its records could not be saved ({e.strerror or e}), "
                            f"{self.path} was not written")
        return RunError(literal(f"{why}, so {self.path} was not written; this run's records are "
                                f"in {rescue} (rename it to {self.partial} and rerun with ")
                        + "{0})", "resume")

    def close(self) -> None:
        """Close without renaming (what happens on an exception): the partial stays for --resume."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _corrupt(self, detail: str, *settings: str) -> InputError:
        """The partial cannot be resumed: `detail` says why, in plain text, or with `settings`
        as a template naming them (`{0}`...)."""
        if settings:
            return SettingError(f"{literal(str(self.partial))}: cannot resume, {detail}; delete "
                                "it to start over", *settings)
        return InputError(f"{self.partial}: cannot resume, {detail}; delete it to start over")

    def discard(self) -> None:
        """Close and delete a partial this run created and wrote no record to (a run that
        never started); anything else is kept."""
        self.close()
        if (self.partial and not self.existed and not self.done_ids and self._ident is not None
                and self._still_ours()):
            with contextlib.suppress(OSError):
                os.remove(self.partial)
            _UNFINISHED.pop(os.path.abspath(self.partial), None)


def _replace_with(path: str, write: Callable[[int], object]) -> None:
    """`path` replaced, atomically, by a file `write(fd)` fills (fsynced before the rename)."""
    tmp = f"{path}.{os.getpid()}.tmp{PARTIAL_SUFFIX}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o666)
    try:
        write(fd)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _read_all(fd: int) -> bytes:
    """The whole file behind `fd`, from its start (without moving an O_APPEND writer)."""
    chunks, offset = [], 0
    while True:
        chunk = os.pread(fd, 1 << 20, offset)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        offset += len(chunk)


def _lock_holder(path: str) -> int | None:
    """None when no process holds `path`'s lock; else the holder's pid (0 when unknown)."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return _holder_of(os.fstat(fd))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def _holder_of(st: os.stat_result) -> int:
    """The pid holding a lock on the file `st` describes, from /proc/locks (Linux), another
    process's before this one's; 0 when it cannot be told."""
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    holders: list[int] = []
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/locks").read_text().splitlines():
            fields = line.split()  # "1: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"
            if len(fields) >= 6 and "->" not in fields and fields[5] == dev:  # "->": a waiter
                holders.append(int(fields[4]))
    others = [pid for pid in holders if pid != os.getpid()]
    return (others or holders or [0])[0]


def _split_lines(data: bytes) -> list[tuple[int, int, bool]]:
    """(start, end without '\\n', ends with '\\n') for each line of `data`."""
    out: list[tuple[int, int, bool]] = []
    i = 0
    while i < len(data):
        j = data.find(b"\n", i)
        if j == -1:
            out.append((i, len(data), False))
            break
        out.append((i, j, True))
        i = j + 1
    return out


class FastaOutput(_PartialOutput):
    """Generated sequences as FASTA, `line_width` letters per line (0 = one line per record)."""

    def __init__(self, path: str | None, line_width: int = 60, resume: bool = False,
                 index: bool = False) -> None:
        """`index`: also write `PATH.fai` (and `PATH.gzi` for a `.gz`/`.bgz` name, which is
        written as BGZF), as `samtools faidx` would."""
        if isinstance(line_width, bool) or not isinstance(line_width, int) or line_width < 0:
            raise SettingError.of("line_width", "must be an integer >= 0 (0 = no wrapping), "
                                                f"got {line_width!r}")
        self.line_width = line_width
        self.done_descriptions: dict[str, str] = {}  # header text after the id, per resumed record
        check_fasta_index(path, index)
        super().__init__(path, resume, index=index)

    def write(self, record_id: str, description: str, seq: str) -> None:
        """Append one complete record (durably, when writing to a file)."""
        if not record_id or any(c.isspace() for c in record_id):
            raise ValueError(f"record id must be non-empty without whitespace, got {record_id!r}")
        if "\n" in description or "\r" in description:
            raise ValueError("description must be a single line")
        if _SEQ_OK_STR.fullmatch(seq) is None:
            raise ValueError(f"record {record_id!r}: sequence must be letters only "
                             "(no whitespace or '>')")
        if record_id in self.done_ids:
            raise ValueError(f"record {record_id!r} was already written")
        header = f">{record_id} {description}" if description else f">{record_id}"
        w = self.line_width or max(len(seq), 1)
        body = "".join(seq[i : i + w] + "\n" for i in range(0, len(seq), w))
        self._emit(header + "\n" + body, record_id)

    def check_resumed(self, want: Mapping[str, str],
                      records: Mapping[str, Mapping[str, str]] | None = None,
                      absent: Mapping[str, str] | None = None) -> None:
        """Refuse to --resume a FASTA whose finished records were made otherwise (their headers
        record the settings as `evspark key=value ...`): the final file would mix two runs.

        `want` holds the settings every header must show; `records`, when given, this run's
        record ids, each with what its own header must show (its prompt's hash): a finished
        record this run would not write (other inputs, regions, shard or samples) is refused.
        `absent`: what a header without a word stands for (a setting added later)."""
        for rid, desc in self.done_descriptions.items():
            words = desc.split()
            if not words or words[0] != "evspark":
                raise self._corrupt(f"record '{rid}' has a header evspark did not write")
            got = {**(absent or {}), **dict(w.split("=", 1) for w in words[1:] if "=" in w)}
            # a run-wide setting the header records otherwise is named first: one that also
            # renames records (--include-prompt: .cont/.ext) is not a foreign record
            self._check_settings(rid, got, {k: v for k, v in want.items() if k in got})
            if records is not None and rid not in records:
                raise SettingError(f"{{0}}: {literal(str(self.partial))} has record "
                                   f"'{literal(rid)}', which this run does not write (other "
                                   "inputs, {1}, {2} or {3}?); rerun with the same options or "
                                   "delete the .partial", "resume", "region", "shard", "samples")
            self._check_settings(rid, got, {**want, **(records or {}).get(rid, {})})

    def _check_settings(self, rid: str, got: Mapping[str, str], want: Mapping[str, str]) -> None:
        for key, value in want.items():
            if got.get(key) != value:
                had = f"{key}={got[key]}" if key in got else f"no {key} recorded"
                raise SettingError.of("resume", f"{self.partial} has record '{rid}' made with "
                                      f"{had}, this run has {key}={value}; rerun with the same "
                                      "options or delete the .partial", sep=": ")

    def _scan(self, data: bytes) -> tuple[int, list[str]]:
        lines = _split_lines(data)
        if lines and not data.startswith(b">"):
            raise self._corrupt("it does not start with a FASTA header")
        starts = [k for k, (a, _b, _n) in enumerate(lines) if data[a : a + 1] == b">"]
        ids: list[str] = []
        for r, k0 in enumerate(starts):
            k1 = starts[r + 1] if r + 1 < len(starts) else len(lines)
            problem, rid, settings = self._check_record(data, lines[k0:k1])
            if problem is None and rid in ids:
                problem, settings = f"record {rid!r} appears twice", ()
            if problem is not None:
                if r == len(starts) - 1:  # a torn last record: drop it, it will be redone
                    return lines[k0][0], ids
                raise self._corrupt(problem, *settings)
            ids.append(rid)
            header = data[lines[k0][0] + 1: lines[k0][1]].decode("utf-8").split(None, 1)
            self.done_descriptions[rid] = header[1] if len(header) > 1 else ""
        return len(data), ids

    def _records(self, data: bytes) -> list[tuple[str, int, int]]:
        starts = [a for a, _b, _n in _split_lines(data) if data[a: a + 1] == b">"]
        ends = starts[1:] + [len(data)]
        return [(data[a + 1: data.index(b"\n", a)].split(None, 1)[0].decode("utf-8"), a, e)
                for a, e in zip(starts, ends)]

    def _check_record(self, data: bytes, rec: list[tuple[int, int, bool]]
                      ) -> tuple[str | None, str, tuple[str, ...]]:
        """(problem, record id, settings): problem is None if `rec` (header + sequence lines) is
        a complete record as `write` makes them; else plain text, or with settings a template
        naming them (`_corrupt`)."""
        if not all(nl for _a, _b, nl in rec):
            return "it ends in the middle of a line", "", ()
        try:
            header = data[rec[0][0] + 1 : rec[0][1]].decode("utf-8")
        except UnicodeDecodeError:
            return "a header is not UTF-8", "", ()
        rid = header.split(None, 1)[0] if header.split() else ""
        if not rid:
            return "a header has no record id", "", ()
        seq_lines = rec[1:]
        for a, b, _nl in seq_lines:
            if _SEQ_OK.fullmatch(data, a, b) is None:
                return f"record {rid!r} has a line that is not sequence", rid, ()
        lens = [b - a for a, b, _nl in seq_lines]
        if self.line_width == 0:
            if len(lens) > 1:
                return (f"record {literal(repr(rid))} is wrapped but {{0}} is 0 "
                        "(different {0}?)", rid, ("line_width",))
        elif lens and (any(n != self.line_width for n in lens[:-1]) or lens[-1] > self.line_width):
            return (f"record {literal(repr(rid))} has lines of another width (different {{0}}?)",
                    rid, ("line_width",))
        return None, rid, ()


_NUMBER_DIGITS = 6


def _plain(value: Any) -> Any:
    """numpy/torch scalars -> Python scalars, so formatting below sees int/float/bool/str."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    return str(value)


def _tsv_cell(value: Any) -> str:
    value = _plain(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.{_NUMBER_DIGITS}g}" if math.isfinite(value) else str(value)
    return str(value).replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _json_value(value: Any) -> Any:
    value = _plain(value)
    if isinstance(value, float) and not isinstance(value, bool):
        return float(f"{value:.{_NUMBER_DIGITS}g}") if math.isfinite(value) else None
    return value


class StatsOutput(_PartialOutput):
    """Per-record statistics: `.tsv` (header row, '' for None) or `.jsonl` (null for None).

    Floats keep 6 significant digits; non-finite floats are `nan`/`inf` in TSV and null in JSONL
    (JSON has no NaN). `done_ids` holds the values of the `record_id` column (else the first
    column) of resumed rows; `done_rows` the rows themselves (TSV: strings; JSONL: JSON values).
    """

    def __init__(self, path: str | None, columns: Sequence[str], resume: bool = False,
                 fmt: str | None = None, resumable: bool = True) -> None:
        """`fmt` ("tsv" or "jsonl") overrides the format the file name's extension implies;
        `resumable` as for the partial protocol."""
        cols = list(columns)
        if not cols or len(set(cols)) != len(cols):
            raise ValueError("columns must be a non-empty list of distinct names")
        if any(not c or any(ch in c for ch in "\t\r\n") for c in cols):
            raise ValueError("column names must be non-empty without tabs or newlines")
        self.columns = cols
        self.id_column = "record_id" if "record_id" in cols else cols[0]
        self.done_rows: list[dict[str, Any]] = []
        if fmt is not None:
            if fmt not in ("tsv", "jsonl"):
                raise ValueError(f"unknown stats format {fmt!r}")
            self.format = fmt
        elif _is_stdout(path):
            self.format = "tsv"
        else:
            assert path is not None
            ext = os.path.splitext(plain_name(path))[1].lower()
            if ext not in (".tsv", ".jsonl"):
                raise SettingError.of("stats", f"{path}: use a .tsv or .jsonl file name (.gz "
                                               "for a compressed one)")
            self.format = ext[1:]
        super().__init__(path, resume, resumable)
        if self.path is None:
            write_stdout(self._preamble())

    def _preamble(self) -> str:
        return "\t".join(self.columns) + "\n" if self.format == "tsv" else ""

    def write(self, row: Mapping[str, Any]) -> None:
        """Append one row; missing columns are empty/null, unknown keys are a bug (ValueError)."""
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"unknown stats columns: {sorted(unknown)}")
        if self.format == "tsv":
            line = "\t".join(_tsv_cell(row.get(c)) for c in self.columns) + "\n"
        else:
            obj = {c: _json_value(row.get(c)) for c in self.columns}
            line = json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n"
        key = _plain(row.get(self.id_column))
        self._emit(line, "" if key is None else str(key))

    def _scan(self, data: bytes) -> tuple[int, list[str]]:
        lines = _split_lines(data)
        ids: list[str] = []
        rows: list[dict[str, Any]] = []
        first = 0
        if self.format == "tsv":
            header = self._preamble().encode("utf-8")
            if not data.startswith(header):
                if header.startswith(data):  # torn header line: start the file over
                    return 0, []
                raise self._corrupt("its columns differ from this run's (another {0} file?)",
                                    "stats")
            first = 1
        for k in range(first, len(lines)):
            a, b, nl = lines[k]
            row = self._parse_row(data[a:b]) if nl else None
            if row is None:
                if k == len(lines) - 1:  # torn last row
                    self.done_rows = rows
                    return a, ids
                raise self._corrupt(f"line {k + 1} is not a complete {self.format.upper()} row")
            rows.append(row)
            ids.append(str(row.get(self.id_column)))
        self.done_rows = rows
        return len(data), ids

    def _records(self, data: bytes) -> list[tuple[str, int, int]]:
        lines = _split_lines(data)[1 if self.format == "tsv" else 0:]
        out = []
        for a, b, _nl in lines:
            row = self._parse_row(data[a:b])
            assert row is not None, "a finished stats file has complete rows"
            out.append((str(row.get(self.id_column)), a, b + 1))
        return out

    def check_resumed(self, expected: Mapping[str, Mapping[str, Any]]) -> None:
        """Refuse to --resume a stats file whose rows another run wrote: `expected` maps each
        record id this run writes to the values its row must hold (new_tokens, drafter...); a
        row for another record, or with another value, is a stale file (e.g. from a run with
        another -n) that would be continued as if it were this run's."""
        for row in self.done_rows:
            rid = str(row.get(self.id_column))
            if rid not in expected:
                raise SettingError.of("resume", f"{self.partial} has a row for '{rid}', which "
                                      "this run does not write (a stats file of another run?); "
                                      "delete it", sep=": ")
            for key, value in expected[rid].items():
                want = self._cell(value)
                got = row.get(key)
                if got != want:
                    raise SettingError.of("resume", f"{self.partial} has a row for '{rid}' with "
                                          f"{key}={got}, this run has {key}={want}; rerun with "
                                          "the same options or delete the .partial", sep=": ")

    def _cell(self, value: Any) -> Any:
        """`value` as a resumed row holds it (TSV: its cell text; JSONL: its JSON value)."""
        return _tsv_cell(value) if self.format == "tsv" else _json_value(value)

    def _parse_row(self, raw: bytes) -> dict[str, Any] | None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if self.format == "tsv":
            cells = text.split("\t")
            return dict(zip(self.columns, cells)) if len(cells) == len(self.columns) else None
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or set(obj) != set(self.columns):
            return None
        return obj
