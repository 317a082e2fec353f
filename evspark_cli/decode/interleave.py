"""Decoders timed side by side, in turns: how every speedup is measured.

The machine a speedup is measured on does not run at one speed: on a shared VM the same native
decode step's time drifts from one second to the next (`benchmarks/results/timing_noise.json`),
so a native pass timed before a speculative pass of the same jobs is slower or faster than it
for reasons that are not in the passes.
Decoders that are compared therefore run at once, taking turns of `TURN_S` seconds, a whole
`BatchDecoder.step` (a prefill or a round) at a time; each is timed only while it runs, and its
rows' wall times and progress stamps come from a clock that stops while the others run
(`TurnClock`). Drifts slower than a turn then fall on both alike and cancel in the ratio.

The turn goes to the decoder that has emitted the fewest tokens, so decoders of the same jobs
move through them together and finish together, however different their speeds. Turns taken
in a fixed order would leave the slower decoder (native decoding, several times slower)
running alone once the faster one is done, for most of its time: a drift in that stretch
fell on it alone, and three runs of one batch-32 benchmark gave 1.94x-2.88x
(docs/performance.md, "Timing in turns").
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from .batch import JobSource
from .jobs import Outcome

TURN_S = 0.05
"""Seconds a decoder runs before the next takes its turn: the machine's drift is slower than
this (seconds), and a turn holds many rounds, so switching costs nothing measurable."""


class Stepper(Protocol):
    """What takes turns: a decoder that runs one step at a time (`BatchDecoder`)."""

    tokens_emitted: int  # by all its rows so far: how far it has come

    def step(self, source: JobSource) -> list[Outcome] | None:
        """One step (prefills, then a round): the outcomes it finished, None when done."""


class TurnClock:
    """A decoder's own time: `time.perf_counter` less the time it waited for its turns."""

    def __init__(self) -> None:
        self._waited = 0.0
        self._since: float | None = time.perf_counter()  # waiting until its first turn

    def __call__(self) -> float:
        return time.perf_counter() - self._waited

    def start(self) -> None:
        if self._since is not None:
            self._waited += time.perf_counter() - self._since
            self._since = None

    def stop(self) -> None:
        self._since = time.perf_counter()


@dataclass
class TimedRun:
    """One decoder's jobs run in turns (`interleave`): its outcomes as they finished, and the
    seconds it ran (its steps', nobody else's)."""

    decoder: Stepper
    jobs: JobSource
    clock: TurnClock
    seconds: float = 0.0
    outcomes: list[Outcome] = field(default_factory=list)
    done: bool = False

    def turn(self, budget: float) -> None:
        """Steps until `budget` seconds have passed or the jobs are done."""
        self.clock.start()
        t0 = time.perf_counter()
        try:
            while not self.done:
                got = self.decoder.step(self.jobs)
                if got is None:
                    self.done = True
                else:
                    self.outcomes += got
                if time.perf_counter() - t0 >= budget:
                    break
        finally:
            self.seconds += time.perf_counter() - t0
            self.clock.stop()


def timed_run(make: Callable[[TurnClock], Stepper], jobs: JobSource) -> TimedRun:
    """A run of `jobs` on the decoder `make(clock)` builds around its own turn clock."""
    clock = TurnClock()
    return TimedRun(make(clock), jobs, clock)


def interleave(runs: Sequence[TimedRun], turn_s: float = TURN_S,
               on_turn: Callable[[int], None] | None = None) -> None:
    """Run every decoder to the end of its jobs, in turns of `turn_s` seconds, each turn
    going to the live decoder that has emitted the fewest tokens (the first of them, on a
    tie). `on_turn(i)`: run i is about to take its turn (a progress display follows the
    mode)."""
    while True:
        live = [i for i, r in enumerate(runs) if not r.done]
        if not live:
            return
        i = min(live, key=lambda i: runs[i].decoder.tokens_emitted)
        if on_turn is not None:
            on_turn(i)
        runs[i].turn(turn_s)
