"""Draft length by confidence: how many of a round's drafts the verification block holds.

A block of K tokens (the anchor and K - 1 drafts) over B rows costs more as K grows: little on
one row, nearly in proportion at a full batch on a CPU. Drafts past a row's first rejection are
wasted, and a row whose drafts are unsure wastes most. Each round the schedule picks the K that
maximises the expected committed tokens per second of the whole batch,

    rate(K) = sum_b E_b(K) / (cost(B, K) + overhead(B)),
    E_b(K) = 1 + sum_{j < K} prod_{i <= j} a_{b,i},

where a_{b,i} is the chance that row b's draft i is kept given the one before it was: the
drafter's confidence in that draft mapped through a calibration learned from the run's own
accept counts (per confidence bin). Under the coupled rule the confidence is the drafter's
perturbed-score gap (its best Gumbel-max score over the second best: a draft the drafter wins by
a wide margin survives the drafter's errors in q); under greedy decoding a drafter's q is
one-hot and says nothing, so the calibration is the drafter's measured acceptance by position
in the block. `cost` is a
table of measured verification blocks (`BlockCosts`: timed once per model, device, dtype and
threads, cached in the user's cache folder), `overhead` the rest of a round (drafting,
acceptance, bookkeeping), followed as the run goes.

Only for rules whose output does not depend on the draft length: greedy decoding and the
coupled rule emit the target's own tokens whatever is drafted, so K changes speed, never bytes.
Under the residual rule a sampled token depends on the drafts it was tested against, and a K
chosen by the batch's load would make a row's tokens depend on the rows beside it, so residual
sampling keeps its fixed `--gamma`.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..model.model import StripedHyena

ROWS_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256)
BLOCK_GRID = (1, 2, 3, 4, 6, 8, 10, 13, 17, 25, 33)
CALIBRATION_CONTEXT = 1024  # tokens of context the timed blocks attend over
REPEATS = 3
GAP_EDGES = (0.05, 0.1, 0.2, 0.3, 0.45, 0.65, 0.9, 1.25, 1.75, 2.5, 3.5)
"""Bin edges of the perturbed-score gap (logit units); past the last: one bin."""
PRIOR = (1.6, 2.0)  # pseudo-counts (kept, reached) of every bin before the run's own counts


def cache_dir() -> Path:
    """Where measured costs are kept: $XDG_CACHE_HOME/evspark (default ~/.cache/evspark)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "evspark"


@dataclass
class BlockCosts:
    """Seconds of one verification block (extend + commit) by rows and block length, measured
    on grid points and interpolated linearly between them."""

    rows: list[int]
    blocks: list[int]
    seconds: list[list[float]]  # seconds[i][j]: rows[i] rows, blocks[j] tokens

    def __call__(self, rows: int, block: int) -> float:
        i, wi = _bracket(self.rows, rows)
        j, wj = _bracket(self.blocks, block)

        def at(a: int) -> float:
            r = self.seconds[a]
            return r[j] if wj == 0 else (1 - wj) * r[j] + wj * r[j + 1]

        return at(i) if wi == 0 else (1 - wi) * at(i) + wi * at(i + 1)


def _bracket(grid: list[int], x: int) -> tuple[int, float]:
    """Index of the grid point at or below x and the weight of the next one (clamped)."""
    if x <= grid[0]:
        return 0, 0.0
    for i in range(len(grid) - 1):
        if x <= grid[i + 1]:
            return i, (x - grid[i]) / (grid[i + 1] - grid[i])
    n = len(grid) - 1  # past the grid: extrapolate from the last two points, linearly
    return (n - 1, (x - grid[n - 1]) / (grid[n] - grid[n - 1])) if n else (0, 0.0)


def _grid(grid: tuple[int, ...], top: int) -> list[int]:
    return sorted({g for g in grid if g < top} | {top})


def _key(model: StripedHyena, rows: list[int], blocks: list[int]) -> str:
    """What the measurement depends on: the model (config and a weight fingerprint), device,
    dtype, threads, torch and the grid."""
    p = next(model.parameters())
    fingerprint = [float(t.detach().flatten()[:4].double().sum())
                   for t in itertools.islice(model.parameters(), 16)]
    ident = {"config": repr(model.config), "parameters": model.num_parameters(),
             "weights": fingerprint, "device": str(p.device),
             "device_name": (torch.cuda.get_device_name(p.device) if p.device.type == "cuda"
                             else os.uname().machine),
             "dtype": str(p.dtype), "threads": torch.get_num_threads(),
             "torch": torch.__version__, "rows": rows, "blocks": blocks,
             "context": CALIBRATION_CONTEXT, "version": 1}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:24]


_MEMO: dict[str, BlockCosts] = {}


def block_costs(model: StripedHyena, max_rows: int, max_block: int) -> BlockCosts:
    """The measured cost table for up to `max_rows` rows and `max_block` tokens: from memory, the
    cache folder, or timed now (about a second for a small model) and cached there."""
    rows, blocks = _grid(ROWS_GRID, max_rows), _grid(BLOCK_GRID, max_block)
    key = _key(model, rows, blocks)
    if key in _MEMO:
        return _MEMO[key]
    path = cache_dir() / "block-costs" / f"{key}.json"
    costs = None
    try:
        data = json.loads(path.read_text())
        if data["rows"] == rows and data["blocks"] == blocks:
            costs = BlockCosts(rows, blocks, data["seconds"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if costs is None:
        costs = measure_block_costs(model, rows, blocks)
        _save(path, costs)
    _MEMO[key] = costs
    return costs


def _save(path: Path, costs: BlockCosts) -> None:
    """Write the table atomically; a cache folder that cannot be written only costs a rerun."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"rows": costs.rows, "blocks": costs.blocks,
                                   "seconds": costs.seconds}))
        os.replace(tmp, path)
    except OSError:
        pass


@torch.inference_mode()
def measure_block_costs(model: StripedHyena, rows: list[int], blocks: list[int]) -> BlockCosts:
    """Time extend(K) + commit on B rows of a CALIBRATION_CONTEXT-token state, the median of a
    few repeats (after one warm-up), for every grid point."""
    dev = model.device
    n = min(CALIBRATION_CONTEXT, max(1, model.config.max_seqlen - max(blocks) * 4 * REPEATS - 16))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (1, n), generator=g)
    prompt = torch.tensor([65, 67, 71, 84])[ids].to(dev)  # A, C, G, T
    _, _, base = model.prefill(prompt, keep_last=1, reserve=max(blocks) * (REPEATS + 1) + 16)
    table = []
    for b in rows:
        state = base.select([0] * b)
        line = []
        for k in blocks:
            block = torch.full((b, k), 65, dtype=torch.long, device=dev)
            times = []
            for r in range(REPEATS + 1):
                _sync(dev)
                t0 = time.perf_counter()
                _, _, pending = model.extend(state, block)
                out = pending.commit(1)
                _sync(dev)
                if r:
                    times.append(time.perf_counter() - t0)
                del out
            line.append(statistics.median(times))
        table.append(line)
        del state
    return BlockCosts(rows, blocks, table)


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@dataclass
class DraftSchedule:
    """Chooses each round's block length from the drafts' confidence and the cost table, and
    learns how confidence maps to acceptance from the rounds it sees."""

    costs: BlockCosts
    gamma: int  # the longest draft; under greedy, each draft slot is a bin of its own
    coupled: bool  # confidence = the drafter's perturbed-score gap (else the draft slot)
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)
    overhead: dict[int, float] = field(default_factory=dict)  # rows -> seconds per round
    scale: float = 1.0  # measured blocks over the table's (a longer context costs more)
    _bins: Tensor | None = None
    _block_costs: dict[tuple[int, int], list[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(GAP_EDGES) + 1 if self.coupled else self.gamma
        self.hits, self.trials = [PRIOR[0]] * n, [PRIOR[1]] * n

    def choose(self, gaps: Tensor | None, gammas: list[int]) -> int:
        """Drafts to verify this round (every row gets at most that many): `gaps[b, j]` is row
        b's perturbed-score gap at its draft j (coupled rule; None under greedy); entries past
        gammas[b] are ignored."""
        B, G = len(gammas), max(gammas)
        if G == 0:
            return 0
        if gaps is None:
            bins = torch.arange(G).expand(B, G)
        else:
            bins = torch.bucketize(gaps[:, :G].float().contiguous(), torch.tensor(GAP_EDGES))
        self._bins = bins
        rate = torch.tensor(self.hits, dtype=torch.float64) / torch.tensor(self.trials,
                                                                           dtype=torch.float64)
        a = rate[bins]
        a[torch.arange(G)[None, :] >= torch.tensor(gammas)[:, None]] = 0.0
        # expected committed tokens of the batch with j drafts verified, j = 0..G
        gain = torch.cat([torch.zeros(1, dtype=torch.float64),
                          torch.cumprod(a, dim=1).sum(dim=0).cumsum(0)])
        over = self.overhead.get(B, 0.0)
        cost = self._block_costs.get((B, G))
        if cost is None:  # the table's blocks of 1..G + 1 tokens at B rows, looked up once
            cost = self._block_costs[B, G] = [self.costs(B, j + 1) for j in range(G + 1)]
        best, best_rate = G, -1.0
        for j, (got, c) in enumerate(zip(gain.tolist(), cost)):
            r = (B + got) / (self.scale * c + over)
            if r > best_rate * (1 + 1e-9):
                best, best_rate = j, r
        return best

    def observe(self, used: list[int], accepted: list[int]) -> None:
        """Row b verified used[b] drafts and kept accepted[b] of them: count, per confidence bin,
        the drafts reached (the first, and each after a kept one) and kept."""
        if self._bins is None:
            return
        bins = self._bins.tolist()
        for b, (g, m) in enumerate(zip(used, accepted)):
            for j in range(min(g, m + 1)):
                self.trials[bins[b][j]] += 1
                self.hits[bins[b][j]] += j < m
        self._bins = None

    def note_round(self, rows: int, block: int, round_s: float, block_s: float) -> None:
        """Follow, as moving averages, the part of a round that is not the verification block
        and how the measured blocks compare with the table."""
        extra = max(0.0, round_s - block_s)
        old = self.overhead.get(rows)
        self.overhead[rows] = extra if old is None else 0.8 * old + 0.2 * extra
        ratio = block_s / max(self.costs(rows, block), 1e-9)
        self.scale = 0.9 * self.scale + 0.1 * min(max(ratio, 0.25), 4.0)
