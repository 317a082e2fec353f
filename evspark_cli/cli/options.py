"""Options that several commands share, declared once, and the progress bar.

A new shared option (a batch size, say) is declared here and named in each command's signature.
`panel` groups options under a heading in `--help` (Typer's rich_help_panel); the shared
options do not set one yet, so every command lists its options in one block.
"""
from __future__ import annotations

from typing import Any

import typer

INPUT_PANEL = "Input"
MODEL_PANEL = "Model and device"
OUTPUT_PANEL = "Output"
"""Panel names for options that one day get grouped in `--help`."""


def option(default: Any, *names: str, help: str, panel: str | None = None) -> Any:
    """A Typer option declaration (one place to add panels or metadata to every option)."""
    return typer.Option(default, *names, help=help, rich_help_panel=panel)


ModelOpt = option(None, "--model", help="Model folder (config.json + model.safetensors). "
                  "Default: the bundled target.")
RegionOpt = option(None, "--region", help="samtools-style region ID:START-END (1-based, "
                   "inclusive) or ID; repeatable. Read through pyfaidx.")
TailOpt = option(None, "--prompt-tail", help="Use only the last N bases of each record.")
ShardOpt = option(None, "--shard", help="I/N: process only records i with i mod N == I-1 "
                  "(N jobs cover the input exactly once).")
DeviceOpt = option("auto", "--device", help="auto, cpu or cuda.")
DtypeOpt = option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, "
                  "bfloat16.")
CompileOpt = option(False, "--compile", help="On a CPU, run decode steps and verification "
                    "blocks through torch.compile (needs a C++ compiler; a block length "
                    "compiles at its 32nd use: ~20 s the first time on a machine, ~1.5-4 s once "
                    "torch's on-disk cache holds it; then ~1.2x faster native decoding; "
                    "same tokens).")
GraphsOpt = option(True, "--cuda-graphs/--no-cuda-graphs", help="On a GPU, replay decode "
                   "steps and verification blocks from CUDA graphs (no effect on CPU).")
GammaOpt = option(12, "--gamma", "-g", help="Draft length per round.")
QuietOpt = option(False, "--quiet", "-q", help="No progress bar.")
BatchSizeOpt = option(None, "--batch-size", "-b", help="Sequences decoded together (records x "
                      "samples share the batch; finished ones are replaced as they end). Default: "
                      "16 on a CPU, 32 on CUDA, fewer when memory is short. Output does not depend "
                      "on it.")
MaxMemoryOpt = option(None, "--max-memory", help="Refuse, before any work, a model or run "
                      "whose estimated memory exceeds this size (e.g. 8G, 512M). Default: the "
                      "memory available (free GPU memory on a GPU).")
IupacOpt = option("keep", "--iupac", help="What ambiguity codes (N, R, Y...) in prompts "
                  "become: keep (their own tokens, as Evo 2 reads them), error (refused), random "
                  "(one of their bases, the same for the same record and position). U is read "
                  "as T.")
ThreadsOpt = option(0, "--threads", help="CPU threads for torch (0 = torch's default).")


def progress_bar(quiet: bool, label: str, unit: str = "") -> Any:
    """A rich progress bar on stderr when it is a terminal (and not --quiet), else silent."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(stderr=True)
    enabled = not quiet and console.is_terminal
    return Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                    TextColumn("{task.fields[note]}"), console=console, disable=not enabled,
                    transient=False)
