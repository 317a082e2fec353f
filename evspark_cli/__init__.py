"""EvSpark: lossless speculative decoding for StripedHyena 2 (Evo 2-style) DNA models.

The stable Python API (the contract in docs/): `load_model`, `convert_checkpoint`, `tokenize`,
`detokenize`, `generate`, `generate_many`, `score`, `score_variants`, `embed`; a model offers
`forward`, `prefill`, `extend` and blocks offer `commit`.
Names are resolved lazily so that `evspark --help` does not import torch.
"""
from __future__ import annotations

import importlib
from typing import Any

from .cpus import screen_cpu_env, take_cpu_env_warnings

__version__ = "0.1.0"

screen_cpu_env()  # before torch is imported: libgomp reads OMP_NUM_THREADS then (cpus.py)

_API = {
    "load_model": "evspark_cli.model.checkpoint",
    "convert_checkpoint": "evspark_cli.model.checkpoint",
    "save_model": "evspark_cli.model.checkpoint",
    "tokenize": "evspark_cli.model.tokenizer",
    "detokenize": "evspark_cli.model.tokenizer",
    "generate": "evspark_cli.api",
    "generate_many": "evspark_cli.api",
    "GenerateOutput": "evspark_cli.api",
    "score": "evspark_cli.api",
    "ScoreResult": "evspark_cli.api",
    "score_variants": "evspark_cli.api",
    "VariantScore": "evspark_cli.api",
    "embed": "evspark_cli.api",
    "Client": "evspark_cli.serve.client",
    "ModelConfig": "evspark_cli.model.config",
    "StripedHyena": "evspark_cli.model.model",
}

__all__ = [*_API, "__version__"]


def __getattr__(name: str) -> Any:
    if name in _API:
        _warn_environment()
        return vars(importlib.import_module(_API[name]))[name]
    raise AttributeError(f"module 'evspark_cli' has no attribute {name!r}")


def _warn_environment() -> None:
    """The malformed CPU variables found at import (cpus.py), for a Python caller: a
    RuntimeWarning each, once (the command line shows them as warning lines instead)."""
    import warnings

    for message in take_cpu_env_warnings():
        warnings.warn(f"evspark: {message}", RuntimeWarning, stacklevel=3)
