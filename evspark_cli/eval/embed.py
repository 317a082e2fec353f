"""Embeddings: a named layer's activations per record, pooled, from the model's own pass.

Layers are named as Evo 2's checkpoints and its `return_embeddings` name them (module paths:
`blocks.28.mlp.l3`, `blocks.28`, `norm`, `embedding_layer`; `StripedHyena.activation_names`
lists them) or by EvSpark's short names: `embedding`, `block.N` (block N's output, the
residual stream), `block.N.mlp` (its MLP's output before the residual add, Evo 2's
`blocks.N.mlp.l3`), `block.N.pre_norm`, `block.N.post_norm` and `final` (the final norm's
output, or the last block's without one). N may count from the end (`block.-1`).

A record longer than one pass is embedded in windows, as `score` scores it: positions
0..L-1 go `window` at a time, each pass starting up to `context` bases earlier, so every
position sees at least min(context, p) earlier bases (a record no longer than the window is one
pass: exactly the activations of a whole-record forward). Pooling: `mean` over the record's
positions, `last` (the last position, which has seen the whole record: the usual choice for a
causal model), or `none` (every position, (L, D)).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from ..defaults import EMBED_SPAN
from ..errors import RunError, SettingError
from ..model.config import ModelConfig
from ..model.memory import FP32, MAX_MEMORY, Budget, prefill_bytes
from ..model.model import StripedHyena

POOLS = ("mean", "last", "none")
EMBED_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_SHORT = re.compile(r"^blocks?\.(-?\d+)(?:\.(mlp|mlp\.l3|pre_norm|post_norm))?$")


def layer_names(model: StripedHyena) -> list[tuple[str, str]]:
    """Every layer `embed` takes: (Evo 2 module name, EvSpark short name)."""
    short = {"embedding_layer": "embedding", "norm": "final"}
    out = []
    for name in model.activation_names():
        m = _SHORT.match(name)
        if m is not None:
            kind = m.group(2)
            alias = f"block.{m.group(1)}" + {None: "", "mlp.l3": ".mlp"}.get(kind, f".{kind}")
        else:
            alias = short[name]
        out.append((name, alias))
    if not model.config.final_norm:
        out.append((f"blocks.{len(model.blocks) - 1}", "final"))
    return out


def resolve_layer(model: StripedHyena, name: str) -> str:
    """The module name of layer `name` (either naming); SettingError for one the model lacks."""
    n_blocks = len(model.blocks)
    key = name.strip()
    if key in ("embedding", "embedding_layer"):
        return "embedding_layer"
    if key in ("final", "norm"):
        if model.config.final_norm:
            return "norm"
        if key == "final":
            return f"blocks.{n_blocks - 1}"
    m = _SHORT.match(key)
    if m is not None:
        i = int(m.group(1))
        if -n_blocks <= i < n_blocks:
            kind = m.group(2)
            tail = "" if kind is None else ".mlp.l3" if kind.startswith("mlp") else f".{kind}"
            return f"blocks.{i % n_blocks}{tail}"
    raise SettingError.of("layer", f"{name!r} is not a layer of this model ({n_blocks} blocks "
                                   f"0..{n_blocks - 1}): e.g. blocks.{n_blocks - 1}.mlp.l3, "
                                   f"block.{n_blocks - 1}, final; `evspark info --layers` lists "
                                   "them")


def check_embed_settings(pool: str, dtype: str) -> None:
    if pool not in POOLS:
        raise SettingError.of("pool", f"must be {', '.join(POOLS)}, got {pool!r}")
    if dtype not in EMBED_DTYPES:
        raise SettingError.of("embed_dtype", f"must be {', '.join(EMBED_DTYPES)}, got {dtype!r}")


def embed_windows(n: int, window: int, context: int) -> Iterator[tuple[int, int, int]]:
    """The passes over a record of n positions: (begin, first, stop), the pass reading
    ids[begin:stop] and keeping positions first..stop-1 (each kept exactly once)."""
    if window < 1 or context < 0:
        raise ValueError("window must be >= 1 and context >= 0")
    for first in range(0, n, window):
        yield max(0, first - context), first, min(first + window, n)


@torch.inference_mode()
def embed_record(model: StripedHyena, ids: Tensor, layers: Sequence[str], pool: str = "mean",
                 window: int = EMBED_SPAN, context: int = EMBED_SPAN, dtype: str = "float32",
                 on_window: Callable[[int], None] | None = None) -> dict[str, Tensor]:
    """The pooled activations of each of `layers` (module names, `resolve_layer`) over ids
    (1-D): (D,) for mean/last, (L, D) for none, in `dtype`, on the CPU. Means are taken in
    fp32 over every position; `on_window(done)` is told the positions embedded so far."""
    check_embed_settings(pool, dtype)
    n = int(ids.shape[-1])
    if n == 0:
        raise ValueError("an empty record has no embedding")
    sums: dict[str, Tensor] = {}
    parts: dict[str, list[Tensor]] = {name: [] for name in layers}
    for begin, first, stop in embed_windows(n, window, context):
        _, acts = model.activations(ids[begin:stop][None].to(model.device), layers)
        for name in layers:
            kept = acts[name][0, first - begin:].float()
            if pool == "mean":
                s = kept.sum(dim=0)
                sums[name] = s if name not in sums else sums[name] + s
            elif pool == "none" or stop == n:
                parts[name].append((kept if pool == "none" else kept[-1]).cpu())
        if on_window is not None:
            on_window(stop)
    out = {}
    for name in layers:
        got = (sums[name] / n).cpu() if pool == "mean" else (
            torch.cat(parts[name]) if pool == "none" else parts[name][0])
        if not bool(torch.isfinite(got).all()):
            raise RunError(f"non-finite activations in {name}")
        cast = got.to(EMBED_DTYPES[dtype]).contiguous()
        if not bool(torch.isfinite(cast).all()):
            raise RunError(f"{name}: values up to {float(got.abs().max()):.3g} overflow {dtype}; "
                           "use float32")
        out[name] = cast
    return out


def embed_bytes(hidden: int, lengths: Sequence[int], layers: int, pool: str, dtype: str) -> int:
    """What a run's kept embeddings take in memory and on disk."""
    size = torch.empty(0, dtype=EMBED_DTYPES[dtype]).element_size()
    rows = sum(lengths) if pool == "none" else len(lengths)
    return rows * layers * hidden * size


def resolve_layers(model: StripedHyena, names: Sequence[str]) -> list[str]:
    """The module names of `names`, each once, in the order first given."""
    if not names:
        raise SettingError.of("layer", "name at least one layer")
    out: list[str] = []
    for name in names:
        got = resolve_layer(model, name)
        if got not in out:
            out.append(got)
    return out


def check_embed_windows(window: int | None, context: int | None) -> None:
    """A window of >= 1 position, a context >= 0 bases (None: the default, `embed_spans`)."""
    if window is not None and window < 1:
        raise SettingError.of("window", f"must be >= 1 position, got {window}")
    if context is not None and context < 0:
        raise SettingError.of("context", f"must be >= 0 bases, got {context}")


def embed_spans(cfg: ModelConfig, window: int | None, context: int | None) -> tuple[int, int]:
    """(window, context), None picking the default: 8,192 each, or within the model's context
    half of it for the context and the rest for the window, as `score` picks them."""
    check_embed_windows(window, context)
    limit = cfg.max_seqlen
    if context is None:
        context = min(EMBED_SPAN, max(0, limit // 2) if window is None else
                      max(0, limit - window))
    if window is None:
        window = min(EMBED_SPAN, max(1, limit - context))
    return window, context


def check_embed_memory(model: StripedHyena, lengths: Sequence[int], layers: int, pool: str,
                       dtype: str, window: int, context: int, budget: Budget) -> None:
    """Refuse, before any work, passes longer than the model's context or a run whose passes
    or kept embeddings do not fit in `budget` (SettingError naming the settings to lower)."""
    cfg = model.config
    span = min(max(lengths, default=0), window + context)
    if span > cfg.max_seqlen:
        raise SettingError("{0} + {1} make passes of " + f"{span:,} tokens, more than the "
                           f"model's context of {cfg.max_seqlen:,}; lower them", "window",
                           "context")
    need = prefill_bytes(cfg, span) + FP32 * span * cfg.hidden_size * (layers + 1)
    reason = budget.refusal_template(need, f"embedding passes of {span:,} tokens", slot=2)
    if reason is not None:
        raise SettingError("{0} and {1}: " + reason + "; lower them", "window", "context",
                           MAX_MEMORY)
    kept = embed_bytes(cfg.hidden_size, lengths, layers, pool, dtype)
    reason = budget.refusal_template(need + kept, "keeping the embeddings of every record",
                                     slot=1)
    if reason is not None:
        raise SettingError("{0}: " + reason + "; embed fewer or shorter records, or pool them",
                           "pool", MAX_MEMORY)


def embed_settings(model: StripedHyena, layers: Sequence[str], pool: str, dtype: str,
                   window: int, context: int) -> dict[str, object]:
    """What an embedding output records of its run (a resumed run must have the same)."""
    cfg = model.config
    return {"layers": list(layers), "pool": pool, "dtype": dtype, "window": window,
            "context": context, "hidden": cfg.hidden_size, "model": cfg.model_name,
            "parameters": model.num_parameters()}
