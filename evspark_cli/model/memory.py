"""How much memory a model and a batch of rows need, from the config alone, and how much there is.

Estimates are made before anything is allocated, so that a run that cannot fit is refused with
one line instead of failing (or swapping) after minutes. They count what the engine holds:

- parameters, in the weights' dtype;
- per row, the fixed-size state (FIR windows and modal states, fp32) and the KV cache
  (2 x hidden per attention layer per position, in the activations' dtype) for the run's context;
- per verification block, the per-position states `commit` slices (widened FIR buffers, modal
  states per position) and the block's activations;
- the prompt being prefilled (one chunk's activations and FFT buffers) and the one-row copies
  a batch makes while rows join it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError
from .config import ModelConfig

FP32 = 4


def _kinds(cfg: ModelConfig) -> list[str]:
    return [cfg.block_type(i) for i in range(cfg.num_layers)]


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters of a StripedHyena 2 with this config (as `StripedHyena(cfg)` would hold)."""
    D, F, V = cfg.hidden_size, cfg.mlp_size, cfg.vocab_size
    n = V * D + D  # tied embedding, final norm
    for kind in _kinds(cfg):
        n += 2 * D + 3 * D * F  # two norms, gated MLP
        if kind == "attn":
            n += 3 * D * D + D * D + D  # Wqkv, out_proj + bias
            n += 3 * D if cfg.qkv_proj_bias else 0
            n += cfg.head_dim // 2  # rotary inv_freq (a buffer)
            continue
        n += 3 * D * D + D * D + (D if cfg.hyena_out_proj_bias else 0)
        n += 3 * D * cfg.short_filter_length
        if kind == "hcs":
            n += cfg.hcs_filter_groups * cfg.hcs_filter_length
        elif kind == "hcm":
            n += cfg.hcm_filter_groups * cfg.hcm_filter_length + D
        else:
            n += 2 * D * cfg.state_size + D
    return n


def fixed_state_bytes(cfg: ModelConfig) -> int:
    """One row's FIR windows and modal states (fp32; the same at any context)."""
    D, n = cfg.hidden_size, 0
    for kind in _kinds(cfg):
        if kind == "attn":
            continue
        n += 3 * D * (cfg.short_filter_length - 1)
        n += D * {"hcs": cfg.hcs_filter_length - 1, "hcm": cfg.hcm_filter_length - 1,
                  "hcl": cfg.state_size}[kind]
    return n * FP32


def kv_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype) -> int:
    """One row's KV cache per position: keys and values of every attention layer."""
    item = torch.empty((), dtype=dtype).element_size()
    return sum(2 * cfg.hidden_size * item for kind in _kinds(cfg) if kind == "attn")


def block_bytes(cfg: ModelConfig, rows: int, k: int) -> int:
    """A verification block of k positions for `rows` rows: the per-position states it keeps for
    `commit` and its largest activations (fp32 upper bound)."""
    D, F, V = cfg.hidden_size, cfg.mlp_size, cfg.vocab_size
    per_pos = 0
    for kind in _kinds(cfg):
        if kind == "attn":
            continue
        per_pos += 3 * D + D  # widened featurizer and inner FIR buffers grow by a column
        per_pos += D * cfg.state_size if kind == "hcl" else 0  # modal state per position
    widths = 3 * D * (cfg.short_filter_length - 1) + D * max(cfg.hcm_filter_length, 1)
    activations = 4 * D + 2 * F + V + len(cfg.drafter_layers) * D
    return FP32 * rows * (k * (per_pos + activations) + widths)


def prefill_bytes(cfg: ModelConfig, chunk: int) -> int:
    """A prefill chunk's transient memory: activations and the LI layers' FFT buffers."""
    D, F = cfg.hidden_size, cfg.mlp_size
    fft = 2 * (2 * chunk) * D * 2  # complex spectra of w and h at twice the chunk, fp32 pairs
    return FP32 * chunk * (6 * D + 2 * F + cfg.vocab_size) + FP32 * fft


@dataclass(frozen=True)
class RunMemory:
    """The estimate for a run: parameters, rows of state at a context, and transients."""

    parameters: int
    per_row: int
    transient: int

    def total(self, rows: int) -> int:
        return self.parameters + rows * self.per_row + self.transient


def run_memory(cfg: ModelConfig, weight_dtype: torch.dtype, act_dtype: torch.dtype,
               context: int, block: int, rows: int = 1, with_parameters: bool = True
               ) -> RunMemory:
    """Memory of decoding `rows` rows of up to `context` positions with blocks of `block`."""
    item = torch.empty((), dtype=weight_dtype).element_size()
    params = parameter_count(cfg) * item if with_parameters else 0
    # a row's state; plus, once per run, the prompt being prefilled and its fork (2 more rows)
    per_row = fixed_state_bytes(cfg) + kv_bytes_per_token(cfg, act_dtype) * context
    transient = (2 * per_row + block_bytes(cfg, rows, block)
                 + prefill_bytes(cfg, min(cfg.prefill_chunk, max(context, 1))))
    return RunMemory(params, per_row, transient)


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory this process may still use: free GPU memory on CUDA; on a CPU the smaller of the
    kernel's MemAvailable and the cgroup's limit minus its usage (a SLURM job's or container's
    share). None when nothing can be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        return int(free)
    found: list[int] = []
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            found.append(max(int(limit) - usage, 0))
    env = os.environ.get("EVSPARK_MAX_MEMORY")
    if env:
        found.append(parse_size(env))
    return min(found) if found else None


def parse_size(text: str) -> int:
    """'12G', '512M', '2.5GiB', '1000000' -> bytes (binary units)."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in "KMGT" and t[-1:] else t
    try:
        value = float(number)
    except ValueError:
        raise InputError(f"memory size {text!r}: use a number with K, M, G or T") from None
    if not value > 0:
        raise InputError(f"memory size {text!r} must be positive")
    return int(value * scale)


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def check_batch_fits(cfg: ModelConfig, weight_dtype: torch.dtype, act_dtype: torch.dtype,
                     rows: int, context: int, block: int, budget: int | None,
                     loaded: bool = True) -> None:
    """Refuse (InputError, one line) a batch whose state at `context` would not fit in `budget`
    bytes, naming the largest batch that fits. `loaded`: the parameters are already in memory
    (and so already out of `budget`)."""
    if budget is None:
        return
    est = run_memory(cfg, weight_dtype, act_dtype, context, block, rows, with_parameters=not loaded)
    need = est.total(rows)
    if need <= budget:
        return
    fits = largest_batch(cfg, weight_dtype, act_dtype, context, block, budget, loaded)
    hint = (f"the largest batch that fits is {fits} (--batch-size {fits})" if fits
            else "not even one row fits: use a shorter --prompt-tail or fewer tokens")
    raise InputError(f"a batch of {rows} rows at a context of {context:,} tokens needs about "
                     f"{gib(need)} of memory, {gib(budget)} is available; {hint}")


def largest_batch(cfg: ModelConfig, weight_dtype: torch.dtype, act_dtype: torch.dtype,
                  context: int, block: int, budget: int, loaded: bool = True) -> int:
    """The largest number of rows whose estimate fits in `budget` (0 if none)."""
    lo, hi = 0, 1
    fits = lambda r: run_memory(cfg, weight_dtype, act_dtype, context, block, r,  # noqa: E731
                                with_parameters=not loaded).total(r) <= budget
    while fits(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
