"""Shared pieces of every block: RMSNorm, gated MLP, and the pre-norm residual wrapper."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


class Derived:
    """Tensors derived from parameters (fused weights, fp32 filter taps), cached for inference.

    An entry is reused while every source is the same tensor (object, storage) at the same
    version counter, so any update or move of the weights invalidates it; with autograd on
    (training) everything is rebuilt so gradients flow. A decode step looks entries up dozens of
    times, so the check is a few attribute reads.
    """

    def __init__(self) -> None:
        self._cache: dict[str, tuple[tuple, Any]] = {}

    def get(self, name: str, sources: tuple[Tensor, ...], build: Callable[[], Any]) -> Any:
        if torch.is_grad_enabled():
            return build()
        if torch.compiler.is_compiling():  # traced once: what is cached at tracing is what runs
            hit = self._cache.get(name)
            return hit[1] if hit is not None else build()
        # inference tensors (a model moved or loaded under inference_mode) have no version
        # counter; they cannot be updated in place outside inference_mode, so (object,
        # storage) identifies them. Uncached, a captured graph would find no RoPE table.
        sig = tuple((id(t), -1 if t.is_inference() else t._version, t.data_ptr())
                    for t in sources)
        hit = self._cache.get(name)
        if hit is not None and hit[0] == sig:
            return hit[1]
        if len(self._cache) > 64:
            self._cache.clear()
        value = build()
        self._cache[name] = (sig, value)
        return value

    def covering(self, name: str, sources: tuple[Tensor, ...], n: int,
                 build: Callable[[int], Any], grow: Callable[[int], int]) -> Any:
        """A cached entry covering at least n positions (`_length`), rebuilt for
        max(n, grow(positions held)) when more are asked for (LI impulse, RoPE table)."""
        value = self.get(name, sources, lambda: build(n))
        have = _length(value)
        if have < n:
            self.drop(name)
            value = self.get(name, sources, lambda: build(max(n, grow(have))))
        return value

    def peek(self, name: str) -> Any:
        """The cached value as it is, unchecked (for captured graphs, which built it beforehand)."""
        hit = self._cache.get(name)
        if hit is None:
            raise KeyError(f"{name} was not built before the graph was recorded")
        return hit[1]

    def drop(self, name: str) -> None:
        self._cache.pop(name, None)

    def values(self) -> list[Any]:
        """Every cached value (what a recorded graph reads, and keeps alive)."""
        return [value for _, value in self._cache.values()]


def derived_values(module: nn.Module) -> list[Any]:
    """The cached derived values of `module` and of every module inside it."""
    return [value for m in module.modules() for d in vars(m).values() if isinstance(d, Derived)
            for value in d.values()]


def input_major(module: nn.Module, extra: tuple[Tensor, ...] = ()) -> None:
    """Store the CPU weights of `module`'s projections (and the (out, in) matrices in `extra`)
    input-major: the same values in (in, out) row-major storage, seen through `.t()`.

    Why: for the 1-16-row products of decoding and verification, `linear` then splits each
    product over the cores by column slices of that storage; on the AMD EPYC this layout is
    measured on, even unsplit, MKL streams it from DRAM faster than the (out, in) layout. This
    depends on the CPU: on an Intel Xeon the (out, in) layout is the faster one
    (`benchmarks/weight_layout.py`, `benchmarks/results/weight_layout.json`). Names, values
    and `state_dict()` are unchanged (checkpoints are written `.contiguous()`). fp32 CPU weights
    only: with bf16 weights this layout makes a CPU step ~15 % slower, and CUDA does not need it.
    """
    weights = [m.weight for m in module.modules() if isinstance(m, nn.Linear)] + list(extra)
    with torch.no_grad():
        for w in weights:
            if (w.device.type == "cpu" and w.dtype == torch.float32 and w.dim() == 2
                    and w.is_contiguous()):
                w.data = w.data.t().contiguous().t()


SPLIT_ROWS = 16  # products of at most this many rows are split over the cores


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           residual: Tensor | None = None) -> Tensor:
    """`F.linear` (plus `residual`, when given), except for a few rows (decode steps,
    verification blocks) against an input-major CPU weight: those run as one `bmm` (`baddbmm`
    with a bias) over n column slices of the (in, out) storage, which ATen spreads over n cores.

    Why: MKL computes such skinny products on one core, at a third to a half of the memory
    bandwidth two cores reach (`benchmarks/cache_cliff.py`, `weight_layout.py`). Each output is
    still one dot product over the whole input, so the result does not depend on n. A product
    of several rows comes out slice-major, (n, rows, d_out / n); with a `residual` the add
    itself puts each row's slices side by side, so a residual branch needs no separate copy."""
    parts = _split_product(x, weight, bias)
    if parts is None:
        y = F.linear(x, weight, bias)
    elif parts.shape[1] == 1:
        y = parts.view(*x.shape[:-1], weight.shape[0])
    elif residual is not None and residual.is_contiguous():
        n, rows, part = parts.shape
        return torch.add(residual.view(rows, n, part), parts.transpose(0, 1)).view(residual.shape)
    else:
        y = parts.transpose(0, 1).reshape(*x.shape[:-1], weight.shape[0])
    return y if residual is None else residual + y


def linear_halves(x: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
    """`linear(x, weight).chunk(2, dim=-1)`. Split over two cores, the halves are the product's
    two slices as they come out (views), where a block of rows would otherwise be copied into
    row-major order first (the fused MLP input [l1; l2])."""
    parts = _split_product(x, weight, None)
    if parts is not None and parts.shape[0] == 2:
        shape = (*x.shape[:-1], parts.shape[-1])
        return parts[0].view(shape), parts[1].view(shape)
    a, b = linear(x, weight).chunk(2, dim=-1)
    return a, b


def _split_product(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """x @ weight.T (+ bias) as (n, rows, d_out / n) column slices, or None when the product
    is not split (`_column_slices` is 1)."""
    d_in = x.shape[-1]
    rows = x.numel() // d_in if d_in else 0
    n = _column_slices(weight, rows, x.device) if rows else 1
    if n == 1:
        return None
    d_out = weight.shape[0]
    part = d_out // n
    parts = weight.as_strided((n, d_in, part), (part, d_out, 1))  # column slices, no copy
    xs = x.reshape(1, rows, d_in).expand(n, rows, d_in)
    return torch.bmm(xs, parts) if bias is None else torch.baddbmm(bias.view(n, 1, part), xs, parts)


def _column_slices(weight: Tensor, rows: int, device: torch.device) -> int:
    """How many column slices a product splits into (1: plain F.linear)."""
    if device.type != "cpu" or rows > SPLIT_ROWS or not is_input_major(weight):
        return 1
    n, d_out = _threads(), weight.shape[0]
    while n > 1 and (d_out % n or d_out // n < 32):
        n -= 1
    return n


def _threads() -> int:
    return torch.get_num_threads()


def threads_constant_for_compile() -> None:
    """Make the thread count a constant to torch.compile (a traced call would break the graph;
    see compile_probe.py). Done when a model first compiles, not at import: the decorator
    imports torch._dynamo, a second of every command's start."""
    global _threads, _compile_ready
    if not _compile_ready:
        _threads = torch.compiler.assume_constant_result(_threads)
        _compile_ready = True


_compile_ready = False


def is_input_major(weight: Tensor) -> bool:
    """An (out, in) matrix whose storage is (in, out) row-major."""
    return weight.dim() == 2 and weight.stride() == (1, weight.shape[0])


def cat_rows(weights: list[Tensor]) -> Tensor:
    """Stack (out, in) weights along out, keeping an input-major layout if they all have one."""
    if all(is_input_major(w) for w in weights):
        return torch.cat([w.t() for w in weights], dim=1).t()
    return torch.cat(weights)


def _length(value: Any) -> int:
    """Positions held by a growing cache entry: a (D, n) impulse or a (cos, sin) pair of (n, d)."""
    return value[0].shape[0] if isinstance(value, tuple) else value.shape[-1]


class RMSNorm(nn.Module):
    """g * x / (||x||_2 / sqrt(D) + eps): eps outside the square root, as Evo 2."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.scale, self.eps)


def rms_norm(x: Tensor, scale: Tensor, eps: float) -> Tensor:
    """Evo 2's RMSNorm as a function (the decode step calls it without module dispatch)."""
    rms = torch.linalg.vector_norm(x, dim=-1, keepdim=True) * x.shape[-1] ** -0.5
    return scale * (x / (rms + eps))


def gelu(x: Tensor) -> Tensor:
    """Exact (erf) GELU, computed by ATen's own vectorised kernel whatever x's layout.

    Why: on CPU `F.gelu` hands a contiguous fp32 or bf16 tensor to a oneDNN primitive, and a
    strided one to ATen's kernel. A decode step's one-row activations are contiguous, a
    verification block's (a chunk of the fused MLP product) are not, so through `F.gelu` alone
    the two would take different kernels and round differently, and the oneDNN call costs
    several times ATen's inside a decode step. Seen as a transposed (2, n/2) grid the same
    memory is strided, so every call takes ATen's kernel, whose output keeps that memory order.
    Elsewhere (CUDA, odd sizes, training under autograd) this is `F.gelu` itself."""
    n = x.numel()
    if x.device.type != "cpu" or x.requires_grad or not x.is_contiguous() or n % 2 or n == 0:
        return F.gelu(x)
    y = F.gelu(x.as_strided((2, n // 2), (1, 2)))
    if y.stride() != (1, 2):  # an output not in the input's memory order: read it back in order
        return y.t().reshape(x.shape)
    return y.as_strided(x.shape, x.stride(), 0)


class GatedMLP(nn.Module):
    """l3(act(l1 x) * l2 x); act is GELU, or identity past layer 0 with Evo 2's activation quirk."""

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        D, Fdim = cfg.hidden_size, cfg.mlp_size
        self.l1 = nn.Linear(D, Fdim, bias=False)
        self.l2 = nn.Linear(D, Fdim, bias=False)
        self.l3 = Projection(Fdim, D, bias=False)
        self.gelu = layer == 0 or not cfg.evo2_style_activations
        self._derived = Derived()

    def forward(self, x: Tensor, residual: Tensor | None = None) -> Tensor:
        """The MLP's output, added to `residual` when one is given."""
        return linear(self._gated(x), self.l3.weight, residual=residual)

    def forward_hooked(self, x: Tensor) -> Tensor:
        """`forward` without a residual, calling `l3` as a module (its forward hooks fire)."""
        return self.l3(self._gated(x))

    def _gated(self, x: Tensor) -> Tensor:
        """act(l1 x) * l2 x, the input of l3."""
        if not torch.is_grad_enabled():
            # inference: one fused [l1; l2] product streams both weights in one pass
            w = self._derived.get("l12", (self.l1.weight, self.l2.weight),
                                  lambda: cat_rows([self.l1.weight, self.l2.weight]))
            a, b = linear_halves(x, w)
        else:
            a, b = F.linear(x, self.l1.weight), F.linear(x, self.l2.weight)
        return (gelu(a) if self.gelu else a) * b


class Projection(nn.Linear):
    """An `nn.Linear` computed by `linear`, the product the model's own passes compute, so that
    a forward hook on it (Evo 2's embeddings hook `blocks.N.mlp.l3`) sees the model's numbers."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class ResidualBlock(nn.Module):
    """Pre-norm residual block: u + mix(norm(u)), then + MLP(norm(.)). Subclasses define `mix`."""

    kind: str

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.pre_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.post_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.mlp = GatedMLP(cfg, layer)

    def mix(self, h: Tensor, st, t0, residual: Tensor,
            position: Tensor | None):  # pragma: no cover - abstract
        """residual + the mixer's output for h, and the layer's pending state."""
        raise NotImplementedError

    def forward(self, x: Tensor, st, t0, position: Tensor | None = None):
        """`t0`: each row's position before x, one int per row. `position`, when given, is the
        static form of a recorded graph: the same positions as a (B,) device tensor, which
        attention reads instead of `t0`. Only attention reads either."""
        # norms and MLP called as functions: no module dispatch on the per-token path; the
        # residual adds happen inside the output projections (`linear(..., residual=x)`)
        x, pending = self.mix(rms_norm(x, self.pre_norm.scale, self.pre_norm.eps), st, t0, x,
                              position)
        return self.mlp.forward(rms_norm(x, self.post_norm.scale, self.post_norm.eps), x), pending

    def forward_hooked(self, x: Tensor, t0, keep: Callable[[str, Tensor], None]) -> Tensor:
        """The stateless `forward`, calling the norms and the MLP's `l3` as modules (forward
        hooks on them fire) and telling `keep(name, tensor)` the block's inner activations:
        "pre_norm", "post_norm", "mlp" (l3's output) and "" (the block's output). The same
        products as `forward`, so the output is the same tensor bit for bit."""
        h = self.pre_norm(x)
        keep("pre_norm", h)
        x, _ = self.mix(h, None, t0, x, None)
        h = self.post_norm(x)
        keep("post_norm", h)
        m = self.mlp.forward_hooked(h)
        keep("mlp", m)
        out = x + m
        keep("", out)
        return out
