"""Variant effect scores: the log-likelihood of an alternative window minus the reference's.

The window is Evo 2's recipe (its BRCA1 zero-shot notebook): for a variant at 0-based position
p of a contig of length n, the reference window is contig[max(0, p - W/2) : min(n, p + W/2)]
(W = `window`, 8,192 by default), widened at the right when needed so that it holds the whole
REF allele; the variant sits at offset o = p - start. The alternative window is the reference
window with REF replaced by ALT at o (an insertion makes it longer, a deletion shorter; its
right end is not refilled). A window's score is the log-likelihood of its bases 1.. given the
bases before them (nats; the first base has no context), reduced by `mean` (Evo 2's default:
over the window's scored bases) or `sum`; delta = alt - ref. Letters are scored as uppercase.

Every window of a site shares the bases before o, and a causal model's state after them is the
same for all of them. So a site's shared prefix is prefilled once and forked into one row per
allele (the reference and each ALT), which only extend their own suffixes, in one batched pass
(`score_site`); `naive=True` scores every window from scratch, the reference computation the
tests and the benchmark compare against.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor

from ..errors import SettingError
from ..io.types import Variant
from ..model.model import StripedHyena

REDUCTIONS = ("mean", "sum")
VARIANT_COLUMNS = ("chrom", "pos", "id", "ref", "alt", "ref_ll", "alt_ll", "delta")
"""Columns of a variant score table (TSV); `pos` is the VCF's 1-based position."""
PAD = ord("N")  # fills a shorter allele's row of a batched pass (after its end: never scored)


class Reference(Protocol):
    """The reference genome, by contig (io/indexed.py's `Source`: pyfaidx or in memory)."""

    def ids(self) -> list[str]: ...

    def length(self, name: str) -> int: ...

    def fetch(self, name: str, start: int, end: int) -> str: ...  # 1-based, inclusive


@dataclass(frozen=True)
class Window:
    """A variant's reference window on its contig and the alternative one."""

    start: int  # 0-based start of the reference window on the contig
    offset: int  # the variant's 0-based offset in the window
    ref: str
    alt: str


@dataclass(frozen=True)
class VariantScore:
    variant: Variant
    ref_ll: float
    alt_ll: float

    @property
    def delta(self) -> float:
        return self.alt_ll - self.ref_ll

    def row(self) -> dict[str, object]:
        v = self.variant
        return {"chrom": v.chrom, "pos": v.pos, "id": v.id, "ref": v.ref, "alt": v.alt,
                "ref_ll": self.ref_ll, "alt_ll": self.alt_ll, "delta": self.delta}


def check_variant_settings(window: int, reduce: str) -> None:
    if window < 2:
        raise SettingError.of("window", f"must be >= 2 bases, got {window}")
    if reduce not in REDUCTIONS:
        raise SettingError.of("reduce", f"must be {' or '.join(REDUCTIONS)}, got {reduce!r}")


def variant_window(reference: Reference, v: Variant, window: int) -> Window:
    """The windows of `v` on its contig (the module docstring's definition)."""
    p = v.pos - 1
    start = max(0, p - window // 2)
    end = max(min(reference.length(v.chrom), p + window // 2), p + len(v.ref))
    ref = reference.fetch(v.chrom, start + 1, end).upper()
    o = p - start
    return Window(start, o, ref, ref[:o] + v.alt.upper() + ref[o + len(v.ref):])


def _ids(seq: str) -> list[int]:
    return list(seq.encode("ascii"))


def _token_ll(logits: Tensor, targets: Tensor) -> Tensor:
    """Log-probability of each target under the logits that predict it (fp32)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[..., None])[..., 0]


def _reduce(total: Tensor | float, n_scored: int, reduce: str) -> float:
    return float(total) / max(n_scored, 1) if reduce == "mean" else float(total)


@torch.inference_mode()
def window_ll(model: StripedHyena, seq: str, reduce: str = "mean") -> float:
    """A window's score from scratch: one stateless pass (the naive computation)."""
    ids = torch.tensor([_ids(seq)], dtype=torch.long, device=model.device)
    if ids.shape[1] < 2:
        return 0.0
    ll = _token_ll(model(ids)[0, :-1], ids[0, 1:])
    return _reduce(ll.double().sum(), ids.shape[1] - 1, reduce)


@torch.inference_mode()
def score_site(model: StripedHyena, offset: int, windows: Sequence[str],
               reduce: str = "mean") -> list[float]:
    """Scores of windows that share their first `offset` bases (a site's reference and
    alternative windows): the shared prefix prefilled once, then one row per window extending
    its own suffix, all rows in one pass."""
    prefix = windows[0][:offset]
    if any(w[:offset] != prefix for w in windows):
        raise ValueError("score_site: the windows do not share their first offset bases")
    if offset < 2:  # nothing worth sharing: each window from scratch
        return [window_ll(model, w, reduce) for w in windows]
    dev = model.device
    pre = torch.tensor([_ids(prefix)], dtype=torch.long, device=dev)
    suffixes = [w[offset:] for w in windows]
    longest = max(len(s) for s in suffixes)
    logits, _, state = model.prefill(pre, reserve=longest + 1)
    prefix_ll = _token_ll(logits[0, :-1], pre[0, 1:]).double().sum()
    last = logits[0, -1]  # predicts each window's base at `offset`
    totals = [prefix_ll.clone() for _ in windows]
    if longest:
        rows = torch.full((len(windows), longest), PAD, dtype=torch.long, device=dev)
        for i, s in enumerate(suffixes):
            rows[i, : len(s)] = torch.tensor(_ids(s), dtype=torch.long)
        ext = _extend_rows(model, state.select([0] * len(windows)), rows)
        for i, s in enumerate(suffixes):
            n = len(s)
            if n == 0:
                continue
            first = _token_ll(last, rows[i, 0])
            rest = _token_ll(ext[i, : n - 1], rows[i, 1:n]) if n > 1 else first.new_zeros(0)
            totals[i] = totals[i] + first.double() + rest.double().sum()
    return [_reduce(t, len(w) - 1, reduce) for t, w in zip(totals, windows)]


def _extend_rows(model: StripedHyena, state, rows: Tensor) -> Tensor:
    """The logits of `rows` fed to `state`, in the model's prefill chunks (a long block in one
    pass would take FFTs of the next power of two and per-position states of every position)."""
    chunk = model.prefill_chunk()
    parts = []
    for c in range(0, rows.shape[1], chunk):
        piece = rows[:, c: c + chunk]
        logits, _, block = model.extend(state, piece)
        parts.append(logits)
        if c + chunk < rows.shape[1]:
            state = block.commit(piece.shape[1])
    return torch.cat(parts, dim=1)


def score_variants(model: StripedHyena, reference: Reference, variants: Sequence[Variant],
                   window: int = 8192, reduce: str = "mean", naive: bool = False
                   ) -> list[VariantScore]:
    """Score each variant (checked against `reference`: io/vcf.py) on its contig, in input
    order. Variants at one position that share a reference window are scored as one
    site: its reference window once, each ALT as a row of the site's pass."""
    check_variant_settings(window, reduce)
    out: list[VariantScore | None] = [None] * len(variants)
    sites: dict[tuple[str, int, int, str], list[tuple[int, Window]]] = {}
    for i, v in enumerate(variants):
        w = variant_window(reference, v, window)
        sites.setdefault((v.chrom, w.start, w.offset, w.ref), []).append((i, w))
    for members in sites.values():
        offset = members[0][1].offset
        ref = members[0][1].ref
        alts = [w.alt for _, w in members]
        if naive:
            scores = [window_ll(model, s, reduce) for s in [ref] + alts]
        else:
            scores = score_site(model, offset, [ref] + alts, reduce)
        for (i, _), alt_ll in zip(members, scores[1:]):
            out[i] = VariantScore(variants[i], scores[0], alt_ll)
    return [s for s in out if s is not None]
