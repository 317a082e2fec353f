"""Feedback while a command runs, for every command: one `Progress` that picks its form.

- stderr is a terminal: a rich bar (done/total in the command's unit, rate, detail such as tau
  or loss, time left), redrawn a few times a second.
- stderr is a file or a pipe (Snakemake and SLURM logs, `2> log`): plain timestamped lines, one
  when a unit of work worth reporting ends (`milestone`, e.g. a record) and one every
  `interval` seconds while nothing ends, never two within `min_gap` seconds (a milestone that
  comes too soon is folded into the next line), and a last one when the work ends. A heartbeat
  thread keeps the cadence while the work sends no update (a long prefill chunk, a model
  loading): its line says what the last update said, with the time elapsed.
- `--quiet`: neither. The summary line (`summary`) is printed in every case: a log always says
  what a run did.

The time left is the command's own estimate when it has one (`eta`: `generate`'s comes from
cli/meter.py, which counts prefill and native passes), else the remaining work over the recent
rate.
"""
from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import IO, Any

from .formats import Rate, fmt_count, fmt_duration, fmt_rate

INTERVAL_S = 10.0
"""Seconds between progress lines in a log while no milestone is reached."""
MIN_GAP_S = 0.5
"""The least time between two progress lines in a log (at most two lines a second)."""
"""The rate shown is measured over about this many recent seconds."""
BAR_REFRESH_S = 0.1
"""The bar's fields (rate, time left) are recomputed at most this often, however fast rounds
come: a GPU run makes thousands of rounds a second."""


class Progress:
    """A command's progress on stderr (see the module docstring); use as a context manager.

    `unit` names what `total` and `advance` count (tokens, bases, steps). A caller that knows
    better than the recent rate gives `eta` (seconds left, or None while unknown).
    """

    def __init__(self, command: str, unit: str, total: float | None = None, quiet: bool = False,
                 stream: IO[str] | None = None, tty: bool | None = None,
                 interval: float | None = None, min_gap: float = MIN_GAP_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """`interval`: seconds between log lines, INTERVAL_S when None (read at each run, so a
        test can shorten a command's cadence)."""
        self.command, self.unit, self.total = command, unit, total
        self.stream = stream if stream is not None else sys.stderr
        is_tty = tty if tty is not None else _is_terminal(self.stream)
        self.mode = "off" if quiet else ("bar" if is_tty else "lines")
        self.interval = INTERVAL_S if interval is None else interval
        self.min_gap, self.clock = min_gap, clock
        self.done = 0.0
        self.detail = ""  # e.g. "2/4 records, tau 3.41"
        self.status = ""  # what happens now, e.g. "loading model"
        self.eta: Callable[[], float | None] | None = None
        self.per_s: Callable[[], float | None] | None = None  # the rate shown, when not `rate`'s
        self.rate = Rate(clock)
        self.t_start = clock()
        self._last_line = self._last_draw = -math.inf
        self._pending = False  # a milestone not yet reported in a line
        self._bar: Any = None
        self._task: Any = None
        self._said: tuple[float, str, str] | None = None  # what the last line reported
        self._lock = threading.Lock()  # one line at a time: the heartbeat's or the updates'
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> Progress:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(finished=exc[0] is None)

    def start(self) -> None:
        """Show the bar at once (a run that loads a model says so before its first unit of
        work); in a log the first update (usually what the run is doing) is the first line."""
        if self.mode == "bar":
            self._bar = _rich_bar(self.stream)
            self._bar.start()
            self._task = self._bar.add_task(self.command, total=self.total, count="", rate="",
                                            detail="", left="")
            self._refresh()
        elif self.mode == "lines" and self.interval > 0 and self.clock is time.monotonic:
            # (not on a test's own clock, nor with a line at every update already)
            self._heartbeat = threading.Thread(target=self._beat, daemon=True,
                                               name="evspark-progress")
            self._heartbeat.start()

    def _beat(self) -> None:
        """A line at most `interval` seconds after the last one while no update prints one
        (it wakes every `tick` seconds, so it speaks a tick early rather than a tick late)."""
        tick = min(1.0, max(0.05, self.interval / 4))
        while not self._stop.wait(tick):
            with self._lock:
                if self.mode == "lines" and self.clock() - self._last_line >= self.interval - tick:
                    self._line()

    def close(self, finished: bool = True) -> None:
        """Stop the bar; in a log, one last line with where the work ended."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        if self._bar is not None:
            self._refresh()
            self._bar.stop()
            self._bar = None
        elif self.mode == "lines" and (finished or self._pending or self.done) \
                and self._said != self._state():  # never the same line twice at the end
            self._line()
        self.mode = "off"

    # ------------------------------------------------------------------ updates
    def set_total(self, total: float | None) -> None:
        self.total = total
        self._changed()

    def advance(self, n: float = 1) -> None:
        self.update(self.done + n)

    def update(self, done: float | None = None, detail: str | None = None,
               status: str | None = None) -> None:
        if done is not None:
            self.done = done
            self.rate.add(done)
        if detail is not None:
            self.detail = detail
        if status is not None:
            self.status = status
        self._changed()

    def milestone(self, detail: str | None = None) -> None:
        """A unit worth a line in a log ended (a record, a prompt, an evaluation)."""
        if detail is not None:
            self.detail = detail
        self._pending = True
        self._changed()

    def elapsed(self) -> float:
        return self.clock() - self.t_start

    def shown_rate(self) -> float | None:
        """The rate a line or the bar shows: the command's own definition (`per_s`), else
        units done per second of the recent past."""
        return self.per_s() if self.per_s is not None else self.rate.per_s()

    def time_left(self) -> float | None:
        if self.eta is not None:
            return self.eta()
        rate = self.rate.per_s()
        if self.total is None or not rate:
            return None
        return max(0.0, self.total - self.done) / rate

    # ------------------------------------------------------------------ output
    def _changed(self) -> None:
        if self.mode == "bar":
            now = self.clock()
            if now - self._last_draw >= BAR_REFRESH_S:  # rich redraws 4 times a second
                self._last_draw = now
                self._refresh()
        elif self.mode == "lines":
            with self._lock:
                since = self.clock() - self._last_line
                if (self._pending and since >= self.min_gap) or since >= self.interval:
                    self._line()

    def _refresh(self) -> None:
        if self._bar is None:
            return
        rate = self.shown_rate()
        left = self.time_left()
        count = (f"{fmt_count(self.done)}/{fmt_count(self.total)}" if self.total
                 else fmt_count(self.done))
        self._bar.update(self._task, completed=self.done, total=self.total,
                         count=f"{count} {self.unit}", rate=fmt_rate(rate, self.unit),
                         detail=", ".join(x for x in (self.status, self.detail) if x),
                         left=fmt_duration(left))

    def text(self) -> str:
        """What a log line says after its timestamp."""
        parts: list[str] = []
        if self.total:
            pct = 100 * self.done / self.total
            parts.append(f"{fmt_count(self.done)}/{fmt_count(self.total)} {self.unit} "
                         f"({pct:.0f}%)")
        else:
            parts.append(f"{fmt_count(self.done)} {self.unit}")
        if self.detail:
            parts.append(self.detail)
        rate = self.shown_rate()
        if rate:
            parts.append(fmt_rate(rate, self.unit))
        parts.append(f"elapsed {fmt_duration(self.elapsed())}")
        left = self.time_left()
        if left is not None and self.total and self.done < self.total:
            parts.append(f"ETA {fmt_duration(left)}")
        head = f"{self.command}: {self.status}: " if self.status else f"{self.command}: "
        return head + ", ".join(parts)

    def _state(self) -> tuple[float, str, str]:
        """What a line reports, its clock aside."""
        return self.done, self.detail, self.status

    def _line(self) -> None:
        self._last_line = self.clock()
        self._pending = False
        self._said = self._state()
        stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        _write(self.stream, f"evspark [{stamp}] {self.text()}")

    def summary(self, line: str) -> None:
        """The run's last line: printed even with --quiet (and after the bar is gone)."""
        self.close()
        _write(self.stream, line)

    def log(self, message: str) -> None:
        """A step's own report (bench's results): counted as one unit of progress, printed
        above the bar or as a timestamped line; nothing with --quiet."""
        self.done += 1
        self.rate.add(self.done)
        if self.mode == "bar":
            self.say(message)
            self._refresh()
        elif self.mode == "lines":
            self._last_line = self.clock()
            stamp = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
            _write(self.stream, f"evspark [{stamp}] {self.command}: {message}")

    def say(self, line: str) -> None:
        """A diagnostic line (a warning, a failed record) above the bar, or as a line in a log;
        always printed."""
        if self._bar is not None:
            self._bar.console.print(line, markup=False, highlight=False, soft_wrap=True)
        else:
            _write(self.stream, line)


def _write(stream: IO[str], line: str) -> None:
    try:
        print(line, file=stream, flush=True)
    except (OSError, ValueError):  # a closed log: the run's results matter more
        pass


def _is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _rich_bar(stream: IO[str]) -> Any:
    """A rich Progress with the columns every command shares (rich is imported only here)."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn

    # the caller decided that `stream` is a terminal (or was told so)
    console = Console(file=stream, stderr=stream is sys.stderr, force_terminal=True)
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TaskProgressColumn(),
        TextColumn("{task.fields[count]}"), TextColumn("{task.fields[rate]}"),
        TextColumn("ETA {task.fields[left]}"), TextColumn("{task.fields[detail]}"),
        # transient: the summary line takes the bar's place (and a usage error leaves no bar)
        console=console, transient=True, refresh_per_second=4,
        # stdout may carry the data (FASTA, TSV): never through the bar; other diagnostics on
        # stderr print above it
        redirect_stdout=False, redirect_stderr=True,
    )

