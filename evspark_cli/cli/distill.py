"""`evspark distill`: distil a DSpark drafter from a target (train/distill.py)."""
from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import List, Optional

import typer

from .app import command, interrupt_code, say
from .common import use_threads, warn
from .options import MaxMemoryOpt, ModelOpt, QuietOpt, ThreadsOpt, option
from .progress import Progress

EXAMPLE = """Example: distil a drafter (seed 1) for a converted Evo 2 model from your genomes,
building its teacher cache on the GPU:

  evspark distill --model models/evo2-1b --train genomes/ --seed 1 --device cuda"""


@command({"prefix_len": "--prefix"})
def distill(
    model_dir: Optional[str] = ModelOpt,
    train_data: Optional[List[str]] = typer.Option(None, "--train", help="Training FASTA files or "
                                                    "folders for the teacher cache."),
    cache: Optional[str] = typer.Option(None, "--cache", help="Teacher-cache folder (built here "
                                        "if it has no index.json)."),
    out: Optional[str] = typer.Option(None, "-o", "--output", help="Drafter folder to write "
                                      "(default MODEL/drafters/seed{SEED})."),
    seed: int = typer.Option(0, "--seed", help="Drafter training seed."),
    steps: int = typer.Option(3000, "--steps", help="Training steps."),
    batch: int = typer.Option(64, "--batch", help="Anchors per step."),
    gamma: int = typer.Option(12, "--gamma", help="Draft positions supervised per anchor."),
    natural_windows: int = typer.Option(384, "--natural-windows", help="Natural windows in the "
                                        "cache."),
    onpolicy_windows: int = typer.Option(192, "--onpolicy-windows", help="Target-generated "
                                         "windows."),
    greedy_windows: int = typer.Option(0, "--greedy-windows", help="Windows the target "
                                       "continues greedily (teach greedy decoding's repeats)."),
    window: int = typer.Option(1024, "--window", help="Tokens per cached window."),
    width: int = typer.Option(128, "--width", help="Drafter trunk width."),
    layers: int = typer.Option(2, "--layers", help="Drafter trunk layers."),
    prefix: int = typer.Option(64, "--prefix", help="Hidden-state prefix length P."),
    markov_order: int = typer.Option(1, "--markov-order", help="Tokens the Markov head reads "
                                     "before each draft (1: the previous token only)."),
    trunk_markov: bool = option(False, "--trunk-markov", help="The trunk also writes each "
                                "draft slot's Markov table, so how a draft follows the tokens "
                                "before it depends on the context."),
    run_dir: Optional[str] = typer.Option(None, "--run-dir", help="Checkpoints and log "
                                          "(resumable; default OUT.run)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda: where the target "
                               "builds the cache and the drafter trains."),
    threads: int = ThreadsOpt,
    quiet: bool = QuietOpt,
    max_memory: Optional[str] = MaxMemoryOpt,
) -> None:
    """Distil a DSpark drafter (parallel trunk + Markov head) from a target model."""
    from ..bundled import default_model_dir
    from ..train.distill import CacheConfig, DistillConfig, DistillTrainer, prepare_cache
    from ..train.pretrain import checkpoint_step

    target = Path(model_dir) if model_dir else default_model_dir()
    cache_dir = Path(cache) if cache else target / "teacher_cache"
    dest = Path(out) if out else target / "drafters" / f"seed{seed}"
    cfg = DistillConfig(cache=str(cache_dir), out_dir=run_dir or f"{dest}.run", seed=seed,
                        steps=steps, batch=batch, gamma=gamma, width=width, layers=layers,
                        prefix_len=prefix, markov_order=markov_order,
                        trunk_markov=trunk_markov, device=device)
    cache_cfg = CacheConfig(target=str(target), out_dir=str(cache_dir),
                            train=list(train_data or []), natural_windows=natural_windows,
                            onpolicy_windows=onpolicy_windows, greedy_windows=greedy_windows,
                            window=window, seed=0, device=device)
    _check_outputs(target, dest, cache_dir, train_data or [])
    used = use_threads(threads)
    t0 = time.monotonic()
    prepare_cache(cache_cfg, log=lambda m: None if quiet else say(m), max_memory=max_memory,
                  warn=warn)
    trainer = DistillTrainer(cfg, max_memory=max_memory)
    if trainer.resume():
        say(f"evspark: resumed drafter training at step {trainer.step}")
    first, losses = trainer.step, []
    with Progress("distill", "steps", total=steps, quiet=quiet) as prog:
        prog.update(trainer.step)

        def step_done(step: int, total: int, loss: float) -> None:
            losses[:] = [loss]
            prog.update(step, detail=f"loss {loss:.4f}")

        try:
            trainer.run(step_done)
        except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM
            ckpt = trainer.out / "ckpt.pt"
            say(f"evspark: interrupted; rerun the same command to resume from {ckpt} "
                f"(step {checkpoint_step(ckpt)})")
            raise typer.Exit(interrupt_code(e)) from None
    folder = trainer.export(dest)
    say(f"evspark: wrote drafter {folder} ({trainer.step * batch * gamma:,} supervised positions)")
    loss = f", last loss {losses[0]:.4f}" if losses else ""
    say(f"evspark: distill: steps {first} to {trainer.step} of {steps} in "
        f"{time.monotonic() - t0:.1f} s{loss}, {used.describe()}")


def _check_outputs(target: Path, dest: Path, cache: Path, train: List[str]) -> None:
    """The drafter folder must not overwrite the target's files, the teacher cache's or a
    training file (`-o MODEL` would replace the target's weights with the drafter's)."""
    from ..errors import InputError
    from ..files import Output, check_distinct, folder_inputs
    from ..limits import run_inputs
    from ..train.corpus import fasta_files

    fasta: list[str] = []
    for path in train:  # a missing one is reported where it is read (if it is needed)
        with contextlib.suppress(InputError):
            fasta += [str(f) for f in fasta_files([path])]
    inputs = [*run_inputs(fasta, model_dir=target),
              *folder_inputs(cache, f"in the teacher cache {cache}")]
    check_distinct(inputs, [Output("--output", str(dest / name), (".tmp",))
                            for name in ("config.json", "model.safetensors")])
