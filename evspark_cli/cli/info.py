"""`evspark info`: what a model folder holds, from its config, weights and model card; or what a
drafter folder holds, and the model it belongs to."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from .app import command
from .common import out_line
from .options import MaxMemoryOpt, ModelOpt, option

EXAMPLE = """Example: what the bundled target holds, or any converted model, or a drafter:

  evspark info
  evspark info --model models/evo2-1b
  evspark info models/evspark-sh2-192/drafters/seed0"""

FolderArg = typer.Argument(None, metavar="[FOLDER]", show_default=False,
                           help="A model folder (the same as --model) or a drafter folder.")


@command()
def info(folder: Optional[str] = FolderArg, model_dir: Optional[str] = ModelOpt,
         max_memory: Optional[str] = MaxMemoryOpt,
         layers: bool = option(False, "--layers", help="List the layers `evspark embed` takes: "
                               "Evo 2's module name and EvSpark's, one per line.")) -> None:
    """Architecture, parameters, layer pattern, state size and training summary of a model, or
    of a drafter folder."""
    from ..decode.drafters.dspark import is_drafter_folder
    from ..errors import SettingError

    if folder is not None and model_dir is not None:
        raise SettingError("give the folder once: as FOLDER or with {0}", "model")
    where = folder if folder is not None else model_dir
    if where is not None and is_drafter_folder(where):
        if layers:
            raise SettingError("{0} lists a model's layers, not a drafter's", "layers")
        _drafter_info(where, max_memory)
    elif layers:
        _layer_names(where, max_memory)
    else:
        _model_info(where, max_memory)


def _layer_names(model_dir: str | None, max_memory: str | None) -> None:
    from ..eval.embed import layer_names
    from ..model.checkpoint import load_model

    model = load_model(model_dir, device="cpu", max_memory=max_memory)
    for evo2, short in layer_names(model):
        out_line(f"{evo2}\t{short}")


def _model_info(model_dir: str | None, max_memory: str | None) -> None:
    from ..model.checkpoint import load_model, model_card_summary

    model = load_model(model_dir, device="cpu", max_memory=max_memory)
    cfg = model.config
    st = model.empty_state(1, capacity=1).nbytes()
    pattern = model.layer_kinds()
    counts = {k: pattern.count(k) for k in ("hcs", "hcm", "hcl", "attn")}
    out_line(f"model          {cfg.model_name}  ({model.source_dir or ''})")
    out_line(f"parameters     {model.num_parameters():,}")
    out_line(f"hidden         {cfg.hidden_size}  layers {cfg.num_layers}  heads "
             f"{cfg.num_attention_heads}  mlp {cfg.mlp_size}")
    out_line(f"layer pattern  {' '.join(pattern)}")
    out_line(f"blocks         SE {counts['hcs']}  MR {counts['hcm']}  LI {counts['hcl']}  "
             f"attention {counts['attn']}")
    out_line(f"filters        SE {cfg.hcs_filter_length} taps/{cfg.hcs_filter_groups} groups, MR "
             f"{cfg.hcm_filter_length} taps/{cfg.hcm_filter_groups} groups, LI {cfg.state_size} "
             "modes")
    out_line(f"context        {cfg.max_seqlen:,} tokens (RoPE base {cfg.rotary_emb_base:g}, scale "
             f"{cfg.rope_scale:g})")
    out_line(f"state          {st['fixed']:,} bytes per sequence + {st['kv_per_token']:,} bytes "
             "per token")
    out_line(f"drafter layers {cfg.drafter_layers}")
    card = model_card_summary(model.source_dir) if model.source_dir is not None else None
    if card:
        summary = [ln for ln in card.splitlines() if ln.startswith(("- **", "**"))][:8]
        if summary:
            out_line("training       " + "\n               ".join(s.strip("- ") for s in summary))


def _drafter_info(folder: str, max_memory: str | None) -> None:
    """A drafter folder: its net, draft slots, the target it was distilled from and how to use
    it (with the model folder it is bundled in, MODEL/drafters/seedN, when it is)."""
    from ..decode.drafters.dspark import load_drafter
    from ..errors import printable

    d = load_drafter(folder, max_memory=max_memory)
    c = d.cfg
    target = printable(c.target_name) if c.target_name else "unnamed"
    weights = f", weights sha256 {c.target_hash[:12]}..." if c.target_hash else ""
    out_line(f"drafter        dspark  ({folder})")
    out_line(f"parameters     {sum(p.numel() for p in d.net.parameters()):,}")
    out_line(f"net            width {c.width}  layers {c.layers}  heads {c.heads}  mlp ratio "
             f"{c.mlp_ratio}  Markov order {c.markov_order}"
             + ("  (tables from the trunk)" if c.trunk_markov else ""))
    out_line(f"drafts         up to {c.gamma_max} a round (--gamma {c.gamma_max} at most), "
             f"conditioned on the target's last {c.prefix_len} positions")
    out_line(f"target         {target}: hidden {c.target_hidden}, {c.target_layers} conditioning "
             f"layers, vocabulary {c.vocab_size}{weights}")
    home = _bundled_in(folder)
    model = "TARGET" if home is None else home
    if home is not None:
        out_line(f"bundled with   {home}")
    out_line(f"use            evspark generate IN.fa --model {model} --drafter {folder}")
    if c.training:
        items = [f"{k} {printable(str(v))}" for k, v in c.training.items()]
        out_line("training       " + ",\n               ".join(_lines(items, 64)))


def _lines(items: list[str], width: int) -> list[str]:
    """`items` joined by commas into lines of about `width` characters, none split."""
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 2 + len(item) <= width:
            lines[-1] += ", " + item
        else:
            lines.append(item)
    return lines


def _bundled_in(folder: str) -> str | None:
    """The model folder a drafter folder is bundled in (MODEL/drafters/seedN), if it is."""
    path = Path(folder).resolve()
    home = path.parent.parent
    if path.parent.name != "drafters" or not (home / "config.json").is_file():
        return None
    return os.path.relpath(home) if not os.path.isabs(folder) else str(home)
