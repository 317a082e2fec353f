"""The Python API of cli.md: `generate` and drafter resolution, shared by the CLI."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .decode.drafters.base import Drafter, RngKey
from .decode.drafters.identity import IdentityDrafter
from .decode.drafters.kmer import KmerDrafter
from .decode.native import DecodeResult, decode_native
from .decode.sampling import SamplerConfig
from .decode.speculative import ROLLBACKS, decode_speculative
from .errors import InputError, ModelError
from .model.model import StripedHyena
from .model.tokenizer import detokenize, tokenize

STATS_COLUMNS = ["record_id", "sample", "prompt_len", "new_tokens", "mode", "drafter", "gamma",
                 "rounds", "tau", "acceptance_rate", "wall_s", "tokens_per_s", "native_wall_s",
                 "native_tokens_per_s", "speedup"]


def bundled_drafter_dir(model: StripedHyena, seed: int = 0) -> Path | None:
    if model.source_dir is None:
        return None
    d = Path(model.source_dir) / "drafters" / f"seed{seed}"
    return d if (d / "config.json").is_file() else None


def check_gamma(drafter: Any, gamma: int) -> None:
    """Refuse a gamma the drafter cannot propose (a dspark drafter has slots for gamma_max).
    Callers pass the largest gamma a round will use: min(gamma, new tokens - 1)."""
    limit = getattr(getattr(drafter, "cfg", None), "gamma_max", None)
    if isinstance(limit, int) and gamma > limit:
        raise InputError(f"gamma {gamma}: this drafter proposes at most {limit} tokens per round")


def resolve_drafter(model: StripedHyena, spec: Any, force: bool = False) -> Drafter | None:
    """'auto' | None/'none' | 'identity' | 'kmer' | 'dspark' | a drafter folder | a Drafter."""
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
        raise InputError(f"--drafter {s!r}: not a drafter name (auto, dspark, kmer, identity, none) "
                         "nor a drafter folder")
    from .decode.drafters.dspark import load_drafter

    return load_drafter(path, model, force=force)


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
    row: dict[str, Any] = {
        "record_id": record_id, "sample": sample, "prompt_len": prompt_len, "new_tokens": n,
        "mode": res.mode, "drafter": drafter, "gamma": gamma if res.mode == "speculative" else None,
        "rounds": res.rounds if res.mode == "speculative" else None, "tau": _round(res.tau),
        "acceptance_rate": _round(res.acceptance_rate), "wall_s": _round(res.wall_s),
        "tokens_per_s": _round(n / res.wall_s if res.wall_s > 0 else None, 2),
        "native_wall_s": None, "native_tokens_per_s": None, "speedup": None,
    }
    if native is not None:
        row["native_wall_s"] = _round(native.wall_s)
        row["native_tokens_per_s"] = _round(len(native.tokens) / native.wall_s, 2)
        row["speedup"] = _round(native.wall_s / res.wall_s, 3)
    return row


def generate(model: StripedHyena, prompt: str | list[int], max_new_tokens: int = 64,
             drafter: Any = "auto", gamma: int = 12, temperature: float = 1.0, top_k: int = 4,
             top_p: float = 1.0, seed: int = 0, rollback: str = "slice", record: int = 0,
             sample: int = 0, record_id: str = "prompt", compare_native: bool = False,
             force_drafter: bool = False) -> GenerateOutput:
    """Continue `prompt` by `max_new_tokens` tokens; lossless whatever the drafter."""
    ids = tokenize(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
    if not ids:
        raise InputError("empty prompt")
    vocab = model.config.vocab_size
    bad = next((t for t in ids if not 0 <= t < vocab), None)
    if bad is not None:
        raise InputError(f"prompt token {bad} is outside the model's vocabulary 0..{vocab - 1}")
    for name, v in (("max_new_tokens", max_new_tokens), ("gamma", gamma), ("seed", seed)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise InputError(f"{name} must be an integer, got {v!r}")
    if not 0 <= seed < 2 ** 63:
        raise InputError(f"seed must be an integer in [0, 2**63), got {seed}")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if gamma < 1:
        raise InputError(f"gamma must be >= 1, got {gamma}")
    limit = model.config.max_seqlen
    if len(ids) + max_new_tokens > limit:
        raise InputError(f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the "
                         f"model's context of {limit}")
    if rollback not in ROLLBACKS:
        raise InputError(f"rollback must be one of {', '.join(ROLLBACKS)}, got {rollback!r}")
    sampler = SamplerConfig(temperature, top_k, top_p)
    sampler.validate()
    d = resolve_drafter(model, drafter, force=force_drafter)
    check_gamma(d, min(gamma, max_new_tokens - 1))  # rounds never draft more
    rng = RngKey(seed, record, sample)
    native = None
    if compare_native:
        native = decode_native(model, ids, max_new_tokens, sampler, rng, label=record_id)
    if d is None:
        res = native or decode_native(model, ids, max_new_tokens, sampler, rng, label=record_id)
    else:
        res = decode_speculative(model, ids, max_new_tokens, sampler, d, gamma, rng, rollback,
                                 label=record_id)
    stats = make_stats(record_id, sample, len(ids), res, drafter_name(d), gamma,
                       native if d is not None else None)
    return GenerateOutput(res.tokens, detokenize(res.tokens), stats, res, native)
