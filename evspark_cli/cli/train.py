"""`evspark train`: pretrain a StripedHyena 2 target on FASTA genomes (train/pretrain.py)."""
from __future__ import annotations

import time
from typing import Optional

import typer

from .app import command, interrupt_code, say
from .common import warn_clamped
from .options import MaxMemoryOpt, QuietOpt
from .progress import Progress

EXAMPLE = """Example: pretrain the bundled recipe in a run folder of your own (resumable: rerun
the same command after an interruption), then export the model:

  evspark train --config runs/sh2-192/train_config.json"""


@command()
def train(
    config: str = typer.Option(..., "--config", help="train_config.json of the run (see "
                               "models/*/MODEL_CARD.md for the bundled recipe)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", metavar="",
                                help="Continue from RUN/ckpt.pt if present."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Override the total number of "
                                        "steps (the length of the cosine schedule)."),
    stop_at: Optional[int] = typer.Option(None, "--stop-at", help="Checkpoint and stop at this "
                                          "step (to replay a run whose budget changed on the "
                                          "way)."),
    export_only: bool = typer.Option(False, "--export-only", metavar="", help="Only export the "
                                     "last checkpoint as a model folder."),
    export: Optional[str] = typer.Option(None, "--export", help="Model folder to export to "
                                         "(default RUN/model)."),
    quiet: bool = QuietOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Pretrain a StripedHyena 2 target on FASTA genomes (resumable, logged, deterministic)."""
    from ..train.pretrain import (
        RunOptions,
        Trainer,
        check_run_outputs,
        checkpoint_step,
        load_train_config,
    )

    cfg = load_train_config(config, steps)
    run = RunOptions(stop_at, export)
    check_run_outputs(cfg, run.export, config)
    trainer = Trainer(cfg, max_memory=max_memory)
    if trainer.threads is not None:
        warn_clamped(trainer.threads, "train config: threads")
    if trainer.start(resume, export_only):
        say(f"evspark: resumed {cfg.out_dir} at step {trainer.step}")
    t0, first, last_loss = time.monotonic(), trainer.step, None
    if not export_only:
        with Progress("train", "steps", total=cfg.steps, quiet=quiet) as prog:
            prog.update(trainer.step)

            def cb(step: int, total: int, loss: float) -> None:
                nonlocal last_loss
                last_loss = loss
                prog.update(step, detail=f"loss {loss:.3f}")

            try:
                trainer.run(cb, stop_at=run.stop_at)
            except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM
                say(f"evspark: interrupted; rerun the same command to resume from "
                    f"{trainer.ckpt_path} (step {checkpoint_step(trainer.ckpt_path)})")
                raise typer.Exit(interrupt_code(e)) from None
    folder = trainer.export(run.export)
    say(f"evspark: exported {folder} (step {trainer.step}, {trainer.tokens_seen:,} tokens)")
    loss = f", last loss {last_loss:.3f}" if last_loss is not None else ""
    say(f"evspark: train: steps {first} to {trainer.step} of {cfg.steps} in "
        f"{time.monotonic() - t0:.1f} s{loss}, {trainer.tokens_seen:,} tokens seen")
