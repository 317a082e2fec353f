"""DSpark-style distilled drafter: a parallel trunk plus a full-matrix Markov head.

One trunk pass proposes all gamma positions at once from the target's hidden states over the
last P committed positions (the "hidden-state prefix"); a V x V Markov table per draft position
(V = the DNA alphabet, so the table is tiny) then makes each draft depend on the previous draft:

    z_k = U_k + B_k[c_k] (+ T(h_k)[c_k]),   q_k = S(z_k),   d_k ~ q_k   (left to right, fp32)

where U_k are the trunk's base logits, c_k the context x_{k-m}..x_{k-1}, x_0 is the anchor
(x_{<0} the committed tokens before it), m is the table's order (`markov_order`: 1 is DSpark's
previous-token head; DNA's alphabet makes the (A+1)^m-row table of a higher order cheap too),
T(h_k) the table the trunk writes from slot k's output h_k (`trunk_markov`: how a draft follows
the tokens before it then depends on the context) and S is the target's own sampler
transform. q_k is exactly the distribution d_k is drawn from, as the acceptance rule requires.
The hidden states of newly committed positions come from the verification pass (no extra target
work). The folder records the hash of the target weights it was distilled from.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from ...alphabet import BASE_IDS
from ...errors import ModelError, literal
from ...files import read_bounded
from ...model.model import StripedHyena
from ...model.state import InferenceState, put_rows, swap_remove
from ..sampling import Purpose, coupled_noise, sampler_probs
from ..tree import DraftPaths
from .base import DraftContext, Proposal

SCALAR_WALK = 2
"""Rows at most this many (one stream) walk their draws on host ints (`DSparkRows._walk`)."""

PATH_SCALE = 0.2
"""The score gap (logit units) at which the tree planner takes the drafter's second letter to
be e times less likely than its first to be the target's token (decode/tree.py): the drafter's
error in its logits, which its perturbed scores (coupled) inherit. Measured on held-out genomes
(0.05-0.2 gave the bundled drafters the longest accepted runs of 0.05-3;
docs/performance.md)."""


@dataclass
class DSparkConfig:
    target_hidden: int = 192  # D of the target
    target_layers: int = 4  # target layers in the conditioning (the target's hidden_layers)
    width: int = 128
    layers: int = 2
    heads: int = 4
    mlp_ratio: int = 2
    prefix_len: int = 64  # P: committed positions the trunk attends to
    gamma_max: int = 16
    markov_order: int = 1  # the Markov head's context: the last m tokens before a draft
    trunk_markov: bool = False  # the trunk writes each slot's Markov table too (per context)
    alphabet: list[int] = field(default_factory=lambda: list(BASE_IDS))
    vocab_size: int = 512
    target_hash: str = ""
    target_name: str = ""
    training: dict = field(default_factory=dict)

    @property
    def n_alpha(self) -> int:
        return len(self.alphabet)

    @property
    def classes(self) -> int:
        """Rows of a position's Markov table: one per context of `markov_order` tokens, each
        a letter or "other" (A + 1 values)."""
        return (self.n_alpha + 1) ** self.markov_order

    @classmethod
    def from_dict(cls, raw: dict, where: str = "drafter config") -> "DSparkConfig":
        """A config from a drafter folder's config.json (without its "kind"), checked."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in raw if k not in known)
        if unknown:
            raise ModelError(f"{where}: unknown field(s) {', '.join(map(str, unknown))[:120]}")
        cfg = cls(**raw)
        cfg.validate(where)
        return cfg

    def validate(self, where: str = "drafter config") -> None:
        """Refuse (ModelError, one line) values no drafter can be built or run from: a string
        where a number goes ("heads": "4"), sizes below 1, an alphabet outside the vocabulary."""
        sizes = {"target_hidden": self.target_hidden, "target_layers": self.target_layers,
                 "width": self.width, "layers": self.layers, "heads": self.heads,
                 "mlp_ratio": self.mlp_ratio, "prefix_len": self.prefix_len,
                 "gamma_max": self.gamma_max, "vocab_size": self.vocab_size,
                 "markov_order": self.markov_order}
        for name, v in sizes.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ModelError(f"{where}: {name} must be an integer >= 1, got {_short(v)}")
        if self.markov_order > MAX_MARKOV_ORDER:
            raise ModelError(f"{where}: markov_order must be at most {MAX_MARKOV_ORDER}, got "
                             f"{self.markov_order}")
        if not isinstance(self.trunk_markov, bool):
            raise ModelError(f"{where}: trunk_markov must be true or false, got "
                             f"{_short(self.trunk_markov)}")
        if self.width % self.heads:
            raise ModelError(f"{where}: width {self.width} is not a multiple of heads "
                             f"{self.heads}")
        a = self.alphabet
        if (not isinstance(a, list) or not a or len(set(map(repr, a))) != len(a)
                or not all(isinstance(t, int) and not isinstance(t, bool)
                           and 0 <= t < self.vocab_size for t in a)):
            raise ModelError(f"{where}: alphabet must be distinct token ids below vocab_size "
                             f"{self.vocab_size}, got {_short(a)}")
        for name, text in (("target_hash", self.target_hash), ("target_name", self.target_name)):
            if not isinstance(text, str):
                raise ModelError(f"{where}: {name} must be a string, got {_short(text)}")
        if not isinstance(self.training, dict):
            raise ModelError(f"{where}: training must be a mapping, got {_short(self.training)}")

    def parameter_count(self) -> int:
        """Numbers in a DSparkNet of this config (as `DSparkNet(cfg)` holds them)."""
        d, V, r = self.width, self.n_alpha, self.mlp_ratio
        per_layer = 3 * d + 4 * d * d + 3 * r * d * d
        return (self.target_layers * self.target_hidden * d + 3 * d + self.prefix_len * d
                + (V + 1) * d + self.gamma_max * d + self.layers * per_layer + d * V + V
                + self.gamma_max * self.classes * V + self.trunk_markov * d * self.classes * V)

    def memory_bytes(self) -> int:
        """A loaded drafter's memory, fp32: its parameters, the token lookup table, and one
        row's hidden-state prefix (prefix_len x target_layers x target_hidden)."""
        return 4 * (self.parameter_count() + self.prefix_len * self.target_layers
                    * self.target_hidden) + 8 * self.vocab_size


MAX_MARKOV_ORDER = 4
"""The highest Markov order a drafter may have: 625 table rows per draft position over DNA, whose
every conditional a round transforms at once."""


def _short(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


class _Norm(nn.Module):
    def __init__(self, d: int, learn: bool = True) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d)) if learn else None

    def forward(self, x: Tensor) -> Tensor:
        """x·rsqrt(mean(x²) + 1e-6)·scale, as one fused op (a round runs seven)."""
        return F.rms_norm(x, x.shape[-1:], self.scale, 1e-6)


class _Layer(nn.Module):
    """Block slots attend to [prefix ; block] (bidirectional inside the block), then an MLP."""

    def __init__(self, d: int, heads: int, ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.n1, self.n2, self.nc = _Norm(d), _Norm(d), _Norm(d)
        self.q = nn.Linear(d, d, bias=False)
        self.kv = nn.Linear(d, 2 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.up = nn.Linear(d, 2 * ratio * d, bias=False)
        self.down = nn.Linear(ratio * d, d, bias=False)

    def forward(self, x: Tensor, ctx: Tensor, mask: Tensor | None) -> Tensor:
        B, g, d = x.shape
        h = self.n1(x)
        mem = torch.cat([self.nc(ctx), h], dim=1)
        q = self.q(h).view(B, g, self.heads, -1).transpose(1, 2)
        k, v = self.kv(mem).view(B, mem.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(B, g, d))
        u, gate = self.up(self.n2(x)).chunk(2, dim=-1)
        return x + self.down(F.gelu(gate) * u)


class DSparkNet(nn.Module):
    def __init__(self, cfg: DSparkConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d, V = cfg.width, cfg.n_alpha
        self.layer_norm = _Norm(cfg.target_hidden, learn=False)  # per-layer scale removal
        self.ctx_proj = nn.Linear(cfg.target_layers * cfg.target_hidden, d, bias=False)
        self.ctx_norm = _Norm(d)
        self.ctx_pos = nn.Embedding(cfg.prefix_len, d)
        self.tok = nn.Embedding(V + 1, d)  # alphabet + "other"
        self.mask = nn.Parameter(torch.zeros(d))
        self.slot_pos = nn.Embedding(cfg.gamma_max, d)
        self.blocks = nn.ModuleList(_Layer(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.layers))
        self.out_norm = _Norm(d)
        self.head = nn.Linear(d, V, bias=True)
        self.markov = nn.Parameter(torch.zeros(cfg.gamma_max, cfg.classes, V))  # B_k[ctx, next]
        # the trunk's own table per slot (B, gamma, classes, V): how a draft follows the tokens
        # before it may then depend on the context, not only on the slot
        self.pair = nn.Linear(d, cfg.classes * V, bias=False) if cfg.trunk_markov else None
        lut = torch.full((cfg.vocab_size,), V, dtype=torch.long)
        lut[torch.tensor(cfg.alphabet)] = torch.arange(V)
        self.register_buffer("lut", lut, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
        if self.pair is not None:
            nn.init.zeros_(self.pair.weight)  # starts as the static table

    def condition(self, hidden: Tensor) -> Tensor:
        """(B, P, n_layers, D_target) raw target hidden states -> (B, P, d)."""
        h = self.layer_norm(hidden.float()).flatten(-2)
        return self.ctx_norm(self.ctx_proj(h))

    def base_logits(self, ctx: Tensor, ctx_valid: Tensor | None, anchor: Tensor, gamma: int
                    ) -> Tensor:
        """Trunk: U (B, gamma, V) from conditioning (B, P, d), valid mask (B, P) (None: all
        valid), anchors (B,)."""
        return self.head(self._trunk(ctx, ctx_valid, anchor, gamma))

    def conditionals(self, ctx: Tensor, ctx_valid: Tensor | None, anchor: Tensor, gamma: int
                     ) -> Tensor:
        """Every Markov conditional's logits Z (B, gamma, classes, V): U_k + B_k[c], plus the
        trunk's table for the slot (`trunk_markov`)."""
        h = self._trunk(ctx, ctx_valid, anchor, gamma)
        Z = self.head(h)[:, :, None, :] + self.markov[:gamma]
        if self.pair is not None:
            Z = Z + self.pair(h).view(*h.shape[:2], self.cfg.classes, self.cfg.n_alpha)
        return Z

    def _trunk(self, ctx: Tensor, ctx_valid: Tensor | None, anchor: Tensor, gamma: int
               ) -> Tensor:
        """The trunk's normalised output (B, gamma, d) for every draft slot."""
        B, P, d = ctx.shape
        ctx = ctx + self.ctx_pos.weight[-P:] if P else ctx
        slots = self.mask.expand(B, gamma, d).clone()
        slots[:, 0] = self.tok(self.lut[anchor])
        x = slots + self.slot_pos.weight[:gamma]
        mask = None
        if P and ctx_valid is not None and not bool(ctx_valid.all()):
            keep = torch.cat([ctx_valid, ctx_valid.new_ones(B, gamma)], dim=1)
            mask = keep[:, None, None, :]
        for blk in self.blocks:
            x = blk(x, ctx, mask)
        return self.out_norm(x)

    def context_class(self, prev: Tensor) -> Tensor:
        """The Markov row of each context: prev (..., m) tokens, prev[..., 0] the newest (the
        token just before the slot), as base-(A+1) digits of their letters (or "other")."""
        digits = self.lut[prev]
        base = self.cfg.n_alpha + 1
        return (digits * base ** torch.arange(prev.shape[-1], device=prev.device)).sum(-1)

    def logits(self, ctx: Tensor, ctx_valid: Tensor, anchor: Tensor, prev: Tensor) -> Tensor:
        """Teacher-forced corrected logits z (B, gamma, V); prev[:, k] = the token before slot
        k, or prev[:, k, j] the j-th token before it (B, gamma, markov_order)."""
        gamma = prev.shape[1]
        if prev.dim() == 2:
            prev = prev[..., None]
        if prev.shape[-1] != self.cfg.markov_order:
            raise ValueError(f"prev holds {prev.shape[-1]} tokens per slot; this head's order "
                             f"is {self.cfg.markov_order}")
        Z = self.conditionals(ctx, ctx_valid, anchor, gamma)
        rows = self.context_class(prev)  # (B, gamma)
        return Z.gather(2, rows[:, :, None, None].expand(-1, -1, 1, Z.shape[-1]))[:, :, 0]


class DSparkDrafter:
    """The drafter as the decoders see it: a distilled net shared by all rows."""

    name = "dspark"
    scores_paths = True  # the Markov head scores every path (token trees)

    def __init__(self, net: DSparkNet, folder: Path | None = None) -> None:
        self.net = net.eval()
        self.cfg = net.cfg
        self.prefix_len = self.cfg.prefix_len
        self.gamma_limit: int | None = self.cfg.gamma_max  # the net has gamma_max draft slots
        self.folder = folder

    def rows(self, contexts: Sequence[DraftContext]) -> "DSparkRows":
        return DSparkRows(self, list(contexts))


class DSparkRows:
    """Each row's rolling hidden-state prefix, kept conditioned: (B, P, width), the committed
    tokens before its anchor that its Markov head reads (B, order - 1), and its drafts.

    A position's conditioning (per-layer normalisation, projection, norm) does not depend on
    where it sits in the prefix, so each committed position is conditioned once, when it arrives,
    not again every round. The trunk runs once per round for all rows that draft the same
    number of tokens (the whole batch but in a row's last rounds); every Markov conditional is
    transformed in one batch and the left-to-right draws walk them on the host, all rows at
    once."""

    def __init__(self, drafter: DSparkDrafter, contexts: list[DraftContext]) -> None:
        self.net, self.cfg = drafter.net, drafter.cfg
        self.contexts = contexts
        dev = contexts[0].model.device
        self.net.to(dev)
        self.sampler = contexts[0].sampler
        if any(c.sampler != self.sampler for c in contexts):
            raise ValueError("the rows of a batch share one sampler")
        self.alpha = torch.tensor(self.cfg.alphabet, device=dev)
        self._lut: list[int] = self.net.lut.tolist()
        B, P = len(contexts), self.cfg.prefix_len
        self.ctx = torch.zeros(B, P, self.cfg.width, device=dev)
        self.valid = torch.zeros(B, P, dtype=torch.bool, device=dev)
        self._full: bool | None = None  # every row's prefix holds P positions (None: unknown)
        keep = self.cfg.markov_order - 1  # the prompt's tokens before its last (the anchor)
        # a token before the sequence's start reads as "other" (id 0 is outside the alphabet)
        self.hist = torch.tensor([([0] * keep + list(c.prompt[:-1]))[len(c.prompt) - 1:]
                                  for c in contexts], dtype=torch.long).view(B, keep)
        with torch.inference_mode():
            for b, c in enumerate(contexts):
                h = c.prefill_hidden
                n = 0 if h is None else min(h.shape[0], P)
                if n:
                    assert h is not None
                    self.ctx[b, P - n:] = self.net.condition(h[None, -n:])[0]
                    self.valid[b, P - n:] = True

    # ------------------------------------------------------------------ rows come and go
    def place(self, slots: Sequence[int], new: "DSparkRows") -> None:  # type: ignore[override]
        self.ctx = put_rows(self.ctx, slots, new.ctx)
        self.valid = put_rows(self.valid, slots, new.valid)
        self.hist = put_rows(self.hist, slots, new.hist)
        self._full = None
        for slot, c in zip(slots, new.contexts):
            self.contexts[slot] = c

    def append(self, new: "DSparkRows") -> None:  # type: ignore[override]
        self.ctx, self.valid = torch.cat([self.ctx, new.ctx]), torch.cat([self.valid, new.valid])
        self.hist = torch.cat([self.hist, new.hist])
        self._full = None
        self.contexts += new.contexts

    def remove(self, row: int) -> None:
        self.ctx, self.valid = swap_remove(self.ctx, row), swap_remove(self.valid, row)
        self.hist = swap_remove(self.hist, row)
        self._full = None if self._full is False else self._full
        last = self.contexts.pop()
        if row < len(self.contexts):
            self.contexts[row] = last

    def observe(self, fed: Tensor, hidden: Tensor, counts: list[int]) -> None:
        """Each row's prefix moves on by its committed positions, conditioned as they arrive;
        its token history takes the committed tokens (anchor and accepted drafts)."""
        if self.hist.shape[1]:
            both = torch.cat([self.hist, fed.cpu()], dim=1)  # row b keeps its last order-1
            at = torch.tensor(counts)[:, None] + torch.arange(self.hist.shape[1])
            self.hist = both.gather(1, at)
        B, P = self.ctx.shape[:2]
        k = max(counts)
        new = self.net.condition(hidden[:, :k])  # (B, k, width): only the positions that arrive
        n = counts[0]
        if counts.count(n) == len(counts):  # every row moves on by n: one copy
            self.ctx = torch.cat([self.ctx[:, n:], new], dim=1)[:, -P:]
            self.valid = torch.cat([self.valid[:, n:], self.valid.new_ones(B, n)], dim=1)[:, -P:]
            self._full = self._full or None
            return
        both = torch.cat([self.ctx, new], dim=1)  # (B, P + k, width)
        ok = torch.cat([self.valid, self.valid.new_ones(B, k)], dim=1)
        start = torch.tensor(counts, device=both.device)[:, None]
        idx = start + torch.arange(P, device=both.device)  # row b keeps positions n_b .. n_b+P-1
        self.ctx = both.gather(1, idx[:, :, None].expand(B, P, both.shape[2]))
        self.valid = ok.gather(1, idx)
        self._full = self._full or None  # a full prefix stays full; a partial one may fill

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def propose(self, state: InferenceState, anchors: Sequence[int], gammas: Sequence[int]
                ) -> Proposal:
        gmax = max(gammas)
        if gmax > self.cfg.gamma_max:
            raise ModelError(f"this drafter was built for gamma <= {self.cfg.gamma_max}")
        B, V = len(anchors), self.cfg.vocab_size
        starts = self._start_classes(anchors)
        if min(gammas) == gmax:  # every row drafts gmax: one group, as is
            drafts, q, scores, gap = self._draft(list(range(B)), list(anchors), starts,
                                                 list(state.lengths[:B]), gmax)
        else:
            drafts = torch.zeros(B, gmax, dtype=torch.long)
            q = torch.zeros(B, gmax, V, dtype=torch.float32, device=self.ctx.device)
            A, C = self.cfg.n_alpha, self.cfg.classes
            scores = torch.full((B, gmax, C, A), -math.inf, dtype=torch.float64)
            gap = torch.full((B, gmax), math.nan, dtype=torch.float64) if self._coupled else None
            for g in sorted(set(gammas) - {0}):
                rows = [b for b in range(B) if gammas[b] == g]
                d, qs, sc, gp = self._draft(rows, [anchors[b] for b in rows],
                                            [starts[b] for b in rows],
                                            [state.lengths[b] for b in rows], g)
                drafts[rows, :g] = d
                q[rows, :g] = qs
                scores[rows, :g] = sc
                if gap is not None and gp is not None:
                    gap[rows, :g] = gp
        paths = DraftPaths(scores, self.alpha.cpu(), starts, PATH_SCALE)
        return Proposal(drafts, q, paths, gap)

    @property
    def _coupled(self) -> bool:
        """Drafts are Gumbel-max draws with the target's noise (coupled, not greedy)."""
        return self.sampler.coupled and not self.sampler.greedy

    def _start_classes(self, anchors: Sequence[int]) -> list[int]:
        """Each row's Markov context before its first draft: its anchor, then its history
        (`DSparkNet.context_class` on host ints: a round's few numbers)."""
        lut, base = self._lut, self.cfg.n_alpha + 1
        out = []
        for a, before in zip(anchors, self.hist.tolist()):
            c = 0
            for t in before:  # oldest first: each older digit ends up more significant
                c = c * base + lut[t]
            out.append(c * base + lut[a])
        return out

    def _draft(self, rows: list[int], anchors: list[int], starts: list[int],
               positions: list[int], gamma: int
               ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Drafts (n, gamma), q (n, gamma, V) of `rows`, each anchored at its position with its
        Markov context `starts`, the scores of every path (n, gamma, classes, A) whose argmax
        the draws take (`DraftPaths`): the perturbed scores log q + g under the coupled rule,
        else the logits (greedy), and under the coupled rule each draft's perturbed-score gap
        (n, gamma), read off the scores of its own context (`Proposal.confidence`)."""
        net = self.net
        whole = len(rows) == self.ctx.shape[0]
        ctx = self.ctx if whole else self.ctx[rows]
        if self._full is None:
            self._full = bool(self.valid.all())
        valid = None if self._full else self.valid if whole else self.valid[rows]
        # every conditional the left-to-right draws can meet, transformed in one batch:
        # Q[r, k, c] = S(Z_rkc) over the alphabet, for every context class c
        Z = net.conditionals(ctx, valid, torch.tensor(anchors, device=ctx.device), gamma).float()
        Q = sampler_probs(Z, self.sampler)
        if self._coupled:
            scores = self._coupled_scores(Q, rows, positions)
            best = scores.argmax(dim=-1).numpy()  # (n, gamma, classes)
            classes, letters = self._walk(starts, gamma, lambda k, r, c: best[r, k, c],
                                          lambda r, k, c: int(best[r, k, c]))
        else:
            scores = Z.to(torch.float64).cpu()
            cdf = Q.to(torch.float64).cumsum(dim=-1).cpu().numpy()  # (n, gamma, classes, A)
            u = np.array([self.contexts[b].rng.floats(range(pos + 1, pos + gamma + 1),
                                                      Purpose.DRAFT)
                          for b, pos in zip(rows, positions)], dtype=np.float64)
            classes, letters = self._walk(
                starts, gamma, lambda k, r, c: _inverse_cdf(cdf[r, k, c], u[:, k]),
                lambda r, k, c: _inverse_cdf_one(cdf[r, k, c].tolist(), float(u[r, k])))
        dev = Q.device
        n = len(rows)
        at = (torch.arange(n)[:, None], torch.arange(gamma), torch.from_numpy(classes))
        gap = None
        if self._coupled:  # the drafts' own scores: best minus second best, as coupled_draw
            top2 = scores[at].topk(2, dim=-1).values  # (n, gamma, 2)
            gap = (top2[..., 0] - top2[..., 1]) * self.sampler.temperature
        sel = at if dev.type == "cpu" else tuple(t.to(dev) for t in at)
        q_small = Q[sel]
        q = q_small.new_zeros(n, gamma, self.cfg.vocab_size)
        q[..., self.alpha] = q_small  # each draft's exact distribution over the vocabulary
        drafts = self.alpha[torch.from_numpy(letters).to(dev)]
        return drafts.cpu(), q, scores, gap

    def _walk(self, starts: list[int], gamma: int, choose, choose_one
              ) -> tuple[np.ndarray, np.ndarray]:
        """The left-to-right draws of all rows at once: at slot k each row's letter is
        choose(k, rows, classes) given its Markov context class, which then takes the letter
        as its newest digit. At most SCALAR_WALK rows (one stream) walk on host ints instead,
        choose_one(row, k, class) a letter at a time: the same letters without a dozen array
        calls a round. Returns (classes (n, gamma), letters (n, gamma))."""
        C, base = self.cfg.classes, self.cfg.n_alpha + 1
        n = len(starts)
        if n <= SCALAR_WALK:
            cls_out, let_out = [], []
            for r, c in enumerate(starts):
                for k in range(gamma):
                    a = choose_one(r, k, c)
                    cls_out.append(c)
                    let_out.append(a)
                    c = (c * base) % C + a
            return (np.array(cls_out, dtype=np.int64).reshape(n, gamma),
                    np.array(let_out, dtype=np.int64).reshape(n, gamma))
        cls = np.array(starts, dtype=np.int64)
        rows = np.arange(n)
        classes = np.empty((n, gamma), dtype=np.int64)
        letters = np.empty((n, gamma), dtype=np.int64)
        for k in range(gamma):
            classes[:, k] = cls
            letters[:, k] = a = choose(k, rows, cls)
            cls = (cls * base) % C + a
        return classes, letters

    def _coupled_scores(self, Q: Tensor, rows: list[int], positions: list[int]) -> Tensor:
        """Every conditional's perturbed scores log q + g (n, gamma, classes, A) on the host,
        with the target's noise: a slot's noise depends on its position and letter only, so it
        is drawn once per slot and shared by the slot's Markov rows."""
        n, gamma, _, A = Q.shape
        keys = torch.tensor([self.contexts[b].rng.coupled for b in rows]).repeat_interleave(gamma)
        at = torch.tensor([pos + 1 + k for pos in positions for k in range(gamma)])
        g = coupled_noise(keys, at, self.alpha.expand(n * gamma, A)).view(n, gamma, 1, A)
        q64 = Q.to(torch.float64)
        return torch.where(q64 > 0, torch.log(q64) + g, -math.inf).cpu()


def _inverse_cdf_one(cdf: list[float], u: float) -> int:
    """`_inverse_cdf` of one row on host floats (the same IEEE products and comparisons)."""
    total = cdf[-1]
    target = u * total
    for i, c in enumerate(cdf):
        if c > target:
            return i
    for i, c in enumerate(cdf):
        if c >= total:
            return i
    return 0  # a row of nan (argmax of all-false, as the array path)


def _inverse_cdf(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Per row of cdf (n, A), the first index whose cumulative mass exceeds u·total, as
    `sampling.sample_from_probs` draws; a target that rounding puts at or past the end takes
    the first index reaching the total (which has mass)."""
    total = cdf[:, -1:]
    over = cdf > u[:, None] * total
    reach = (cdf >= total).argmax(axis=1)
    return np.where(over.any(axis=1), over.argmax(axis=1), reach)


# ------------------------------------------------------------------------------------ folders


def save_drafter(net: DSparkNet, out: str | Path) -> Path:
    """A drafter folder: weights and config, each through a fresh temporary file (never written
    through a symlink or over a half-written file)."""
    from ...files import atomic_path

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
    with atomic_path(str(folder / "model.safetensors")) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt", "producer": "evspark-dspark"})
    with atomic_path(str(folder / "config.json")) as tmp:
        Path(tmp).write_text(json.dumps({"kind": "dspark", **asdict(net.cfg)}, indent=1))
    return folder


MAX_CONFIG_BYTES = 1 << 20
"""The largest drafter config.json read (a real one is under 1 KiB)."""


def load_drafter(folder: str | Path, target: StripedHyena | None = None, force: bool = False,
                 max_memory: str | int | None = None) -> DSparkDrafter:
    """Load a drafter folder; refuse one distilled from other target weights unless forced.

    Its config is checked (types, sizes, the target's vocabulary) and its memory estimated
    against what there is (or `max_memory`) before the net is built (ModelError)."""
    from ...model.checkpoint import (
        check_tensors_against,
        read_safetensors,
        safetensors_elements,
        weights_hash,
    )
    from ...model.memory import MISMATCH_SLACK, count, memory_budget, memory_refusal

    folder = Path(folder)
    cfg_path = folder / "config.json"
    weights = folder / "model.safetensors"
    if not cfg_path.is_file() or not weights.is_file():
        raise ModelError(f"drafter folder {folder} needs config.json and model.safetensors")
    raw = _read_config(cfg_path)
    if not isinstance(raw, dict) or raw.pop("kind", None) != "dspark":
        raise ModelError(f"{folder} is not a dspark drafter folder")
    cfg = DSparkConfig.from_dict(raw, str(cfg_path))
    if target is not None:
        src = target.source_dir
        if src is not None and cfg.target_hash and not force:
            h = weights_hash(src)
            if h != cfg.target_hash:
                raise ModelError(literal(f"drafter {folder} was distilled from another target "
                                         f"(weights sha256 {cfg.target_hash[:12]}…, this model "
                                         f"{h[:12]}…); ") + "use {0} to use it anyway",
                                 "force_drafter")
        tc = target.config
        if cfg.target_hidden != tc.hidden_size or cfg.target_layers != len(tc.drafter_layers):
            raise ModelError(f"drafter {folder} expects a target with hidden {cfg.target_hidden} "
                             "and "
                             f"{cfg.target_layers} conditioning layers")
        if cfg.vocab_size != tc.vocab_size:
            raise ModelError(f"drafter {folder} has vocab_size {cfg.vocab_size}, its target "
                             f"{tc.vocab_size}")
    if cfg.parameter_count() > safetensors_elements(weights) + MISMATCH_SLACK:
        raise ModelError(f"{cfg_path}: describes a drafter of {count(cfg.parameter_count())} "
                         "parameters, far more than its weights hold (config and weights "
                         "disagree)")
    device = target.device if target is not None else "cpu"
    reason = memory_budget(device, max_memory).refusal_template(cfg.memory_bytes(),
                                                                f"drafter {folder}")
    if reason is not None:
        raise memory_refusal(reason)
    try:
        net = DSparkNet(cfg)
    except (TypeError, ValueError, RuntimeError, IndexError) as e:
        raise ModelError(f"{cfg_path}: invalid drafter config ({str(e).splitlines()[0]})") from None
    check_tensors_against(net, read_safetensors(weights), weights)
    return DSparkDrafter(net, folder)


def is_drafter_folder(folder: str | Path) -> bool:
    """Whether `folder`'s config.json is a drafter's ("kind": "dspark"), read without loading
    anything; False for a folder without one or an unreadable one (its loader says why)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    try:
        raw = _read_config(path)
    except ModelError:
        return False
    return isinstance(raw, dict) and raw.get("kind") == "dspark"


def _read_config(path: Path) -> object:
    """A drafter's config.json, refused in one line when it is not small, valid JSON."""
    data = read_bounded(path, MAX_CONFIG_BYTES, str(path), "drafter config")
    try:
        return json.loads(data.decode("utf-8-sig"))
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else " ".join(str(e).split())
        raise ModelError(f"{path}: not valid JSON ({why[:160]})") from None
