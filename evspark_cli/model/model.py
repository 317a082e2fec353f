"""StripedHyena 2 (Evo 2's architecture) with three entry points and one semantics.

- ``forward(ids)``: stateless, whole sequences (training, scoring).
- ``prefill(ids)``: the same pass leaving an :class:`InferenceState` (chunked for long prompts).
- ``extend(state, ids)``: feed k tokens to a live state; returns a :class:`Block` whose
  ``commit(j)`` is the state after the first j tokens. A decode step is ``extend`` with k = 1.

All three run the same block code (`_run`); the only difference is whether a state is threaded
through. Parameter names follow Evo 2 / vortex checkpoints (``blocks.{i}.filter.h`` ...).
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionBlock
from .config import ModelConfig
from .hyena import HyenaBlock
from .layers import Derived, ResidualBlock, RMSNorm, linear
from .state import Block, InferenceState, Lengths

if TYPE_CHECKING:
    from .graphs import GraphRunner


CPU_PREFILL_CHUNK = 2048
"""On a CPU, chunks of 2k tokens keep a layer's activations in cache: an 8k-base prefill of the
bundled target took 0.66 s in 2k chunks against 0.79 s in one chunk, 16k bases 1.79 s against
2.01 s (2 cores); a GPU takes the config's longer chunks."""

class StripedHyena(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.embedding_layer = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(make_block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.hidden_layers: list[int] = cfg.drafter_layers
        self.graphs: GraphRunner | None = None  # set by use_graphs()
        self.source_dir: Path | None = None  # the folder it was loaded from (checkpoint.load_model)
        self._derived = Derived()

    # ------------------------------------------------------------------ core
    @property
    def device(self) -> torch.device:
        return self.embedding_layer.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embedding_layer.weight.dtype

    def _run(self, ids: Tensor, state: InferenceState | None, hidden: bool,
             position: Tensor | None = None) -> tuple[Tensor, Tensor | None, Block | None]:
        """The one forward pass. `position` (a (B,) device tensor standing for state.lengths) is
        the graph-capturable form: attention then reads its positions from the device
        (graphs.py)."""
        x = F.embedding(ids, self._lookup_table())
        t0: Lengths = state.lengths if state is not None else (0,) * ids.shape[0]
        keep: list[Tensor] = []
        pendings = []
        for i, blk in enumerate(self.blocks):
            x, pending = blk.forward(x, state.layers[i] if state is not None else None, t0,
                                     position)
            pendings.append(pending)
            if hidden and i in self.hidden_layers:
                keep.append(x)
        x = self.norm(x) if self.config.final_norm else x
        logits = linear(x, self.embedding_layer.weight)
        hid = torch.stack(keep, dim=2) if hidden else None  # (B, k, n_layers, D)
        block = Block(tuple(pendings), t0, ids.shape[1]) if state is not None else None
        return logits, hid, block

    def _lookup_table(self) -> Tensor:
        """The embedding as row-major (V, D) for lookups: with an input-major CPU layout (kept
        for the tied unembedding, which reads every row per step) a row would be D strided reads."""
        w = self.embedding_layer.weight
        return w if w.is_contiguous() else self._derived.get("rows", (w,), w.contiguous)

    def forward(self, ids: Tensor, return_hidden: bool = False):
        """Stateless logits (B, L, V) for whole sequences; optionally the drafters' hidden
        states."""
        logits, hid, _ = self._run(ids, None, return_hidden)
        return (logits, hid) if return_hidden else logits

    def activation_names(self) -> list[str]:
        """The activations `activations` can return, named by module path as Evo 2's and
        vortex's checkpoints name them: `embedding_layer`, then per block `blocks.{i}.pre_norm`,
        `blocks.{i}.post_norm`, `blocks.{i}.mlp.l3` (the MLP's output, before the residual
        add) and `blocks.{i}` (the block's output), and `norm` with a final norm."""
        names = ["embedding_layer"]
        for i in range(len(self.blocks)):
            names += [f"blocks.{i}.pre_norm", f"blocks.{i}.post_norm", f"blocks.{i}.mlp.l3",
                      f"blocks.{i}"]
        return names + (["norm"] if self.config.final_norm else [])

    @torch.inference_mode()
    def activations(self, ids: Tensor, names: Sequence[str]) -> tuple[Tensor, dict[str, Tensor]]:
        """Logits (B, L, V) of whole sequences and the named activations (B, L, D) of the same
        pass (`activation_names`). The stateless `forward`, with every norm, block and `l3`
        called as a module, so that forward hooks on them fire as they do on Evo 2's model;
        its logits are `forward`'s, bit for bit."""
        unknown = sorted(set(names) - set(self.activation_names()))
        if unknown:
            raise KeyError(f"no activation named {unknown[0]!r}")
        wanted = set(names)
        got: dict[str, Tensor] = {}

        def keep(name: str, t: Tensor) -> None:
            if name in wanted:
                got[name] = t

        x = self.embedding_layer(ids)
        keep("embedding_layer", x)
        t0 = (0,) * ids.shape[0]
        for i, blk in enumerate(self.blocks):
            x = blk.forward_hooked(x, t0, lambda n, t, i=i: keep(
                f"blocks.{i}" + (f".{n}" if n else "") + (".l3" if n == "mlp" else ""), t))
        if self.config.final_norm:
            x = self.norm(x)
            keep("norm", x)
        return linear(x, self.embedding_layer.weight), got

    def empty_state(self, batch: int = 1, capacity: int = 1024) -> InferenceState:
        """The state before any token: zero FIR windows, zero modal states, empty KV caches."""
        layers = []
        for blk in self.blocks:
            layers.append(blk.empty_state(batch, capacity, self.dtype, self.device))
        return InferenceState(tuple(layers), (0,) * batch)

    def extend(self, state: InferenceState, ids: Tensor) -> tuple[Tensor, Tensor, Block]:
        """Feed ids (B, k) to `state`: logits (B, k, V), hidden (B, k, n, D) and the block."""
        if ids.dim() == 1:
            ids = ids[None]
        if ids.shape[0] != state.batch:
            raise ValueError(f"extend: {ids.shape[0]} rows of ids for a state of {state.batch}")
        if self.graphs is not None and self.graphs.takes(state, ids):
            return self.graphs.extend(state, ids)
        return self.extend_eager(state, ids)

    def extend_eager(self, state: InferenceState, ids: Tensor) -> tuple[Tensor, Tensor, Block]:
        """`extend` without recorded graphs."""
        logits, hid, block = self._run(ids, state, True)
        assert hid is not None and block is not None
        return logits, hid, block

    def extend_static(self, state: InferenceState, ids: Tensor, position: Tensor
                      ) -> list[Tensor]:
        """`extend` in the static form that graphs.py records or compiles, as a flat list:
        logits, hidden, then the block's per-position tensors (`Block.outputs()` order).

        `position` (B,) holds each row's position on the device and stands for state.lengths:
        attention writes its keys there and attends over each whole KV cache under a mask, so
        every shape is fixed by the caches' capacities. The caches' version books are the
        caller's (`InferenceState.block_from` builds the block to commit)."""
        logits, hid, block = self._run(ids, state, True, position=position)
        assert hid is not None and block is not None
        return [logits, hid] + block.outputs()

    def use_graphs(self, backend: str | None = "cuda") -> None:
        """Replay decode steps and verification blocks from recorded graphs (None: eager).

        "cuda" records CUDA graphs (a GPU model); "compile" runs the static form through
        torch.compile (CPU decoding); "eager" re-runs the static form, which tests use to check
        it on CPU. See graphs.py."""
        from .graphs import GraphRunner

        self.graphs = (GraphRunner(self, self.extend_static, backend) if backend is not None
                       else None)

    def prefill(self, ids: Tensor, keep_last: int | None = None, reserve: int = 2048,
                chunk: int | None = None, on_chunk: Callable[[int], None] | None = None
                ) -> tuple[Tensor, Tensor, InferenceState]:
        """Run a prompt (B, L) and return (logits, hidden, state).

        Long prompts go in chunks of `prefill_chunk()` tokens so memory stays bounded
        (FFT filters per chunk, modal states carried between chunks). `keep_last` keeps only the
        last positions' logits and hidden states; `reserve` preallocates KV rows for decoding.
        `on_chunk(done)` is told the tokens prefilled so far after each chunk, so that a long
        prompt's minutes of prefill can show progress (on a GPU: chunks launched, not finished).
        """
        if ids.dim() == 1:
            ids = ids[None]
        B, L = ids.shape
        if L == 0:
            raise ValueError("prefill needs at least one token")
        chunk = chunk or self.prefill_chunk()
        state = self.empty_state(B, capacity=L + reserve)
        logit_parts: list[Tensor] = []
        hid_parts: list[Tensor] = []
        for s in range(0, L, chunk):
            piece = ids[:, s: s + chunk]
            logits, hid, block = self.extend(state, piece)
            state = block.commit(piece.shape[1])
            if on_chunk is not None:
                on_chunk(s + piece.shape[1])
            if keep_last is not None:  # copies: a view would keep every chunk's whole output
                logits, hid = logits[:, -keep_last:].clone(), hid[:, -keep_last:].clone()
            logit_parts.append(logits)
            hid_parts.append(hid)
        logits = torch.cat(logit_parts, dim=1)
        hid = torch.cat(hid_parts, dim=1)
        if keep_last is not None:
            logits, hid = logits[:, -keep_last:], hid[:, -keep_last:]
        return logits, hid, state

    def prefill_chunk(self) -> int:
        """Tokens per prefill chunk on this model's device: the config's, at most
        CPU_PREFILL_CHUNK on a CPU."""
        chunk = self.config.prefill_chunk
        return min(chunk, CPU_PREFILL_CHUNK) if self.device.type == "cpu" else chunk

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def layer_kinds(self) -> Sequence[str]:
        return [b.kind for b in self.blocks]


def make_block(cfg: ModelConfig, layer: int) -> ResidualBlock:
    return AttentionBlock(cfg, layer) if cfg.block_type(layer) == "attn" else HyenaBlock(cfg, layer)

