"""Hyena operators of StripedHyena 2: Hyena-SE (short FIR), -MR (medium FIR) and -LI (modal IIR).

Every operator is ``out_proj(q * filter(k * v))`` on featurized input projections
(docs/engine.md, "Hyena operators"). One code path serves the stateless forward, prefill and
block verification: a block of k inputs is convolved over ``[state ; inputs]``; without a state
the history is zeros.
Filters run in fp32 whatever the weight dtype (Evo 2's precision policy).

The filters see one of two layouts of the same values. Verification blocks (2 <= k <= 64, with
a state, in inference) stay position-major, (B, k, C), as the projections produce them: FIRs of
a few taps are a few multiply-adds over row slices or sums over unfolded windows, the block needs
no transposes or copies (1-4 % cheaper on CPU, `benchmarks/verify_cost.py`), and with bf16
activations its products round as the decode steps' do, so a block matches the steps it stands
for. Decode steps (where both layouts are the same memory) and long blocks (FFTs along positions)
run channel-major, (B, C, k). States are channel-major either way; a block's committed window is
a view of its buffer.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .layers import Derived, ResidualBlock, linear
from .state import (
    FIRPending,
    FIRWindow,
    HyenaPending,
    HyenaState,
    ModalInputs,
    ModalSigmas,
    ModalState,
    pole_powers,
)

SHORT_BLOCK = 64  # blocks up to this length: LI states by the step recurrence (inference) or a
# k x k product (training), FIRs by multiply-adds or unfolded windows (few taps), or Toeplitz GEMMs
FEW_TAPS = 8  # short blocks of SE/MR filters with at most this many taps: unfolded windows


def fp32_filters(x: Tensor):
    """Autocast off where the filters run: Evo 2 keeps them in fp32, and CUDA autocast would
    hand bf16 (from einsum/matmul) to FFTs that reject it. A no-op context outside autocast."""
    if torch.is_autocast_enabled(x.device.type):
        return torch.autocast(x.device.type, enabled=False)
    return contextlib.nullcontext()


def depthwise_causal_conv(widened: Tensor, weight: Tensor) -> Tensor:
    """Valid depthwise cross-correlation: (B, C, K-1+k) with (C, K) taps -> (B, C, k), fp32.

    Short blocks (decode, verification) use a direct product over the unfolded window; long ones
    (prefill, training) an FFT, whose cost does not grow with the filter length.
    """
    C, K = weight.shape
    n = widened.shape[-1]
    k = n - K + 1
    if k == 1:  # a decode step: one dot product per channel
        return (widened * weight).sum(-1, keepdim=True)
    if K <= 4 and k <= 4096:  # the featurizer's 3 taps: K fused multiply-adds beat any unfold
        out = widened[..., :k] * weight[:, :1]
        for j in range(1, K):
            out = out.addcmul_(widened[..., j: j + k], weight[:, j: j + 1])
        return out
    if k * K <= 4096 or K <= 8:
        if K <= 8 or k <= 4:
            win = widened.unfold(-1, K, 1)  # (B, C, k, K)
            return torch.einsum("bckj,cj->bck", win, weight)
        return F.conv1d(widened, weight[:, None, :], groups=C)
    size = 1 << (n + K - 1).bit_length()
    spec = torch.fft.rfft(widened, n=size) * torch.fft.rfft(weight.flip(-1), n=size)
    return torch.fft.irfft(spec, n=size)[..., K - 1: n]


def grouped_toeplitz_conv(widened: Tensor, toeplitz: Tensor) -> Tensor:
    """The same valid cross-correlation for a short block of a grouped filter, as one batched
    matrix product: (G, k, K-1+k) Toeplitz matrices times each group's channels.

    Channels of a group share their taps (Evo 2's `repeat_interleave` grouping), so a
    verification block costs G small GEMMs instead of a depthwise convolution (4x faster for
    Hyena-MR's 128 taps at k = 13 on CPU)."""
    B, C, n = widened.shape
    G, k, _ = toeplitz.shape
    x = widened.view(B, G, C // G, n).transpose(-1, -2)  # (B, G, n, C/G)
    return torch.matmul(toeplitz, x).transpose(-1, -2).reshape(B, C, k)


def fir_extend(x: Tensor, window: FIRWindow | None, weight: Tensor,
               toeplitz: Tensor | None = None) -> tuple[Tensor, FIRPending | None]:
    """Causal FIR over a block x (B, C, k) continuing `window` (zeros when None); with
    `toeplitz` (a grouped filter's matrices for this k) the block is one batched product."""
    K = weight.shape[-1]
    if window is None:
        widened = F.pad(x, (K - 1, 0))
        pending = None
    else:
        widened = window.widen(x)
        pending = FIRPending(widened, K - 1)
    if toeplitz is not None:
        return grouped_toeplitz_conv(widened, toeplitz), pending
    return depthwise_causal_conv(widened, weight), pending


def fir_block(x: Tensor, window: FIRWindow, *, rows: Tensor | None = None,
              weight: Tensor | None = None, toeplitz: Tensor | None = None
              ) -> tuple[Tensor, FIRPending]:
    """`fir_extend` for a verification block in position-major layout: x (B, k, C) -> (B, k, C).

    The taps come in one of three forms: `rows` (K, C), one contiguous row per tap, for K
    multiply-adds over row slices (the featurizer's 3 taps); `weight` (C, K), summed against
    each position's unfolded window (a few taps: 2 ops whatever K); or `toeplitz` (G, k, K-1+k),
    a grouped filter's matrices, for one batched product (long filters). The widened buffer
    [window ; x] is built as (B, K-1+k, C) and handed to the pending as its (B, C, K-1+k) view,
    so commit(j) is the same slice as after `fir_extend`."""
    B, k, C = x.shape
    width = window.buf.shape[-1]
    widened = torch.cat([window.buf.transpose(1, 2), x.to(window.buf.dtype)], dim=1)
    pending = FIRPending(widened.transpose(1, 2), width)
    if rows is not None:
        out = widened[:, :k] * rows[0]
        for j in range(1, width + 1):
            out.addcmul_(widened[:, j: j + k], rows[j])
        return out, pending
    if weight is not None:  # (B, k, C, K) windows of the buffer, a view
        return (widened.unfold(1, width + 1, 1) * weight).sum(-1), pending
    assert toeplitz is not None
    # one product per group over every row's channels of the group: (k, K-1+k) x (K-1+k, B C/G)
    # (Hyena-MR, k = 13, 32 rows: 0.5 ms, against 1.4 ms as B x G products of 8 columns each)
    G = toeplitz.shape[0]
    cols = widened.view(B, width + k, G, C // G).permute(2, 1, 0, 3).reshape(G, width + k, -1)
    out = torch.bmm(toeplitz, cols)  # (G, k, B C/G)
    return out.view(G, k, B, C // G).permute(2, 1, 0, 3).reshape(B, k, C), pending


class HyenaFilter(nn.Module):
    """Parameters of one Hyena operator, named as in Evo 2 checkpoints (``blocks.i.filter.*``)."""

    def __init__(self, cfg: ModelConfig, kind: str) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.kind = kind
        self.short_filter_weight = nn.Parameter(torch.zeros(3 * D, 1, cfg.short_filter_length))
        if kind == "hcs":
            self.groups = cfg.hcs_filter_groups
            self.h = nn.Parameter(torch.zeros(self.groups, 1, cfg.hcs_filter_length))
        elif kind == "hcm":
            self.groups = cfg.hcm_filter_groups
            self.h = nn.Parameter(torch.zeros(self.groups, 1, cfg.hcm_filter_length))
            self.D = nn.Parameter(torch.zeros(D))
        elif kind == "hcl":
            self.log_poles = nn.Parameter(torch.zeros(D, cfg.state_size, 1))
            self.residues = nn.Parameter(torch.zeros(D, cfg.state_size))
            self.D = nn.Parameter(torch.zeros(D))
        else:
            raise ValueError(kind)
        self.hidden = D
        self._derived = Derived()

    # ------------------------------------------------------------------ filters in fp32
    def _memo(self, name: str, sources: tuple[Tensor, ...], build: Callable[[], Any]) -> Any:
        return self._derived.get(name, sources, build)

    def feat_taps(self) -> Tensor:
        """(3D, K) featurizer taps in fp32 (cross-correlation)."""
        w = self.short_filter_weight
        return self._memo("feat", (w,), lambda: w[:, 0, :].float())

    def fir_taps(self) -> Tensor:
        """(D, K) cross-correlation taps (SE as stored; MR flipped, it is a convolution kernel)."""

        def build() -> Tensor:
            h = self.h[:, 0, :].float().repeat_interleave(self.hidden // self.groups, dim=0)
            return (h if self.kind == "hcs" else h.flip(-1)).contiguous()

        return self._memo("fir", (self.h,), build)

    def feat_rows(self) -> Tensor:
        """The featurizer taps as (K, 3D), one contiguous row per tap (for `fir_block`)."""
        return self._memo("feat_rows", (self.short_filter_weight,),
                          lambda: self.feat_taps().t().contiguous())

    def fir_toeplitz(self, k: int) -> Tensor:
        """(G, k, K-1+k): row i of group g holds its taps at columns i..i+K-1 (cached per k)."""

        def build() -> Tensor:
            taps = self.fir_taps()[:: self.hidden // self.groups]  # one row per group
            K = taps.shape[-1]
            lag = (torch.arange(K - 1 + k, device=taps.device)[None, :]
                   - torch.arange(k, device=taps.device)[:, None])  # (k, n): column - row
            inside = (lag >= 0) & (lag < K)
            return torch.where(inside, taps[:, lag.clamp(0, K - 1)], taps.new_zeros(()))

        return self._memo(f"fir_toeplitz{k}", (self.h,), build)

    def poles(self) -> tuple[Tensor, Tensor]:
        return self._memo("poles", (self.log_poles, self.residues),
                          lambda: (self.log_poles[..., 0].float(), self.residues.float()))

    def step_poles(self) -> Tensor:
        """p = exp(lambda) (D, S): one decode step's decay of the modal state."""
        return self._memo("p1", (self.log_poles,), lambda: torch.exp(self.poles()[0]))

    def li_impulse(self, n: int) -> Tensor:
        """h[d, t] = sum_s R[d, s] exp(lambda[d, s] t) for t < n, from `pole_powers` factors.

        Cached in inference as one (D, n_max) tensor: every prefill chunk slices a prefix of it."""

        def build(m: int) -> Tensor:  # h[d, a c + r] = sum_s R p^(a c) p^r (`pole_powers`)
            lam, R = self.poles()
            low, high = pole_powers(lam, m)
            h = torch.einsum("dsa,dsr->dar", R[..., None] * high, low)
            return h.reshape(h.shape[0], -1)[:, :m].contiguous()

        # built at powers of two: a run of ever longer prompts rebuilds it log2 times, not each
        m = 1 << max(0, n - 1).bit_length()
        h = self._derived.covering("impulse", (self.log_poles, self.residues), m, build,
                                   grow=lambda have: m)
        return h[:, :n]

    def li_toeplitz(self, k: int) -> tuple[Tensor, Tensor]:
        """(p^1..p^k as (D, S, k), lower-triangular p^(j-i) as (D, S, k, k)), cached in
        inference."""

        def build() -> tuple[Tensor, Tensor]:
            lam, _ = self.poles()
            j = torch.arange(k, device=lam.device, dtype=torch.float32)
            diff = j[:, None] - j[None, :]
            tri = torch.where(diff >= 0, torch.exp(lam[..., None, None] * diff.clamp(min=0)),
                              torch.zeros((), device=lam.device))
            return torch.exp(lam[..., None] * (j + 1)), tri

        return self._memo(f"toeplitz{k}", (self.log_poles,), build)

    # ------------------------------------------------------------------ inner filter over a block
    def inner(self, w: Tensor, st: FIRWindow | ModalState | None):
        """c = filter(w) for a block w (B, D, k) fp32 continuing state `st`: (c, pending)."""
        if self.kind in ("hcs", "hcm"):
            k = w.shape[-1]
            grouped = self.hidden // self.groups > 1  # else a depthwise conv is as cheap
            toeplitz = self.fir_toeplitz(k) if grouped and 2 <= k <= SHORT_BLOCK else None
            c, pending = fir_extend(w, st, self.fir_taps(), toeplitz)  # type: ignore[arg-type]
            if self.kind == "hcm":
                c = c + self.D.float()[:, None] * w
            return c, pending
        return self._li(w, st)  # type: ignore[arg-type]

    def inner_block(self, w: Tensor, st: FIRWindow | ModalState):
        """`inner` for a verification block in position-major layout: w (B, k, D) fp32 -> c."""
        if isinstance(st, ModalState):  # Hyena-LI
            return self._li_scan(w, st.sigma)
        k, K = w.shape[1], self.h.shape[-1]
        if K <= FEW_TAPS:
            c, pending = fir_block(w, st, weight=self.fir_taps())
        elif self.hidden // self.groups > 1:
            c, pending = fir_block(w, st, toeplitz=self.fir_toeplitz(k))
        else:  # many taps, no groups to share them: the channel-major convolution
            cm, pending = fir_extend(w.transpose(1, 2), st, self.fir_taps())
            c = cm.transpose(1, 2)
        if self.kind == "hcm":
            c = c + self.D.float() * w
        return c, pending

    def _li(self, w: Tensor, st: ModalState | None):
        lam, R = self.poles()
        k = w.shape[-1]
        Dskip = self.D.float()[:, None] * w
        if k == 1 and st is not None:  # a decode step: sigma_1 = p sigma_0 + w_1
            sigma = torch.addcmul(w, self.step_poles(), st.sigma)  # (B, D, 1) + (D, S) * (B, D, S)
            c = torch.linalg.vecdot(sigma, R)[..., None] + Dskip  # no (B, D, S) temporary
            return c, ModalSigmas(sigma[..., None])
        if k <= SHORT_BLOCK:
            powers, tri = self.li_toeplitz(k)
            sigmas = torch.einsum("dsji,bdi->bdsj", tri, w)
            if st is not None:
                sigmas = sigmas + powers * st.sigma[..., None]
            c = torch.einsum("bdsj,ds->bdj", sigmas, R) + Dskip
            pending = ModalSigmas(sigmas) if st is not None else None
            return c, pending
        # long block: FFT convolution with the impulse response, plus the decayed initial state
        h = self.li_impulse(k)
        size = 1 << (2 * k - 1).bit_length()
        c = torch.fft.irfft(torch.fft.rfft(w, n=size) * torch.fft.rfft(h, n=size), n=size)[..., :k]
        c = c + Dskip
        pending = None
        if st is not None:
            if bool(st.sigma.any()):  # a prompt's first chunk starts from zeros: nothing decays
                c = c + self._decayed_state_output(st.sigma, lam, R, k)
            pending = ModalInputs(st.sigma, w, lam)
        return c, pending

    def _li_scan(self, w: Tensor, sigma0: Tensor):
        """A verification block (w: (B, k, D), position-major) as k decode steps' recurrences,
        written into one buffer.

        Each sigma_j is the decode step's own `addcmul`, so a block's states and outputs are
        bit-identical to k single steps; and it reads (B, D, S) per position where the
        lower-triangular product would read a (D, S, k, k) table (2 MB at k = 13)."""
        p1 = self.step_poles()
        _, R = self.poles()
        B, k, D = w.shape
        sig = torch.empty(B, k, D, sigma0.shape[-1], device=w.device, dtype=sigma0.dtype)
        # per-position views made once (unbind), so the loop issues nothing but the k addcmuls
        prev = sigma0
        for w_j, sig_j in zip(w.unsqueeze(-1).unbind(1), sig.unbind(1)):
            prev = torch.addcmul(w_j, p1, prev, out=sig_j)
        c = torch.linalg.vecdot(sig, R) + self.D.float() * w  # (B, k, D), no (B, k, D, S) temporary
        return c, ModalSigmas(sig.permute(0, 2, 3, 1))

    @staticmethod
    def _decayed_state_output(sigma0: Tensor, lam: Tensor, R: Tensor, k: int) -> Tensor:
        """sum_s R_s p_s^j sigma0_s for j = 1..k (the powers as `pole_powers` factors)."""
        low, high = pole_powers(lam, k + 1)  # p^j = p^(a c) p^r, j = 1..k
        scaled = (sigma0 * R)[..., None] * high  # (B, D, S, A)
        out = torch.einsum("bdsa,dsr->bdar", scaled, low)
        return out.reshape(*out.shape[:2], -1)[..., 1: k + 1]

    def empty_inner(self, batch: int, device) -> FIRWindow | ModalState:
        if self.kind == "hcl":
            modes = self.log_poles.shape[1]
            return ModalState(torch.zeros(batch, self.hidden, modes, device=device))
        return FIRWindow(torch.zeros(batch, self.hidden, self.h.shape[-1] - 1, device=device))


class HyenaBlock(ResidualBlock):
    """A Hyena block; its mixer is projections -> featurizer -> q * filter(k * v) -> out proj."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer)
        D = cfg.hidden_size
        kind = self.kind = cfg.block_type(layer)
        self.projections = nn.Linear(D, 3 * D, bias=False)
        self.filter = HyenaFilter(cfg, kind)
        self.out_filter_dense = nn.Linear(D, D, bias=cfg.hyena_out_proj_bias)

    def mix(self, u: Tensor, st: HyenaState | None, t0, residual: Tensor,
            position: Tensor | None = None) -> tuple[Tensor, HyenaPending | None]:
        act = u.dtype
        p = linear(u, self.projections.weight).float()  # (B, k, 3D)
        block = (st is not None and 1 < u.shape[1] <= SHORT_BLOCK
                 and not torch.is_grad_enabled())  # a verification block: position-major filters
        with fp32_filters(p):  # autocast (bf16 training) must not round the filters or their FFTs
            if block:
                assert st is not None
                z, feat_pending = fir_block(p, st.feat, rows=self.filter.feat_rows())
            else:
                zc, feat_pending = fir_extend(p.transpose(1, 2),
                                              st.feat if st is not None else None,
                                              self.filter.feat_taps())
                z = zc.transpose(1, 2)
            z = z.to(act)
            # de-interleave: post-gate, pre-gate, value
            q, k, v = z[..., 0::3], z[..., 1::3], z[..., 2::3]
            w = (k * v).float()  # (B, k, D), either layout's strides
            if block:
                assert st is not None
                c, inner_pending = self.filter.inner_block(w, st.inner)
            else:
                cc, inner_pending = self.filter.inner(w.transpose(1, 2),
                                                      st.inner if st is not None else None)
                c = cc.transpose(1, 2)
        if self.filter.kind == "hcl":
            y = (q.float() * c).to(act)
        else:
            y = q * c.to(act)
        out = linear(y, self.out_filter_dense.weight, self.out_filter_dense.bias, residual)
        pending = HyenaPending(feat_pending, inner_pending) if st is not None else None
        return out, pending

    def empty_state(self, batch: int, capacity: int, dtype, device) -> HyenaState:
        D3 = self.projections.out_features
        K = self.filter.short_filter_weight.shape[-1]
        return HyenaState(FIRWindow(torch.zeros(batch, D3, K - 1, device=device)),
                          self.filter.empty_inner(batch, device))
