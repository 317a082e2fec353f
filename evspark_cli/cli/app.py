"""The Typer app, the console entry point and the one place errors become exit codes.

Every failure becomes one `evspark: error: ...` line and a documented exit code (errors.py); set
EVSPARK_DEBUG=1 for a traceback. The library checks values and names a bad one by its Python
name (`max_new_tokens`); here it is shown as the option the user typed (`--max-new-tokens`).
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
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
            from ..errors import EvsparkError
            from ..io.writers import forget_partials

            forget_partials()  # the interrupt line names only this command's files
            try:
                return fn(*args, **kwargs)
            except typer.Exit:
                raise
            except EvsparkError as e:
                debug_traceback()
                fail(_message(e, names), e.exit_code)
            except BrokenPipeError:
                # `evspark generate ... | head`: the reader went away; stop quietly like others
                with contextlib.suppress(OSError):
                    devnull = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(devnull, sys.stdout.fileno())
                raise typer.Exit(141) from None
            except KeyboardInterrupt:
                say(_interrupted())
                raise typer.Exit(130) from None
            except MemoryError:
                fail("out of memory (try a shorter --prompt-tail or fewer tokens)", 1)
            except Exception as e:  # noqa: BLE001 - never a traceback for users
                debug_traceback()
                msg = str(e).splitlines()[0] if str(e) else ""
                fail(f"internal error: {type(e).__name__}: {msg} "
                     "(set EVSPARK_DEBUG=1 for a traceback)", 1)

        return run

    return wrap


def _interrupted() -> str:
    """The interrupt line: which `.partial` files hold finished records, if any were started."""
    from ..io.writers import kept_partials

    kept = kept_partials()
    if not kept:
        return "evspark: interrupted"
    return (f"evspark: interrupted; finished records are kept in {', '.join(kept)} "
            "(rerun with --resume)")


def register(*commands: Callable, examples: Mapping[str, str] | None = None) -> None:
    """Add commands to the app, in the order `evspark --help` lists them; `examples` maps a
    command's name to the worked example its help ends with."""
    for fn in commands:
        app.command(epilog=(examples or {}).get(fn.__name__))(fn)


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"evspark {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", "-V", callback=_print_version,
                                       is_eager=True, help="Print the version and exit.")
          ) -> None:
    """Lossless speculative decoding for StripedHyena 2 (Evo 2-style) DNA language models."""


def main() -> None:
    """Console entry point: usage errors become one line with exit code 2."""
    try:
        rc = app(standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except Exception as e:  # typer's vendored click usage errors (never imported directly)
        code = getattr(e, "exit_code", None)
        fmt = getattr(e, "format_message", None)
        if code is not None and fmt is not None:
            msg = " ".join(str(fmt()).split())
            say(f"evspark: error: {msg}")
            sys.exit(2 if code not in (0, 1) else code or 0)
        if isinstance(e, (EOFError,)):
            sys.exit(1)
        raise
    sys.exit(rc if isinstance(rc, int) else 0)
