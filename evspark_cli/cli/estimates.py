"""What a generation run's time left is estimated from (cli/meter.py): the decoding rate of a
mode and the cost of prefilling, each measured on its own kind of work, so that neither is
mistaken for the other (a long prompt after short ones, a run's setup in its first round)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DecodeTiming:
    """Seconds and tokens of one mode's decoding: round intervals without a prefill ("plain"),
    and those with one less its measured prefill time ("mixed", also holding rows joining)."""

    plain_s: float = 0.0
    plain_tokens: int = 0
    mixed_s: float = 0.0
    mixed_tokens: int = 0

    def rate(self) -> float | None:
        """Tokens per second: of plain rounds where there are some (the cleanest measure),
        else of the mixed ones (a run whose records each take a round or two)."""
        for s, n in ((self.plain_s, self.plain_tokens), (self.mixed_s, self.mixed_tokens)):
            if s > 0 and n:
                return n / s
        return None


@dataclass
class PrefillFit:
    """Prefill seconds as `a` per prompt plus `b` per unit of work (`prefill_work`), fitted by
    least squares (both non-negative) on the chunks timed so far: a prompt's first chunk holds
    its fixed overhead, its later chunks the work alone. While every chunk timed was the first
    of a prompt of one length, the two cannot be told apart and all the time counts as work."""

    kk: float = 0.0  # sums over chunks: k (1 for a first chunk), w (its work), dt (its seconds)
    ww: float = 0.0
    kw: float = 0.0
    kdt: float = 0.0
    wdt: float = 0.0

    def add(self, first: bool, w: float, dt: float) -> None:
        k = 1.0 if first else 0.0
        self.kk, self.ww, self.kw = self.kk + k, self.ww + w * w, self.kw + k * w
        self.kdt, self.wdt = self.kdt + k * dt, self.wdt + w * dt

    def coefficients(self) -> tuple[float, float] | None:
        """(seconds per prompt, seconds per unit of work); None before any chunk."""
        if not self.ww:
            return None
        det = self.kk * self.ww - self.kw * self.kw
        if self.kk and det > 1e-9 * self.kk * self.ww:
            a = (self.kdt * self.ww - self.wdt * self.kw) / det
            b = (self.wdt * self.kk - self.kdt * self.kw) / det
            if a < 0:
                return 0.0, max(0.0, self.wdt / self.ww)
            if b < 0:
                return max(0.0, self.kdt / self.kk), 0.0
            return a, b
        return 0.0, max(0.0, self.wdt / self.ww)
