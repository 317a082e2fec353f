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
"""
from __future__ import annotations

import sys
from collections import OrderedDict
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from .attention import RotaryEmbedding
from .state import (Block, FIRPending, FIRWindow, HyenaPending, HyenaState, InferenceState,
                    KVPending, KVState, LayerPending, ModalPending, ModalState)

if TYPE_CHECKING:
    from .model import StripedHyena

MAX_GRAPH_BLOCK = 64  # longer blocks are prefill chunks: eager
MAX_RECORDINGS = 4  # e.g. the step and the verification block for two live prompts


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
                first = (str(exc).strip().splitlines() or [""])[0][:200]  # one line on stderr
                self.disabled_reason = f"{type(exc).__name__}: {first}"
                what = "torch.compile" if self.backend == "compile" else "graph capture"
                print(f"evspark: {what} failed ({self.disabled_reason}); decoding eagerly",
                      file=sys.stderr)
                return self.model.extend_eager(state, ids)
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

        if self.backend in ("eager", "compile"):
            logits, hidden, block = run()
            assert hidden is not None and block is not None
            outs = [logits, hidden] + pending_tensors(block.pendings)

            def tensors() -> list[Tensor]:
                lg, hd, bl = run()
                assert hd is not None and bl is not None
                return [lg, hd] + pending_tensors(bl.pendings)

            fn = tensors
            if self.backend == "compile":
                fn = compiled(tensors, model, state, ids.shape[1])
                fn()  # a compiler's failure surfaces here, inside the capture's try

            def replay() -> None:
                for dst, src in zip(outs, fn()):
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


def compiled(fn: Callable[[], list[Tensor]], model: "StripedHyena", state: InferenceState, k: int
             ) -> Callable[[], list[Tensor]]:
    """`fn` through torch.compile (the "compile" backend: CPU decoding without per-op dispatch).

    The static form has no Python-int position, so it traces to one graph per block length.
    torch.compile keeps its compiled variants on the function's code object; each block length
    gets a code object of its own (same code, named by k), so lengths neither count against
    one recompile limit nor turn each other's shapes dynamic. The KV caches' capacity is marked
    dynamic (and the RoPE table that covers it), so the states of other prompts reuse the code."""
    for st in state.layers:
        if isinstance(st, KVState):
            torch._dynamo.mark_dynamic(st.cache.k, 2)
            torch._dynamo.mark_dynamic(st.cache.v, 2)
    for m in model.modules():  # the RoPE table covers the capacity, so its length varies too
        if isinstance(m, RotaryEmbedding):
            for t in m._derived.peek("table"):
                torch._dynamo.mark_dynamic(t, 0)
    code = _CODES.setdefault(k, fn.__code__.replace(co_name=f"extend_block_{k}"))
    per_k = FunctionType(code, fn.__globals__, code.co_name, fn.__defaults__, fn.__closure__)
    return torch.compile(per_k)


def pending_tensors(pendings) -> list[Tensor]:
    """The per-position state tensors of a block's Hyena layers, in a fixed order."""
    out: list[Tensor] = []
    for p in pendings:
        if isinstance(p, HyenaPending):
            out.append(p.feat.widened)
            out.append(p.inner.widened if isinstance(p.inner, FIRPending) else p.inner.sigmas)
    return out
