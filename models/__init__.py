"""Bundled models, installed as the package data `evspark_cli.models` (see pyproject.toml).

Each folder is a model (config.json, model.safetensors, MODEL_CARD.md, drafters/); DEFAULT
names the default target. Found at run time through evspark_cli/bundled.py.
"""
