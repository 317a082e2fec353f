"""The sampler transform, the two ways of drawing from it, and counter-based random numbers.

Native decoding and speculative verification both call `sampler_probs`, so the distribution the
rule is lossless against is, by construction, the one native decoding draws from. Random numbers
come from a hash of (seed, record, sample, position, purpose), never from a global stream, so a
run is reproducible and does not depend on batch composition.

A token is drawn from p̃ under one of two rules (`SamplerConfig.rule`):

- `residual`: inverse-CDF with one uniform per position; speculative decoding accepts a draft by
  the Leviathan/Chen test and draws corrections from the residual. Lossless in distribution.
- `coupled`: Gumbel-max, token = argmax_v log p̃(v) + g(v), with g(v) a Gumbel number keyed by
  (seed, record, sample, position, v) (`coupled_noise`). Drafters draft with the same noise, so
  a draft is accepted iff it equals the token the target realizes there, and speculative output
  is native sampling of the same seed, token for token, whatever the drafter, draft length or
  batch (Daliri, Musco and Suresh 2024: drafter-invariant speculative decoding). Greedy is the
  zero-noise case of both.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
import torch
from torch import Tensor

from evspark_cli.errors import SettingError

__all__ = [
    "RULES",
    "SamplerConfig",
    "Purpose",
    "scrub_logits",
    "argmax_lowest",
    "sampler_probs",
    "uniform",
    "uniform_float",
    "uniform_floats",
    "sample_from_probs",
    "coupled_key",
    "coupled_noise",
    "coupled_scores",
    "coupled_draw",
]

_FP32_MAX = torch.finfo(torch.float32).max

RULES = ("residual", "coupled")
ALPHABETS = ("all", "acgt")
"""What sampling may draw: every token of the vocabulary (as Evo 2 samples), or only A/C/G/T."""
"""How a token is drawn from p̃ (the module docstring); `residual` is the default."""


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class SamplerConfig:
    """Evo 2's sampler settings (its defaults: T = 1, top-k 4, top-p 1)."""

    temperature: float = 1.0
    top_k: int = 4
    top_p: float = 1.0
    rule: str = "residual"  # how tokens are drawn from p̃: one of RULES
    alphabet: str = "all"  # "acgt": only A, C, G and T can be drawn (ALPHABETS)

    @property
    def greedy(self) -> bool:
        """top_k == 1 or T == 0 short-circuits to argmax, as in Evo 2."""
        return self.top_k == 1 or self.temperature == 0

    @property
    def coupled(self) -> bool:
        """True when tokens are Gumbel-max draws (the coupled rule); greedy is its zero-noise
        case, so a greedy run is coupled under either rule."""
        return self.rule == "coupled"

    def validate(self) -> None:
        """Reject settings that have no sampling meaning, with a one-line message naming the
        setting (the command line shows it as the option: --top-p)."""
        t = self.temperature
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise SettingError.of("temperature", f"must be a finite number >= 0, got {t!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SettingError.of("top_k", "must be an integer >= 0 (0 = no top-k), got "
                                           f"{self.top_k!r}")
        p = self.top_p
        if not isinstance(p, (int, float)) or not (0.0 < p <= 1.0):
            raise SettingError.of("top_p", f"must be in (0, 1], got {p!r}")
        # the nucleus is cut in fp32: a smaller top_p is 0 there (or flushed to 0 on a GPU),
        # which would keep no token at all
        if self.rule not in RULES:
            raise SettingError.of("rule", f"must be {' or '.join(RULES)}, got {self.rule!r}")
        if self.alphabet not in ALPHABETS:
            raise SettingError.of("alphabet", f"must be {' or '.join(ALPHABETS)}, got "
                                              f"{self.alphabet!r}")
        tiny = torch.finfo(torch.float32).tiny
        if p < tiny:
            raise SettingError.of("top_p", f"must be at least {tiny:.2g} (the smallest "
                                           f"probability the fp32 sampler represents), got {p!r}")


GREEDY = SamplerConfig(1.0, 1, 1.0)
"""Greedy decoding: the top-1 sampler (sampling's zero-temperature limit)."""


# --------------------------------------------------------------------------- sampler transform


def _work_dtype(x: Tensor) -> torch.dtype:
    """fp64 stays fp64 (exact tests); everything else is computed in fp32 like Evo 2."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def scrub_logits(logits: Tensor) -> Tensor:
    """Cast to the working dtype and replace NaN by 0 and ±inf by ±(largest fp32)."""
    x = logits.to(_work_dtype(logits))
    return torch.nan_to_num(x, nan=0.0, posinf=_FP32_MAX, neginf=-_FP32_MAX)


def argmax_lowest(logits: Tensor) -> Tensor:
    """Greedy token over the last dim; the lowest index wins a tie (torch.argmax's documented rule).

    Logits are scrubbed first so a NaN cannot win.
    """
    return torch.argmax(scrub_logits(logits), dim=-1)


def _acgt_mask(x: Tensor) -> Tensor:
    """The vocabulary entries (last dim of `x`) of the four bases A, C, G, T (byte tokens)."""
    allowed = torch.zeros(x.shape[-1], dtype=torch.bool, device=x.device)
    allowed[list(b"ACGT")] = True
    return allowed


def _top_k_mask(x: Tensor, k: int) -> Tensor:
    """Keep exactly k entries per row; among ties at the k-th value the lowest indices win.

    torch.topk's choice among ties is unspecified, so only its k-th *value* is used: everything
    at or above it is the answer when that is k entries per row (no tie across the cut, the
    usual case, checked with one host read); otherwise ties at the cut are taken in index order.
    """
    if k == 0 or k >= x.shape[-1]:
        return torch.ones_like(x, dtype=torch.bool)
    kth = torch.topk(x, k, dim=-1).values[..., -1:]
    keep = x >= kth  # at least k per row
    if int(keep.sum()) == k * (x.numel() // x.shape[-1]):
        return keep
    above = x > kth
    tied = x == kth
    room = k - above.sum(dim=-1, keepdim=True)
    return above | (tied & (tied.cumsum(dim=-1) <= room))


def _top_p_mask(z: Tensor, keep: Tensor, top_p: float) -> Tensor:
    """Smallest prefix of the kept set (by descending probability) with mass >= top_p."""
    probs = softmax_last(z.masked_fill(~keep, -math.inf))
    sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    before = torch.nn.functional.pad(sorted_p.cumsum(dim=-1)[..., :-1], (1, 0))
    return torch.zeros_like(keep).scatter(-1, order, before < top_p)


def sampler_probs(logits: Tensor, cfg: SamplerConfig) -> Tensor:
    """p̃ = S(logits) over the last dim: scrub, top-k on raw logits, /T, top-p, softmax.

    Returns fp32 (fp64 for fp64 input). This is the distribution native decoding draws from, so
    it is also the one speculative verification must use.
    """
    cfg.validate()
    x = scrub_logits(logits)
    acgt = cfg.alphabet == "acgt" and x.shape[-1] > max(b"ACGT")  # (not a 4-letter drafter's)
    if acgt:  # every other token below the lowest logit there can be
        x = x.masked_fill(~_acgt_mask(x), -math.inf)
    if cfg.greedy:  # x is scrubbed: the first (lowest) index of the largest value wins
        hot = torch.nn.functional.one_hot(torch.argmax(x, dim=-1), x.shape[-1])
        return hot.to(x.dtype)
    keep = _top_k_mask(x, cfg.top_k)
    if acgt:
        keep = keep & _acgt_mask(x)
    z = x
    if cfg.temperature != 1.0:  # x / 1 is x: skip two ops per call at Evo 2's default
        big = torch.finfo(x.dtype).max
        z = (x / cfg.temperature).clamp(-big, big)  # T < 1 may overflow scrubbed ±fp32 max
    if cfg.top_p < 1.0:
        keep = keep & _top_p_mask(z, keep, cfg.top_p)
    return softmax_last(torch.where(keep, z, -math.inf))


NARROW = 8  # a last dim this short (a 4-letter drafter's conditionals) takes `softmax_last`'s
# trailing unit dim


def softmax_last(x: Tensor) -> Tensor:
    """softmax over the last dim. A narrow one goes through PyTorch's kernel for a dim that is not
    innermost, behind a trailing unit dim: the last-dim CPU kernel leaves a dim of 4 most of a
    vector register idle (a batch-32 round's drafter conditionals, (32, 12, 125, 4): 2.1 ms,
    against 0.8 ms). Every element then takes the same scalar path whatever the tensor's shape,
    so a row's probabilities are bit for bit those of the row alone (the left-to-right
    reference, a batch of one)."""
    if x.shape[-1] > NARROW:
        return torch.softmax(x, dim=-1)
    return torch.softmax(x.unsqueeze(-1), dim=-2).squeeze(-1)


# --------------------------------------------------------------------------- counter-based RNG


class Purpose(IntEnum):
    """What a random number is for; each purpose is an independent stream.

    SAMPLE is any draw from the target's p̃: a native token and the speculative correction/bonus
    token use the same stream.
    """

    SAMPLE = 0
    DRAFT = 1
    ACCEPT = 2
    RESIDUAL = 3
    COUPLED = 4  # the coupled rule's Gumbel noise, shared by the target and every drafter


_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MUL1 = 0xBF58476D1CE4E5B9
_MUL2 = 0x94D049BB133111EB


def _as_int64(x: int) -> int:
    """The two's-complement int64 reading of a 64-bit pattern (torch has no uint64 maths)."""
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _fmix_int(x: int) -> int:
    """splitmix64's finalizer on Python ints (used for the scalar keys)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK64
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK64
    return x ^ (x >> 31)


def _srl(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 bit patterns: arithmetic shift, then clear the sign copies."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _fmix_tensor(x: Tensor) -> Tensor:
    """splitmix64's finalizer on int64 tensors; multiplication wraps modulo 2**64."""
    x = (x ^ _srl(x, 30)) * _as_int64(_MUL1)
    x = (x ^ _srl(x, 27)) * _as_int64(_MUL2)
    return x ^ _srl(x, 31)


def _check_key(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 63:
        raise ValueError(f"{name} must be an int in [0, 2**63), got {value!r}")
    return int(value)


def _unit_int(h: int, position: int) -> float:
    """The last absorption and `_to_unit` on Python ints (bit-identical to the tensor path)."""
    return (_fmix_int(h + (position + 1) * _GOLDEN) >> 11) * (2.0**-53)


def _to_unit(h: Tensor) -> Tensor:
    """Top 53 bits of a 64-bit hash as a float64 in [0, 1 - 2**-53]; never 1.0."""
    return _srl(h, 11).to(torch.float64) * (2.0**-53)


@functools.lru_cache(maxsize=4096, typed=True)  # typed: True and 1.0 are refused, not hits
def _key_hash(seed: int, record: int, sample: int, purpose: int) -> int:
    """The hash after absorbing the four scalar keys: a record's decode asks for the same few
    (one per purpose) at every position, so they are hashed once."""
    h = 0
    for name, key in (("seed", seed), ("record", record), ("sample", sample), ("purpose", purpose)):
        h = _fmix_int(h + (_check_key(name, key) + 1) * _GOLDEN)
    return h


def uniform_float(seed: int, record: int, sample: int, position: int, purpose: int) -> float:
    """`uniform` for one position as a host float (a decode step's draw)."""
    return _unit_int(_key_hash(seed, record, sample, purpose), _check_key("position", position))


def uniform_floats(seed: int, record: int, sample: int, positions: range | list[int],
                   purpose: int) -> list[float]:
    """`uniform` for a few positions as host floats (the same numbers, no tensor made): a
    batched round asks for a handful per row."""
    h = _key_hash(seed, record, sample, purpose)
    if len(positions):
        _check_key("position", min(positions))
        _check_key("position", max(positions))
    return [_unit_int(h, x) for x in positions]


def uniform(
    seed: int,
    record: int,
    sample: int,
    position: Tensor | range | int,
    purpose: int,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """U[0, 1) float64 numbers keyed by (seed, record, sample, position, purpose).

    Each key is absorbed as one splitmix64 step, h ← fmix64(h + (key + 1)·φ); the four scalar
    keys are hashed on the host, the position tensor elementwise. One number per element of
    `position` (an int gives a 0-d tensor, a range a 1-d one); the same key always gives the
    same number.
    """
    h = _key_hash(seed, record, sample, purpose)
    if isinstance(position, Tensor):
        if position.is_floating_point() or position.is_complex():
            raise ValueError("position must be an integer tensor")
        pos = position.to(torch.int64)
    elif isinstance(position, range):  # a round's few positions: host ints, as for one number
        if len(position):  # a range's extremes are its ends
            _check_key("position", position[0])
            _check_key("position", position[-1])
        units = [_unit_int(h, x) for x in position]
        return torch.tensor(units, dtype=torch.float64, device=device)
    else:  # one number: the same arithmetic on Python ints, 10x cheaper than tensor ops
        return torch.tensor(_unit_int(h, _check_key("position", position)), dtype=torch.float64,
                            device=device)
    mixed = _fmix_tensor(_as_int64(h) + (pos + 1) * _as_int64(_GOLDEN))
    return _to_unit(mixed)


# --------------------------------------------------------------------------- drawing a token


def sample_from_probs(probs: Tensor, u: Tensor | float) -> Tensor:
    """Inverse-CDF draw along the last dim: the first index whose cumulative mass exceeds u·total.

    probs need not be normalised but each row needs positive mass (an all-zero row gives 0).
    A zero-probability index is never returned: a zero entry adds nothing to the cumulative sum,
    and a u·total that rounding puts at or beyond the end is clamped to the first index where
    the cumulative sum reaches its total, which has positive mass.
    """
    p = probs.to(torch.float64)
    cdf = p.cumsum(dim=-1).contiguous()
    total = cdf[..., -1:].contiguous()
    u64 = torch.as_tensor(u, dtype=torch.float64, device=p.device)
    target = (u64[..., None] if u64.dim() else u64) * total
    idx = torch.searchsorted(cdf, target, right=True)
    reach = torch.searchsorted(cdf, total)  # first index with cdf >= total
    return torch.minimum(idx, reach).squeeze(-1)


# --------------------------------------------------------------------------- the coupled rule


def coupled_key(seed: int, record: int, sample: int) -> int:
    """The coupled stream's hash of a row's scalar keys, as an int64 (`coupled_noise` absorbs
    the position and the token)."""
    return _as_int64(_key_hash(seed, record, sample, int(Purpose.COUPLED)))


def coupled_noise(keys: Tensor | np.ndarray, positions: Tensor | np.ndarray, tokens: Tensor
                  ) -> Tensor:
    """Gumbel numbers g = -log(-log U) in fp64, one per (row, token): row i of `tokens` (N, K)
    at positions[i] of the row whose `coupled_key` is keys[i] (int64 tensors, or host int64
    arrays: a decoder's few keys and positions need no tensor made).

    U = (top 53 bits + 1/2)·2**-53 lies strictly inside (0, 1), so g is always finite. The
    number depends only on (seed, record, sample, position, token), so the target and a drafter
    asking for the same position and token get the same number, in any batch. The hash runs on
    the host in numpy's wrapping uint64 arithmetic (a round's few hundred numbers: a tenth of the
    per-call cost of the same int64 tensor ops); the logs are torch's, on the tokens' device."""
    pos = _host_u64(positions)
    if pos.size and int(pos.view(np.int64).min()) < 0:
        raise ValueError("positions must be >= 0")
    h = _fmix_u64(_host_u64(keys) + (pos + _ONE) * _GOLDEN_U64)
    mixed = _fmix_u64(h[:, None] + (_host_u64(tokens) + _ONE) * _GOLDEN_U64)
    u = ((mixed >> np.uint64(11)).astype(np.float64) + 0.5) * (2.0**-53)
    return -torch.log(-torch.log(torch.from_numpy(u).to(tokens.device)))


_ONE = np.uint64(1)
_GOLDEN_U64 = np.uint64(_GOLDEN)
_MUL1_U64, _MUL2_U64 = np.uint64(_MUL1), np.uint64(_MUL2)


def _host_u64(x: Tensor | np.ndarray) -> np.ndarray:
    """An integer tensor's (or host array's) int64 bit patterns as a host uint64 array (negative
    keys wrap)."""
    if isinstance(x, np.ndarray):
        return x.astype(np.int64, copy=False).view(np.uint64)
    return x.detach().to("cpu", torch.int64).numpy().view(np.uint64)


def _fmix_u64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer on uint64 arrays (numpy's array arithmetic wraps modulo 2**64)."""
    x = (x ^ (x >> np.uint64(30))) * _MUL1_U64
    x = (x ^ (x >> np.uint64(27))) * _MUL2_U64
    return x ^ (x >> np.uint64(31))


def coupled_scores(probs: Tensor, keys: Tensor | np.ndarray, positions: Tensor | np.ndarray,
                   candidates: int = 0) -> tuple[Tensor, Tensor]:
    """The perturbed scores log p̃(v) + g(v) of rows `probs` (N, V): (scores (N, K), their
    token ids (N, K)).

    `candidates` = K > 0 scores only the K most likely tokens of each row, which is exact when a
    row has at most K tokens of positive probability (top-k sampling: K = top_k); 0 scores all V.
    A token of zero probability scores -inf and never wins."""
    p = probs.to(torch.float64)
    if 0 < candidates < p.shape[-1]:
        top = torch.topk(p, candidates, dim=-1)
        p, tokens = top.values, top.indices
    else:
        tokens = torch.arange(p.shape[-1], device=p.device).expand(p.shape[0], -1)
    g = coupled_noise(keys, positions, tokens)
    return torch.where(p > 0, torch.log(p) + g, -math.inf), tokens


SCALAR_DRAW = 64
"""CPU draws of at most this many candidates (rows x top-k: a decode step's few rows) take
`_scalar_draw`: the same numbers as the array path, without its few dozen tensor and array
calls, which cost a native step more than the model's arithmetic at small batches. On a GPU
every draw takes the array path, whose logs run on the GPU: a host log could differ from the
device's in the last place, and a step would then not draw as the block that verifies it."""


def coupled_draw(probs: Tensor, keys: Tensor | np.ndarray, positions: Tensor | np.ndarray,
                 cfg: SamplerConfig) -> tuple[Tensor, Tensor]:
    """Gumbel-max draws from rows `probs` (N, V) = p̃: (tokens (N,), margins (N,) fp64).

    A margin is the gap between the two best perturbed scores times the temperature, in logit
    units (inf when one token has all the mass): a perturbation of the logits by e moves it by
    at most 2e, so a divergence at a margin below the tie tolerance is a floating-point tie, as
    the top-1/top-2 logit gap classifies greedy ties. The best of a row's candidates is the
    first of the largest score (candidates in `coupled_scores`' order)."""
    n, V = probs.shape
    if cfg.greedy:  # one-hot p̃: no noise can move the argmax
        return torch.argmax(probs, dim=-1), torch.full((n,), math.inf, dtype=torch.float64)
    if probs.device.type == "cpu" and 0 < cfg.top_k < V and n * cfg.top_k <= SCALAR_DRAW:
        return _scalar_draw(probs, keys, positions, cfg)
    scores, tokens = coupled_scores(probs, keys, positions, cfg.top_k)
    s, t = scores.cpu().numpy(), tokens.cpu().numpy()
    rows = np.arange(n)
    first = s.argmax(axis=1)
    if s.shape[1] == 1:
        gap = np.full(n, math.inf)
    else:
        rest = s.copy()
        rest[rows, first] = -math.inf
        with np.errstate(invalid="ignore"):  # a row without mass (a proposal's padding)
            gap = (s[rows, first] - rest.max(axis=1)) * cfg.temperature  # scores nan
    winner = torch.from_numpy(t[rows, first]).to(probs.device)
    return winner, torch.from_numpy(gap)


def _scalar_draw(probs: Tensor, keys: Tensor | np.ndarray, positions: Tensor | np.ndarray,
                 cfg: SamplerConfig) -> tuple[Tensor, Tensor]:
    """`coupled_draw` of a few top-k rows on host scalars, bit for bit the array path's numbers:
    the same candidates (`coupled_scores`' fp64 top-k), the hash on Python ints (exact, as
    `test_noise_is_splitmix64_of_its_keys_bit_for_bit` checks), the logs by one CPU
    `torch.log` call each (the kernel the array path uses on a CPU), and the sums, differences
    and products in IEEE fp64 (one rounding each, as in the tensors)."""
    n = probs.shape[0]
    top = torch.topk(probs.to(torch.float64), cfg.top_k, dim=-1)
    p_rows, t_rows = top.values.tolist(), top.indices.tolist()
    pos = _host_u64(positions).view(np.int64).tolist()
    if pos and min(pos) < 0:
        raise ValueError("positions must be >= 0")
    us = []
    for key, at, toks in zip(_host_u64(keys).tolist(), pos, t_rows):
        h = _fmix_int(key + (at + 1) * _GOLDEN)
        us += [((_fmix_int(h + (t + 1) * _GOLDEN) >> 11) + 0.5) * 2.0**-53 for t in toks]
    k = cfg.top_k
    logs = torch.log(torch.tensor(us + [x for row in p_rows for x in row], dtype=torch.float64))
    g = torch.log(logs[: n * k].neg()).tolist()  # -log(-log u) = -g here
    log_p = logs[n * k:].tolist()
    winners, gaps = [], []
    for i in range(n):
        scores = [log_p[i * k + j] - g[i * k + j] if p_rows[i][j] > 0 else -math.inf
                  for j in range(k)]
        best = max(range(k), key=scores.__getitem__)  # the first of the largest
        second = max((s for j, s in enumerate(scores) if j != best), default=-math.inf)
        winners.append(t_rows[i][best])
        gaps.append((scores[best] - second) * cfg.temperature)
    return (torch.tensor(winners, dtype=torch.long, device=probs.device),
            torch.tensor(gaps, dtype=torch.float64))
