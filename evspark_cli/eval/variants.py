"""Variant effect scores: the log-likelihood of an alternative window minus the reference's.

The window is Evo 2's recipe (its BRCA1 zero-shot notebook): for a variant at 0-based position
p of a contig of length n, the reference window is contig[max(0, p - W/2) : min(n, p + W/2)]
(W = `window`, 8,192 by default), widened at the right when needed so that it holds the whole
REF allele; the variant sits at offset o = p - start. The alternative window is the reference
window with REF replaced by ALT at o (an insertion makes it longer, a deletion shorter; its
right end is not refilled). A window's score is the log-likelihood of its bases 1.. given the
bases before them (nats; the first base has no context), reduced by `mean` (Evo 2's default:
over the window's scored bases) or `sum`; delta = alt - ref. Letters are scored as uppercase.
With `rc`, a score is the mean of the window's and its reverse complement's.

Every window of a site shares the bases before o, and a causal model's state after them is the
same for all of them. So a site's shared prefix is prefilled once and forked into one row per
allele (the reference and each ALT), which only extend their own suffixes, in one batched pass
(`score_site`); `naive=True` scores every window from scratch, the reference computation the
tests and the benchmark compare against.
"""
from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass

import torch
from Bio.Seq import reverse_complement
from torch import Tensor

from ..errors import SettingError
from ..io.indexed import Source as Reference  # pyfaidx or in memory: ids, length, fetch
from ..io.types import Variant
from ..model.model import StripedHyena
from ..model.state import InferenceState

REDUCTIONS = ("mean", "sum")
VARIANT_COLUMNS = ("chrom", "pos", "id", "ref", "alt", "ref_ll", "alt_ll", "delta")
"""Columns of a variant score table (TSV); `pos` is the VCF's 1-based position."""
CPU_SITE_ROWS, GPU_SITE_ROWS = 1, 16
"""Windows per batched pass of `score_variants` by default (a site's windows are never split,
so 1 is a pass per site with its alleles as rows). On 2 CPU cores a pass of more rows is not
faster per row: 8 biallelic SNV sites of 8,192-base windows took 11.96-12.52 s a site a pass
and 12.82-12.97 s two sites a pass (15.5 s with eight); a GPU is not filled by one window, so
there sites share a pass."""
PAD = ord("N")  # fills a shorter allele's row of a batched pass (after its end: never scored)


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
    """A window's score from scratch (the naive computation), as lean as one window's pass
    can be: the model's prefill chunks, whose passes keep a layer's activations in cache (an
    8,192-base window took 1.16 s so against 1.58 s as one stateless pass on 2 cores)."""
    ids = torch.tensor([_ids(seq)], dtype=torch.long, device=model.device)
    if ids.shape[1] < 2:
        return 0.0
    logits = model.prefill(ids, reserve=1)[0]
    ll = _token_ll(logits[0, :-1], ids[0, 1:])
    return _reduce(ll.double().sum(), ids.shape[1] - 1, reduce)


@torch.inference_mode()
def score_site(model: StripedHyena, offset: int, windows: Sequence[str],
               reduce: str = "mean") -> list[float]:
    """Scores of windows that share their first `offset` bases (a site's reference and
    alternative windows): the shared prefix prefilled once, then one row per window extending
    its own suffix, all rows in one pass."""
    return score_sites(model, offset, [windows], reduce)[0]


@torch.inference_mode()
def score_sites(model: StripedHyena, offset: int, sites: Sequence[Sequence[str]],
                reduce: str = "mean") -> list[list[float]]:
    """`score_site` for several sites whose windows share their first `offset` bases within
    each site (sites at one offset: every site away from a contig end): the sites' prefixes
    prefilled as the rows of one pass, each forked into a row per window, and every window's
    suffix extended in one batched pass."""
    for windows in sites:
        if any(w[:offset] != windows[0][:offset] for w in windows):
            raise ValueError("score_site: the windows do not share their first offset bases")
    if offset < 2:  # nothing worth sharing: each window from scratch
        return [[window_ll(model, w, reduce) for w in windows] for windows in sites]
    dev = model.device
    pre = torch.tensor([_ids(windows[0][:offset]) for windows in sites], dtype=torch.long,
                       device=dev)
    flat = [(i, w) for i, windows in enumerate(sites) for w in windows]
    suffixes = [w[offset:] for _, w in flat]
    longest = max(len(x) for x in suffixes)
    logits, _, state = model.prefill(pre, reserve=longest + 1)
    prefix_ll = _token_ll(logits[:, :-1], pre[:, 1:]).double().sum(-1)
    last = logits[:, -1]  # last[i] predicts site i's bases at `offset`
    totals = [prefix_ll[i].clone() for i, _ in flat]
    if longest:
        rows = torch.full((len(flat), longest), PAD, dtype=torch.long, device=dev)
        for r, x in enumerate(suffixes):
            rows[r, : len(x)] = torch.tensor(_ids(x), dtype=torch.long)
        ext = _extend_rows(model, state.select([i for i, _ in flat]), rows)
        for r, ((i, _), x) in enumerate(zip(flat, suffixes)):
            n = len(x)
            if n == 0:
                continue
            first = _token_ll(last[i], rows[r, 0])
            rest = _token_ll(ext[r, : n - 1], rows[r, 1:n]) if n > 1 else first.new_zeros(0)
            totals[r] = totals[r] + first.double() + rest.double().sum()
    scores = [_reduce(t, len(w) - 1, reduce) for t, (_, w) in zip(totals, flat)]
    out: list[list[float]] = [[] for _ in sites]
    for (i, _), score in zip(flat, scores):
        out[i].append(score)
    return out


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
                   window: int = 8192, reduce: str = "mean", naive: bool = False,
                   rc: bool = False, rows: int | None = None) -> list[VariantScore]:
    """Score each variant (checked against `reference`: io/vcf.py) on its contig, in input
    order. Consecutive variants at one position that share a reference window are scored as
    one site: its reference window once, each ALT as a row of the site's pass; consecutive
    sites share a pass up to `rows` windows (a site's are never split; default
    `site_rows(model.device)`). `rc`: each score
    is the mean of the window's and its reverse complement's (whose windows share the bases
    after the variant, reversed)."""
    check_variant_settings(window, reduce)
    rows = site_rows(model.device) if rows is None else rows
    if rows < 1:
        raise SettingError.of("rows", f"must be >= 1, got {rows}")
    scored: dict[int, VariantScore] = {}
    batch: list[list[tuple[Variant, Window]]] = []
    for site in _sites(reference, variants, window):  # windows held for one pass at a time
        if batch and sum(len(b) + 1 for b in batch) + len(site) + 1 > rows:
            scored.update(_score_batch(model, batch, reduce, naive, rc))
            batch = []
        batch.append(site)
    if batch:
        scored.update(_score_batch(model, batch, reduce, naive, rc))
    return [scored[id(v)] for v in variants]


def site_rows(device: torch.device) -> int:
    """Windows a pass of `score_variants` holds by default on `device`."""
    return CPU_SITE_ROWS if device.type == "cpu" else GPU_SITE_ROWS


def site_chunks(sites: list[list[Variant]], rows: int) -> Iterator[list[Variant]]:
    """Consecutive sites (`consecutive_sites`) joined into runs of at most `rows` windows (a
    site's reference and ALTs; a larger site alone): what one `score_variants` pass holds."""
    chunk: list[Variant] = []
    used = 0
    for site in sites:
        if chunk and used + len(site) + 1 > rows:
            yield chunk
            chunk, used = [], 0
        chunk += site
        used += len(site) + 1
    if chunk:
        yield chunk


def _sites(reference: Reference, variants: Sequence[Variant], window: int
           ) -> Iterator[list[tuple[Variant, Window]]]:
    """The alleles of each site (one reference window) with their windows, in input order."""
    for group in consecutive_sites(variants):
        sites: dict[tuple[int, int, str], list[tuple[Variant, Window]]] = {}
        for v in group:
            w = variant_window(reference, v, window)
            sites.setdefault((w.start, w.offset, w.ref), []).append((v, w))
        yield from sites.values()


def _score_batch(model: StripedHyena, batch: list[list[tuple[Variant, Window]]], reduce: str,
                 naive: bool, rc: bool) -> dict[int, VariantScore]:
    """Scores of a pass's sites, keyed by id(variant)."""
    windows = [[site[0][1].ref] + [w.alt for _, w in site] for site in batch]
    scores = _batched(model, [(site[0][1].offset, ws) for site, ws in zip(batch, windows)],
                      reduce, naive)
    if rc:
        tails = [min(len(w.ref) - w.offset - len(v.ref) for v, w in site) for site in batch]
        back = _batched(model, [(t, [reverse_complement(x) for x in ws])
                                for t, ws in zip(tails, windows)], reduce, naive)
        scores = [[(a + b) / 2 for a, b in zip(f, r)] for f, r in zip(scores, back)]
    return {id(v): VariantScore(v, got[0], alt_ll)
            for site, got in zip(batch, scores) for (v, _), alt_ll in zip(site, got[1:])}


def _batched(model: StripedHyena, sites: list[tuple[int, list[str]]], reduce: str,
             naive: bool) -> list[list[float]]:
    """Each site's window scores: sites at one offset in one `score_sites` pass."""
    if naive:
        return [[window_ll(model, w, reduce) for w in ws] for _, ws in sites]
    out: list[list[float]] = [[] for _ in sites]
    by_offset: dict[int, list[int]] = {}
    for i, (offset, _) in enumerate(sites):
        by_offset.setdefault(offset, []).append(i)
    for offset, which in by_offset.items():
        for i, got in zip(which, score_sites(model, offset, [sites[i][1] for i in which],
                                             reduce)):
            out[i] = got
    return out


def consecutive_sites(variants: Sequence[Variant]) -> list[list[Variant]]:
    """Runs of consecutive variants at one position (a VCF's ALTs of a record, or records of one
    site written next to each other): they may share a reference window."""
    out: list[list[Variant]] = []
    for v in variants:
        if out and (out[-1][0].chrom, out[-1][0].pos) == (v.chrom, v.pos):
            out[-1].append(v)
        else:
            out.append([v])
    return out


def mutagenesis_window(length: int, start: int, end: int, window: int) -> tuple[int, int]:
    """The one window (0-based start, end) that holds the 1-based region start..end of a contig
    of `length` bases: `window` bases centred on the region (shifted inside the contig near its
    ends; the whole contig when it is shorter)."""
    if end - start + 1 > window:
        raise SettingError.of("mutagenesis", f"a region of {end - start + 1:,} bases does not fit "
                                             f"in one --window of {window:,}", sep=": ")
    mid = (start - 1 + end) // 2
    w0 = max(0, min(mid - window // 2, length - window))
    return w0, min(length, w0 + window)


def saturation_variants(reference: Reference, chrom: str, start: int, end: int) -> list[Variant]:
    """Every base of chrom:start-end (1-based, inclusive) to each of the three others, in order
    (positions whose reference letter is not A, C, G or T are left out)."""
    seq = reference.fetch(chrom, start, end).upper()
    return [Variant(chrom, start + i, ".", b, a) for i, b in enumerate(seq) if b in "ACGT"
            for a in "ACGT" if a != b]


@torch.inference_mode()
def score_mutagenesis(model: StripedHyena, reference: Reference, chrom: str, start: int,
                      end: int, window: int = 8192, reduce: str = "mean", naive: bool = False,
                      only: Collection[Variant] | None = None) -> list[VariantScore]:
    """In-silico saturation mutagenesis of chrom:start-end in one window that holds the region
    (`mutagenesis_window`): every variant's reference window is that window, its alternative the
    window with one base changed.

    One reference pass serves every variant: the window is run once (its per-base
    log-likelihoods give each variant's shared prefix), the region is fed as blocks whose
    `commit(j)` is the state before each of its bases (the rollback protocol: slicing, no
    recomputation), and each position's three alternatives fork that state and extend only
    the alternative base and the rest of the window. `naive`: every window from scratch.
    `only`: score just these of the region's variants (a shard's, or those a resumed run
    lacks); the reference pass is the same."""
    check_variant_settings(window, reduce)
    w0, w1 = mutagenesis_window(reference.length(chrom), start, end, window)
    seq = reference.fetch(chrom, w0 + 1, w1).upper()
    variants = saturation_variants(reference, chrom, start, end)
    if only is not None:
        wanted = set(only)
        variants = [v for v in variants if v in wanted]
    n_scored = len(seq) - 1
    if naive:
        ref_ll = window_ll(model, seq, reduce)
        return [VariantScore(v, ref_ll, window_ll(model, _mutate(seq, v.pos - 1 - w0, v.alt),
                                                  reduce)) for v in variants]
    ids = torch.tensor(_ids(seq), dtype=torch.long, device=model.device)
    by_pos: dict[int, list[Variant]] = {}
    for v in variants:
        by_pos.setdefault(v.pos - 1 - w0, []).append(v)
    at_zero = by_pos.pop(0, [])  # the window's first base: nothing before it to share
    # the reference pass, in prefill chunks: up to the region's first position, the region as
    # blocks whose commits are each position's state, then the rest of the window
    o = min(by_pos) if by_pos else len(seq)
    last = max(by_pos) if by_pos else len(seq) - 1
    logits, _, state = model.prefill(ids[None, :o], reserve=len(seq) - o + 1)
    ll = torch.zeros(len(seq) - 1, dtype=torch.float64, device=ids.device)  # ll[i]: base i + 1
    ll[:o - 1] = _token_ll(logits[0, :-1], ids[1:o])
    prev, alts = logits[0, -1:], []  # prev: the logits that predict base o
    chunk = model.prefill_chunk()
    while o < len(seq):
        stop = min(last + 1 if o <= last else len(seq), o + chunk)
        out, _, block = model.extend(state, ids[None, o:stop])
        rows = torch.cat([prev, out[0, :-1]])  # rows[j] predicts base o + j
        ll[o - 1:stop - 1] = _token_ll(rows, ids[o:stop])
        for p in range(o, stop):
            if p in by_pos:  # the state before base p: the block's commit (none for o)
                at = state if p == o else block.commit(p - o)
                alts += _alternatives(model, at, ids, p, by_pos[p], rows[p - o],
                                      float(ll[:p - 1].sum()))
        prev, state, o = out[0, -1:], block.commit(stop - o), stop
    ref_total = float(ll.sum())
    totals = [VariantScore(v, ref_total, window_ll(model, _mutate(seq, 0, v.alt), "sum"))
              for v in at_zero] + [VariantScore(v, ref_total, alt) for v, alt in alts]
    order = {v: i for i, v in enumerate(variants)}
    totals.sort(key=lambda s: order[s.variant])
    return [VariantScore(s.variant, _reduce(s.ref_ll, n_scored, reduce),
                         _reduce(s.alt_ll, n_scored, reduce)) for s in totals]


def _mutate(seq: str, o: int, alt: str) -> str:
    return seq[:o] + alt + seq[o + 1:]


def _alternatives(model: StripedHyena, at: InferenceState, ids: Tensor, p: int,
                  here: list[Variant], prev: Tensor, prefix: float
                  ) -> list[tuple[Variant, float]]:
    """Window totals (nats, not reduced) of the alternatives at position p >= 1: `at` is the
    state after the window's first p bases, `prev` the logits that predict base p, `prefix` the
    log-likelihood of bases 1..p-1 (shared by every alternative at p)."""
    rows = ids[p:].repeat(len(here), 1)
    rows[:, 0] = torch.tensor([ord(v.alt) for v in here], dtype=torch.long, device=ids.device)
    ext = _extend_rows(model, at.select([0] * len(here)), rows)
    out = []
    for i, v in enumerate(here):
        total = prefix + float(_token_ll(prev, rows[i, 0]))
        if rows.shape[1] > 1:
            total += float(_token_ll(ext[i, :-1], rows[i, 1:]).double().sum())
        out.append((v, total))
    return out
