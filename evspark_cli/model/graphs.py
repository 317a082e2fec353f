"""Recorded decode steps and verification blocks: CUDA graphs for `extend(k)` at a fixed k.

On a GPU a decode step or a short verification block is launch-bound: each layer issues dozens
of small kernels. A CUDA graph records one `extend(k)` and replays all of them with one launch.
A graph replays fixed addresses and shapes, so the runner keeps static copies of what varies
between calls and works on them:

- **inputs**: the k token ids, the position t0 as a device scalar (attention then reads its
  position from the device and attends over the whole preallocated KV cache under a mask:
  `attention.attend_static`), and every Hyena layer's FIR windows and modal state, copied in
  before each replay (they are small: fixed size whatever the context);
- **KV caches** are not copied: a recording belongs to one set of caches and writes their rows in
  place. A state with other caches (a new prompt, a cache that grew) gets its own recording,
  made the second time a block of that shape meets those caches, so one-off states (the
  snapshot-and-replay baseline's copies) stay eager. The runner keeps the caches' version books
  (`KVCache.note_write`), which a replay cannot;
- **outputs** (logits, hidden states and each layer's per-position state) are cloned after the
  replay, so the returned :class:`Block` commits by slicing exactly like an eager one (state.py).

`backend="eager"` re-runs the recorded static form instead of replaying a graph; tests use it
on CPU to hold the static form to `extend`'s results. Long blocks (prefill chunks) stay eager.

`backend="compile"` (CPU `--compile`) records nothing: torch.compile takes tensors as inputs,
so one compiled static form per block length is called on the live state's own tensors (its
Hyena windows made contiguous, its KV caches as they are), for every prompt and every record,
and its outputs become the block directly: no static copies in, no copies out, no eager first
calls per KV cache. A length is compiled once it has been used `COMPILE_AFTER` times.
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from .layers import derived_values
from .state import Block, InferenceState

if TYPE_CHECKING:
    from .model import StripedHyena

StaticPass = Callable[[InferenceState, Tensor, Tensor], list[Tensor]]
"""(state, ids, position) -> [logits, hidden, per-position tensors]: `model.extend_static`."""

MAX_GRAPH_BLOCK = 64  # longer blocks are prefill chunks: eager
MAX_RECORDINGS = 4  # e.g. the step and the verification block for two live prompts
COMPILE_AFTER = 32  # "compile": a block length is compiled at its 32nd call (eager before)


@dataclass
class Recording:
    """One recorded `extend(k)` with its static inputs and outputs."""

    ids: Tensor  # (B, k)
    position: Tensor  # (B,) int64: each row's t0
    inputs: list[Tensor]  # the state's fixed-size tensors (Hyena windows, modal states)
    outputs: list[Tensor]  # logits, hidden, then the block's per-position tensors
    replay: Callable[[], None]
    pinned: list  # derived tensors the graph reads (fused weights, rotary table): kept alive


def static_state(state: InferenceState) -> InferenceState:
    """A copy of `state` whose fixed-size tensors are fresh (static) buffers; KV caches shared.
    Its lengths are zeros: the static form reads positions from a device tensor, and Python ints
    here would only make torch.compile specialise (recompile) on each recording's lengths."""
    return state.with_fixed([t.clone() for t in state.fixed()], (0,) * state.batch)


class GraphRunner:
    """Serves `model.extend` for short blocks from recordings, one per (shape, KV caches).

    `static_pass` is the pass it records, replays or compiles (`model.extend_static`); blocks
    it does not serve go to `model.extend_eager`."""

    def __init__(self, model: "StripedHyena", static_pass: StaticPass,
                 backend: str = "cuda") -> None:
        if backend not in ("cuda", "eager", "compile"):
            raise ValueError("backend must be 'cuda', 'eager' or 'compile'")
        self.model = model
        self.static_pass = static_pass
        self.backend = backend
        self.recordings: OrderedDict[tuple, Recording] = OrderedDict()
        self.sightings: OrderedDict[tuple, int] = OrderedDict()  # keys met once, not recorded
        self.disabled_reason: str | None = None
        self.replays = 0
        self.compiled_fns: dict[int, Callable] = {}  # "compile": block length -> compiled form
        self.calls_by_length: dict[int, int] = {}  # "compile": calls of lengths not compiled yet

    # ------------------------------------------------------------------ dispatch
    def takes(self, state: InferenceState, ids: Tensor) -> bool:
        """True when this block can be served from a recording (else `extend` runs eagerly)."""
        if self.disabled_reason is not None or torch.is_grad_enabled():
            return False
        k = ids.shape[1]
        if not 1 <= k <= MAX_GRAPH_BLOCK or min(state.lengths) == 0:
            return False
        if self.backend == "cuda" and ids.device.type != "cuda":
            return False
        return all(c.dense and max(state.lengths) + k <= c.capacity for c in state.caches())

    def extend(self, state: InferenceState, ids: Tensor) -> tuple[Tensor, Tensor, Block]:
        state.check()  # a stale branch fails here exactly as in eager extend
        if self.backend == "compile":
            return self._compiled_extend(state, ids)
        key = (tuple(ids.shape), ids.device,
               tuple((id(c), c.k.data_ptr(), c.v.data_ptr(), c.capacity) for c in state.caches()))
        rec = self.recordings.get(key)
        if rec is None:
            if self.sightings.get(key, 0) < 1:  # first meeting: eager (maybe a one-off state)
                self.sightings[key] = 1
                if len(self.sightings) > 64:
                    self.sightings.popitem(last=False)
                return self.model.extend_eager(state, ids)
            try:
                rec = self._record(state, ids)
            except Exception as exc:  # noqa: BLE001 - any capture failure: fall back to eager
                return self._give_up(exc, state, ids)
            self.recordings[key] = rec
            if len(self.recordings) > MAX_RECORDINGS:
                self.recordings.popitem(last=False)
        else:
            self.recordings.move_to_end(key)
        rec.ids.copy_(ids)
        rec.position.copy_(torch.tensor(state.lengths, dtype=torch.long))
        for dst, src in zip(rec.inputs, state.fixed()):
            dst.copy_(src)
        rec.replay()
        self.replays += 1
        outs = [t.clone() for t in rec.outputs]
        return outs[0], outs[1], state.block_from(outs[2:], ids.shape[1])

    def _give_up(self, exc: Exception, state: InferenceState, ids: Tensor
                 ) -> tuple[Tensor, Tensor, Block]:
        """Disable the runner after a failed capture or compile: one line on stderr, then eager."""
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        self.disabled_reason = f"{type(exc).__name__}: {first}"
        what = "torch.compile" if self.backend == "compile" else "graph capture"
        print(f"evspark: {what} failed ({self.disabled_reason}); decoding eagerly",
              file=sys.stderr)
        return self.model.extend_eager(state, ids)

    # ------------------------------------------------------------------ compile backend
    def _compiled_extend(self, state: InferenceState, ids: Tensor
                         ) -> tuple[Tensor, Tensor, Block]:
        model, k = self.model, ids.shape[1]
        fn = self.compiled_fns.get(k)
        if fn is None:
            # compiling takes seconds and saves about a millisecond per call: only the lengths a
            # decoder keeps using (the step, gamma + 1) earn it, not the last round's odd length
            seen = self.calls_by_length[k] = self.calls_by_length.get(k, 0) + 1
            if seen < COMPILE_AFTER:
                return model.extend_eager(state, ids)
            fn = self.compiled_fns[k] = compile_static_form(k)
        view = compile_view(model, state)
        position = torch.tensor(state.lengths, dtype=torch.long, device=ids.device)
        try:
            outs = fn(self.static_pass, ids, position, view)
        except Exception as exc:  # noqa: BLE001 - a compiler failure: fall back to eager
            return self._give_up(exc, state, ids)
        self.replays += 1
        return outs[0], outs[1], state.block_from(outs[2:], k)

    # ------------------------------------------------------------------ recording
    def _record(self, state: InferenceState, ids: Tensor) -> Recording:
        model = self.model
        _cover_rotary(model, state)
        s_ids = ids.clone()
        s_pos = torch.tensor(state.lengths, dtype=torch.long, device=ids.device)
        s_state = static_state(state)

        def run() -> list[Tensor]:
            return static_form(self.static_pass, s_ids, s_pos, s_state)

        if self.backend == "eager":
            outs = run()

            def replay() -> None:
                for dst, src in zip(outs, run()):
                    dst.copy_(src)
        else:
            side = torch.cuda.Stream(device=ids.device)
            side.wait_stream(torch.cuda.current_stream(ids.device))
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up: lazy inits, cached weights, allocator pools
                    run()
            torch.cuda.current_stream(ids.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outs = run()
            replay = graph.replay
        pinned = derived_values(model)
        return Recording(s_ids, s_pos, s_state.fixed(), outs, replay, pinned)


def _cover_rotary(model: "StripedHyena", state: InferenceState) -> None:
    """Every cache row a recorded or compiled block can reach has its rotary angles."""
    capacity = max((c.capacity for c in state.caches()), default=0)
    if capacity:
        for blk in model.blocks:
            if blk.kind == "attn":
                blk.inner_mha_cls.rotary_emb.table(capacity)


_CODES: dict[int, CodeType] = {}  # block length -> the code object its compiled form hangs on


def static_form(static_pass: StaticPass, ids: Tensor, position: Tensor, state: InferenceState
                ) -> list[Tensor]:
    """extend(k) in the static form, as a flat list: logits, hidden, per-position states (the
    function `compile_static_form` compiles once per block length)."""
    return static_pass(state, ids, position)


def compile_static_form(k: int) -> Callable:
    """`static_form` through torch.compile, for blocks of length k (the "compile" backend).

    The static form has no Python-int position, so it traces to one graph per block length.
    torch.compile keeps its compiled variants on the function's code object; each block length
    gets a code object of its own (same code, named by k), so lengths neither count against
    one recompile limit nor turn each other's shapes dynamic."""
    from .layers import threads_constant_for_compile

    threads_constant_for_compile()
    code = _CODES.setdefault(k, static_form.__code__.replace(co_name=f"extend_block_{k}"))
    return torch.compile(FunctionType(code, static_form.__globals__, code.co_name))


def compile_view(model: "StripedHyena", state: InferenceState) -> InferenceState:
    """`state` as the compiled form takes it: fixed-size tensors contiguous (a committed window
    is a view whose strides depend on the block it came from, and would be recompiled for), KV
    caches shared with their capacity and the RoPE table that covers it marked dynamic (so
    every prompt's cache runs the same compiled code), lengths 0 (positions are a tensor)."""
    for c in state.caches():
        torch._dynamo.mark_dynamic(c.k, 2)
        torch._dynamo.mark_dynamic(c.v, 2)
    if state.caches():
        _cover_rotary(model, state)
        for blk in model.blocks:
            if blk.kind == "attn":
                for t in blk.inner_mha_cls.rotary_emb.built_table():
                    torch._dynamo.mark_dynamic(t, 0)
    return state.with_fixed([_dense(t) for t in state.fixed()], (0,) * state.batch)


def _dense(t: Tensor) -> Tensor:
    """t with row-major strides, exactly (`contiguous()` keeps a size-1 dim's odd stride, which
    torch.compile's guards still compare)."""
    want, step = [], 1
    for n in reversed(t.shape):
        want.append(step)
        step *= n
    if t.stride() == tuple(reversed(want)):
        return t
    return t.clone(memory_format=torch.contiguous_format)
