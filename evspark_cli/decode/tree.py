"""Token trees on idle rows: which alternative drafts a job's spare rows verify.

A batch with free rows (one long generation, fewer jobs than rows) spends them on one job's
*branches*: copies of its row (forked once, kept in step by `Block.commit(j, source)`) that
verify other drafts in the same batched pass. Every branch shares the main chain's drafts up to
a slot k, puts another letter there, and continues as the drafter would after that letter. The
round keeps the row that verified the most drafts and every row of the job takes its tokens.

Lossless for any choice of branches under the rules whose tokens are the target's own (greedy,
coupled): each row accepts drafts while they equal the target's token at that position given
the row's own prefix, so every row's accepted prefix is native decoding's, and the longest is
native decoding's too (docs/sampling-and-acceptance.md). Only speed depends on the branches.

Which branches: a drafter whose next draft depends only on a context class of the last few
tokens (the dspark drafter's Markov head of order m: base-(A+1) digits of the last m tokens)
scores every path it could draft (`DraftPaths`): scores[k, c, a] is letter a's score at slot k
in context class c, and softmax(scores / scale) estimates the chance that a is the target's
token there. A path's chance is the product along it. Branches are added
best first (the node outside the tree most likely to be reached, then the drafter's own
continuation from it), as EAGLE-2 grows its tree from the most probable nodes; every node is
added once.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import Tensor


@dataclass
class DraftPaths:
    """Every path a Markov-head drafter could draft this round, per row.

    scores (B, G, C, A): letter a's score at draft slot k in context class c; the drafter's
    own draft there is the argmax. A class is the last m tokens as base-(A+1) digits, the newest
    least significant (a letter's digit is its index, A is any other token), so drafting letter
    a in class c leads to class (c·(A+1)) mod C + a; with m = 1 the class is the previous token.
    `scale`: the score difference that makes one letter e times likelier than another to be the
    target's token."""

    scores: Tensor
    alphabet: Tensor  # (A,) token ids of the letters
    start: list[int]  # each row's context class before its first draft (anchor and history)
    scale: float = 1.0

    def after(self, cls: int, letter: int) -> int:
        """The context class once `letter` (an index into the alphabet) follows class cls."""
        C, base = self.scores.shape[2], self.scores.shape[3] + 1
        return (cls * base) % C + letter

    def branches(self, row: int, main: Sequence[int], n: int) -> list[list[int]]:
        """Up to n alternative drafts (token ids, each as long as `main`) for `row`, whose own
        drafts are `main`, most likely to be accepted further first."""
        g = len(main)
        if n <= 0 or g == 0:
            return []
        s = self.scores[row, :g].to(torch.float64)
        logp = torch.log_softmax(s / self.scale, dim=-1).tolist()  # (g, C, A)
        best = s.argmax(dim=-1).tolist()  # (g, C): the drafter's letter in each class
        letters = self.alphabet.tolist()
        index = {t: i for i, t in enumerate(letters)}
        chain = [index.get(t, -1) for t in main]
        if min(chain) < 0:  # a draft outside the alphabet: not a path this table describes
            return []
        A = len(letters)
        heap: list[tuple[float, int, list[int], int, int]] = []
        tick = 0  # insertion order breaks ties (deterministic)

        def classes(path: list[int]) -> list[int]:
            out = [self.start[row]]
            for a in path[:-1]:
                out.append(self.after(out[-1], a))
            return out

        def deviations(path: list[int], first: int, reach: float) -> None:
            """Push every node that leaves `path` at a slot >= first; `reach` is the log
            chance of path[:first]."""
            nonlocal tick
            ctx = classes(path)
            for k in range(first, g):
                row_p = logp[k][ctx[k]]
                for a in range(A):
                    if a != path[k]:
                        heapq.heappush(heap, (-(reach + row_p[a]), tick, path, k, a))
                        tick += 1
                reach += row_p[path[k]]
                if reach < -30.0:  # nothing below this will be chosen
                    return

        deviations(chain, 0, 0.0)
        out: list[list[int]] = []
        while heap and len(out) < n:
            neg, _, path, k, a = heapq.heappop(heap)
            new = path[:k] + [a]
            cls = classes(new + [0])[-1]  # the class after new's last letter
            for j in range(k + 1, g):
                new.append(best[j][cls])
                cls = self.after(cls, new[-1])
            out.append(new)
            deviations(new, k + 1, -neg)
        return [[letters[a] for a in p] for p in out]


def share_rows(spare: int, live: int) -> list[int]:
    """Branch rows per live row when `spare` rows are free: as even as possible, the first
    rows taking the remainder."""
    if live <= 0 or spare <= 0:
        return [0] * max(live, 0)
    q, r = divmod(spare, live)
    return [q + (b < r) for b in range(live)]



MARGIN = 0.1
"""More branches are kept only when they promise this much more tokens per second than fewer:
a few dozen timed rounds of a busy machine differ by about as much."""


@dataclass
class TreeSizer:
    """How many branch rows a live row keeps: as many as their measured gain pays for.

    Its first rounds run without branches and with `cap` per row in turn (`phases`), each
    timed. A round with branches also tells what fewer would have given: branches are
    planned best first, so the first i of them are what i rows would have verified, and the row
    would have kept 1 + max(m_own, m_1..m_i) tokens. The sizer then keeps the i with the most
    tokens per second: a round's time at i branches between the two measured ones, in the
    proportion the measured block-cost table (`BlockCosts`: rows x block length, timed once per
    model and device) gives for i, more branches only for MARGIN more."""

    costs: Callable[[int, int], float]  # seconds of a verification block: (rows, tokens)
    cap: int
    phases: tuple[int, ...] = (4, 8, 4, 8)  # rounds without branches, with `cap`, without, ...
    gains: list[float] = field(default_factory=list)  # tokens branch i added, summed
    own: float = 0.0  # tokens the rows' own drafts gave, summed (the bonus token included)
    samples: int = 0  # row-rounds with branches counted
    plain_s: list[float] = field(default_factory=list)  # round times without branches
    trial_s: list[float] = field(default_factory=list)  # round times with branches
    decided: int | None = None  # the chosen width, once chosen

    def __post_init__(self) -> None:
        self.gains = [0.0] * self.cap

    @property
    def width(self) -> int:
        """Branch rows per live row now: while measuring, none and the cap in turn (so that a
        drift of the machine's speed hits both), then the choice."""
        if self.decided is not None:
            return self.decided
        done = len(self.plain_s) + len(self.trial_s)
        for i, n in enumerate(self.phases):
            if done < n:
                return 0 if i % 2 == 0 else self.cap
            done -= n
        return self.cap

    def observe(self, accepted: Sequence[Sequence[int]], block: int, round_s: float) -> None:
        """One round of `block` tokens that took `round_s` seconds: accepted[b] = [drafts the
        row's own chain kept, then each of its branches', in plan order]."""
        if self.decided is not None:
            return
        want = self.width
        if all(len(m) == 1 for m in accepted):
            if want == 0:
                self.plain_s.append(round_s)
            return
        if want == 0:
            return  # the branches leave at the next step
        for m in accepted:
            best = m[0]
            self.own += 1 + best
            for i, mi in enumerate(m[1:]):
                if mi > best:
                    self.gains[i] += mi - best
                    best = mi
        self.samples += len(accepted)
        self.trial_s.append(round_s)
        if len(self.plain_s) + len(self.trial_s) >= sum(self.phases):
            self.decided = self.choose([len(m) - 1 for m in accepted], block)

    def choose(self, branches: Sequence[int], block: int) -> int:
        """The width with the most tokens per second, the rows having had `branches` each."""
        live = len(branches)

        def rows(i: int) -> int:
            return live + sum(min(i, n) for n in branches)

        t0 = sorted(self.plain_s)[len(self.plain_s) // 2] if self.plain_s else 0.0
        tc = sorted(self.trial_s)[len(self.trial_s) // 2]
        top = max(branches)
        c0, cc = self.costs(live, block), self.costs(rows(top), block)
        best, best_rate, tokens = 0, -1.0, self.own / max(self.samples, 1)
        for i in range(top + 1):
            if i:  # what branch i added per row that had it, over all rows
                tokens += self.gains[i - 1] / max(self.samples, 1)
            share = (self.costs(rows(i), block) - c0) / (cc - c0) if cc > c0 else i / top
            seconds = t0 + (tc - t0) * share
            rate = tokens / seconds if seconds > 0 else 0.0
            if rate > best_rate * (1 + MARGIN):
                best, best_rate = i, rate
        return best
