"""A prompt run through the model once: the state after `prompt[:-1]` and its anchor.

Both decoders start the same way: the prompt except its last token is prefilled, and that last
token becomes the *anchor*, the newest token not yet fed to the model. A record's samples, and
benchmarks timing several decoders on one prompt, share one `Prefilled` (each row gets a copy).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ..errors import InputError
from ..model.model import StripedHyena
from ..model.state import InferenceState


@dataclass
class Prefilled:
    """A prompt already run through the model, reusable by several rows (each gets a copy).

    Benchmarks prefill a long prompt once and decode natively and speculatively from it, so that
    both decoders are timed on decoding alone."""

    state: InferenceState  # one row
    anchor: int
    hidden: Tensor | None  # hidden states of the last prompt positions, for drafters
    seconds: float

    def begin(self, keep_hidden: int = 0) -> tuple[InferenceState, int, Tensor | None]:
        return self.state.clone(), self.anchor, self.hidden_for(keep_hidden)

    def hidden_for(self, keep_hidden: int) -> Tensor | None:
        if not keep_hidden or self.state.seqlen == 0:  # a one-token prompt has no hidden states
            return None
        if self.hidden is None or self.hidden.shape[0] < min(keep_hidden, self.state.seqlen):
            raise ValueError("this prefill kept fewer hidden states than the drafter needs")
        return self.hidden[-keep_hidden:]

    def nbytes(self) -> int:
        """Bytes held: the state (KV caches at their capacity, FIR windows, modal states) and
        the hidden states."""
        st = self.state
        fixed = sum(t.numel() * t.element_size() for t in st.fixed())
        kv = sum(c.nbytes() for c in st.caches())
        hid = self.hidden.numel() * self.hidden.element_size() if self.hidden is not None else 0
        return fixed + kv + hid


PrefillProgress = Callable[[int, int], None]
"""Told (bases done, bases of the prompt) when a prefill starts (0), after each chunk, and when
it ends (all of them, the anchor included): a progress display's hook, never the CLI itself."""


def start(model: StripedHyena, prompt: list[int] | tuple[int, ...], reserve: int,
          keep_hidden: int = 0, progress: PrefillProgress | None = None
          ) -> tuple[InferenceState, int, Tensor | None]:
    """Prefill prompt[:-1]; return (state, anchor, hidden states of the last `keep_hidden`)."""
    if not prompt:
        raise InputError("empty prompt")
    n = len(prompt)
    tell = progress or _silent
    tell(0, n)
    ids = torch.tensor([list(prompt[:-1])], dtype=torch.long, device=model.device)
    if ids.shape[1] == 0:
        tell(n, n)
        return model.empty_state(1, capacity=reserve), prompt[-1], None

    def chunk_done(done: int) -> None:
        if done < n - 1:  # the last chunk is told as the end, below (after a GPU's sync)
            tell(done, n)

    _, hidden, state = model.prefill(ids, keep_last=max(1, keep_hidden), reserve=reserve,
                                     on_chunk=chunk_done if progress is not None else None)
    if ids.device.type == "cuda":  # so that prefill_s times the prefill, not its launch
        torch.cuda.synchronize(ids.device)
    tell(n, n)
    return state, prompt[-1], (hidden[0] if keep_hidden else None)


@torch.inference_mode()
def prefill_prompt(model: StripedHyena, prompt: list[int] | tuple[int, ...], reserve: int,
                   keep_hidden: int = 0, progress: PrefillProgress | None = None) -> Prefilled:
    t0 = time.perf_counter()
    state, anchor, hidden = start(model, prompt, reserve, keep_hidden, progress)
    return Prefilled(state, anchor, hidden, time.perf_counter() - t0)


def _silent(done: int, total: int) -> None:
    """No progress display."""


PromptKey = tuple[tuple[int, ...], int, int]
"""What makes two prefills the same state: the prompt, the KV reserve, the hidden states kept."""


class PromptCache:
    """Prefilled prompts kept for later jobs of the same prompt, least recently used out first,
    within `max_bytes`.

    A server's clients often send one prompt in several requests (a sample each, pipeline
    shards of one FASTA); without this, each request would prefill it again (measured on 2 CPU
    cores: 48 prompts x 4 samples run as 192 separate records took 4.4x the prefill time of 48
    records x 4 samples, and 1.5x the run's time). An entry is reused only for the same prompt, KV
    reserve and kept hidden states, so a hit is the state a fresh prefill would make, bit for
    bit: rows copy from it and never write to it."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"PromptCache: max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[PromptKey, tuple[Prefilled, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: PromptKey) -> Prefilled | None:
        got = self._entries.get(key)
        if got is None:
            self.misses += 1
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return got[0]

    def put(self, key: PromptKey, pre: Prefilled) -> None:
        """Keep `pre` (an entry larger than the whole budget is not kept), dropping the least
        recently used entries until it fits."""
        size = pre.nbytes()
        if size > self.max_bytes or key in self._entries:
            return
        while self.bytes + size > self.max_bytes:
            _, (_, freed) = self._entries.popitem(last=False)
            self.bytes -= freed
        self._entries[key] = (pre, size)
        self.bytes += size
