"""Plain autoregressive decoding through `extend(k=1)`: the reference everything is checked against.

Both decoders start the same way: the prompt except its last token is prefilled, and that last
token becomes the *anchor* — the newest token not yet fed to the model. A native step feeds the
anchor, samples the next token from p̃ with the SAMPLE stream at its absolute position, and makes
it the new anchor. (A speculative round feeds the anchor plus gamma drafts instead.)
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import InputError, RunError
from ..model.model import StripedHyena
from ..model.state import InferenceState
from .drafters.base import RngKey
from .sampling import Purpose, SamplerConfig, sample_from_probs, sampler_probs


@dataclass
class DecodeResult:
    tokens: list[int]
    wall_s: float
    mode: str  # "native" or "speculative"
    rounds: int = 0
    accepted: list[int] = field(default_factory=list)  # drafts accepted per round
    proposed: list[int] = field(default_factory=list)  # drafts proposed per round
    draft_s: float = 0.0
    verify_s: float = 0.0
    margins: list[float] = field(default_factory=list)  # native top1 - top2 logit gap per token
    position_accepts: list[int] = field(default_factory=list)  # per draft slot: times accepted
    position_trials: list[int] = field(default_factory=list)  # per draft slot: times reached
    prefill_s: float = 0.0  # time spent in the prompt's prefill (inside wall_s)
    progress: list[tuple[int, float]] = field(default_factory=list)  # (tokens so far, seconds)

    @property
    def tau(self) -> float | None:
        """Committed tokens per round, bonus/correction token included."""
        return (sum(self.accepted) + self.rounds) / self.rounds if self.rounds else None

    @property
    def acceptance_rate(self) -> float | None:
        return sum(self.accepted) / sum(self.proposed) if sum(self.proposed) else None


def start(model: StripedHyena, prompt: list[int], reserve: int, keep_hidden: int = 0
          ) -> tuple[InferenceState, int, Tensor | None]:
    """Prefill prompt[:-1]; return (state, anchor, hidden states of the last `keep_hidden`)."""
    if not prompt:
        raise InputError("empty prompt")
    ids = torch.tensor([prompt[:-1]], dtype=torch.long, device=model.device)
    if ids.shape[1] == 0:
        return model.empty_state(1, capacity=reserve), prompt[-1], None
    _, hidden, state = model.prefill(ids, keep_last=max(1, keep_hidden), reserve=reserve)
    if ids.device.type == "cuda":  # so that prefill_s times the prefill, not its launch
        torch.cuda.synchronize(ids.device)
    return state, prompt[-1], (hidden[0] if keep_hidden else None)


@dataclass
class Prefilled:
    """A prompt already run through the model, reusable by several decodes (each gets a clone).

    Benchmarks prefill a long prompt once and decode natively and speculatively from it, so that
    both decoders are timed on decoding alone."""

    state: InferenceState
    anchor: int
    hidden: Tensor | None  # hidden states of the last prompt positions, for drafters
    seconds: float

    def begin(self, keep_hidden: int = 0) -> tuple[InferenceState, int, Tensor | None]:
        hidden = None
        if keep_hidden:
            if self.hidden is None or self.hidden.shape[0] < min(keep_hidden, self.state.seqlen):
                raise ValueError("this prefill kept fewer hidden states than the drafter needs")
            hidden = self.hidden[-keep_hidden:]
        return self.state.clone(), self.anchor, hidden


@torch.inference_mode()
def prefill_prompt(model: StripedHyena, prompt: list[int], reserve: int, keep_hidden: int = 0
                   ) -> Prefilled:
    t0 = time.perf_counter()
    state, anchor, hidden = start(model, prompt, reserve, keep_hidden)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    return Prefilled(state, anchor, hidden, time.perf_counter() - t0)


def all_finite(logits: Tensor) -> bool:
    """True when no entry is NaN or inf. One sum shows any of them (a sum that only overflows
    is rechecked entry by entry); 2 us where isfinite(...).all() takes 9-19 us per step/round."""
    return math.isfinite(float(logits.sum())) or bool(torch.isfinite(logits).all())


def check_finite(logits: Tensor, position: int, label: str) -> None:
    if not all_finite(logits):
        where = f"record '{label}', " if label else ""
        raise RunError(f"{where}position {position}: the model produced NaN or inf logits")


@torch.inference_mode()
def decode_native(model: StripedHyena, prompt: list[int], max_new_tokens: int,
                  sampler: SamplerConfig, rng: RngKey | None = None, label: str = "",
                  track_margins: bool = False, prefilled: Prefilled | None = None) -> DecodeResult:
    """Generate `max_new_tokens` tokens one `extend(k=1)` at a time (after `prefilled` if given)."""
    rng = rng or RngKey()
    t0 = time.perf_counter()
    if prefilled is not None:
        state, anchor, _ = prefilled.begin()
    else:
        state, anchor, _ = start(model, prompt, reserve=max_new_tokens + 16)
    prefill_s = time.perf_counter() - t0
    out: list[int] = []
    margins: list[float] = []
    progress: list[tuple[int, float]] = []
    dev = model.device
    while len(out) < max_new_tokens:
        logits, _, block = model.extend(state, torch.tensor([[anchor]], device=dev))
        state = block.commit(1)
        row = logits[0, -1]
        check_finite(row, state.seqlen, label)
        if track_margins:
            top = torch.topk(row.float(), 2).values
            margins.append(float(top[0] - top[1]))
        p = sampler_probs(row, sampler)
        anchor = int(sample_from_probs(p, rng.u(state.seqlen, Purpose.SAMPLE)))
        out.append(anchor)
        progress.append((len(out), time.perf_counter() - t0))
    return DecodeResult(out, time.perf_counter() - t0, "native", margins=margins, prefill_s=prefill_s,
                        progress=progress)
