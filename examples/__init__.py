"""Example prompts, installed as the package data `evspark_cli.examples` (see pyproject.toml)."""
