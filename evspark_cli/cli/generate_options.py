"""The options of `evspark generate` that no other command shares (cli/options.py has the shared
ones), each in its `--help` panel."""
from __future__ import annotations

import typer

from .. import defaults
from .options import (
    INPUT_PANEL,
    MODEL_PANEL,
    OUTPUT_PANEL,
    SAMPLING_PANEL,
    SPECULATION_PANEL,
    option,
)

InputsArg = typer.Argument(None, metavar="INPUT", show_default=False,
                           help="FASTA files (plain, gzip, BGZF); '-' reads FASTA from stdin.")
PromptOpt = option(None, "--prompt", panel=INPUT_PANEL,
                   help="One literal prompt (ACGT...) instead of INPUT (given once); its id "
                   "is 'prompt', so its output is 'prompt.cont'.")

MaxNewTokensOpt = option(defaults.MAX_NEW_TOKENS, "-n", "--max-new-tokens",
                         help="Tokens per record.", panel=SAMPLING_PANEL)
TemperatureOpt = option(defaults.TEMPERATURE, "--temperature",
                        help="Sampling temperature (0 = greedy).", panel=SAMPLING_PANEL)
TopKOpt = option(defaults.TOP_K, "--top-k",
                 help="Keep the k most likely tokens (1 = greedy, 0 = all).", panel=SAMPLING_PANEL)
TopPOpt = option(defaults.TOP_P, "--top-p", help="Nucleus sampling inside the kept tokens.",
                 panel=SAMPLING_PANEL)
GreedyOpt = option(False, "--greedy", help="Same as --top-k 1.", panel=SAMPLING_PANEL)
SeedOpt = option(defaults.SEED, "--seed", help="Random seed; the same seed reproduces a run.",
                 panel=SAMPLING_PANEL)
SamplesOpt = option(defaults.SAMPLES, "--samples", help="Continuations per record (ids get _s{i}).",
                    panel=SAMPLING_PANEL)

DrafterOpt = option(defaults.DRAFTER, "--drafter", panel=SPECULATION_PANEL,
                    help="auto (the model's bundled drafter), dspark, kmer, identity, none "
                    "(native decoding) or a drafter folder.")
RollbackOpt = option(defaults.ROLLBACK, "--rollback", panel=SPECULATION_PANEL,
                     help="slice (per-position state) or replay (snapshot-and-replay baseline).")
ForceDrafterOpt = option(False, "--force-drafter", panel=SPECULATION_PANEL,
                         help="Use a drafter distilled from another target anyway.")
CompareNativeOpt = option(False, "--compare-native", panel=SPECULATION_PANEL,
                          help="Also decode natively in the same process, interleaved with "
                          "speculative decoding (at least 3 timed pairs), and report the speedup "
                          "and its spread.")

OutputOpt = option(None, "-o", "--output", panel=OUTPUT_PANEL,
                   help="FASTA of generated sequences (default stdout); written atomically, "
                   "BGZF-compressed when it ends in .gz or .bgz.")
StatsOpt = option(None, "--stats", help="Per-record statistics, .tsv or .jsonl (.gz: "
                  "compressed).",
                  panel=OUTPUT_PANEL)
IndexOpt = option(False, "--index", panel=OUTPUT_PANEL,
                  help="Also write OUTPUT.fai (and OUTPUT.gzi for a .gz/.bgz OUTPUT, which is "
                  "BGZF), as samtools faidx does.")
LineWidthOpt = option(60, "--line-width", help="FASTA line width (0 = one line).",
                      panel=OUTPUT_PANEL)
IncludePromptOpt = option(False, "--include-prompt", panel=OUTPUT_PANEL,
                          help="Prepend the prompt (ids end in .ext instead of .cont).")
ResumeOpt = option(False, "--resume", help="Continue an interrupted run from OUTPUT.partial.",
                   panel=OUTPUT_PANEL)
ServerOpt = option(None, "--server", panel=MODEL_PANEL,
                   help="Decode on a running `evspark serve` at this URL (e.g. "
                   "http://127.0.0.1:8000) instead of loading the model here: the same output, "
                   "stats, .partial and --resume; the server's model, drafters, device and "
                   "batch.")
ApiKeyFileOpt = option(None, "--api-key-file", panel=MODEL_PANEL,
                       help="With --server: a file whose first line is the server's API key.")
