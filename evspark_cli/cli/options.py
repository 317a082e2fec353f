"""Options that several commands share, declared once, and the progress bar.

A new shared option (a batch size, say) is declared here and named in each command's signature.
`panel` groups options under a heading in `--help` (Typer's rich_help_panel): input, model and
device, sampling, speculation, output, performance; an option without one is listed under
"Options".
"""
from __future__ import annotations

from typing import Any

import typer

from .. import defaults

INPUT_PANEL = "Input"
MODEL_PANEL = "Model and device"
SAMPLING_PANEL = "Sampling"
SPECULATION_PANEL = "Speculation"
OUTPUT_PANEL = "Output"
PERFORMANCE_PANEL = "Performance"
"""The panels of `--help`, in the order a user reads a command's options."""


def option(default: Any, *names: str, help: str, panel: str | None = None) -> Any:
    """A Typer option declaration (one place to add panels or metadata to every option). A
    flag (a bool default) shows no metavar: newer Typers would render `--greedy <bool>`, as if
    it took a value."""
    extra = {"metavar": ""} if isinstance(default, bool) else {}
    return typer.Option(default, *names, help=help, rich_help_panel=panel, **extra)


ModelOpt = option(None, "--model", help="Model folder (config.json + model.safetensors). "
                  "Default: the bundled target.", panel=MODEL_PANEL)
RegionOpt = option(None, "--region", help="samtools-style region ID:START-END (1-based, "
                   "inclusive; commas allowed), ID:START, ID, or {ID} for a record whose name "
                   "looks like a range; repeatable. Read through pyfaidx.", panel=INPUT_PANEL)
RegionsOpt = option(None, "--regions", help="BED file of regions (0-based, half-open; the "
                    "name column, when present, names the prompt), after any --region.",
                    panel=INPUT_PANEL)
StrictOpt = option(False, "--strict", help="An empty record is an error (exit 2) instead of "
                   "being skipped with a warning.", panel=INPUT_PANEL)
CircularOpt = option(False, "--circular", panel=INPUT_PANEL,
                     help="Records are circular (plasmids, organelles, phages): a region may run "
                     "across the origin (START > END, or a BED end past the record's end).")
TailOpt = option(None, "--prompt-tail", help="Use only the last N bases of each record.",
                 panel=INPUT_PANEL)
ShardOpt = option(None, "--shard", help="I/N: process only records i with i mod N == I-1 "
                  "(N jobs cover the input exactly once).", panel=INPUT_PANEL)
DeviceOpt = option(defaults.DEVICE, "--device", help="auto, cpu or cuda.", panel=MODEL_PANEL)
DtypeOpt = option("auto", "--dtype", help="auto (fp32 on CPU, bf16 on CUDA), float32, "
                  "bfloat16.", panel=MODEL_PANEL)
CompileOpt = option(False, "--compile", help="On a CPU, run decode steps and verification "
                    "blocks through torch.compile (needs a C++ compiler; a block length "
                    "compiles at its 32nd use: ~20 s the first time on a machine, ~1.5-4 s once "
                    "torch's on-disk cache holds it; then ~1.2x faster native decoding; "
                    "same tokens).", panel=PERFORMANCE_PANEL)
GraphsOpt = option(True, "--cuda-graphs/--no-cuda-graphs", help="On a GPU, replay decode "
                   "steps and verification blocks from CUDA graphs (no effect on CPU).",
                   panel=PERFORMANCE_PANEL)
GammaOpt = option(defaults.GAMMA, "--gamma", "-g", help="Draft length per round.",
                  panel=SPECULATION_PANEL)
RuleOpt = option(defaults.RULE, "--rule", panel=SPECULATION_PANEL,
                 help="How tokens are drawn: residual (lossless in distribution) or coupled "
                 "(Gumbel-max: sampled output equals native sampling of the same seed, token for "
                 "token, whatever the drafter, gamma or batch).")
AlphabetOpt = option(defaults.ALPHABET, "--alphabet", panel=SAMPLING_PANEL,
                     help="all (every token of the vocabulary, as Evo 2 samples) or acgt (only "
                     "A, C, G and T are drawn, on both paths: still lossless).")
DraftLengthOpt = option(defaults.DRAFT_LENGTH, "--draft-length", panel=SPECULATION_PANEL,
                        help="fixed (--gamma drafts every round) or confidence (each round "
                        "verifies as many drafts as the drafter's confidence and the measured "
                        "cost of a block make worth it, --gamma at most; greedy or --rule "
                        "coupled only; same output).")
TreeRowsOpt = option(defaults.TREE_ROWS, "--tree-rows", panel=SPECULATION_PANEL,
                     help="Token trees: each job may verify up to N alternative drafts beside "
                     "its own in each round's pass, on rows of the batch that no queued job "
                     "needs (greedy or --rule coupled only; same output). 0: none.")
QuietOpt = option(False, "--quiet", "-q", help="No progress (neither the bar on a terminal nor "
                  "the timestamped lines in a log); warnings, errors and the summary line stay.",
                  panel=OUTPUT_PANEL)
BatchSizeOpt = option(None, "--batch-size", "-b", help="Sequences decoded together (records x "
                      "samples share the batch; finished ones are replaced as they end). Default: "
                      "32 on a CPU, 64 on CUDA, fewer when memory is short. Output does not depend "
                      "on it.", panel=PERFORMANCE_PANEL)
MaxMemoryOpt = option(None, "--max-memory", help="Refuse, before any work, a model or run "
                      "whose estimated memory exceeds this size (e.g. 8G, 512M). Default: the "
                      "memory available (free GPU memory on a GPU).", panel=PERFORMANCE_PANEL)
IupacOpt = option("keep", "--iupac", help="What ambiguity codes (N, R, Y...) in prompts "
                  "become: keep (their own tokens, as Evo 2 reads them), error (refused), random "
                  "(one of their bases, the same for the same record and position). U is read "
                  "as T.", panel=INPUT_PANEL)
ThreadsOpt = option(0, "--threads", "-t", help="CPU threads for torch. 0: the CPUs this process "
                    "may use (the smallest of its CPU affinity, cgroup quota, "
                    "SLURM_CPUS_PER_TASK, NSLOTS and OMP_NUM_THREADS); more are clamped to "
                    "them, with a warning.", panel=PERFORMANCE_PANEL)
