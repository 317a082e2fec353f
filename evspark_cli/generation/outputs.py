"""A run's outputs: FASTA and stats files opened (resumed ones checked against the run) and
its outcomes written in input order.

Records go to `OUTPUT.partial` as they finish (io/writers.py) and the files get their names
once every record is written: a record that fails is reported (through a callback) and skipped,
the others stay for a resumed run. A resumed run keeps the records an earlier run finished, so
the final file is one run only if every finished record was made exactly as this run would make
it: headers and stats rows are checked against this run's settings (generation/records.py).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field

from ..decode.jobs import Job
from ..errors import SettingError
from ..io.types import Prompt
from ..io.writers import FastaOutput, StatsOutput, fasta_letters
from .records import LATER_WORDS, OPTIONAL_WORDS, RecordScheme
from .results import STATS_COLUMNS, JobOutcome


@dataclass
class RunOutputs:
    """The FASTA (and stats) outputs of a run over `prompts`, in the order `order` names."""

    fasta: FastaOutput
    stats: StatsOutput | None
    order: list[str]

    @property
    def done_ids(self) -> set[str]:
        """Output ids an earlier run finished (a resumed run skips them)."""
        return self.fasta.done_ids

    def finish(self) -> None:
        """Every record is written: give the files their names, records in input order."""
        self.fasta.finish(self.order)
        if self.stats is not None:
            self.stats.finish(self.order)

    def close(self) -> None:
        """Leave the partial files for a resumed run."""
        if self.stats is not None:
            self.stats.close()
        self.fasta.close()


def open_outputs(scheme: RecordScheme, prompts: Sequence[Prompt], output: str | None,
                 stats: str | None, line_width: int = 60, index: bool = False,
                 resume: bool = False) -> RunOutputs:
    """The outputs of a run over `prompts`; resumed ones checked against this run (a
    SettingError naming the setting that differs). A run refused here leaves no new `.partial`
    behind."""
    ids = scheme.output_ids(list(prompts))
    by_id = dict(zip(ids, scheme.jobs(list(prompts))))
    fasta = FastaOutput(output, line_width=line_width, resume=resume, index=index)
    stat_out: StatsOutput | None = None
    try:
        want = {**OPTIONAL_WORDS, **scheme.settings,
                "new_tokens": str(scheme.options.max_new_tokens)}
        fasta.check_resumed(want, {i: scheme.record_words(p, s) for i, (p, s) in by_id.items()},
                            {**LATER_WORDS, **OPTIONAL_WORDS})
        if stats:
            # with the FASTA on standard output nothing can be resumed: a stats partial is
            # kept (it holds the rows of the records written) but not offered to --resume
            stat_out = StatsOutput(stats, STATS_COLUMNS, resume=resume,
                                   resumable=fasta.path is not None)
            stat_out.check_resumed({i: scheme.stats_row(p, s) for i, (p, s) in by_id.items()})
            if fasta.done_ids and not stat_out.existed:
                raise SettingError(f"{{0}}: {_braced(fasta.partial)} has {len(fasta.done_ids)} "
                                   f"finished records but there is no "
                                   f"{_braced(stat_out.partial)} (was the run started without "
                                   "{1}?); rerun without {1} or delete the .partial",
                                   "resume", "stats")
        return RunOutputs(fasta, stat_out, ids)
    except BaseException:
        if stat_out is not None:
            stat_out.discard()
        fasta.discard()
        raise


def _braced(text: str | None) -> str:
    """`text` inside a SettingError template (braces doubled)."""
    return str(text).replace("{", "{{").replace("}", "}}")


@dataclass
class OrderedWriter:
    """Writes a run's outcomes as they come (in input order), each job's stats row before its
    FASTA record; failures go to `on_failure` and are collected in `failed`."""

    scheme: RecordScheme
    outputs: RunOutputs
    prompts: dict[str, Prompt]  # by the base of their output ids (`Job.record`)
    on_failure: Callable[[Job, Exception], None] = lambda job, error: None
    on_written: Callable[[JobOutcome], None] = lambda outcome: None
    failed: list[str] = field(default_factory=list)

    def write_all(self, outcomes: Iterable[JobOutcome],
                  unsent: Callable[[], list[JobOutcome]]) -> None:
        """Write every outcome; on any early exit, also those `unsent()` gives (finished out of
        order: nothing finished is lost, and a resumed run restores the order). When no job
        failed, the files get their names."""
        try:
            for o in outcomes:
                self.write(o)
        except BaseException:
            for o in unsent():
                self.write(o)
            raise
        if not self.failed:
            self.outputs.finish()
        elif self.outputs.stats is not None:
            self.outputs.stats.close()

    def write(self, o: JobOutcome) -> None:
        """Write one finished job (its stats row first), or report its failure."""
        self.on_written(o)
        job = o.job
        if o.output is None:
            assert o.error is not None
            self.on_failure(job, o.error)
            self.failed.append(job.label)
            return
        out = o.output
        prompt = self.prompts[job.record]
        text = self.scheme.record_text(prompt, fasta_letters(out.text))
        # stats row first: a record counts as done once it is in the FASTA, so an interrupt
        # between the two writes must not leave a done record without its row (a row without
        # its record is kept and not written twice on a resumed run)
        stats = self.outputs.stats
        if stats is not None and job.label not in stats.done_ids:
            stats.write({**out.stats, **self.scheme.input_columns(prompt, job.sample)})
        self.outputs.fasta.write(job.label, self.scheme.header(prompt, job.sample,
                                                               len(out.tokens)), text)


def closing(outputs: RunOutputs) -> ExitStack:
    """A context that closes the outputs' files on the way out (finished or not)."""
    stack = ExitStack()
    stack.enter_context(outputs.fasta)
    if outputs.stats is not None:
        stack.enter_context(outputs.stats)
    return stack
