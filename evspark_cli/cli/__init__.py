"""The `evspark` command line: one module per command (the contract is documented in docs/).

`app` holds the Typer app, the console entry point and the mapping of errors to exit codes;
`options` the options several commands share. Every user value is checked in the library (api,
io, eval, train); a command reads its options, calls the library and writes what it returns.
Heavy modules (torch, the engine) are imported inside the commands so `evspark --help` is fast.
"""
from __future__ import annotations

from . import bench, convert, distill, generate, info, score, train, verify
from .app import app, main, register

# the order of `evspark --help`; each command's help ends with its module's worked EXAMPLE
_MODULES = (generate, verify, score, convert, info, train, distill, bench)
register(*(getattr(m, m.__name__.rsplit(".", 1)[1]) for m in _MODULES),
         examples={m.__name__.rsplit(".", 1)[1]: m.EXAMPLE for m in _MODULES})

__all__ = ["app", "main"]
