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

from .state import (Block, FIRPending, FIRWindow, HyenaPending, HyenaState, InferenceState,
                    KVPending, KVState, LayerPending, ModalPending, ModalState)

if TYPE_CHECKING:
    from .model import StripedHyena

MAX_GRAPH_BLOCK = 64  # longer blocks are prefill chunks: eager
MAX_RECORDINGS = 4  # e.g. the step and the verification block for two live prompts
COMPILE_AFTER = 32  # "compile": a block length is compiled at its 32nd call (eager before)


@dataclass
class Recording:
    """One recorded `extend(k)` with its static inputs and outputs."""

    ids: Tensor  # (B, k)
    position: Tensor  # 0-d int64: t0
    inputs: list[Tensor]  # Hyena layers' windows / modal states, in layer order
    logits: Tensor
    hidden: Tensor
    pendings: tuple[LayerPending | None, ...]  # per-position states (static); None for KV layers
    replay: Callable[[], None]
    pinned: list  # derived tensors the graph reads (fused weights, rotary table): kept alive


def hyena_tensors(state: InferenceState) -> list[Tensor]:
    """The fixed-size state tensors of every Hyena layer (what a replay copies in)."""
    out: list[Tensor] = []
    for st in state.layers:
        if isinstance(st, HyenaState):
            out.append(st.feat.buf)
            out.append(st.inner.sigma if isinstance(st.inner, ModalState) else st.inner.buf)
    return out


def static_state(state: InferenceState) -> InferenceState:
    """A copy of `state` whose Hyena tensors are fresh (static) buffers; KV caches are shared."""
    layers = []
    for st in state.layers:
        if isinstance(st, HyenaState):
            inner = (ModalState(st.inner.sigma.clone()) if isinstance(st.inner, ModalState)
                     else FIRWindow(st.inner.buf.clone()))
            layers.append(HyenaState(FIRWindow(st.feat.buf.clone()), inner))
        else:
            layers.append(st)
    # length 0: the static form reads its position from a device tensor, and a Python int here
    # would only make torch.compile specialise (recompile) on each recording's length
    return InferenceState(tuple(layers), 0)


def _fir(p: FIRPending) -> FIRPending:
    return FIRPending(p.widened.clone(), p.width)


def _modal(p: ModalPending) -> ModalPending:
    assert p.sigmas is not None, "short blocks keep per-position modal states"
    return ModalPending(p.sigmas.clone(), None, None, None)


def fresh_pending(template: LayerPending | None, st, t0: int) -> LayerPending:
    """The pending state of one layer after a replay: static outputs cloned, KV books kept."""
    if template is None:  # attention: the replay wrote rows t0.. of this state's cache
        assert isinstance(st, KVState)
        return KVPending(st.cache, t0, st.cache.note_write(t0))
    assert isinstance(template, HyenaPending)
    inner = template.inner
    return HyenaPending(_fir(template.feat),
                        _fir(inner) if isinstance(inner, FIRPending) else _modal(inner))


class GraphRunner:
    """Serves `model.extend` for short blocks from recordings, one per (shape, KV caches)."""

    def __init__(self, model: "StripedHyena", backend: str = "cuda") -> None:
        if backend not in ("cuda", "eager", "compile"):
            raise ValueError("backend must be 'cuda', 'eager' or 'compile'")
        self.model = model
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
        if not 1 <= k <= MAX_GRAPH_BLOCK or state.seqlen == 0:
            return False
        if self.backend == "cuda" and ids.device.type != "cuda":
            return False
        for st in state.layers:
            if isinstance(st, KVState) and state.seqlen + k > st.cache.capacity:
                return False
        return True

    def extend(self, state: InferenceState, ids: Tensor) -> tuple[Tensor, Tensor, Block]:
        for st in state.layers:
            if isinstance(st, KVState):
                st.check()  # a stale branch fails here exactly as in eager extend
        if self.backend == "compile":
            return self._compiled_extend(state, ids)
        key = (tuple(ids.shape), ids.device,
               tuple((id(st.cache), st.cache.k.data_ptr(), st.cache.v.data_ptr(),
                      st.cache.capacity) for st in state.layers if isinstance(st, KVState)))
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
        t0 = state.seqlen
        rec.ids.copy_(ids)
        rec.position.fill_(t0)
        for dst, src in zip(rec.inputs, hyena_tensors(state)):
            dst.copy_(src)
        rec.replay()
        self.replays += 1
        pendings = tuple(fresh_pending(p, st, t0) for p, st in zip(rec.pendings, state.layers))
        return rec.logits.clone(), rec.hidden.clone(), Block(pendings, t0, ids.shape[1])

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
        model, k, t0 = self.model, ids.shape[1], state.seqlen
        fn = self.compiled_fns.get(k)
        if fn is None:
            # compiling takes seconds and saves about a millisecond per call: only the lengths a
            # decoder keeps using (the step, gamma + 1) earn it, not the last round's odd length
            seen = self.calls_by_length[k] = self.calls_by_length.get(k, 0) + 1
            if seen < COMPILE_AFTER:
                return model.extend_eager(state, ids)
            fn = self.compiled_fns[k] = compile_static_form(k)
        view = compile_view(model, state)
        try:
            outs = fn(model, ids, torch.tensor(t0, dtype=torch.long, device=ids.device), view)
        except Exception as exc:  # noqa: BLE001 - a compiler failure: fall back to eager
            return self._give_up(exc, state, ids)
        self.replays += 1
        it = iter(outs[2:])
        pendings: list[LayerPending] = []
        for st in state.layers:
            if isinstance(st, KVState):  # the compiled form wrote rows t0.. of this cache
                pendings.append(KVPending(st.cache, t0, st.cache.note_write(t0)))
                continue
            feat = FIRPending(next(it), st.feat.buf.shape[-1])
            inner = next(it)
            pendings.append(HyenaPending(feat, ModalPending(inner, None, None, None)
                                         if isinstance(st.inner, ModalState)
                                         else FIRPending(inner, st.inner.buf.shape[-1])))
        return outs[0], outs[1], Block(tuple(pendings), t0, k)

    # ------------------------------------------------------------------ recording
    def _record(self, state: InferenceState, ids: Tensor) -> Recording:
        model = self.model
        for st in state.layers:  # every cache row a replay can reach has its rotary angles
            if isinstance(st, KVState):
                for blk in model.blocks:
                    if blk.kind == "attn":
                        blk.inner_mha_cls.rotary_emb.table(st.cache.capacity)
                break
        s_ids = ids.clone()
        s_pos = torch.tensor(state.seqlen, dtype=torch.long, device=ids.device)
        s_state = static_state(state)

        def run() -> tuple[Tensor, Tensor | None, Block | None]:
            return model._run(s_ids, s_state, True, position=s_pos)

        if self.backend == "eager":
            logits, hidden, block = run()
            assert hidden is not None and block is not None
            outs = [logits, hidden] + pending_tensors(block.pendings)

            def tensors() -> list[Tensor]:
                lg, hd, bl = run()
                assert hd is not None and bl is not None
                return [lg, hd] + pending_tensors(bl.pendings)

            def replay() -> None:
                for dst, src in zip(outs, tensors()):
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
                logits, hidden, block = run()
            assert hidden is not None and block is not None
            replay = graph.replay
        pendings = tuple(None if isinstance(p, KVPending) or p is None else p
                         for p in block.pendings)
        pinned = [entry for m in model.modules() if hasattr(m, "_derived")
                  for entry in m._derived._cache.values()]
        return Recording(s_ids, s_pos, hyena_tensors(s_state), logits, hidden, pendings, replay,
                         pinned)


_CODES: dict[int, CodeType] = {}  # block length -> the code object its compiled form hangs on


def static_form(model: "StripedHyena", ids: Tensor, position: Tensor, state: InferenceState
                ) -> list[Tensor]:
    """extend(k) in the static form, as a flat list: logits, hidden, per-position states."""
    logits, hidden, block = model._run(ids, state, True, position=position)
    assert hidden is not None and block is not None
    return [logits, hidden] + pending_tensors(block.pendings)


def compile_static_form(k: int) -> Callable:
    """`static_form` through torch.compile, for blocks of length k (the "compile" backend).

    The static form has no Python-int position, so it traces to one graph per block length.
    torch.compile keeps its compiled variants on the function's code object; each block length
    gets a code object of its own (same code, named by k), so lengths neither count against
    one recompile limit nor turn each other's shapes dynamic."""
    code = _CODES.setdefault(k, static_form.__code__.replace(co_name=f"extend_block_{k}"))
    return torch.compile(FunctionType(code, static_form.__globals__, code.co_name))


def compile_view(model: "StripedHyena", state: InferenceState) -> InferenceState:
    """`state` as the compiled form takes it: Hyena windows contiguous (a committed window is a
    view whose strides depend on the block it came from, and would be recompiled for), KV
    caches shared with their capacity and the RoPE table that covers it marked dynamic (so
    every prompt's cache runs the same compiled code), length 0 (the position is a tensor)."""
    layers: list = []
    capacity = 0
    for st in state.layers:
        if isinstance(st, HyenaState):
            inner = (ModalState(_dense(st.inner.sigma)) if isinstance(st.inner, ModalState)
                     else FIRWindow(_dense(st.inner.buf)))
            layers.append(HyenaState(FIRWindow(_dense(st.feat.buf)), inner))
            continue
        torch._dynamo.mark_dynamic(st.cache.k, 2)
        torch._dynamo.mark_dynamic(st.cache.v, 2)
        layers.append(KVState(st.cache, 0))
        capacity = st.cache.capacity
    if capacity:
        for blk in model.blocks:  # every row the block can reach has its rotary angles
            if blk.kind == "attn":
                rope = blk.inner_mha_cls.rotary_emb
                rope.table(capacity)
                for t in rope._derived.peek("table"):
                    torch._dynamo.mark_dynamic(t, 0)
    return InferenceState(tuple(layers), 0)


def _dense(t: Tensor) -> Tensor:
    """t with row-major strides, exactly (`contiguous()` keeps a size-1 dim's odd stride, which
    torch.compile's guards still compare)."""
    want, step = [], 1
    for n in reversed(t.shape):
        want.append(step)
        step *= n
    return t if t.stride() == tuple(reversed(want)) else t.clone(memory_format=torch.contiguous_format)


def pending_tensors(pendings) -> list[Tensor]:
    """The per-position state tensors of a block's Hyena layers, in a fixed order."""
    out: list[Tensor] = []
    for p in pendings:
        if isinstance(p, HyenaPending):
            out.append(p.feat.widened)
            out.append(p.inner.widened if isinstance(p.inner, FIRPending) else p.inner.sigmas)
    return out
