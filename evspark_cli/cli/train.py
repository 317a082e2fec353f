"""`evspark train`: pretrain a StripedHyena 2 target on FASTA genomes (train/pretrain.py)."""
from __future__ import annotations

from typing import Optional

import typer

from .app import command, say
from .options import MaxMemoryOpt, QuietOpt, progress_bar


@command()
def train(
    config: str = typer.Option(..., "--config", help="train_config.json of the run (see "
                               "models/*/MODEL_CARD.md for the bundled recipe)."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from RUN/ckpt.pt if "
                                "present."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Override the total number of "
                                        "steps (the length of the cosine schedule)."),
    stop_at: Optional[int] = typer.Option(None, "--stop-at", help="Checkpoint and stop at this "
                                          "step (to replay a run whose budget changed on the "
                                          "way)."),
    export_only: bool = typer.Option(False, "--export-only", help="Only export the last "
                                     "checkpoint as a model folder."),
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
    check_run_outputs(cfg, run.export)
    trainer = Trainer(cfg, max_memory=max_memory)
    if trainer.start(resume, export_only):
        say(f"evspark: resumed {cfg.out_dir} at step {trainer.step}")
    if not export_only:
        with progress_bar(quiet, "train") as prog:
            task = prog.add_task("train", total=cfg.steps, completed=trainer.step, note="")

            def cb(step: int, total: int, loss: float) -> None:
                prog.update(task, completed=step, note=f"loss={loss:.3f}")

            try:
                trainer.run(cb, stop_at=run.stop_at)
            except KeyboardInterrupt:
                say(f"evspark: interrupted; rerun the same command to resume from "
                    f"{trainer.ckpt_path} (step {checkpoint_step(trainer.ckpt_path)})")
                raise typer.Exit(130) from None
    folder = trainer.export(run.export)
    say(f"evspark: exported {folder} (step {trainer.step}, {trainer.tokens_seen:,} tokens)")
