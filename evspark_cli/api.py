"""The Python API: `generate`, the decoding settings and drafter resolution (docs/).

Every decoding setting a user gives is checked here, once: a `DecodeOptions` cannot be built
from values that have no meaning, `check_context` and `check_gamma` judge them against a model
and a drafter. The command line builds the same objects and only maps their errors to exit codes.
"""
from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .cpus import Threads, usable_cpus
from .decode.drafters.base import Drafter, RngKey
from .decode.drafters.identity import IdentityDrafter
from .decode.drafters.kmer import KmerDrafter
from .decode.native import DecodeResult, decode_native
from .decode.sampling import SamplerConfig
from .decode.speculative import ROLLBACKS, decode_speculative
from .errors import InputError, ModelError, SettingError, at_least
from .model.model import StripedHyena
from .model.tokenizer import detokenize, tokenize

if TYPE_CHECKING:
    from .io.fasta import Prompt

STATS_COLUMNS = ["record_id", "sample", "prompt_len", "new_tokens", "mode", "drafter", "gamma",
                 "rounds", "tau", "acceptance_rate", "wall_s", "tokens_per_s", "native_wall_s",
                 "native_tokens_per_s", "speedup"]


@dataclass(frozen=True)
class DecodeOptions:
    """What a generation asks for; checked when built, so an instance always holds valid values.

    Defaults are the Python API's; the command line passes its own.
    """

    max_new_tokens: int = 64
    gamma: int = 12
    temperature: float = 1.0
    top_k: int = 4
    top_p: float = 1.0
    seed: int = 0
    samples: int = 1  # continuations per record
    rollback: str = "slice"

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "gamma", "seed", "samples"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise SettingError.of(name, f"must be an integer, got {v!r}")
        if not 0 <= self.seed < 2 ** 63:
            raise SettingError.of("seed", f"must be an integer in [0, 2**63), got {self.seed}")
        at_least("max_new_tokens", self.max_new_tokens, 1)
        at_least("gamma", self.gamma, 1)
        at_least("samples", self.samples, 1)
        if self.rollback not in ROLLBACKS:
            raise SettingError.of("rollback", f"must be {' or '.join(ROLLBACKS)}, "
                                              f"got {self.rollback!r}")
        self.sampler.validate()

    @property
    def sampler(self) -> SamplerConfig:
        return SamplerConfig(self.temperature, self.top_k, self.top_p)

    @property
    def largest_draft(self) -> int:
        """The most drafts a round proposes: rounds never draft past the tokens still asked."""
        return min(self.gamma, self.max_new_tokens - 1)


def check_context(model: StripedHyena, prompt_len: int, new_tokens: int, record_id: str) -> None:
    """A prompt and its continuation must fit in the model's context."""
    limit = model.config.max_seqlen
    if prompt_len + new_tokens > limit:
        raise InputError(f"record '{record_id}': prompt of {prompt_len} bases + {new_tokens} new "
                         f"tokens exceeds the model's context of {limit}; use --prompt-tail N")


def check_gamma(drafter: Any, gamma: int) -> None:
    """Refuse a gamma the drafter cannot propose (a dspark drafter has slots for gamma_max).
    Callers pass the largest gamma a round will use (`DecodeOptions.largest_draft`)."""
    limit = getattr(getattr(drafter, "cfg", None), "gamma_max", None)
    if isinstance(limit, int) and gamma > limit:
        raise InputError(f"gamma {gamma}: this drafter proposes at most {limit} tokens per round")


def set_threads(threads: int) -> Threads:
    """CPU threads for torch: `threads`, or for 0 the CPUs this process may use (affinity,
    cgroup quota, scheduler variables: cpus.py), so a job never oversubscribes its allowance by
    default. Returns what was set and why (the run's summary reports it)."""
    at_least("threads", threads, 0)
    import torch

    allowed = usable_cpus()
    n = threads or allowed.count
    torch.set_num_threads(n)
    return Threads(n, "--threads" if threads else allowed.source, allowed)


def record_key(record_id: str) -> int:
    """A stable RNG key per record id: output does not depend on record order or sharding."""
    return int.from_bytes(hashlib.sha256(record_id.encode()).digest()[:7], "big")


def model_and_drafter(model_dir: str | Path | None, prompts: Sequence[Prompt],
                      options: DecodeOptions, drafter: Any = "auto", force_drafter: bool = False,
                      **load: Any) -> tuple[StripedHyena, Drafter | None]:
    """The model (`load_model` keywords in `load`) and the drafter for a run over `prompts`,
    with every prompt's length and the draft length checked against them before any work."""
    from .model.checkpoint import load_model

    model = load_model(model_dir, **load)
    for p in prompts:
        check_context(model, len(p.seq), options.max_new_tokens, p.id)
    d = resolve_drafter(model, drafter, force=force_drafter, max_memory=load.get("max_memory"))
    check_gamma(d, options.largest_draft)
    return model, d


def bundled_drafter_dir(model: StripedHyena, seed: int = 0) -> Path | None:
    if model.source_dir is None:
        return None
    d = Path(model.source_dir) / "drafters" / f"seed{seed}"
    return d if (d / "config.json").is_file() else None


def resolve_drafter(model: StripedHyena, spec: Any, force: bool = False,
                    max_memory: str | int | None = None) -> Drafter | None:
    """'auto' | None/'none' | 'identity' | 'kmer' | 'dspark' | a drafter folder | a Drafter.
    A drafter folder is refused unbuilt when it would not fit in memory (or `max_memory`)."""
    if spec is None or spec == "none":
        return None
    if not isinstance(spec, (str, Path)):
        return spec
    s = str(spec)
    if s == "identity":
        return IdentityDrafter()
    if s == "kmer":
        return KmerDrafter(vocab=model.config.vocab_size)
    if s in ("auto", "dspark"):
        folder = bundled_drafter_dir(model)
        if folder is None:
            if s == "auto":
                return KmerDrafter(vocab=model.config.vocab_size)
            raise ModelError("this model has no bundled dspark drafter; pass a drafter folder")
        spec = folder
    path = Path(spec)
    if not path.is_dir():
        raise InputError(f"--drafter {s!r}: not a drafter name (auto, dspark, kmer, identity, "
                         "none) nor a drafter folder")
    return _loaded_drafter(model, path, force, max_memory)


_DRAFTERS: "weakref.WeakKeyDictionary[StripedHyena, dict[tuple, Drafter]]" = \
    weakref.WeakKeyDictionary()
"""Drafters loaded for each live model, by folder and file stamps: a loop of `generate` calls
loads (and checks against its target's weights hash) a drafter folder once, not once a call."""


def _loaded_drafter(model: StripedHyena, folder: Path, force: bool,
                    max_memory: str | int | None) -> Drafter:
    """The drafter of `folder` for `model`, loaded once while its files stay unchanged (a
    drafter holds weights only; each run's rows live in `Drafter.rows`)."""
    from .decode.drafters.dspark import load_drafter

    folder = folder.resolve()
    stamps = tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None
                   for f in (folder / "config.json", folder / "model.safetensors"))
    key = (str(folder), force, stamps)
    loaded = _DRAFTERS.setdefault(model, {})
    if key not in loaded:
        loaded.clear()  # one folder at a time per model: a replaced drafter is not kept alive
        loaded[key] = load_drafter(folder, model, force=force, max_memory=max_memory)
    return loaded[key]


def drafter_name(drafter: Drafter | None) -> str:
    return "none" if drafter is None else getattr(drafter, "name", type(drafter).__name__)


@dataclass
class GenerateOutput:
    tokens: list[int]
    text: str
    stats: dict[str, Any] = field(default_factory=dict)
    result: DecodeResult | None = None
    native: DecodeResult | None = None


def _round(x: float | None, nd: int = 4) -> float | None:
    return None if x is None else round(float(x), nd)


def make_stats(record_id: str, sample: int, prompt_len: int, res: DecodeResult, drafter: str,
               gamma: int, native: DecodeResult | None) -> dict[str, Any]:
    n = len(res.tokens)
    spec = res.mode == "speculative"
    row: dict[str, Any] = {
        "record_id": record_id, "sample": sample, "prompt_len": prompt_len, "new_tokens": n,
        "mode": res.mode, "drafter": drafter, "gamma": gamma if spec else None,
        "rounds": res.rounds if spec else None, "tau": _round(res.tau),
        "acceptance_rate": _round(res.acceptance_rate), "wall_s": _round(res.wall_s),
        "tokens_per_s": _round(n / res.wall_s if res.wall_s > 0 else None, 2),
        "native_wall_s": None, "native_tokens_per_s": None, "speedup": None,
    }
    if native is not None:
        row["native_wall_s"] = _round(native.wall_s)
        row["native_tokens_per_s"] = _round(len(native.tokens) / native.wall_s, 2)
        row["speedup"] = _round(native.wall_s / res.wall_s, 3)
    return row


def prompt_ids(model: StripedHyena, prompt: str | list[int]) -> list[int]:
    """A prompt as token ids inside the model's vocabulary."""
    ids = tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise InputError("empty prompt")
    vocab = model.config.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InputError(f"prompt token {bad} is outside the model's vocabulary 0..{vocab - 1}")
    return ids


def continue_prompt(model: StripedHyena, ids: list[int], options: DecodeOptions,
                    drafter: Drafter | None, record: int = 0, sample: int = 0,
                    record_id: str = "prompt", compare_native: bool = False) -> GenerateOutput:
    """Continue checked prompt ids with checked options (see `generate`): the engine call the
    command line makes per record, after checking every value once for the whole run."""
    sampler, n = options.sampler, options.max_new_tokens
    rng = RngKey(options.seed, record, sample)
    native = None
    if compare_native:
        native = decode_native(model, ids, n, sampler, rng, label=record_id)
    if drafter is None:
        res = native or decode_native(model, ids, n, sampler, rng, label=record_id)
    else:  # a round never drafts past the tokens still asked: nothing is reserved for more
        res = decode_speculative(model, ids, n, sampler, drafter, max(options.largest_draft, 1),
                                 rng, options.rollback, label=record_id)
    stats = make_stats(record_id, sample, len(ids), res, drafter_name(drafter), options.gamma,
                       native if drafter is not None else None)
    return GenerateOutput(res.tokens, detokenize(res.tokens), stats, res, native)


def generate(model: StripedHyena, prompt: str | list[int], max_new_tokens: int = 64,
             drafter: Any = "auto", gamma: int = 12, temperature: float = 1.0, top_k: int = 4,
             top_p: float = 1.0, seed: int = 0, rollback: str = "slice", record: int = 0,
             sample: int = 0, record_id: str = "prompt", compare_native: bool = False,
             force_drafter: bool = False) -> GenerateOutput:
    """Continue `prompt` by `max_new_tokens` tokens; lossless whatever the drafter."""
    options = DecodeOptions(max_new_tokens, gamma, temperature, top_k, top_p, seed,
                            rollback=rollback)
    ids = prompt_ids(model, prompt)
    check_context(model, len(ids), max_new_tokens, record_id)
    d = resolve_drafter(model, drafter, force=force_drafter)
    check_gamma(d, options.largest_draft)
    return continue_prompt(model, ids, options, d, record, sample, record_id, compare_native)
