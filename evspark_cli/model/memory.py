"""How much memory a model and a batch of rows need, from the config alone, and how much there is.

Estimates are made before anything is allocated, so that a run that cannot fit is refused with
one line instead of failing (or swapping) after minutes. They count what the engine holds:

- parameters, in the weights' dtype;
- per row, the fixed-size state (FIR windows and modal states, fp32) and the KV cache
  (2 x hidden per attention layer per position, in the activations' dtype) for the run's context;
- per verification block, the per-position states `commit` slices (widened FIR buffers, modal
  states per position) and the block's activations;
- the prompt being prefilled (one chunk's activations, FFT buffers and per-position states) and
  its state, which its record's samples fork from while they decode;
- the rotary tables of the attention layers, which cover every position reached;
- what the process holds before any of it (the interpreter, torch, the model: its resident
  set), which a fixed limit (`--max-memory`) must also pay for.

Loading is estimated too (`check_load_fits`): a config that asks for a model far larger than
its weights file, or than the machine, is refused before a single tensor is built. The budget
(`memory_budget`) is the memory available, or less where the `max_memory` setting or
EVSPARK_MAX_MEMORY say so, and every refusal names the estimate and which limit it broke.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ..cgroups import memory_limits
from ..errors import InputError, ModelError, SettingError, literal
from .config import ModelConfig
from .kvcache import class_layout_bytes

FP32 = 4

MAX_MEMORY = "max_memory"
"""The setting that caps a run's memory (the command line's `--max-memory`)."""


def _kinds(cfg: ModelConfig) -> list[str]:
    return cfg.layer_pattern


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters of a StripedHyena 2 with this config (as `StripedHyena(cfg)` would hold)."""
    D, F, V = cfg.hidden_size, cfg.mlp_size, cfg.vocab_size
    n = V * D + D  # tied embedding, final norm
    for kind in _kinds(cfg):
        n += 2 * D + 3 * D * F  # two norms, gated MLP
        if kind == "attn":
            n += 3 * D * D + D * D  # Wqkv, out_proj
            n += D if cfg.mha_out_proj_bias else 0
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


ROPE_STEP = 1 << 16
"""A rotary table grows by doubling up to this many rows, then by this many (attention.py)."""


def rope_rows(positions: int) -> int:
    """Rows of a rotary table that covers `positions`, as it grows (doubling, then steps)."""
    if positions <= ROPE_STEP:
        return 1 << max(0, positions - 1).bit_length()
    return -(-positions // ROPE_STEP) * ROPE_STEP


def rope_bytes(cfg: ModelConfig, positions: int) -> int:
    """Every attention layer's rotary table (cos and sin, fp32) covering `positions`, plus the
    angles of the one being rebuilt as the table grows."""
    layers = sum(1 for kind in _kinds(cfg) if kind == "attn")
    if not layers:
        return 0
    half = cfg.head_dim // 2
    return FP32 * rope_rows(positions) * half * (2 * layers + 1)


def prefill_bytes(cfg: ModelConfig, chunk: int) -> int:
    """A prefill chunk's transient memory: activations and the LI layers' FFT buffers."""
    D, F = cfg.hidden_size, cfg.mlp_size
    fft = 2 * (2 * chunk) * D * 2  # complex spectra of w and h at twice the chunk, fp32 pairs
    return FP32 * chunk * (6 * D + 2 * F + cfg.vocab_size) + FP32 * fft


ALLOCATOR_SLACK = 0.08
"""What the allocator holds beyond the live tensors (freed blocks it keeps, fragmentation), as a
fraction of a run's state and transients: a resident peak 3 % above the live count was measured
on a CPU (benchmarks/memory_check.py), so a run planned to a limit stays under it."""


@dataclass(frozen=True)
class RunMemory:
    """The estimate for a run: parameters, rows of state, and transients.

    Dense layout (`needs` None): every row at the run's longest context, `per_row` each. Class
    layout (kvcache.py, CPU): each row its fixed state (`fixed_row`) plus its own KV need, the
    r rows being the r largest `needs` (the worst batch the run can hold), in shelves.

    `transient` is held beside the rows all along (a record's prefilled row, the rotary
    tables); `moments` are what one phase holds for a while and frees before the next starts
    (a round's block, a prompt's prefill chunk; in the class layout also a shelf's growth as
    rows join), so only the largest of them counts: a prefill runs between rounds, and rows
    join after their prefill has finished."""

    parameters: int
    per_row: int
    transient: int
    fixed_row: int = 0
    kv_position: int = 0
    needs: tuple[int, ...] | None = None  # each job's KV positions, largest first
    moments: tuple[int, ...] = ()  # a round's block, a prefill chunk: never at the same time

    def total(self, rows: int) -> int:
        if self.needs is None:
            run = rows * self.per_row + self.transient + max(self.moments, default=0)
        else:
            uniform = len(set(self.needs)) <= 1  # every job needs the same positions
            held, growth = class_layout_bytes(self.needs[:rows], self.kv_position, uniform)
            run = (rows * self.fixed_row + held + self.transient
                   + max((growth,) + self.moments))
        return self.parameters + math.ceil(run * (1 + ALLOCATOR_SLACK))


def run_memory(cfg: ModelConfig, weight_dtype: torch.dtype, act_dtype: torch.dtype,
               context: int, block: int, rows: int = 1, with_parameters: bool = True,
               needs: Sequence[int] | None = None, chunk: int | None = None) -> RunMemory:
    """Memory of decoding `rows` rows of up to `context` positions with blocks of `block`;
    with `needs` (each job's KV positions), rows in the class layout (`RunMemory`); `chunk`:
    the prefill chunk (`StripedHyena.prefill_chunk`; default the config's)."""
    item = torch.empty((), dtype=weight_dtype).element_size()
    params = parameter_count(cfg) * item if with_parameters else 0
    fixed, per_position = fixed_state_bytes(cfg), kv_bytes_per_token(cfg, act_dtype)
    per_row = fixed + per_position * context
    chunk = min(chunk or cfg.prefill_chunk, max(context, 1))
    # beside the rows: the record whose samples are decoding keeps its prefilled state (one
    # row; the dense layout's at the run's capacity, so a new batch is copied once). For a
    # while: a prompt's prefill holds its chunk's activations and the chunk's per-position
    # states (a block of `chunk` positions); a round holds its block's
    transient = per_row + rope_bytes(cfg, context)
    moments = (block_bytes(cfg, rows, block),
               prefill_bytes(cfg, chunk) + block_bytes(cfg, 1, chunk))
    return RunMemory(params, per_row, transient, fixed, per_position,
                     None if needs is None else tuple(sorted(needs, reverse=True)), moments)


def process_bytes() -> int:
    """Memory this process holds now: its resident set (the interpreter, torch and its
    libraries, a loaded model), which a fixed limit (`max_memory`) must also pay for."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):  # not Linux: the peak so far is the best known
        import resource
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _limits(device: torch.device | str = "cpu") -> list[tuple[int, str]]:
    """Every limit on this process's memory that can be read, each with its name: on a CPU the
    kernel's MemAvailable and what each level of this process's own cgroup leaves (cgroups.py),
    which already exclude what the process holds; EVSPARK_MAX_MEMORY as given (`fixed_limit`)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        free, _ = torch.cuda.mem_get_info(dev)
        found = [(int(free), "free GPU memory")]
    else:
        found = []
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    found.append((int(line.split()[1]) * 1024, "available memory"))
        except (OSError, ValueError, IndexError):
            pass
        found.extend((c.left, "available memory (cgroup)") for c in memory_limits())
    env = os.environ.get("EVSPARK_MAX_MEMORY")
    if env:
        found.append((parse_size(env, None), "EVSPARK_MAX_MEMORY"))
    return found


FIXED_LIMITS = (MAX_MEMORY, "EVSPARK_MAX_MEMORY")
"""Limits that count the whole process (what it already holds included), unlike the memory
still available, which is read live."""


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """Memory this process may still use: free GPU memory on CUDA; on a CPU the smaller of the
    kernel's MemAvailable and the cgroup's limit minus its usage (a SLURM job's or container's
    share); never more than EVSPARK_MAX_MEMORY. None when nothing can be read."""
    found = _limits(device)
    return min(b for b, _ in found) if found else None


@dataclass(frozen=True)
class Budget:
    """The bytes a run may use (None: unknown, nothing is refused) and the limit that says so,
    named in a refusal ("available memory", "max_memory less the model"...). `setting` is the
    setting the limit came from (`max_memory`), which `source` names by its Python name."""

    bytes: int | None
    source: str = "available memory"
    setting: str | None = None

    def refusal(self, need: int, what: str) -> str | None:
        """A one-line reason to refuse `what` needing `need` bytes, or None when it fits."""
        reason = self.refusal_template(need, what)
        return None if reason is None else reason.format(self.setting)

    def refusal_template(self, need: int, what: str, slot: int = 0) -> str | None:
        """`refusal` as an error template (errors.py) with the limit's setting, when it is one,
        as `{slot}`: the error names `max_memory` at that position, e.g.
        `ModelError(reason + "; ...", "max_memory")` for slot 0."""
        if self.bytes is None or need <= self.bytes:
            return None
        return (literal(f"{what} needs about {gib(need)} of memory, ") + self.named(slot)
                + literal(f" is {gib(self.bytes)}"))

    def named(self, slot: int = 0) -> str:
        """`source` as an error template, its setting (if any) as `{slot}`."""
        text = literal(self.source)
        return text if self.setting is None else text.replace(self.setting, f"{{{slot}}}", 1)


def memory_budget(device: torch.device | str = "cpu",
                  max_memory: str | int | None = None) -> Budget:
    """What a run on `device` may still allocate: the tightest of the readable limits
    (`_limits`) and `max_memory` (a size such as "8G", or bytes). On a CPU a fixed limit
    (`FIXED_LIMITS`) counts the whole process, so what the process holds now (`process_bytes`:
    the interpreter, torch, a loaded model) is taken off it."""
    return _tightest(device, max_memory, 0)


def run_budget(device: torch.device | str, max_memory: str | int | None,
               loaded_bytes: int) -> Budget:
    """What a run may still use once its model (`loaded_bytes`) is in memory: as
    `memory_budget`; on a GPU a fixed limit is taken as the GPU's, less the model there."""
    return _tightest(device, max_memory, loaded_bytes)


def _tightest(device: torch.device | str, max_memory: str | int | None,
              loaded_bytes: int) -> Budget:
    found = _limits(device)
    if max_memory is not None:
        limit = parse_size(max_memory) if isinstance(max_memory, str) else int(max_memory)
        if limit <= 0:
            raise SettingError.of("max_memory", f"must be positive, got {max_memory!r}")
        found.append((limit, MAX_MEMORY))
    if not found:
        return Budget(None)
    on_cpu = torch.device(device).type == "cpu"
    held = process_bytes() if on_cpu else loaded_bytes
    if on_cpu and max_memory is not None and found[-1][0] <= held:
        raise SettingError.of(MAX_MEMORY, f"{max_memory}: less than this process already holds "
                                          f"({gib(held)}: Python, torch and what is loaded)")
    what = f"the {gib(held)} this process holds" if on_cpu else "the model"
    budgets = [(max(n - held, 0), f"{source} less {what}") if source in FIXED_LIMITS and held
               else (n, source) for n, source in found]
    nbytes, source = min(budgets, key=lambda f: f[0])
    return Budget(nbytes, source, MAX_MEMORY if source.startswith(MAX_MEMORY) else None)


def parse_size(text: str | int, setting: str | None = "max_memory") -> int:
    """'12G', '512M', '2.5GiB', '1000000' -> bytes (binary units). A bad size is a SettingError
    naming `setting` (None: a plain InputError, e.g. for an environment variable)."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    number = t[:-1] if t[-1:] in "KMGT" and t[-1:] else t
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0 and value * scale >= 1):
        problem = f"must be a positive size such as 512M or 8G, got {text!r}"
        if setting is None:
            raise InputError(f"memory size {problem}")
        raise SettingError.of(setting, problem)
    return int(value * scale)


def load_bytes(cfg: ModelConfig, weights_bytes: int) -> int:
    """Host memory while loading: the model built in fp32 and the weights file's tensors read
    beside it (the copy into the model and the cast then go tensor by tensor)."""
    return parameter_count(cfg) * FP32 + weights_bytes


MISMATCH_SLACK = 64 << 20
"""Parameters a config may imply beyond what its weights file holds before it is refused
unbuilt: a small mismatch is left to the tensor-by-tensor check (which names the tensor), a
large one would allocate far more than the weights are worth just to find out."""


def check_load_fits(cfg: ModelConfig, weights_elements: int, weights_bytes: int,
                    budget: Budget, device_budget: Budget | None = None,
                    dtype: torch.dtype = torch.float32, what: str = "this model") -> None:
    """Refuse (ModelError, one line) to build a model whose config asks for far more than its
    weights file holds (`weights_elements` numbers) or that does not fit: judged from the config
    alone, before anything is allocated. `device_budget`: the GPU's, for a model that runs there
    (in `dtype`)."""
    n = parameter_count(cfg)
    if n > weights_elements + MISMATCH_SLACK:
        raise ModelError(f"{what}: its config implies {count(n)} parameters but its weights "
                         f"file holds {count(weights_elements)} numbers (config and weights "
                         "disagree)")
    reason = budget.refusal_template(load_bytes(cfg, weights_bytes), f"loading {what}")
    if reason is None and device_budget is not None:
        item = torch.empty((), dtype=dtype).element_size()
        reason = device_budget.refusal_template(n * item, f"{what} on the GPU")
    if reason is not None:
        raise memory_refusal(reason)


def memory_refusal(reason: str) -> ModelError:
    """A ModelError for a `Budget.refusal_template` (slot 0): what does not fit, and the way
    out (a bigger machine, or a larger `max_memory`)."""
    return ModelError(reason + "; use a machine with more memory (or a larger {0})", MAX_MEMORY)


def count(n: int) -> str:
    """A count for a message: digits with commas, or a power of ten for an absurd one (a
    config can ask for 10^300 parameters)."""
    return f"{n:,}" if n < 10 ** 15 else f"about 10^{len(str(n)) - 1}"


def gib(n: int) -> str:
    """A size for a message: GiB, or MiB / KiB below one GiB."""
    if n >= 10 ** 15 << 30:
        return f"{count(n >> 30)} GiB"
    for unit, shift in (("GiB", 30), ("MiB", 20)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.2f} {unit}"
    return f"{n / 1024:.1f} KiB"


def check_batch_fits(cfg: ModelConfig, weight_dtype: torch.dtype, act_dtype: torch.dtype,
                     rows: int, context: int, block: int, budget: int | Budget | None,
                     loaded: bool = True, needs: Sequence[int] | None = None,
                     chunk: int | None = None, decoders: int = 1) -> None:
    """Refuse (InputError, one line) a batch whose state at `context` would not fit in `budget`
    (bytes, or a `Budget` that names its limit), naming the largest batch that fits. `loaded`:
    the parameters are already in memory (and so already out of `budget`). `needs`: each job's
    KV positions, for rows in the class layout (`RunMemory`), `decoders` times over when that
    many decoders hold such a batch at once; `chunk`: the prefill chunk."""
    if not isinstance(budget, Budget):
        budget = Budget(budget)
    if budget.bytes is None:
        return
    est = run_memory(cfg, weight_dtype, act_dtype, context, block, rows * decoders,
                     with_parameters=not loaded, needs=needs, chunk=chunk)
    need = est.total(rows * decoders)
    if need <= budget.bytes:
        return
    fits = largest_batch(cfg, weight_dtype, act_dtype, context, block, budget.bytes, loaded,
                         needs, chunk) // decoders
    hint = (f"the largest batch that fits is {fits} ({{1}} {fits})" if fits
            else "not even one row fits: use a shorter {2} or fewer tokens")
    limit = "is available" if budget.source == "available memory" else f"({budget.named(0)})"
    held = " (twice: --compare-native holds a native and a speculative batch)" \
        if decoders == 2 else ""
    raise SettingError(f"a batch of {rows} rows{held} at a context of {context:,} tokens needs "
                       f"about {gib(need)} of memory, {gib(budget.bytes)} {limit}; {hint}",
                       MAX_MEMORY, "batch_size", "prompt_tail")


def largest_batch(cfg: ModelConfig, weight_dtype: torch.dtype, act_dtype: torch.dtype,
                  context: int, block: int, budget: int, loaded: bool = True,
                  needs: Sequence[int] | None = None, chunk: int | None = None) -> int:
    """The largest number of rows whose estimate fits in `budget` (0 if none)."""
    lo, hi = 0, 1
    fits = lambda r: run_memory(cfg, weight_dtype, act_dtype, context, block, r,  # noqa: E731
                                with_parameters=not loaded, needs=needs,
                                chunk=chunk).total(r) <= budget
    while fits(hi) and hi < 1 << 20:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
