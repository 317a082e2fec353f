"""Files as the kernel sees them: which paths are the same file, writing one atomically, and
writing standard output so that its failure is a one-line error.

Which paths are the same file is decided by (device, inode), never by names.

Two different names can reach one file (a bind mount, a hard link, `..` through a symlinked
folder), so a command refuses to write where it reads by comparing what the kernel says the
files are. A name that does not exist yet is identified by its folder's (device, inode) and its
own name, which is what a later create or rename would hit.
"""
from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from .errors import InputError, ModelError, SettingError, StdoutError, literal

FileKey = tuple
"""(st_dev, st_ino) of an existing file, or (st_dev, st_ino, name) of a name in a folder."""


def file_key(path: str | os.PathLike[str]) -> FileKey | None:
    """The identity of the file `path` names (symlinks followed, as reading it does), or of the
    name itself in its folder when there is no such file; None when even the folder is gone."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
        return (st.st_dev, st.st_ino)
    except OSError:
        pass
    folder = os.path.dirname(os.path.abspath(p))
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, os.path.basename(p))


@dataclass(frozen=True)
class Output:
    """A file a command writes: the option that names it, its path, and the companion files it
    writes on the way (`OUT.partial`, `OUT.tmp`) as suffixes. With `setting`, `option` is a
    setting's Python name (`output`), which the command line writes as its option."""

    option: str
    path: str | None
    companions: tuple[str, ...] = ()
    setting: bool = False

    def files(self) -> list[str]:
        if self.path is None or self.path == "-":
            return []
        return [self.path, *(self.path + s for s in self.companions)]


@dataclass(frozen=True)
class Input:
    """A file a run reads, when a plain path does not say enough: `what` it is, for the
    message (`the index of g.fa`), and whether the run may `create` it (an index built on the
    way), so that its name is refused as an output even while no file has it."""

    path: str
    what: str = ""
    create: bool = False


PathLike = str | os.PathLike[str]
RunInput = PathLike | Input


def folder_inputs(folder: PathLike, what: str) -> list[Input]:
    """The files directly in `folder` (a model or drafter folder), each described as `what`:
    a run reads its folder's files, so an output must not be one of them."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:  # a missing folder is reported where it is loaded
        return []
    paths = (os.path.join(folder, n) for n in names)
    return [Input(p, what) for p in paths if os.path.isfile(p)]


def _input_keys(inputs: Iterable[RunInput] | None) -> dict[FileKey, Input]:
    """The inputs by identity: an existing file by its own, one the run may create by its name
    in its folder; standard input and missing files left out (reading reports them)."""
    ins: dict[FileKey, Input] = {}
    for item in inputs or []:
        inp = item if isinstance(item, Input) else Input(os.fspath(item))
        if inp.path == "-" or not (inp.create or os.path.exists(inp.path)):
            continue
        key = file_key(inp.path)
        if key is not None:
            ins.setdefault(key, inp)
    return ins


def _also(inp: Input, f: str) -> str:
    """What an output also is, for the refusal: the input's path when another name reaches it,
    and what it is."""
    parts = [p for p in (inp.path if inp.path != f else "", inp.what) if p]
    return f" ({', '.join(parts)})" if parts else ""


def check_distinct(inputs: Iterable[RunInput] | None, outputs: Sequence[Output]) -> None:
    """Refuse (InputError) an output file that is an input, or that two outputs would both
    write (an output named like another's `.partial`): compared by identity, so a bind mount or
    a hard link to an input is caught too. `inputs`: paths, or `Input`s that say what they
    are."""
    ins = _input_keys(inputs)
    written: dict[FileKey, tuple[Output, str]] = {}
    for out in outputs:
        for f in out.files():
            key = file_key(f)
            if key is None:
                continue
            if key in ins:
                what = f" {out.path}" if f == out.path else f" {out.path} (its {f})"
                raise _refusal(out, f"{what} is also an input{_also(ins[key], f)}; it would be "
                               "overwritten")
            if key in written:
                other, g = written[key]
                if other.option == out.option:
                    continue
                raise _clash(other, g, out, f)
            written[key] = (out, f)


def _clash(a: Output, fa: str, b: Output, fb: str) -> InputError:
    if fa == a.path and fb == b.path:
        return _refusal(b, " and ", a, f" name the same file {b.path}")
    both = fb if fb != b.path else fa
    return _refusal(a, f" {a.path} and ", b, f" {b.path} would both write {both}; rename one")


def _refusal(*parts: str | Output) -> InputError:
    """One message of text and outputs, each output written as its option: one named by a
    setting (`Output.setting`) makes it a SettingError, whose option the command line shows."""
    template, settings = "", []
    for part in parts:
        if isinstance(part, Output) and part.setting:
            template += f"{{{len(settings)}}}"
            settings.append(part.option)
        else:
            template += literal(part.option if isinstance(part, Output) else part)
    return SettingError(template, *settings) if settings else InputError(template.format())


@contextlib.contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """A fresh temporary name beside `path` (created exclusively: never a file someone else put
    there, nor through a symlink) to write to; renamed onto `path` if the block succeeds."""
    folder, name = os.path.split(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp's 0600 would make the output private
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(tmp)


def write_stdout(text: str) -> None:
    """`text` on standard output, flushed (so that a failure surfaces here, not at exit). A
    write that fails (`> /dev/full`) is a StdoutError naming it; a closed pipe stays a
    BrokenPipeError (the reader went away: not an error)."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        raise StdoutError(f"standard output: {e.strerror or e}") from None


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def read_bounded(path: str | os.PathLike[str], limit: int, name: str, what: str) -> bytes:
    """The bytes of a small file (a config), refused in one line as a ModelError when it cannot
    be read or is larger than `limit`: a hostile config must not be read into memory whole.
    `name` is how messages call the file, `what` what it should have been."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ModelError(f"cannot read {name}: {e.strerror or e}") from None
    if len(data) > limit:
        size = f"{limit >> 20} MiB" if limit >= 1 << 20 else f"{limit >> 10} KiB"
        raise ModelError(f"{name} is larger than {size}: not a {what}")
    return data
