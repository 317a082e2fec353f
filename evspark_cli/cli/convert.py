"""`evspark convert`: an Evo 2 / vortex checkpoint into an EvSpark model folder."""
from __future__ import annotations

import typer

from .app import command, say


@command()
def convert(
    checkpoint: str = typer.Argument(..., help="Evo 2 / vortex checkpoint (.pt or .safetensors)."),
    config: str = typer.Option(..., "--config", help="Its config (.yml or .json, Evo 2 field "
                               "names)."),
    out: str = typer.Option(..., "-o", "--output", help="Output model folder."),
) -> None:
    """Convert an Evo 2 / vortex checkpoint into an EvSpark model folder."""
    from ..model.checkpoint import convert_checkpoint

    folder = convert_checkpoint(checkpoint, config, out)
    say(f"evspark: wrote {folder}")
