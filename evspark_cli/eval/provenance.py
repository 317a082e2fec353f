"""Where a measurement comes from: the commit, date, machine and command, for every result file.

A figure belongs to the code that produced it, so each result records the commit of the
checkout it ran from (`+changes` when tracked files other than results differed from it: a
run that rewrites one result file does not taint the next), the UTC date, the
machine and the exact command (benchmarks/results/README.md).
"""
from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "python": sys.version.split()[0],
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "platform": platform.platform()}


def commit() -> str:
    """The commit of the checkout this package runs from, or its version outside one."""
    root = Path(__file__).resolve().parents[2]

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=10).stdout.strip()

    try:
        head = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                      ":(exclude)benchmarks/results")
    except (OSError, subprocess.SubprocessError):
        head, changed = "", ""
    if not head:
        from .. import __version__

        return f"evspark {__version__} (not a git checkout)"
    return head + ("+changes" if changed else "")


def provenance(command: str | None = None) -> dict[str, Any]:
    """The `provenance` object of a result file; `command` defaults to this process's."""
    return {"commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": machine_info(),
            "command": command if command is not None else " ".join([Path(sys.argv[0]).name,
                                                                     *sys.argv[1:]])}
