"""Pretraining a StripedHyena 2 target on FASTA genomes: resumable, logged, deterministic.

A run lives in one folder: ``train_config.json`` (what was asked), ``ckpt.pt`` (model, optimizer,
data-generator state and step, rewritten atomically), ``log.jsonl`` (one line per log/eval step)
and, at the end, ``model/`` (an EvSpark model folder). Re-running the same command with
``--resume`` continues from the last checkpoint and gives the same losses as an uninterrupted run.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Collection

import torch
import torch.nn.functional as F

from ..cpus import clamp_threads
from ..errors import InputError, ModelError, SettingError, at_least
from ..eval.score import score_sequence
from ..files import atomic_path
from ..io.fasta import iter_records
from ..model.checkpoint import save_model
from ..model.config import ModelConfig
from ..model.memory import MAX_MEMORY, count, memory_budget, parameter_count
from ..model.model import StripedHyena
from .corpus import Corpus, fasta_files


@dataclass
class TrainConfig:
    out_dir: str
    model: dict = field(default_factory=dict)  # ModelConfig fields
    train: list[str] = field(default_factory=list)
    valid: list[str] = field(default_factory=list)
    window: int = 2048
    batch_size: int = 8
    steps: int = 2000
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    rc_prob: float = 0.5
    eval_every: int = 200
    eval_tokens: int = 32768  # scored tokens per validation file at each eval
    eval_context: int = 2048
    ckpt_every: int = 50
    threads: int = 0  # 0 = torch default
    bf16_autocast: str = "auto"  # auto: on CUDA only


def init_weights(model: StripedHyena, seed: int) -> None:
    """Small-model initialisation: GPT-style linears, identity-ish featurizer, decaying filters.

    LI poles are log-uniform in -[1e-3, 0.5] (memory of 2 to 1000 tokens) with residues scaled by
    |lambda| so every mode starts with a bounded gain; MR taps get savanna's decay envelope.
    """
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    n_layers = cfg.num_layers
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.scale") or name == "norm.scale":
                p.fill_(1.0)
            elif name == "embedding_layer.weight":
                p.normal_(0.0, 0.02, generator=g)
            elif name.endswith(("out_filter_dense.weight", "out_proj.weight", "mlp.l3.weight")):
                p.normal_(0.0, 0.02 / math.sqrt(2 * n_layers), generator=g)
            elif name.endswith(".weight") and p.dim() == 2:
                p.normal_(0.0, 0.02, generator=g)
            elif name.endswith(".bias"):
                p.zero_()
            elif name.endswith("short_filter_weight"):
                p.normal_(0.0, 0.1, generator=g)
                p[..., -1] += 1.0
            elif name.endswith("filter.h"):
                G, _, K = p.shape
                p.normal_(0.0, 1.0, generator=g)
                if K > 16:
                    rates = torch.logspace(-2, 2, G)[:, None, None]
                    tau = torch.linspace(0, 1, K)[None, None, :]
                    p.mul_(torch.exp(-rates * tau) / math.sqrt(K) * 2)
                else:
                    p.mul_(1.0 / math.sqrt(K))
                    p[..., -1] += 1.0
            elif name.endswith("filter.log_poles"):
                D, S, _ = p.shape
                u = torch.rand(D, S, 1, generator=g)
                p.copy_(-torch.exp(math.log(1e-3) + u * (math.log(0.5) - math.log(1e-3))))
            elif name.endswith("filter.residues"):
                lam = dict(model.named_parameters())[name.replace("residues", "log_poles")][..., 0]
                p.normal_(0.0, 1.0, generator=g)
                p.mul_(lam.abs() / math.sqrt(p.shape[1]))
            elif name.endswith("filter.D"):
                p.fill_(1.0)


def keep_poles_stable(model: StripedHyena) -> None:
    """Projected step: LI log-poles stay strictly negative (|pole| < 1), as trained Evo 2 poles
    are."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("filter.log_poles"):
                p.clamp_(max=-1e-5)


def lr_at(cfg: TrainConfig, step: int) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    cosine = 0.5 * (1 + math.cos(math.pi * frac))
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine)


def make_optimizer(model: StripedHyena, cfg: TrainConfig) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and "filter" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8)


def lm_loss(model: StripedHyena, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over a (B, W+1) batch."""
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))


def load_run_checkpoint(path: Path, restore: Callable[[dict], None], mismatch: str,
                        start_over: str = "delete it to start over") -> None:
    """Read a run's ckpt.pt (on the CPU) and hand it to `restore`: one-line ModelErrors for a
    file that cannot be read (truncated, not a torch file, a foreign pickle) and for one that
    does not fit the run (`mismatch` says what to do)."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is the same error to a user
        raise ModelError(f"cannot read checkpoint {path} ({type(exc).__name__}); "
                         f"{start_over}") from exc
    try:
        restore(ck)
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise ModelError(f"checkpoint {path} {mismatch}") from exc


def trim_log(log: Path, step: int) -> None:
    """Keep the rows of a run's log.jsonl up to `step` (a resumed run replays the rest), and
    drop a line an interrupt cut short."""
    if not log.is_file():
        return
    keep = []
    for line in log.read_text().splitlines():
        try:
            if json.loads(line).get("step", 0) <= step:
                keep.append(line)
        except (ValueError, AttributeError):
            continue
    with atomic_path(str(log)) as tmp:
        Path(tmp).write_text("".join(x + "\n" for x in keep))


def _first_record(path: str) -> torch.Tensor:
    """Token ids of the first record of a validation file (read no further: genomes are big)."""
    name = Path(str(path)).name
    first = next(iter_records(fasta_files([path])[0]), None)
    if first is None or len(first.seq) < 2:
        raise InputError(f"valid file {name}: its first record needs at least 2 bases")
    return torch.tensor(list(first.seq.encode("ascii")), dtype=torch.long)


def checkpoint_step(path: Path) -> int:
    """The step a run checkpoint holds (0 when there is none or it cannot be read)."""
    try:
        return int(torch.load(path, map_location="cpu", weights_only=True)["step"])
    except Exception:  # noqa: BLE001 - only for a message
        return 0


def check_training_fits(cfg: ModelConfig, device: torch.device,
                        max_memory: str | int | None = None) -> None:
    """Refuse (ModelError, one line) a model config whose weights, gradients and AdamW moments
    alone (16 bytes a parameter, activations not counted) do not fit, before it is built."""
    reason = memory_budget(device, max_memory).refusal_template(
        16 * parameter_count(cfg), f"training a model of {count(parameter_count(cfg))} parameters")
    if reason is not None:
        raise ModelError("train config: " + reason + "; use a smaller model or more memory",
                         MAX_MEMORY)


class Trainer:
    def __init__(self, cfg: TrainConfig, log: Callable[[str], None] = print,
                 max_memory: str | int | None = None) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.log = log
        # clamped to the CPUs this process may use (a huge count crashes the OpenMP runtime)
        self.threads = clamp_threads(cfg.threads) if cfg.threads else None
        if self.threads is not None:
            torch.set_num_threads(self.threads.count)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model_cfg = ModelConfig.from_dict({**ModelConfig().to_dict(), **cfg.model})
        check_training_fits(self.model_cfg, self.device, max_memory)
        torch.manual_seed(cfg.seed)
        self.model = StripedHyena(self.model_cfg)
        init_weights(self.model, cfg.seed)
        self.model.to(self.device)
        self.opt = make_optimizer(self.model, cfg)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step = 0
        self.tokens_seen = 0
        self.wall = 0.0
        if not cfg.train:
            raise SettingError("training needs at least one {0} FASTA file or folder", "train")
        if self.out.exists() and not self.out.is_dir():
            raise InputError(f"out_dir {self.out} is a file, not a run folder")
        self.corpus = Corpus.from_paths(cfg.train)
        longest = int(self.corpus.lengths.max()) if len(self.corpus) else 0
        if longest < cfg.window + 1:
            raise InputError(f"no training record is at least window + 1 = {cfg.window + 1} bases "
                             f"long (longest: {longest}); lower window or add longer genomes")
        self.valid = {Path(str(p)).name: _first_record(p) for p in cfg.valid}
        on_cuda = self.device.type == "cuda"
        self.autocast = cfg.bf16_autocast == "on" or (cfg.bf16_autocast == "auto" and on_cuda)

    # ------------------------------------------------------------------ checkpoints
    @property
    def ckpt_path(self) -> Path:
        return self.out / "ckpt.pt"

    def start(self, resume: bool = True, export_only: bool = False) -> bool:
        """Continue from the run's checkpoint when `resume`; True when one was loaded. Exporting
        alone needs one: without it there is no trained model to export."""
        resumed = self.resume() if resume else False
        if export_only and not resumed:
            where = str(self.ckpt_path).replace("{", "{{").replace("}", "}}")
            raise SettingError("{0}: no checkpoint " + where + " to export"
                               + ("" if resume else " (without {1})"), "export_only", "no_resume")
        return resumed

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(str(self.ckpt_path)) as tmp:  # a fresh name: never through a symlink
            torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(),
                        "gen": self.gen.get_state(), "step": self.step,
                        "tokens_seen": self.tokens_seen, "wall": self.wall,
                        "train_config": asdict(self.cfg),
                        "model_config": self.model_cfg.to_dict()}, tmp)

    def resume(self) -> bool:
        if not self.ckpt_path.is_file():
            return False
        # on the CPU: the generator's state must stay a CPU tensor, and load_state_dict copies
        # model and optimizer tensors to where the parameters live
        def restore(ck: dict) -> None:
            self.model.load_state_dict(ck["model"])
            self.opt.load_state_dict(ck["opt"])
            self.gen.set_state(ck["gen"])
            self.step, self.tokens_seen, self.wall = ck["step"], ck["tokens_seen"], ck["wall"]

        load_run_checkpoint(self.ckpt_path, restore,
                            "does not match this config's model (another layer pattern or "
                            "size?); use another out_dir or --no-resume",
                            "delete it or rerun with --no-resume to start over")
        self.trim_log()
        return True

    def trim_log(self) -> None:
        """Drop log rows past the checkpoint's step: they are replayed, not duplicated."""
        trim_log(self.out / "log.jsonl", self.step)

    def write_log(self, row: dict) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with open(self.out / "log.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------------ loop
    def train_step(self) -> float:
        cfg = self.cfg
        self.model.train()
        batch = self.corpus.sample_windows(cfg.batch_size, cfg.window, self.gen, cfg.rc_prob)
        batch = batch.to(self.device)
        for group in self.opt.param_groups:
            group["lr"] = lr_at(cfg, self.step)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            loss = lm_loss(self.model, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        keep_poles_stable(self.model)
        self.step += 1
        self.tokens_seen += batch.shape[0] * (batch.shape[1] - 1)
        return float(loss.detach())

    def evaluate(self) -> dict[str, float]:
        self.model.eval()
        out = {}
        for name, seq in self.valid.items():
            bpn, _ = score_sequence(self.model, seq, self.cfg.eval_context, 1024,
                                    max_tokens=self.cfg.eval_tokens)
            out[name] = round(bpn, 4)
        return out

    def run(self, progress: Callable[[int, int, float], None] | None = None,
            stop_at: int | None = None) -> list[float]:
        cfg = self.cfg
        losses = []
        t_last = time.time()
        end = min(cfg.steps, stop_at) if stop_at is not None else cfg.steps
        while self.step < end:
            loss = self.train_step()
            losses.append(loss)
            now = time.time()
            self.wall += now - t_last
            t_last = now
            row = {"step": self.step, "loss": round(loss, 5), "bits": round(loss / math.log(2), 4),
                   "lr": lr_at(cfg, self.step - 1), "tokens": self.tokens_seen,
                   "wall_s": round(self.wall, 1)}
            if cfg.eval_every and (self.step % cfg.eval_every == 0 or self.step == cfg.steps):
                row["valid_bits_per_nt"] = self.evaluate()
                t_last = time.time()
            self.write_log(row)
            if progress:
                progress(self.step, cfg.steps, loss)
            if self.step % cfg.ckpt_every == 0 or self.step == end:
                self.save()
        return losses

    def export(self, dest: str | Path | None = None) -> Path:
        """The model folder, its config recording the window it was trained on (runs warn
        about prompts longer than that)."""
        import dataclasses

        self.model.eval()
        self.model.config = dataclasses.replace(self.model.config,
                                                trained_context=self.cfg.window)
        return save_model(self.model.cpu(), dest or self.out / "model")


def validate_train_config(cfg: TrainConfig, given: Collection[str] = ()) -> TrainConfig:
    """Refuse values that cannot train (one line) before any work is done. A field named in
    `given` was set by the caller (an option such as --steps), not read from the file: its
    error names it as a setting."""
    import dataclasses

    def bad(name: str, problem: str) -> InputError:
        if name in given:
            return SettingError.of(name, problem)
        return InputError(f"train config: {name} {problem}")

    values = vars(cfg)  # every field of the dataclass, by name
    for f in dataclasses.fields(cfg):
        v = values[f.name]
        want = {"int": int, "float": (int, float), "str": str, "dict": dict}.get(str(f.type))
        if f.type in ("list[str]",):
            if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                raise bad(f.name, f"must be a list of paths, got {v!r}")
        elif want is not None and (not isinstance(v, want) or isinstance(v, bool)):
            raise bad(f.name, f"must be {str(f.type)}, got {v!r}")
    positive = {"steps": cfg.steps, "batch_size": cfg.batch_size, "window": cfg.window,
                "ckpt_every": cfg.ckpt_every, "eval_tokens": cfg.eval_tokens,
                "eval_context": cfg.eval_context}
    non_negative = {"warmup": cfg.warmup, "eval_every": cfg.eval_every, "threads": cfg.threads,
                    "weight_decay": cfg.weight_decay, "grad_clip": cfg.grad_clip}
    for name, n in positive.items():
        if n < 1:
            raise bad(name, f"must be >= 1, got {n}")
    for name, n in non_negative.items():
        if n < 0:
            raise bad(name, f"must be >= 0, got {n}")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        raise bad("lr", f"must be > 0, got {cfg.lr}")
    if not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise bad("min_lr_ratio", f"must be in [0, 1], got {cfg.min_lr_ratio}")
    if not 0.0 <= cfg.rc_prob <= 1.0:
        raise bad("rc_prob", f"must be in [0, 1], got {cfg.rc_prob}")
    if cfg.bf16_autocast not in ("auto", "on", "off"):
        raise bad("bf16_autocast", f"must be auto, on or off, got {cfg.bf16_autocast!r}")
    return cfg


def load_train_config(path: str | Path, steps: int | None = None) -> TrainConfig:
    """Read and check a train_config.json; `steps` overrides the file's total steps."""
    if not Path(path).is_file():
        raise InputError(f"no such train config: {path}")
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(f"cannot read train config {path}: {' '.join(str(exc).split())}") from exc
    if not isinstance(raw, dict):
        raise InputError(f"train config {path}: expected a JSON object, got {type(raw).__name__}")
    known = {f for f in TrainConfig.__dataclass_fields__}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise InputError(f"train config {path}: unknown field(s) {', '.join(unknown)}")
    if "out_dir" not in raw:
        raise InputError(f"train config {path}: out_dir is required")
    given = {"steps": steps} if steps is not None else {}
    return validate_train_config(TrainConfig(**{**raw, **given}), given)


def check_run_outputs(cfg: TrainConfig, export: str | Path | None = None,
                      config: str | Path | None = None) -> None:
    """The files a run writes (its checkpoint, log and exported model) must not be one of its
    FASTA inputs nor its `config` file, whatever path leads there."""
    from ..files import Output, check_distinct

    out = Path(cfg.out_dir)
    model = Path(export) if export is not None else out / "model"
    inputs: list[str] = [] if config is None else [str(config)]
    for path in cfg.train + cfg.valid:
        try:
            inputs += [str(f) for f in fasta_files([path])]
        except InputError:  # reported where the files are read
            continue
    check_distinct(inputs, [Output("out_dir", str(out / "ckpt.pt")),
                            Output("out_dir", str(out / "log.jsonl")),
                            Output("export", str(model / "config.json"), setting=True),
                            Output("export", str(model / "model.safetensors"), setting=True)])


@dataclass(frozen=True)
class RunOptions:
    """How one invocation drives a run: stop (with a checkpoint) at a step, export where."""

    stop_at: int | None = None
    export: str | None = None  # model folder; None: RUN/model

    def __post_init__(self) -> None:
        if self.stop_at is not None:
            at_least("stop_at", self.stop_at, 1)
        export = Path(self.export) if self.export is not None else None
        if export is not None and export.exists() and not export.is_dir():
            raise SettingError.of("export", f"{self.export} is a file, not a model folder")


def run_from_config(path: str | Path, resume: bool = True,
                    progress: Callable[[int, int, float], None] | None = None) -> Path:
    """Run (or continue) the training described by a train_config.json; export the model folder."""
    cfg = load_train_config(path)
    trainer = Trainer(cfg)
    if resume:
        trainer.resume()
    trainer.run(progress)
    return trainer.export()


if __name__ == "__main__":  # python -m evspark_cli.train.pretrain RUN/train_config.json
    import sys

    print(run_from_config(sys.argv[1]))
