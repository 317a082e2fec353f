"""A prompt run through the model once: the state after `prompt[:-1]` and its anchor.

Both decoders start the same way: the prompt except its last token is prefilled, and that last
token becomes the *anchor*, the newest token not yet fed to the model. A record's samples, and
benchmarks timing several decoders on one prompt, share one `Prefilled` (each row gets a copy).
"""
from __future__ import annotations

import time
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
