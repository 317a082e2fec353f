"""Multi-head attention with GPT-NeoX rotary embeddings (linear position interpolation)."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .kvcache import AttentionCall
from .layers import Derived, ResidualBlock, linear
from .state import (
    KVCache,
    KVPending,
    KVState,
    KVStaticWrite,
    Lengths,
    positions_index,
    same_position,
)

QUERY_CHUNK = 1024  # long prefill chunks attend in slices of queries to bound the score matrix


class RotaryEmbedding(nn.Module):
    """theta_i(t) = inv_freq_i * t / scale; `inv_freq` is a checkpoint buffer, kept in fp32."""

    def __init__(self, head_dim: int, base: float, scale: float) -> None:
        super().__init__()
        inv = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv, persistent=True)
        self.scale = scale
        self._derived = Derived()

    def table(self, n: int) -> tuple[Tensor, Tensor]:
        """cos and sin of the angles at positions 0..n-1 or more, (n', d_h / 2) fp32.

        In inference one table serves every step, so a decode step slices a row instead of
        recomputing it; positions get the same values in prefill and decode. It grows by
        doubling, at most 64k rows at a time (a few percent of the KV cache it indexes)."""

        def build(m: int) -> tuple[Tensor, Tensor]:
            t = torch.arange(m, device=self.inv_freq.device, dtype=torch.float32) / self.scale
            ang = t[:, None] * self.inv_freq.float()[None, :]
            return ang.cos(), ang.sin()

        return self._derived.covering("table", (self.inv_freq,), n, build,
                                      grow=lambda have: have + min(have, 1 << 16))

    def built_table(self) -> tuple[Tensor, Tensor]:
        """The table as `table` last built it, unchecked (a captured graph's form, which must not
        build it)."""
        return self._derived.peek("table")

    def forward(self, x: Tensor, t0: Lengths, position: Tensor | None = None) -> Tensor:
        """Rotate halves of x (B, k, ..., d_h); row b's positions are t0[b]..t0[b]+k-1.

        With `position` (the static form of a captured graph: the same t0 as a (B,) device
        tensor) the rows are gathered from a table that must already cover them (see
        graphs.py), and `t0` is not read."""
        B, k = x.shape[:2]
        if position is not None:
            cos, sin = self.built_table()
            pos = (position[:, None] + torch.arange(k, device=x.device)).reshape(-1)
            cos, sin = cos.index_select(0, pos), sin.index_select(0, pos)
            rows = B
        else:
            cos, sin = self.table(max(t0) + k)
            if same_position(t0):  # every row at the same position: one slice
                cos, sin = cos[t0[0]: t0[0] + k], sin[t0[0]: t0[0] + k]
                rows = 1
            else:
                _, pos = positions_index(t0, k, cos.device)
                flat = pos.reshape(-1)
                cos, sin = cos.index_select(0, flat), sin.index_select(0, flat)
                rows = B
        shape = (rows, k) + (1,) * (x.dim() - 3) + (cos.shape[-1],)
        cos, sin = cos.to(x.dtype).view(shape), sin.to(x.dtype).view(shape)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class MHA(nn.Module):
    """Causal softmax attention; `Wqkv` rows are [q; k; v], head-major inside each."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        D = cfg.hidden_size
        self.heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        self.Wqkv = nn.Linear(D, 3 * D, bias=cfg.qkv_proj_bias)
        self.out_proj = nn.Linear(D, D, bias=cfg.mha_out_proj_bias)
        self.rotary_emb = RotaryEmbedding(cfg.head_dim, cfg.rotary_emb_base, cfg.rope_scale)

    def forward(self, u: Tensor, st: KVState | None, t0: Lengths,
                residual: Tensor | None = None, position: Tensor | None = None
                ) -> tuple[Tensor, KVPending | KVStaticWrite | None]:
        """Attention output projected (plus `residual`), and the pending KV rows.

        `position` (a (B,) device tensor of the rows' positions) selects the static form of a
        captured graph: fixed shapes, positions read from the device, the KV write's books left
        to the graph runner."""
        B, k, _ = u.shape
        qkv = linear(u, self.Wqkv.weight, self.Wqkv.bias).view(B, k, 3, self.heads, self.head_dim)
        qk = self.rotary_emb.forward(qkv[:, :, :2], t0, position)  # q and k in one rotation
        q, key = qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2)  # (B, H, k, d_h)
        val = qkv[:, :, 2].transpose(1, 2)
        pending: KVPending | KVStaticWrite | None = None
        if st is None:
            o = F.scaled_dot_product_attention(q, key, val, is_causal=True)
        elif position is not None:
            o = attend_static(q, key, val, st.cache, position)
            pending = st.static_pending()
        else:
            st.check()
            version = st.cache.write(t0, key, val)
            pending = KVPending(st.cache, t0, version)
            o = attend_block(q, st.cache, t0)
        o = o.transpose(1, 2).reshape(B, k, -1)
        return linear(o, self.out_proj.weight, self.out_proj.bias, residual), pending

    def empty_state(self, batch: int, capacity: int, dtype: torch.dtype, device) -> KVState:
        return KVState(KVCache(batch, capacity, self.heads, self.head_dim, dtype, device),
                       (0,) * batch)


class AttentionBlock(ResidualBlock):
    kind = "attn"

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer)
        self.inner_mha_cls = MHA(cfg)

    def mix(self, h: Tensor, st: KVState | None, t0: Lengths, residual: Tensor,
            position: Tensor | None = None):
        return self.inner_mha_cls.forward(h, st, t0, residual, position)

    def empty_state(self, batch: int, capacity: int, dtype, device) -> KVState:
        return self.inner_mha_cls.empty_state(batch, capacity, dtype, device)


def attend_block(q: Tensor, cache: KVCache, t0: Lengths) -> Tensor:
    """Queries of row b at positions t0[b]..t0[b]+k-1 over that row's keys 0..t0[b]+k-1 (causal
    inside the block).

    The cache says which rows attend together (`KVCache.calls`): per size class of rows, runs of
    rows at nearby positions share one call over their furthest row's keys (the keys a row has
    not written masked); a run at one position attends as a single row does. A batch of prompts
    of very different lengths then costs what its rows need, not every row the longest row's
    keys."""
    k = q.shape[2]
    calls = cache.calls(t0, k)
    if len(calls) == 1 and isinstance(calls[0].rows, slice):  # every row in one call
        return _attend_call(q, calls[0])
    out = torch.empty_like(q)
    for c in calls:
        if isinstance(c.rows, slice):
            out[c.rows] = _attend_call(q[c.rows], c)
        else:
            out.index_copy_(0, c.rows, _attend_call(q.index_select(0, c.rows), c))
    return out


def _attend_call(q: Tensor, c: AttentionCall) -> Tensor:
    if same_position(c.t0):
        return attend(q, c.keys, c.vals, c.t0[0])
    return _attend_ragged(q, c.keys, c.vals, c.t0)


def low_precision_block(q: Tensor) -> bool:
    """A decode step or verification block with bf16 / fp16 activations on a CPU in inference:
    attended by `attend_products`, not by a fused kernel."""
    return (q.device.type == "cpu" and q.dtype != torch.float32 and q.shape[2] <= MASKED_BLOCK
            and not torch.is_grad_enabled())


def attend_products(q: Tensor, keys: Tensor, vals: Tensor, mask: Tensor | None = None
                    ) -> Tensor:
    """Attention of a short low-precision block as two batched products around an fp32 softmax
    (the last k keys causal for the block's own queries, or the additive `mask`).

    Why: on a CPU the fused kernels take bf16 decode steps at several times their fp32 time
    (a step's attention over 800 keys of 32 rows: 4.7 ms against 1.2 ms in fp32 on the AMD EPYC
    of docs/performance.md), while bf16 products run at the CPU's bf16 rate and read half the
    bytes of fp32 keys (0.6 ms). Scores round to bf16 as the model's other products do: the
    logits' distance to fp32's was the same as the fused kernel's. Steps and blocks take the
    same products, so a block still rounds as the steps it stands for."""
    k = q.shape[2]
    # keys are a slice of the cache: as the product's first operand they are read in place,
    # as a transposed second operand bf16 bmm would copy them first (3x slower)
    scores = torch.matmul(keys, q.transpose(-1, -2)).transpose(-1, -2).float()
    scores = scores.mul_(q.shape[-1] ** -0.5)
    if mask is not None:
        scores = scores.add_(mask)
    elif k > 1:  # the block's own keys: the cached causal triangle of `block_mask`
        scores[..., -k:].add_(block_mask(k, 0, torch.float32, q.device))
    return torch.matmul(scores.softmax(-1).to(q.dtype), vals)


def attend(q: Tensor, keys: Tensor, vals: Tensor, t: int) -> Tensor:
    """Queries at positions t..t+k-1 over keys 0..t+k-1 (rows all at position t)."""
    k = q.shape[2]
    if low_precision_block(q):
        return attend_products(q, keys[:, :, :t + k], vals[:, :, :t + k])
    if k == 1:
        return F.scaled_dot_product_attention(q, keys, vals)
    if t == 0 and k > MASKED_BLOCK:  # a prompt's first chunk: causal over its own keys only,
        # which the flash kernel does without a mask (2.2x faster than masked slices at 8k)
        return F.scaled_dot_product_attention(q, keys, vals, is_causal=True)
    if t >= SPLIT_MIN_PREFIX and _flash_lse is not None and q.device.type == "cpu":
        return _attend_split(q, keys, vals, t)
    if (k <= MASKED_BLOCK and t < SPLIT_MIN_PREFIX and q.device.type == "cpu"
            and not torch.is_grad_enabled()):
        return F.scaled_dot_product_attention(q, keys, vals,
                                              attn_mask=block_mask(k, t, q.dtype, q.device))
    outs = []
    for s in range(0, k, QUERY_CHUNK):
        e = min(k, s + QUERY_CHUNK)
        n_keys = t + e
        qpos = torch.arange(t + s, t + e, device=q.device)[:, None]
        mask = torch.arange(n_keys, device=q.device)[None, :] <= qpos
        outs.append(F.scaled_dot_product_attention(q[:, :, s:e], keys[:, :, :n_keys],
                                                   vals[:, :, :n_keys], attn_mask=mask))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


def ragged_mask(t0: Lengths, k: int, first_key: int, n_keys: int, dtype: torch.dtype,
                device) -> Tensor:
    """Additive mask (B, 1, k, n_keys) for keys first_key.. : query i of row b sees the keys at
    positions <= t0[b] + i (0), the others not (-inf)."""
    _, qpos = positions_index(t0, k, device)  # (B, k)
    kpos = torch.arange(first_key, first_key + n_keys, device=device)
    allowed = kpos[None, None, :] <= qpos[:, :, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~allowed, -math.inf)[:, None]


def _attend_ragged(q: Tensor, keys: Tensor, vals: Tensor, t0: Lengths) -> Tensor:
    """One attention call for rows at nearby positions (after speculative rounds), over keys
    0..max(t0)+k-1.

    Keys before the earliest row's block (every row has written them) need no mask; with a long
    such prefix on CPU they go through the mask-free flash kernel and only the few keys after it
    are masked per row, the two passes merged by their log-sum-exps (as `_attend_split`)."""
    k = q.shape[2]
    lo, hi = min(t0), max(t0) + k
    if low_precision_block(q):
        return attend_products(q, keys[:, :, :hi], vals[:, :, :hi],
                               ragged_mask(t0, k, 0, hi, torch.float32, q.device))
    if lo >= SPLIT_MIN_PREFIX and _flash_lse is not None and q.device.type == "cpu":
        tail = ragged_mask(t0, k, lo, hi - lo, q.dtype, q.device)
        o1, l1 = _flash_lse(q, keys[:, :, :lo], vals[:, :, :lo])[:2]
        o2, l2 = _flash_lse(q, keys[:, :, lo:], vals[:, :, lo:], attn_mask=tail)[:2]
        return _merge(o1, l1, o2, l2, q.dtype)
    mask = ragged_mask(t0, k, 0, hi, q.dtype, q.device)
    return F.scaled_dot_product_attention(q, keys, vals, attn_mask=mask)


MASKED_BLOCK = 64  # verification blocks up to this length take their mask from `block_mask`
_BLOCK_MASKS: dict[tuple, Tensor] = {}


def block_mask(k: int, t0: int, dtype: torch.dtype, device) -> Tensor:
    """The additive mask of k queries at t0.. over keys 0..t0+k-1 (t0 < SPLIT_MIN_PREFIX), as a
    view: zeros, then -inf above the diagonal of the block's own k x k keys.

    One (k, SPLIT_MIN_PREFIX + k) buffer per block length holds the triangle at column
    SPLIT_MIN_PREFIX; the mask for t0 is the window starting t0 columns before it. A block then
    builds no mask at all (a quarter of its attention time at 1k context on CPU). CPU inference
    only: a buffer made under inference_mode cannot take part in autograd, and CUDA's
    memory-efficient kernel faults on a mask view that starts off its 16-byte alignment."""
    key = (k, dtype, torch.device(device))
    buf = _BLOCK_MASKS.get(key)
    if buf is None:
        buf = torch.zeros(k, SPLIT_MIN_PREFIX + k, dtype=dtype, device=device)
        buf[:, SPLIT_MIN_PREFIX:].masked_fill_(
            torch.ones(k, k, dtype=torch.bool, device=device).triu(1), -math.inf)
        _BLOCK_MASKS[key] = buf
    return buf[:, SPLIT_MIN_PREFIX - t0:]


def attend_static(q: Tensor, key: Tensor, val: Tensor, cache: KVCache, t0: Tensor) -> Tensor:
    """Write row b's block at device positions t0[b].. and attend over the whole cache under a
    mask.

    Every shape is fixed by the cache's capacity, so a CUDA graph can replay it at any positions;
    masked rows weigh exactly zero. The cache's version bookkeeping is the graph runner's job."""
    B, H, k, dh = q.shape
    pos = t0[:, None] + torch.arange(k, device=q.device)  # (B, k)
    where = pos[:, None, :, None].expand(B, H, k, dh)
    cache.k.scatter_(2, where, key)
    cache.v.scatter_(2, where, val)
    mask = torch.arange(cache.capacity, device=q.device)[None, None, :] <= pos[:, :, None]
    return F.scaled_dot_product_attention(q, cache.k, cache.v, attn_mask=mask[:, None])


# CPU flash attention that also returns the log-sum-exp of each query's scores (private aten op).
_flash_lse = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
SPLIT_MIN_PREFIX = 2048  # below this the masked kernel is as fast


def _attend_split(q: Tensor, keys: Tensor, vals: Tensor, t0: int) -> Tensor:
    """The block's attention as two mask-free passes merged by their log-sum-exps.

    Every query sees all t0 earlier keys (no mask) and the block's own keys causally (a square,
    so `is_causal` is exact). Skipping the (k x L) mask makes long prefill 1.6x faster on CPU and
    keeps its memory O(k) instead of O(k L).
    """
    assert _flash_lse is not None
    o1, l1 = _flash_lse(q, keys[:, :, :t0], vals[:, :, :t0])[:2]
    o2, l2 = _flash_lse(q, keys[:, :, t0:], vals[:, :, t0:], is_causal=True)[:2]
    return _merge(o1, l1, o2, l2, q.dtype)


def _merge(o1: Tensor, l1: Tensor, o2: Tensor, l2: Tensor, dtype: torch.dtype) -> Tensor:
    """Two attention passes over disjoint keys as one, weighted by their log-sum-exps."""
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m)[..., None], torch.exp(l2 - m)[..., None]
    return ((o1.float() * w1 + o2.float() * w2) / (w1 + w2)).to(dtype)
