"""DSpark-style distilled drafter: a parallel trunk plus a full-matrix Markov head.

One trunk pass proposes all gamma positions at once from the target's hidden states over the
last P committed positions (the "hidden-state prefix"); a V x V Markov table per draft position
(V = the DNA alphabet, so the table is tiny) then makes each draft depend on the previous draft:

    z_k = U_k + B_k[x_{k-1}],   q_k = S(z_k),   d_k ~ q_k   (left to right, fp32)

where U_k are the trunk's base logits, x_0 is the anchor and S is the target's own sampler
transform. q_k is exactly the distribution d_k is drawn from, as the acceptance rule requires.
The hidden states of newly committed positions come from the verification pass (no extra target
work). The folder records the hash of the target weights it was distilled from.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import Tensor, nn

from ...errors import ModelError
from ...model.model import StripedHyena
from ...model.state import InferenceState
from ..sampling import Purpose, sampler_probs
from .base import DraftContext, Proposal

DNA = [65, 67, 71, 84]  # A C G T


@dataclass
class DSparkConfig:
    target_hidden: int = 192  # D of the target
    target_layers: int = 4  # number of target layers in the conditioning (the target's hidden_layers)
    width: int = 128
    layers: int = 2
    heads: int = 4
    mlp_ratio: int = 2
    prefix_len: int = 64  # P: committed positions the trunk attends to
    gamma_max: int = 16
    alphabet: list[int] = field(default_factory=lambda: list(DNA))
    vocab_size: int = 512
    target_hash: str = ""
    target_name: str = ""
    training: dict = field(default_factory=dict)

    @property
    def n_alpha(self) -> int:
        return len(self.alphabet)


class _Norm(nn.Module):
    def __init__(self, d: int, learn: bool = True) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d)) if learn else None

    def forward(self, x: Tensor) -> Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return y * self.scale if self.scale is not None else y


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
        self.markov = nn.Parameter(torch.zeros(cfg.gamma_max, V + 1, V))  # B_k[prev, next]
        lut = torch.full((cfg.vocab_size,), V, dtype=torch.long)
        lut[torch.tensor(cfg.alphabet)] = torch.arange(V)
        self.register_buffer("lut", lut, persistent=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def condition(self, hidden: Tensor) -> Tensor:
        """(B, P, n_layers, D_target) raw target hidden states -> (B, P, d)."""
        h = self.layer_norm(hidden.float()).flatten(-2)
        return self.ctx_norm(self.ctx_proj(h))

    def base_logits(self, ctx: Tensor, ctx_valid: Tensor, anchor: Tensor, gamma: int) -> Tensor:
        """Trunk: U (B, gamma, V) from conditioning (B, P, d), valid mask (B, P), anchors (B,)."""
        B, P, d = ctx.shape
        ctx = ctx + self.ctx_pos.weight[-P:] if P else ctx
        slots = self.mask.expand(B, gamma, d).clone()
        slots[:, 0] = self.tok(self.lut[anchor])
        x = slots + self.slot_pos.weight[:gamma]
        mask = None
        if P and not bool(ctx_valid.all()):
            keep = torch.cat([ctx_valid, ctx_valid.new_ones(B, gamma)], dim=1)
            mask = keep[:, None, None, :]
        for blk in self.blocks:
            x = blk(x, ctx, mask)
        return self.head(self.out_norm(x))

    def logits(self, ctx: Tensor, ctx_valid: Tensor, anchor: Tensor, prev: Tensor) -> Tensor:
        """Teacher-forced corrected logits z (B, gamma, V); prev[:, k] = token before slot k."""
        gamma = prev.shape[1]
        U = self.base_logits(ctx, ctx_valid, anchor, gamma)
        rows = self.lut[prev]  # (B, gamma)
        bias = self.markov[torch.arange(gamma, device=rows.device), rows]  # (B, gamma, V)
        return U + bias


class DSparkDrafter:
    """The drafter as the decoders see it: a rolling hidden-state prefix and left-to-right draws."""

    name = "dspark"

    def __init__(self, net: DSparkNet, folder: Path | None = None) -> None:
        self.net = net.eval()
        self.cfg = net.cfg
        self.prefix_len = self.cfg.prefix_len
        self.folder = folder
        self.alpha = torch.tensor(self.cfg.alphabet)

    def begin(self, ctx: DraftContext) -> None:
        self.ctx = ctx
        dev = ctx.model.device
        self.net.to(dev)
        self.alpha = self.alpha.to(dev)
        P = self.prefix_len
        self.buf = torch.zeros(1, P, self.cfg.target_layers, self.cfg.target_hidden, device=dev)
        self.valid = torch.zeros(1, P, dtype=torch.bool, device=dev)
        if ctx.prefill_hidden is not None:
            self._push(ctx.prefill_hidden)

    def _push(self, hidden: Tensor) -> None:
        n = min(hidden.shape[0], self.prefix_len)
        if n == 0:
            return
        self.buf = torch.cat([self.buf[:, n:], hidden[None, -n:].to(self.buf.dtype)], dim=1)
        self.valid = torch.cat([self.valid[:, n:], self.valid.new_ones(1, n)], dim=1)

    @torch.inference_mode()
    def propose(self, state: InferenceState, anchor: int, gamma: int) -> Proposal:
        if gamma > self.cfg.gamma_max:
            raise ModelError(f"this drafter was built for gamma <= {self.cfg.gamma_max}")
        net, sampler, rng = self.net, self.ctx.sampler, self.ctx.rng
        ctx = net.condition(self.buf)
        U = net.base_logits(ctx, self.valid, torch.tensor([anchor], device=ctx.device), gamma)[0]
        U = U.float()
        u = rng.u(range(state.seqlen + 1, state.seqlen + gamma + 1), Purpose.DRAFT)
        # every conditional the left-to-right draws can meet, transformed in one batch:
        # Q[k, prev] = S(U_k + B_k[prev]) over the alphabet, prev = anchor's class or a letter
        Q = sampler_probs(U[:, None, :] + net.markov[:gamma].float(), sampler)  # (g, V+1, V)
        P = Q.to(torch.float64)
        cdf = P.cumsum(dim=-1).tolist()
        rows, prev = [], int(net.lut[anchor])
        for k, uk in enumerate(u.tolist()):  # inverse-CDF draws, as sampling.sample_from_probs
            c = cdf[k][prev]
            target = uk * c[-1]
            i = next((j for j, cj in enumerate(c) if cj > target), None)
            if i is None:  # rounding put the target at the end: the first index reaching it
                i = next(j for j, cj in enumerate(c) if cj >= c[-1])
            rows.append(prev)
            prev = i
        dev = Q.device
        q_small = Q[torch.arange(gamma, device=dev), torch.tensor(rows, device=dev)]  # (g, V)
        q = q_small.new_zeros(gamma, self.cfg.vocab_size)
        q[:, self.alpha] = q_small  # each draft's exact distribution over the vocabulary
        drafts = self.alpha[torch.tensor(rows[1:] + [prev], dtype=torch.long, device=dev)]
        return Proposal(drafts.cpu(), q)

    def observe(self, tokens: list[int], hidden: Tensor) -> None:
        self._push(hidden)


# ------------------------------------------------------------------------------------ folders


def save_drafter(net: DSparkNet, out: str | Path) -> Path:
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in net.state_dict().items()}
    tmp = folder / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt", "producer": "evspark-dspark"})
    os.replace(tmp, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({"kind": "dspark", **asdict(net.cfg)}, indent=1))
    return folder


def load_drafter(folder: str | Path, target: StripedHyena | None = None, force: bool = False
                 ) -> DSparkDrafter:
    """Load a drafter folder; refuse one distilled from other target weights unless forced."""
    from ...model.checkpoint import check_tensors_against, read_safetensors, weights_hash

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file() or not (folder / "model.safetensors").is_file():
        raise ModelError(f"drafter folder {folder} needs config.json and model.safetensors")
    try:
        raw = json.loads(cfg_path.read_text())
    except ValueError as e:
        raise ModelError(f"{cfg_path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict) or raw.pop("kind", None) != "dspark":
        raise ModelError(f"{folder} is not a dspark drafter folder")
    try:
        cfg = DSparkConfig(**raw)
    except TypeError as e:
        raise ModelError(f"{cfg_path}: {e}") from None
    if target is not None:
        src = target.source_dir
        if src is not None and cfg.target_hash and not force:
            h = weights_hash(src)
            if h != cfg.target_hash:
                raise ModelError(f"drafter {folder} was distilled from another target "
                                 f"(weights sha256 {cfg.target_hash[:12]}…, this model {h[:12]}…); "
                                 "use --force-drafter to use it anyway")
        tc = target.config
        if cfg.target_hidden != tc.hidden_size or cfg.target_layers != len(tc.drafter_layers):
            raise ModelError(f"drafter {folder} expects a target with hidden {cfg.target_hidden} and "
                             f"{cfg.target_layers} conditioning layers")
    try:
        net = DSparkNet(cfg)
    except (TypeError, ValueError, RuntimeError, IndexError) as e:  # e.g. "width": "wide"
        raise ModelError(f"{cfg_path}: invalid drafter config ({str(e).splitlines()[0]})") from None
    check_tensors_against(net, read_safetensors(folder / "model.safetensors"), folder / "model.safetensors")
    return DSparkDrafter(net, folder)
