"""`evspark convert`: an Evo 2 / vortex checkpoint into an EvSpark model folder."""
from __future__ import annotations

from typing import Optional

import typer

from .app import command, say
from .options import MaxMemoryOpt

EXAMPLE = """Example: convert the Evo 2 1B base checkpoint and its config, then check it:

  evspark convert evo2_1b_base.pt --config evo2-1b-8k.yml -o models/evo2-1b
  evspark info --model models/evo2-1b"""


@command()
def convert(
    checkpoint: str = typer.Argument(..., help="Evo 2 / vortex checkpoint (.pt or .safetensors)."),
    config: str = typer.Option(..., "--config", help="Its config (.yml or .json, Evo 2 field "
                               "names)."),
    out: str = typer.Option(..., "-o", "--output", help="Output model folder (new, or without "
                            "a model in it)."),
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Convert an Evo 2 / vortex checkpoint into an EvSpark model folder."""
    from ..model.checkpoint import convert_checkpoint

    folder = convert_checkpoint(checkpoint, config, out, max_memory=max_memory)
    say(f"evspark: wrote {folder}")
