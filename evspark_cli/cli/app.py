"""The Typer app, the console entry point and the one place errors become exit codes.

Every failure becomes one `evspark: error: ...` line and a documented exit code (errors.py); set
EVSPARK_DEBUG=1 for a traceback. The library checks values and names a bad one by its Python
name (`max_new_tokens`); here it is shown as the option the user typed (`--max-new-tokens`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from typing import Any

import typer

app = typer.Typer(
    name="evspark",
    help="Lossless speculative decoding for StripedHyena 2 (Evo 2-style) DNA language models.\n\n"
         "Generate DNA several times faster with exactly the model's own output distribution.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def say(msg: str) -> None:
    """A diagnostic line on stderr (data goes to stdout or files); control characters (an
    escape sequence in a record id) are shown escaped, never sent to the terminal."""
    from ..errors import printable

    print(printable(msg), file=sys.stderr, flush=True)


def fail(msg: str, code: int) -> None:
    say(f"evspark: error: {msg}")
    raise typer.Exit(code)


def first_line(e: BaseException) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def debug_traceback(error: BaseException | None = None) -> None:
    """With EVSPARK_DEBUG set, the traceback of `error` (default: the one being handled)."""
    if os.environ.get("EVSPARK_DEBUG"):
        if error is None:
            traceback.print_exc()
        else:
            traceback.print_exception(error)


def _message(e: Exception, options: Mapping[str, str]) -> str:
    """An error's line, with library setting names written as this command's options."""
    from ..errors import EvsparkError, SettingError

    if isinstance(e, SettingError) or (isinstance(e, EvsparkError) and e.settings):
        return e.render(lambda s: options.get(s, "--" + s.replace("_", "-")))
    return first_line(e)


def command(options: Mapping[str, str] | None = None) -> Callable[[Callable], Callable]:
    """Wrap a command so that every error becomes one line and an exit code. `options` maps
    library setting names to this command's option names where the plain rule (`top_k` ->
    `--top-k`) does not give them."""
    names = dict(options or {})

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            from ..errors import EvsparkError, StdoutError
            from ..files import write_stdout
            from ..io.writers import forget_partials

            forget_partials()  # the interrupt line names only this command's files
            restore = sigterm_as_interrupt()
            try:
                result = fn(*args, **kwargs)
                write_stdout("")  # what print() left buffered fails here, not at exit
                return result
            except typer.Exit:
                raise
            except StdoutError as e:  # `> /dev/full`: one line, and no second failure at exit
                debug_traceback()
                _drop_stdout()
                fail(str(e), e.exit_code)
            except EvsparkError as e:
                debug_traceback()
                fail(_message(e, names), e.exit_code)
            except BrokenPipeError:
                # `evspark generate ... | head`: the reader went away; stop quietly like others
                _drop_stdout()
                raise typer.Exit(141) from None
            except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (Terminated)
                say(_interrupted(e))
                raise typer.Exit(interrupt_code(e)) from None
            except MemoryError:
                fail("out of memory (try a shorter --prompt-tail or fewer tokens)", 1)
            except Exception as e:  # noqa: BLE001 - never a traceback for users
                debug_traceback()
                msg = str(e).splitlines()[0] if str(e) else ""
                fail(f"internal error: {type(e).__name__}: {msg} "
                     "(set EVSPARK_DEBUG=1 for a traceback)", 1)
            finally:
                restore()

        return run

    return wrap


def _drop_stdout() -> None:
    """Point standard output at /dev/null: what is still buffered for a reader that went away
    or a full disk is dropped, instead of failing again (a traceback) when Python exits."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


class Terminated(KeyboardInterrupt):
    """SIGTERM (how SLURM, containers and `kill` stop a job), raised where Ctrl-C raises
    KeyboardInterrupt, so that it takes the same path: finished records kept in the `.partial`
    files, one line naming --resume, exit 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def interrupt_code(e: KeyboardInterrupt) -> int:
    """The exit code of an interrupt: 128 + its signal (130 for Ctrl-C, 143 for SIGTERM)."""
    return 128 + (e.signum if isinstance(e, Terminated) else signal.SIGINT)


def _raise_terminated(signum: int, frame: object) -> None:
    # a second SIGTERM must not cut short the writing of the records the first one flushes
    signal.signal(signum, signal.SIG_IGN)
    raise Terminated(signum)


def sigterm_as_interrupt() -> Callable[[], None]:
    """Make SIGTERM an interrupt while a command runs; returns what puts the old handler back.
    Left alone: a SIGTERM that is ignored or handled already (the process was started so, or
    an embedding program set it) and any thread but the main one (which cannot set one)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return lambda: None
    signal.signal(signal.SIGTERM, _raise_terminated)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _interrupted(e: KeyboardInterrupt | None = None) -> str:
    """The interrupt line: which `.partial` files hold finished records, if any were started,
    and how to go on (a run to standard output cannot be resumed)."""
    from ..io.writers import kept_partials

    how = " by SIGTERM" if isinstance(e, Terminated) else ""
    kept, stuck = kept_partials(resumable=True), kept_partials(resumable=False)
    if stuck:
        return (f"evspark: interrupted{how}; finished records are kept in {', '.join(stuck)}, "
                "but a run writing to standard output cannot be resumed: delete it before a "
                "rerun")
    if not kept:
        return f"evspark: interrupted{how}"
    return (f"evspark: interrupted{how}; finished records are kept in {', '.join(kept)} "
            "(rerun with --resume)")


def register(*commands: Callable, examples: Mapping[str, str] | None = None) -> None:
    """Add commands to the app, in the order `evspark --help` lists them; `examples` maps a
    command's name to the worked example its help ends with."""
    for fn in commands:
        app.command(epilog=(examples or {}).get(fn.__name__))(fn)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__
        from ..errors import StdoutError
        from ..files import write_stdout

        try:
            write_stdout(f"evspark {__version__}\n")
        except (StdoutError, BrokenPipeError) as e:
            _drop_stdout()
            if isinstance(e, StdoutError):
                fail(str(e), e.exit_code)
            raise typer.Exit(141) from None
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", metavar="",
                                       callback=_print_version, is_eager=True,
                                       help="Print the version and exit.")
          ) -> None:
    """Lossless speculative decoding for StripedHyena 2 (Evo 2-style) DNA language models."""


def main() -> None:
    """Console entry point: usage errors become one line with exit code 2."""
    _warn_environment()
    try:
        rc = app(standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # typer's vendored click usage errors (never imported directly)
        code = getattr(e, "exit_code", None)
        fmt = getattr(e, "format_message", None)
        if code is not None and fmt is not None:
            msg = " ".join(str(fmt()).split())
            if not msg:  # bare `evspark`: the help was shown, which is all that was asked
                sys.exit(0)
            say(f"evspark: error: {msg}")
            sys.exit(2 if code not in (0, 1) else code or 0)
        if isinstance(e, (EOFError,)):
            sys.exit(1)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)


def _warn_environment() -> None:
    """The malformed CPU variables of the environment, each as one warning line: found when
    the package was imported, before torch (cpus.py), so libgomp never prints its own."""
    from ..cpus import take_cpu_env_warnings
    from .common import warn

    for message in take_cpu_env_warnings():
        warn(message)
