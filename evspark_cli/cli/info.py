"""`evspark info`: what a model folder holds, from its config, weights and model card."""
from __future__ import annotations

from typing import Optional

from .app import command
from .options import MaxMemoryOpt, ModelOpt

EXAMPLE = """Example: what the bundled target holds, or any converted model:

  evspark info
  evspark info --model models/evo2-1b"""


@command()
def info(model_dir: Optional[str] = ModelOpt, max_memory: Optional[str] = MaxMemoryOpt) -> None:
    """Architecture, parameters, layer pattern, state size and training summary of a model."""
    from ..model.checkpoint import load_model, model_card_summary

    model = load_model(model_dir, device="cpu", max_memory=max_memory)
    cfg = model.config
    st = model.empty_state(1, capacity=1).nbytes()
    pattern = model.layer_kinds()
    counts = {k: pattern.count(k) for k in ("hcs", "hcm", "hcl", "attn")}
    print(f"model          {cfg.model_name}  ({model.source_dir or ''})")
    print(f"parameters     {model.num_parameters():,}")
    print(f"hidden         {cfg.hidden_size}  layers {cfg.num_layers}  heads "
          f"{cfg.num_attention_heads}  mlp {cfg.mlp_size}")
    print(f"layer pattern  {' '.join(pattern)}")
    print(f"blocks         SE {counts['hcs']}  MR {counts['hcm']}  LI {counts['hcl']}  attention "
          f"{counts['attn']}")
    print(f"filters        SE {cfg.hcs_filter_length} taps/{cfg.hcs_filter_groups} groups, MR "
          f"{cfg.hcm_filter_length} taps/{cfg.hcm_filter_groups} groups, LI {cfg.state_size} "
          "modes")
    print(f"context        {cfg.max_seqlen:,} tokens (RoPE base {cfg.rotary_emb_base:g}, scale "
          f"{cfg.rope_scale:g})")
    print(f"state          {st['fixed']:,} bytes per sequence + {st['kv_per_token']:,} bytes per "
          "token")
    print(f"drafter layers {cfg.drafter_layers}")
    card = model_card_summary(model.source_dir) if model.source_dir is not None else None
    if card:
        summary = [ln for ln in card.splitlines() if ln.startswith(("- **", "**"))][:8]
        if summary:
            print("training       " + "\n               ".join(s.strip("- ") for s in summary))
