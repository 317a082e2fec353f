"""How progress shows its numbers (counts, durations, rates), and a rate over a recent window."""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

RATE_WINDOW_S = 20.0
"""Seconds of the recent past a `Rate` averages over."""


def fmt_count(x: float) -> str:
    """1234567 -> '1,234,567'; fractions (training steps never are) with one decimal."""
    return f"{x:,.0f}" if float(x).is_integer() else f"{x:,.1f}"


def fmt_duration(seconds: float | None) -> str:
    """An ETA or elapsed time as H:MM:SS ('-:--:--' while unknown)."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "-:--:--"
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def fmt_rough(seconds: float) -> str:
    """A time left for prose, no more precise than an estimate: '~40 s', '~2 min', '~1 h 5 min'."""
    s = max(1, round(seconds))
    if s < 60:
        return f"~{s} s"
    minutes = round(s / 60)
    if minutes < 60:
        return f"~{minutes} min"
    h, m = divmod(minutes, 60)
    return f"~{h} h {m} min" if m else f"~{h} h"


def fmt_rate(rate: float | None, unit: str) -> str:
    if not rate:
        return f"- {unit}/s"
    return f"{rate:,.0f} {unit}/s" if rate >= 10 else f"{rate:.2f} {unit}/s"


class Rate:
    """Work per second over the last RATE_WINDOW_S seconds (all of it until then)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, done: float) -> None:
        now = self.clock()
        self.samples.append((now, done))
        while len(self.samples) > 2 and now - self.samples[1][0] > RATE_WINDOW_S:
            self.samples.popleft()

    def per_s(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 and d1 > d0 else None
