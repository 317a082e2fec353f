"""The `evspark` command line: one module per command (the contract is documented in docs/).

`app` holds the Typer app, the console entry point and the mapping of errors to exit codes;
`options` the options several commands share. Every user value is checked in the library (api,
io, eval, train); a command reads its options, calls the library and writes what it returns.
Heavy modules (torch, the engine) are imported inside the commands so `evspark --help` is fast.
"""
from __future__ import annotations

from . import bench, convert, distill, embed, generate, info, merge, score, serve, train, verify
from .app import app, main, register

# the order of `evspark --help`; each command's help ends with its module's worked EXAMPLE
register(generate.generate, verify.verify, score.score, embed.embed, serve.serve,
         merge.merge,
         convert.convert, info.info, train.train, distill.distill, bench.bench,
         examples={"generate": generate.EXAMPLE, "verify": verify.EXAMPLE, "score": score.EXAMPLE,
                   "embed": embed.EXAMPLE, "serve": serve.EXAMPLE,
                   "merge": merge.EXAMPLE,
                   "convert": convert.EXAMPLE, "info": info.EXAMPLE, "train": train.EXAMPLE,
                   "distill": distill.EXAMPLE, "bench": bench.EXAMPLE})

__all__ = ["app", "main"]
