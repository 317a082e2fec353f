"""Where the bundled model and the example prompts are, wherever the package is installed.

The repository keeps them in its top-level `models/` and `examples/` folders; pyproject.toml
installs those folders as the package data `evspark_cli.models` and `evspark_cli.examples`, so a
wheel, a plain `pip install .` and an editable install all find them through importlib.resources.
`EVSPARK_MODELS` names another folder of model folders (a site-wide model store, say).
"""
from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from .errors import InputError, ModelError, literal


def _package_dir(package: str) -> Path:
    """The folder of an installed data package (a real folder: models are memory-mapped)."""
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        root = None
    if not isinstance(root, Path) or not root.is_dir():
        raise ModelError(f"the package data {package} is not installed as a folder; reinstall "
                         "evspark or set EVSPARK_MODELS to a folder of model folders")
    return root


def models_dir() -> Path:
    """The folder of model folders: $EVSPARK_MODELS, else the bundled `models/`."""
    env = os.environ.get("EVSPARK_MODELS")
    return Path(env) if env else _package_dir("evspark_cli.models")


def default_model_dir() -> Path:
    """The default target: the folder named in `DEFAULT` there, else the first model folder."""
    root = models_dir()
    marker = root / "DEFAULT"
    if marker.is_file():
        return root / marker.read_text().strip()
    found = sorted(p.parent for p in root.glob("*/config.json"))
    if not found:
        raise ModelError(literal(f"no model found in {root}; ") + "pass {0} DIR", "model")
    return found[0]


def example_prompts() -> Path:
    """The example prompts (FASTA) that ship with the package."""
    path = _package_dir("evspark_cli.examples") / "prompts.fa"
    if not path.is_file():
        raise InputError(f"the example prompts {path} are missing; give a FASTA file")
    return path
