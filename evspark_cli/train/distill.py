"""Distilling a DSpark drafter from a target: teacher cache, then drafter training.

1. **Teacher cache** (`build_cache`): the target runs once, teacher-forced, over natural windows
   of the training genomes and over target-generated continuations of them (on-policy data at the
   deployment sampler settings, and optionally greedy continuations: greedy decoding of a small
   target falls into repeats that sampled windows rarely show). Per position it stores the
   conditioning hidden states through the fp32-scale codec, the token, and the target's sampler
   distribution p̃ on the DNA alphabet (plus the mass p̃ puts elsewhere, which a DNA-only
   drafter can never match).
2. **Training** (`DistillTrainer`): anchors are sampled in cached windows; the loss is
   0.1·CE(next token) + 0.9·L1(q, p̃) per draft position, weighted exp(-(k-1)/4). Since the
   acceptance probability of a draft is 1 - ½‖q - p̃‖₁, the L1 term optimises acceptance itself.
   Supervised positions = anchors × gamma. Resumable (ckpt.pt), logged (log.jsonl), seeded.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..alphabet import BASE_IDS
from ..decode.drafters.dspark import MAX_MARKOV_ORDER, DSparkConfig, DSparkNet, save_drafter
from ..decode.sampling import (
    GREEDY,
    Purpose,
    SamplerConfig,
    sample_from_probs,
    sampler_probs,
    uniform,
)
from ..errors import SettingError, at_least, literal
from ..files import atomic_path
from ..model.checkpoint import WEIGHTS, load_model, resolve_device, weights_hash
from ..model.memory import MAX_MEMORY, memory_budget
from ..model.model import StripedHyena
from .codec import EncodedRows, ShardReader, ShardWriter, decode, encode
from .corpus import Corpus
from .pretrain import load_run_checkpoint, trim_log


@dataclass
class CacheConfig:
    target: str
    out_dir: str
    train: list[str] = field(default_factory=list)
    natural_windows: int = 256
    onpolicy_windows: int = 128
    greedy_windows: int = 0  # on-policy windows the target continues greedily
    window: int = 1024
    onpolicy_prompt: int = 512  # on-policy windows: this many natural tokens, then the target
    batch: int = 8
    temperature: float = 1.0
    top_k: int = 4
    top_p: float = 1.0
    seed: int = 0
    codec: str = "bf16"
    device: str = "auto"  # where the target runs (auto: CUDA when present)

    def __post_init__(self) -> None:  # checked once, when built
        at_least("window", self.window, 1)
        at_least("natural_windows", self.natural_windows, 0)
        at_least("onpolicy_windows", self.onpolicy_windows, 0)
        at_least("greedy_windows", self.greedy_windows, 0)
        if self.natural_windows + self.onpolicy_windows + self.greedy_windows < 1:
            raise SettingError("{0} plus {1} plus {2} must be >= 1", "natural_windows",
                               "onpolicy_windows", "greedy_windows")

    @property
    def onpolicy_prompt_len(self) -> int:
        """Natural tokens before the target writes: a prompt that would fill the whole window
        (the 512 default with a short window) falls back to half the window."""
        if 0 < self.onpolicy_prompt < self.window:
            return self.onpolicy_prompt
        return max(1, self.window // 2)


@dataclass
class DistillConfig:
    cache: str
    out_dir: str
    seed: int = 0
    steps: int = 2000
    batch: int = 64
    gamma: int = 12
    gamma_max: int = 0  # the drafter's slots, the largest gamma it serves (0: max(16, gamma))
    width: int = 128
    layers: int = 2
    heads: int = 4
    prefix_len: int = 64
    markov_order: int = 1  # the Markov head's context (tokens); 1 is DSpark's previous token
    trunk_markov: bool = False  # the trunk writes each slot's Markov table too
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.01
    ce_weight: float = 0.1
    l1_weight: float = 0.9
    position_decay: float = 4.0
    ckpt_every: int = 200
    log_every: int = 25
    device: str = "auto"  # where the drafter trains; the cache stays in host memory

    def __post_init__(self) -> None:  # checked once, when built
        at_least("steps", self.steps, 1)
        at_least("batch", self.batch, 1)
        at_least("gamma", self.gamma, 1)
        if not self.gamma_max:
            self.gamma_max = max(DSparkConfig.gamma_max, self.gamma)
        if self.gamma > self.gamma_max:
            raise SettingError.of("gamma", f"must be <= {self.gamma_max} (the drafter's largest "
                                           "block)")
        at_least("layers", self.layers, 1)
        at_least("prefix_len", self.prefix_len, 1)
        at_least("markov_order", self.markov_order, 1)
        if self.markov_order > MAX_MARKOV_ORDER:
            raise SettingError.of("markov_order", f"must be <= {MAX_MARKOV_ORDER}")
        if self.width < self.heads or self.width % self.heads:
            raise SettingError.of("width", f"must be a positive multiple of {self.heads} (the "
                                           f"drafter's heads), got {self.width}")


# ------------------------------------------------------------------------------ teacher cache


@torch.inference_mode()
def generate_batch(model: StripedHyena, prompts: torch.Tensor, n_new: int, sampler: SamplerConfig,
                   seed: int, first_record: int) -> torch.Tensor:
    """Native sampling for a batch of equal-length prompts (B, L) -> (B, L + n_new)."""
    B = prompts.shape[0]
    _, _, state = model.prefill(prompts[:, :-1].to(model.device), keep_last=1, reserve=n_new + 8)
    anchor = prompts[:, -1:].to(model.device)
    out = [prompts.to(model.device)]
    rec = torch.arange(first_record, first_record + B)
    for _ in range(n_new):
        logits, _, block = model.extend(state, anchor)
        state = block.commit(1)
        p = sampler_probs(logits[:, -1], sampler)
        u = torch.stack([uniform(seed, int(r), 0, state.seqlen, int(Purpose.SAMPLE)) for r in rec])
        anchor = sample_from_probs(p, u.to(p.device))[:, None]
        out.append(anchor)
    return torch.cat(out, dim=1).cpu()


@torch.inference_mode()
def teacher_rows(model: StripedHyena, seqs: torch.Tensor, sampler: SamplerConfig,
                 codec: str = "bf16") -> dict:
    """Teacher-forced hidden states, p̃ on the alphabet and the mass outside it, for (B, S)."""
    logits, hidden = model(seqs.to(model.device), return_hidden=True)
    p = sampler_probs(logits.float(), sampler)
    alpha = torch.tensor(BASE_IDS, device=p.device)
    pa = p[..., alpha]
    return {"tokens": seqs.cpu().to(torch.int16), "p_alpha": pa.cpu(),
            "p_other": (1 - pa.sum(-1)).clamp(min=0).cpu(),
            "hidden": encode(hidden.float().cpu(), codec)}


def build_cache(cfg: CacheConfig, log: Callable[[str], None] = print,
                max_memory: str | int | None = None) -> Path:
    """Run the target over natural and on-policy windows; write codec shards + index."""
    out = Path(cfg.out_dir)
    model = load_model(cfg.target, device=cfg.device, max_memory=max_memory)
    sampler = SamplerConfig(cfg.temperature, cfg.top_k, cfg.top_p)
    corpus = Corpus.from_paths(cfg.train)
    prompt_len = cfg.onpolicy_prompt_len  # on-policy windows: a natural prompt, then the target
    generated = cfg.onpolicy_windows + cfg.greedy_windows
    need = max(cfg.window if cfg.natural_windows else 0, prompt_len if generated else 0)
    longest = int(corpus.lengths.max()) if len(corpus) else 0
    if longest < need:
        raise SettingError(f"{{0}}: no record is at least {need} bases long (longest: {longest}); "
                           "lower {1}", "train", "window")
    gen = torch.Generator().manual_seed(cfg.seed)
    meta = {"cache_config": asdict(cfg), "onpolicy_prompt": prompt_len,
            "target_hash": weights_hash(cfg.target),
            "target_hidden_layers": model.config.drafter_layers,
            "hidden_size": model.config.hidden_size,
            "alphabet": list(BASE_IDS)}
    t0 = time.time()
    with ShardWriter(out, prefix="teacher", max_rows_per_shard=64, metadata=meta,
                     overwrite=True) as w:
        done, total = 0, cfg.natural_windows + generated
        kinds = (("natural", cfg.natural_windows, None),
                 ("onpolicy", cfg.onpolicy_windows, sampler),
                 ("greedy", cfg.greedy_windows, GREEDY))
        for kind, n, writer in kinds:  # writer: how the target continues a natural prompt
            for s in range(0, n, cfg.batch):
                b = min(cfg.batch, n - s)
                if writer is None:
                    seqs = corpus.sample_windows(b, cfg.window - 1, gen)
                else:
                    prompts = corpus.sample_windows(b, prompt_len - 1, gen)
                    first = (10_000 if kind == "onpolicy" else 20_000) + s
                    seqs = generate_batch(model, prompts, cfg.window - prompt_len, writer,
                                          cfg.seed, first_record=first)
                rows = teacher_rows(model, seqs, sampler, cfg.codec)  # p̃: the deployment sampler
                rows["onpolicy"] = torch.full((b,), writer is not None, dtype=torch.bool)
                w.append(rows)
                done += b
                log(f"cache: {done}/{total} windows ({time.time() - t0:.0f} s)")
    (out / "cache_config.json").write_text(json.dumps(asdict(cfg), indent=1))
    return out


WINDOW_KINDS = (("natural", "natural_windows"), ("sampled", "onpolicy_windows"),
                ("greedy", "greedy_windows"))
"""A teacher cache's kinds of window and the `CacheConfig` field that counts each."""
CACHE_COMPOSITION = (*(k for _, k in WINDOW_KINDS), "window")
"""The settings that say what a teacher cache holds (a reused cache keeps its own)."""


def prepare_cache(cfg: CacheConfig, log: Callable[[str], None] = print,
                  max_memory: str | int | None = None,
                  warn: Callable[[str], None] | None = None) -> Path:
    """The teacher cache in cfg.out_dir: reused when it holds one (made from cfg.target's
    weights), else built from cfg.train. A new cache that fails half-way is removed. A reused
    cache built with other `CACHE_COMPOSITION` settings than cfg's is reused as it is, with a
    warning (`warn`, default `log`) naming them."""
    out, target = Path(cfg.out_dir), Path(cfg.target)
    if (out / "index.json").is_file():
        meta = json.loads((out / "index.json").read_text()).get("metadata", {})
        built_from = meta.get("target_hash")
        if (target / WEIGHTS).is_file() and built_from and built_from != weights_hash(target):
            raise SettingError(literal(f"teacher cache {out} was built from another target than "
                                       f"{target}; ") + "pass another {0} (with {1}) to build "
                               "one for it", "cache", "train")
        held = meta.get("cache_config", {})  # absent from caches too old to record it
        differ = [f"{k} {held.get(k, 0)} (asked {getattr(cfg, k)})" for k in CACHE_COMPOSITION
                  if held and held.get(k, 0) != getattr(cfg, k)]
        if differ:
            (warn or log)(f"teacher cache {out} is reused as built: " + ", ".join(differ)
                          + "; give a new cache folder to build one with these settings")
        return out
    if not cfg.train:
        raise SettingError(literal(f"no teacher cache at {out}; ") + "pass {0} FASTA... to "
                           "build it", "train")
    if out.exists() and not out.is_dir():
        raise SettingError.of("cache", f"{out} is a file, not a folder")
    fresh = not out.exists()
    try:
        return build_cache(cfg, log, max_memory)
    except BaseException:
        if fresh:  # no half-built cache left behind
            shutil.rmtree(out, ignore_errors=True)
        raise


# ------------------------------------------------------------------------------ training


class TeacherData:
    """The whole cache in memory (bf16 payload + fp32 row scales), decoded batch by batch."""

    def __init__(self, cache_dir: str | Path) -> None:
        r = ShardReader(cache_dir)
        parts: dict[str, list] = {}
        for shard in r.iter_shards(decoded=False):
            for k, v in shard.items():
                parts.setdefault(k, []).append(v)
        self.tokens = torch.cat(parts["tokens"]).long()
        self.p_alpha = torch.cat(parts["p_alpha"]).float()
        self.p_other = torch.cat(parts["p_other"]).float()
        hid = parts["hidden"]
        self.h_payload = torch.cat([e.payload for e in hid])
        self.h_scale = torch.cat([e.scale for e in hid])
        self.h_kind = hid[0].kind
        self.meta = r.metadata
        self.windows, self.seq_len = self.tokens.shape

    def hidden(self, w: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Decoded hidden states at (window, position) index tensors of equal shape."""
        return decode(EncodedRows(self.h_payload[w, pos], self.h_scale[w, pos], self.h_kind))

    def batch(self, n: int, gamma: int, P: int, gen: torch.Generator, order: int = 1
              ) -> dict[str, torch.Tensor]:
        """n anchors: their prefix's hidden states, and per draft slot the `order` true tokens
        before it (newest first: the Markov head is teacher-forced), its target and p̃."""
        w = torch.randint(self.windows, (n,), generator=gen)
        # anchor index: every slot's `order` previous tokens lie in the window
        a = torch.randint(max(1, order - 1), self.seq_len - gamma, (n,), generator=gen)
        ctx_pos = a[:, None] - P + torch.arange(P)  # positions a-P..a-1
        valid = ctx_pos >= 0
        ctx = self.hidden(w[:, None].expand(-1, P), ctx_pos.clamp(min=0)) * valid[..., None, None]
        k = torch.arange(1, gamma + 1)
        tgt_pos = a[:, None] + k  # tokens the drafts should produce
        return {"ctx": ctx, "valid": valid, "anchor": self.tokens[w, a],
                "prev": torch.stack([self.tokens[w[:, None], tgt_pos - 1 - j]
                                     for j in range(order)], dim=-1),
                "target": self.tokens[w[:, None], tgt_pos],
                "p_alpha": self.p_alpha[w[:, None], tgt_pos - 1],
                "p_other": self.p_other[w[:, None], tgt_pos - 1]}


def distill_loss(net: DSparkNet, b: dict[str, torch.Tensor], cfg: DistillConfig
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    z = net.logits(net.condition(b["ctx"]), b["valid"], b["anchor"], b["prev"])  # (B, g, V)
    logq = torch.log_softmax(z.float(), dim=-1)
    q = logq.exp()
    gamma = z.shape[1]
    wk = torch.exp(-torch.arange(gamma, dtype=torch.float32, device=z.device) / cfg.position_decay)
    wk = wk / wk.sum()
    tgt = net.lut[b["target"]]
    in_alpha = tgt < net.cfg.n_alpha
    ce = -(logq.gather(-1, tgt.clamp(max=net.cfg.n_alpha - 1)[..., None])[..., 0]) * in_alpha
    l1 = (q - b["p_alpha"]).abs().sum(-1) + b["p_other"]
    loss = ((cfg.ce_weight * ce + cfg.l1_weight * l1) * wk).sum(-1).mean()
    # expected per-position acceptance (conditional on reaching the position)
    accept = (1 - 0.5 * l1.detach()).mean(0)
    return loss, {"loss": float(loss.detach()), "accept1": float(accept[0]),
                  "accept_mean": float(accept.mean())}


class DistillTrainer:
    def __init__(self, cfg: DistillConfig, data: TeacherData | None = None,
                 max_memory: str | int | None = None) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out_dir)
        self.data = data or TeacherData(cfg.cache)
        meta = self.data.meta
        tl = meta.get("target_hidden_layers") or []
        dcfg = DSparkConfig(target_hidden=int(meta["hidden_size"]), target_layers=len(tl),
                            width=cfg.width, layers=cfg.layers, heads=cfg.heads,
                            prefix_len=cfg.prefix_len, gamma_max=cfg.gamma_max,
                            markov_order=cfg.markov_order, trunk_markov=cfg.trunk_markov,
                            target_hash=meta.get("target_hash", ""),
                            target_name=Path(meta.get("cache_config", {}).get("target", "")).name)
        dcfg.validate("the drafter to distil")
        self.device = resolve_device(cfg.device)
        # the net, its gradients and AdamW's two moments, before any of it is allocated
        reason = memory_budget(self.device, max_memory).refusal_template(
            4 * dcfg.memory_bytes(), f"training a drafter of width {cfg.width}", slot=3)
        if reason is not None:
            raise SettingError("{0}, {1}, {2}: " + reason, "width", "layers", "prefix_len",
                               MAX_MEMORY)
        torch.manual_seed(cfg.seed)
        self.net = DSparkNet(dcfg).to(self.device)
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=cfg.lr, betas=(0.9, 0.98),
                                     weight_decay=cfg.weight_decay)
        self.gen = torch.Generator().manual_seed(cfg.seed)
        self.step = 0
        self.wall = 0.0

    def lr(self) -> float:
        c = self.cfg
        if self.step < c.warmup:
            return c.lr * (self.step + 1) / c.warmup
        frac = (self.step - c.warmup) / max(1, c.steps - c.warmup)
        return c.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))

    def save(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        with atomic_path(str(self.out / "ckpt.pt")) as tmp:  # never through a symlink
            torch.save({"net": self.net.state_dict(), "opt": self.opt.state_dict(),
                        "step": self.step, "gen": self.gen.get_state(), "wall": self.wall,
                        "cfg": asdict(self.cfg)}, tmp)

    def resume(self) -> bool:
        p = self.out / "ckpt.pt"
        if not p.is_file():
            return False

        def restore(ck: dict) -> None:  # load_state_dict places the tensors
            self.net.load_state_dict(ck["net"])
            self.opt.load_state_dict(ck["opt"])
            self.gen.set_state(ck["gen"])
            self.step, self.wall = ck["step"], ck["wall"]

        load_run_checkpoint(p, restore, "was made with another drafter shape (--width, --layers, "
                            "--prefix or target); use another --run-dir")
        trim_log(self.out / "log.jsonl", self.step)
        return True

    def train_step(self) -> dict[str, float]:
        c = self.cfg
        self.net.train()
        b = {k: v.to(self.device) for k, v in
             self.data.batch(c.batch, c.gamma, c.prefix_len, self.gen, c.markov_order).items()}
        for g in self.opt.param_groups:
            g["lr"] = self.lr()
        loss, info = distill_loss(self.net, b, c)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.net.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        return info

    def run(self, progress: Callable[[int, int, float], None] | None = None) -> None:
        c = self.cfg
        t = time.time()
        while self.step < c.steps:
            info = self.train_step()
            now = time.time()
            self.wall += now - t
            t = now
            if self.step % c.log_every == 0 or self.step == c.steps:
                row = {"step": self.step, **{k: round(v, 5) for k, v in info.items()},
                       "supervised_positions": self.step * c.batch * c.gamma,
                       "wall_s": round(self.wall, 1)}
                self.out.mkdir(parents=True, exist_ok=True)
                with open(self.out / "log.jsonl", "a") as f:
                    f.write(json.dumps(row) + "\n")
            if progress:
                progress(self.step, c.steps, info["loss"])
            if self.step % c.ckpt_every == 0 or self.step == c.steps:
                self.save()

    def _windows(self) -> str:
        """What the teacher cache held, as its windows of each kind (the drafter's record)."""
        held = self.data.meta.get("cache_config", {})
        counts = ", ".join(f"{held.get(k, 0)} {name}" for name, k in WINDOW_KINDS)
        return f"{counts} x {held.get('window', self.data.seq_len)} tokens"

    def export(self, dest: str | Path | None = None) -> Path:
        c = self.cfg
        self.net.cfg.training = {"seed": c.seed, "steps": self.step, "batch": c.batch,
                                 "gamma": c.gamma, "markov_order": c.markov_order,
                                 **({"trunk_markov": True} if c.trunk_markov else {}),
                                 "supervised_positions": self.step * c.batch * c.gamma,
                                 "cache": str(c.cache), "cache_windows": self._windows(),
                                 "wall_s": round(self.wall, 1),
                                 "loss": "0.1*CE + 0.9*L1(q, p~), weights exp(-(k-1)/4)"}
        return save_drafter(self.net.eval(), dest or self.out / "drafter")
