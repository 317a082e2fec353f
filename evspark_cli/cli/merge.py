"""`evspark merge`: shard outputs of `generate --shard I/N` back into the unsharded run's output."""
from __future__ import annotations

from typing import List, Optional

import typer

from .app import command, say
from .options import QuietOpt, option

EXAMPLE = """Example: three shards of one run, then their FASTA and stats merged in input order:

  for i in 1 2 3; do
    evspark generate genome.fa --samples 6 -n 1024 --shard $i/3 -o part$i.fa --stats part$i.tsv
  done
  evspark merge part1.fa part2.fa part3.fa -o all.fa
  evspark merge part1.tsv part2.tsv part3.tsv -o all.tsv"""


@command()
def merge(
    shards: List[str] = typer.Argument(..., help="The shards' outputs: FASTA files (plain, "
                                       "gzip or BGZF), or their stats files (.tsv/.jsonl)."),
    output: Optional[str] = option(None, "-o", "--output",
                                   help="The merged file (default stdout): FASTA, or stats for "
                                   "a .tsv/.jsonl name; BGZF when it ends in .gz or .bgz."),
    stats: bool = option(False, "--stats", help="The inputs are stats files (implied by a "
                         ".tsv/.jsonl --output)."),
    index: bool = option(False, "--index", help="Also write OUTPUT.fai (and OUTPUT.gzi for a "
                         ".gz/.bgz OUTPUT), as samtools faidx does."),
    quiet: bool = QuietOpt,
) -> None:
    """Merge the outputs of generate --shard I/N into the unsharded run's output (input
    order), refusing shards of different runs."""
    from ..io.merge import merge_fasta, merge_kind, merge_stats
    from ..io.writers import check_distinct_outputs, check_fasta_index, check_output_path

    check_output_path(output)
    as_stats = stats or (output is not None and merge_kind(output) == "stats")
    outputs: list[tuple[str, str | None]] = [("--output", "-" if output is None else output)]
    if not as_stats:
        outputs += check_fasta_index(output, index)
    check_distinct_outputs(list(shards), outputs)
    got = merge_stats(shards, output) if as_stats else merge_fasta(shards, output, index)
    if not quiet:
        what = "row" if as_stats else "record"
        say(f"evspark: merge: {got.records} {what}{'s' if got.records != 1 else ''} from "
            f"{got.files} file{'s' if got.files != 1 else ''} written to "
            f"{output or 'standard output'}")
