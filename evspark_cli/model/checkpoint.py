"""Model folders (config.json + model.safetensors) and Evo 2 / vortex checkpoint conversion.

Tensor names are vortex's (``blocks.{i}.filter.h`` ...), with two differences from the
distributed Evo 2 files that `convert_checkpoint` takes care of: attention ``Wqkv`` rows are
stored ``[q; k; v]`` (Evo 2 files interleave them per head) and there is no ``unembed.weight``
or Transformer Engine ``_extra_state``.
"""
from __future__ import annotations

import hashlib
import io
import math
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from .. import defaults
from ..bundled import default_model_dir
from ..errors import InputError, ModelError
from .config import ModelConfig
from .layers import input_major
from .memory import Budget, check_load_fits, load_bytes, memory_budget, memory_refusal
from .model import StripedHyena

FP32_KEEP = ("filter.log_poles", "filter.residues", "rotary_emb.inv_freq")
WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        device = str(device)
    if not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:[0-9]+)?", device):
        raise InputError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelError("{0} cuda requested but no CUDA device is available", "device")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16}
    if dtype not in table:
        raise InputError(f"unknown dtype {dtype!r} (use auto, float32 or bfloat16)")
    return table[dtype]


def cast_model(model: StripedHyena, dtype: torch.dtype) -> StripedHyena:
    """Evo 2's precision policy: everything in `dtype` except poles, residues and inv_freq
    (fp32)."""
    named = list(model.named_parameters()) + list(model.named_buffers())
    keep = {name: t.detach().float().clone() for name, t in named if name.endswith(FP32_KEEP)}
    model.to(dtype)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if name in keep:
            t.data = keep[name].to(t.device)
    return model


# ------------------------------------------------------------------------------- read / write


def read_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        with safe_open(str(path), framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ModelError(f"cannot read {path}: corrupt or not a safetensors file "
                         f"({_short(e)})") from None


def safetensors_elements(path: Path) -> int:
    """How many numbers a safetensors file holds, from its header alone (nothing is read into
    memory): what a config must describe before a model is built for it."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ModelError(f"cannot read {path}: corrupt or not a safetensors file "
                         f"({_short(e)})") from None


def _short(e: BaseException) -> str:
    return str(e).splitlines()[0][:160] if str(e) else type(e).__name__


def check_tensors_against(model: torch.nn.Module, tensors: dict[str, Tensor], source: Path) -> None:
    """Strict load: a missing, unexpected, mis-shaped or non-finite tensor is named and refused."""
    own = model.state_dict()
    for name in own:
        if name not in tensors:
            raise ModelError(f"{source}: missing tensor '{name}'")
    for name, t in tensors.items():
        if name not in own:
            raise ModelError(f"{source}: unexpected tensor '{name}' (config and weights disagree?)")
        if tuple(t.shape) != tuple(own[name].shape):
            raise ModelError(f"{source}: tensor '{name}' has shape {tuple(t.shape)}, "
                             f"the config implies {tuple(own[name].shape)}")
        if own[name].is_floating_point() and not t.is_floating_point():
            raise ModelError(f"{source}: tensor '{name}' is stored as {t.dtype}, "
                             "expected floating point")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ModelError(f"{source}: tensor '{name}' contains NaN or inf")
    with torch.no_grad():
        for name, t in tensors.items():
            own[name].copy_(t.to(own[name].dtype))


def model_folder(path: str | Path | None) -> Path:
    """The model folder `path` names (None: the bundled target), checked to hold a model."""
    folder = Path(path) if path is not None else default_model_dir()
    if folder.exists() and not folder.is_dir():
        raise ModelError(f"{folder} is a file, not a model folder (give the folder that holds "
                         f"{CONFIG} and {WEIGHTS})")
    if not folder.is_dir():
        raise ModelError(f"model folder {folder} does not exist")
    for need in (CONFIG, WEIGHTS):
        if not (folder / need).is_file():
            raise ModelError(f"model folder {folder} has no {need}")
    return folder


def load_model(path: str | Path | None = None, device: str | None = defaults.DEVICE,
               dtype: str | torch.dtype | None = None, cuda_graphs: bool = True,
               compile: bool = False, max_memory: str | int | None = None,
               config: ModelConfig | None = None) -> StripedHyena:
    """Load a model folder (None = the bundled target) for inference.

    The config is checked against the weights file's header and against the memory there is
    (or `max_memory`, e.g. "8G") before anything is built: a config that asks for more than its
    weights or the machine hold is refused (ModelError) instead of allocating until memory runs
    out. On a GPU, decode steps and verification blocks replay CUDA graphs unless `cuda_graphs`
    is False; on a CPU, `compile` runs them through torch.compile (model/graphs.py). `config`:
    the folder's config when the caller has read it already (a command reads it once, to bound
    its inputs before the model loads)."""
    folder = model_folder(path)
    cfg = config if config is not None else ModelConfig.load(folder / CONFIG)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    host, gpu = load_budgets(dev, max_memory)
    weights = folder / WEIGHTS
    check_load_fits(cfg, safetensors_elements(weights), weights.stat().st_size, host, gpu, dt,
                    what=f"model {folder}")
    tensors = read_safetensors(weights)
    model = StripedHyena(cfg)
    check_tensors_against(model, tensors, weights)
    del tensors
    model = cast_model(model.to(dev), dt)
    model.eval()
    if dev.type == "cpu":
        input_major(model, extra=(model.embedding_layer.weight,))
    model.source_dir = folder
    if cuda_graphs and dev.type == "cuda":
        model.use_graphs("cuda")
    elif compile and dev.type == "cpu":
        model.use_graphs("compile")
    return model


def load_budgets(device: torch.device, max_memory: str | int | None = None
                 ) -> tuple[Budget, Budget | None]:
    """The host's budget and, on a GPU, the GPU's; `max_memory` limits where the model runs."""
    if device.type == "cuda":
        return memory_budget("cpu"), memory_budget(device, max_memory)
    return memory_budget("cpu", max_memory), None


def save_model(model: StripedHyena, out_dir: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write config.json and model.safetensors (optionally cast, fp32 filters kept), each
    atomically through a fresh temporary file (never through a planted symlink)."""
    from ..files import atomic_path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for k, v in model.state_dict().items():
        t = v.detach().to("cpu")
        if dtype is not None and t.is_floating_point() and not k.endswith(FP32_KEEP):
            t = t.to(dtype)
        tensors[k] = t.contiguous().clone()
    with atomic_path(str(out / WEIGHTS)) as tmp:
        save_file(tensors, tmp, metadata={"format": "pt", "producer": "evspark"})
    with atomic_path(str(out / CONFIG)) as tmp:
        model.config.save(tmp)
    return out


def weights_hash(folder: str | Path) -> str:
    """sha256 of a model's weights file: drafters record it to refuse a different target."""
    h = hashlib.sha256()
    with open(Path(folder) / WEIGHTS, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------------------- conversion


def _read_pt(path: Path) -> dict[str, Tensor]:
    """A `.pt` state dict through torch.load(weights_only=True): no code runs on unpickling."""
    obj = None
    for mmap in (True, False):  # legacy (non-zip) .pt files cannot be memory-mapped
        try:
            with torch.serialization.safe_globals([io.BytesIO]):
                obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=mmap)
            break
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a refusal
            if mmap and "mmap" in str(e).lower():
                continue
            why = next((ln.strip() for ln in str(e).splitlines()
                        if "GLOBAL" in ln or "global" in ln), _short(e))
            raise ModelError(f"refusing to load {path}: not a plain tensor checkpoint "
                             f"({why[:160]})") from None
    for key in ("model", "state_dict", "module"):
        if isinstance(obj, dict) and key in obj and isinstance(obj[key], dict):
            obj = obj[key]
    if not isinstance(obj, dict):
        raise ModelError(f"{path}: expected a dict of tensors, found {type(obj).__name__}")
    return {k: v for k, v in obj.items() if isinstance(v, Tensor)}


def evo2_to_evspark(raw: dict[str, Tensor], cfg: ModelConfig) -> dict[str, Tensor]:
    """Rename/reshape an Evo 2 (vortex checkpoint layout) state dict into EvSpark's layout."""
    out: dict[str, Tensor] = {}
    H, dh, D = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    for name, t in raw.items():
        if name.endswith("_extra_state") or name == "unembed.weight":
            continue
        if name.endswith("inner_mha_cls.Wqkv.weight") and cfg.column_split:
            if tuple(t.shape) != (3 * D, D):
                raise ModelError(f"tensor '{name}' has shape {tuple(t.shape)}, "
                                 f"expected {(3 * D, D)}")
            t = t.reshape(H, 3, dh, D).permute(1, 0, 2, 3).reshape(3 * D, D)
        elif name.endswith("inner_mha_cls.Wqkv.bias") and cfg.column_split:
            t = t.reshape(H, 3, dh).permute(1, 0, 2).reshape(3 * D)
        if name.endswith(FP32_KEEP):
            t = t.float()
        out[name] = t
    return out


def _check_output_dir(out: Path, inputs: tuple[Path, ...] = ()) -> None:
    """Refuse an output folder that cannot be one, or that already holds a model or one of
    the inputs (compared by identity), before any work (exit 2, one line)."""
    from ..files import Output, check_distinct

    if out.exists() and not out.is_dir():
        raise InputError(f"{out}: exists and is not a folder; give a new or existing folder")
    check_distinct([str(p) for p in inputs],
                   [Output("output", str(out / WEIGHTS), setting=True),
                    Output("output", str(out / CONFIG), setting=True)])
    for name in (CONFIG, WEIGHTS):
        if os.path.lexists(out / name):
            raise InputError(f"{out} already holds a model ({name}); give a new folder or "
                             "delete it")
    parent = out.parent if not out.exists() else out
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{out}: cannot create a model folder there ({parent} is not writable)")


def convert_checkpoint(checkpoint: str | Path, config: str | Path, out_dir: str | Path,
                       max_memory: str | int | None = None) -> Path:
    """An Evo 2 / vortex checkpoint (.pt or .safetensors) + config (.yml/.json) -> model folder.

    Nothing is written over an input or an existing model, and a config whose model would not
    fit in memory (or `max_memory`) is refused before it is built."""
    ckpt = Path(checkpoint)
    if not ckpt.is_file():
        raise ModelError(f"checkpoint {ckpt} does not exist")
    _check_output_dir(Path(out_dir), (ckpt, Path(config)))
    cfg = ModelConfig.load(config)
    need = load_bytes(cfg, ckpt.stat().st_size)
    reason = memory_budget("cpu", max_memory).refusal_template(need, f"converting {ckpt}")
    if reason is not None:
        raise memory_refusal(reason)
    raw = read_safetensors(ckpt) if ckpt.suffix == ".safetensors" else _read_pt(ckpt)
    tensors = evo2_to_evspark(raw, cfg)
    model = StripedHyena(cfg)
    for name, buf in model.named_buffers():  # inv_freq absent from some files: the config's base
        tensors.setdefault(name, buf.detach().clone())
    check_tensors_against(model, tensors, ckpt)
    try:
        return save_model(model, out_dir)
    except OSError as e:
        raise InputError(f"{out_dir}: cannot write the model folder ({e.strerror or e})") from None


def model_card_summary(folder: str | Path) -> str | None:
    card = Path(folder) / "MODEL_CARD.md"
    return card.read_text() if card.is_file() else None

