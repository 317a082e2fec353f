"""Which drafter a name means: `auto`, `none`, `identity`, `kmer`, `dspark` or a drafter folder.

A model folder may carry its distilled drafters (`drafters/seed{N}/`); `auto` takes seed 0's and
falls back to the k-mer drafter for a model that has none. A drafter folder is loaded once per
live model while its files stay unchanged, so a loop of API calls does not re-read it (nor
re-hash its target's weights) every time.
"""
from __future__ import annotations

import weakref
from pathlib import Path

from ...errors import ModelError, SettingError
from ...model.model import StripedHyena
from .base import Drafter
from .identity import IdentityDrafter
from .kmer import KmerDrafter

NAMES = ("auto", "dspark", "kmer", "identity", "none")


def drafter_name(drafter: Drafter | None) -> str:
    """The drafter's name as outputs record it; `none` for native decoding."""
    return "none" if drafter is None else drafter.name


def drafter_dir(model_folder: str | Path | None, seed: int = 0) -> Path | None:
    """The folder of the distilled drafter of `seed` a model folder holds, if it has one."""
    if model_folder is None:
        return None
    d = Path(model_folder) / "drafters" / f"seed{seed}"
    return d if (d / "config.json").is_file() else None


def bundled_drafter_dir(model: StripedHyena, seed: int = 0) -> Path | None:
    """The folder of the model's distilled drafter of `seed`, if its folder has one."""
    return drafter_dir(model.source_dir, seed)


def drafter_folder(model_folder: str | Path | None, spec: str | Path | None) -> Path | None:
    """The folder a drafter `spec` (as `resolve_drafter` takes it) reads, found without loading
    anything: None for a built-in drafter, native decoding or a spec that is no folder (which
    `resolve_drafter` refuses)."""
    if spec is None:
        return None
    s = str(spec)
    if s in ("auto", "dspark"):
        return drafter_dir(model_folder)
    if s in NAMES:
        return None
    return Path(s) if Path(s).is_dir() else None


def resolve_drafter(model: StripedHyena, spec: str | Path | Drafter | None, force: bool = False,
                    max_memory: str | int | None = None) -> Drafter | None:
    """'auto' | None/'none' | 'identity' | 'kmer' | 'dspark' | a drafter folder | a Drafter.
    A drafter folder is refused unbuilt when it would not fit in memory (or `max_memory`)."""
    if spec is None or spec == "none":
        return None
    if not isinstance(spec, (str, Path)):
        return spec  # a Drafter object
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
        raise SettingError("{0} " + _braced(repr(s)) + ": not a drafter name ("
                           + ", ".join(NAMES) + ") nor a drafter folder", "drafter")
    return _loaded_drafter(model, path, force, max_memory)


def _braced(text: str) -> str:
    """`text` inside a SettingError template (braces doubled)."""
    return text.replace("{", "{{").replace("}", "}}")


_LOADED: weakref.WeakKeyDictionary[StripedHyena, dict[tuple, Drafter]] = \
    weakref.WeakKeyDictionary()
"""Drafters loaded for each live model, by folder and file stamps."""


def _loaded_drafter(model: StripedHyena, folder: Path, force: bool,
                    max_memory: str | int | None) -> Drafter:
    """The drafter of `folder` for `model`, loaded once while its files stay unchanged (a
    drafter holds weights only; each run's rows live in `Drafter.rows`)."""
    from .dspark import load_drafter

    folder = folder.resolve()
    stamps = tuple((f.stat().st_mtime_ns, f.stat().st_size) if f.is_file() else None
                   for f in (folder / "config.json", folder / "model.safetensors"))
    key = (str(folder), force, stamps)
    loaded = _LOADED.setdefault(model, {})
    if key not in loaded:
        loaded.clear()  # one folder at a time per model: a replaced drafter is not kept alive
        loaded[key] = load_drafter(folder, model, force=force, max_memory=max_memory)
    return loaded[key]
