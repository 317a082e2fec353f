"""What the commands that read prompts and use CPU threads share: warnings and their checks.

A warning is one `evspark: warning: ...` line on stderr, printed whatever `--quiet` says: it
is about the user's data or settings, not about progress.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .app import say

if TYPE_CHECKING:
    from ..cpus import Threads
    from ..io.prompts import Prompts
    from ..io.types import LengthCap, Prompt
    from ..model.config import ModelConfig


PROMPT_OPTIONS = {"literal": "--prompt", "regions": "--region", "bed": "--regions"}
"""The options of the commands that read prompts, by the library's setting names
(io/prompts.load_prompts) where the plain rule (`prompt_tail` -> `--prompt-tail`) does not give
them."""


def out_line(text: str) -> None:
    """A line of a command's data on standard output, written so that a failing stdout (a full
    disk) is one error line (files.write_stdout), not an internal error."""
    from ..files import write_stdout

    write_stdout(text + "\n")


def warn(message: str) -> None:
    say(f"evspark: warning: {message}")


def read_input(inputs: list[str] | None, region: list[str] | None, regions: str | None,
               prompt_tail: int | None, shard: str | None, strict: bool,
               literal: str | list[str] | None = None, iupac: str = "keep",
               cap: LengthCap | None = None, samples: int = 1,
               config: ModelConfig | None = None, circular: bool = False) -> Prompts:
    """The run's prompts (io/prompts.py), with their warnings printed; `iupac` and `cap` as
    for io/fasta.read_prompts; `samples` per prompt for the jobs `shard` splits. With the
    model's `config`, prompts longer than it was trained on are warned about."""
    from ..io.prompts import load_prompts

    got = load_prompts(inputs, region or None, regions, literal, prompt_tail, shard, strict,
                       iupac=iupac, cap=cap, samples=samples, circular=circular)
    for w in got.warnings:
        warn(w)
    if config is not None:
        beyond_training(config, got.prompts)
    return got


def beyond_training(config: ModelConfig, prompts: list[Prompt]) -> None:
    """Warn about prompts longer than the context the model was trained on (its config's
    `trained_context`): the model reads them, but past that length it extrapolates."""
    known = config.known_context
    long = [p for p in prompts if len(p.seq) > known]
    if not long:
        return
    ids = ", ".join(repr(p.id) for p in long[:3]) + (f" and {len(long) - 3} more"
                                                    if len(long) > 3 else "")
    one = len(long) == 1
    warn(f"{len(long)} prompt{'' if one else 's'} ({ids}) {'is' if one else 'are'} longer "
         f"than the {known:,} bases the model was trained on (up to "
         f"{max(len(p.seq) for p in long):,}): past that its output is extrapolation; "
         f"--prompt-tail {known} keeps the last {known:,} bases")


def use_threads(threads: int) -> Threads:
    """Set torch's CPU threads (0: the CPUs this process may use) and warn when more were asked
    for than the process may use: the count is clamped to them (api.set_threads)."""
    from ..api import set_threads

    got = set_threads(threads)
    warn_clamped(got, "--threads")
    return got


def warn_clamped(got: Threads, what: str) -> None:
    """The warning for a thread count (`what`: the option or setting) above the CPUs this
    process may use, which was clamped to them."""
    if got.clamped:
        cpus = got.allowed.count
        warn(f"{what} {got.asked} is more than the {cpus} CPU{'s' if cpus != 1 else ''} this "
             f"process may use ({got.allowed.source}); using {got.count}")
