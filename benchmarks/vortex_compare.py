#!/usr/bin/env python
"""Native decoding speed of EvSpark vs the public vortex implementation (PyPI `vtx` 1.1.0) on the
same checkpoint, on CPU, side by side in one process.

vortex is GPU-first; it runs on CPU with the shims of `../shared/oracle/vtx_reference.py` (an empty
`flash_attn_2_cuda` module, a CPU-tolerant `torch.cuda.device`, Triton's interpreter for its rotary
kernel). Install it outside the project, e.g.

    pip install --target /tmp/vtxlib --no-deps vtx==1.1.0 einops triton
    python benchmarks/vortex_compare.py --vtx-path /tmp/vtxlib

The EvSpark checkpoint (default: the bundled target) is exported to the Evo 2 checkpoint layout
(attention `Wqkv` rows head-interleaved) and loaded through vortex's own `custom_load_state_dict`;
the script first checks that both implementations give the same prompt logits, then times cached
greedy generation of the same prompt, alternating the two, and checks the tokens agree.
Results: benchmarks/results/vortex_compare.json.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def import_vortex(vtx_path: str | None):
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if vtx_path:
        sys.path.insert(0, vtx_path)
    import torch

    try:  # pragma: no cover - only on machines with flash-attn
        import flash_attn_2_cuda  # noqa: F401
    except ImportError:
        sys.modules["flash_attn_2_cuda"] = types.ModuleType("flash_attn_2_cuda")
    cuda_device = torch.cuda.device

    class CpuTolerantDevice:
        def __init__(self, device):
            self.noop = device is None or str(device).startswith("cpu")
            self.inner = None if self.noop else cuda_device(device)

        def __enter__(self):
            return None if self.noop else self.inner.__enter__()

        def __exit__(self, *exc):
            return False if self.noop else self.inner.__exit__(*exc)

    torch.cuda.device = CpuTolerantDevice
    cwd, scratch = os.getcwd(), tempfile.mkdtemp(prefix="vtx_bench_")
    os.chdir(scratch)  # vortex opens a debug log in the working directory at import time
    try:
        from vortex.model.generation import Generator
        from vortex.model.model import StripedHyena as VortexModel
        from vortex.model.tokenizer import CharLevelTokenizer
        from vortex.model.utils import dotdict
    finally:
        os.chdir(cwd)
    import logging
    import warnings

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    return Generator, VortexModel, CharLevelTokenizer, dotdict


def torch_rope():
    """A plain-torch stand-in for vortex's Triton rotary kernel (non-interleaved, dense batches).

    On CPU the Triton kernel runs in Triton's interpreter, which dominates vortex's decode step;
    with --torch-rope the comparison measures the rest of vortex. The prompt-logit check below
    still guards that the model computes the same function."""
    import torch

    def apply_rotary(x, cos, sin, seqlen_offsets=0, cu_seqlens=None, max_seqlen=None,
                     interleaved=False, inplace=False, conjugate=False):
        assert cu_seqlens is None and not interleaved, "only dense, non-interleaved rotary"
        L = x.shape[1]
        half = cos.shape[1]
        if isinstance(seqlen_offsets, torch.Tensor):
            pos = seqlen_offsets[:, None] + torch.arange(L, device=x.device)[None]
            c, s = cos[pos][:, :, None], sin[pos][:, :, None]
        else:
            c = cos[seqlen_offsets: seqlen_offsets + L][None, :, None]
            s = sin[seqlen_offsets: seqlen_offsets + L][None, :, None]
        if conjugate:
            s = -s
        x1, x2 = x[..., :half], x[..., half: 2 * half]
        out = torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * half:]], dim=-1)
        if inplace:
            x.copy_(out)
            return x
        return out

    import vortex.model.rotary as rotary

    rotary.apply_rotary = apply_rotary


def vortex_config(cfg, max_seqlen: int) -> dict:
    """Our ModelConfig in the schema of evo2/configs/*.yml, fp32, no fused kernels."""
    import torch

    D = cfg.hidden_size
    return {
        "model_name": cfg.model_name, "vocab_size": cfg.vocab_size, "hidden_size": D,
        "num_filters": D, "hcs_layer_idxs": cfg.hcs_layer_idxs, "hcm_layer_idxs": cfg.hcm_layer_idxs,
        "hcl_layer_idxs": cfg.hcl_layer_idxs, "attn_layer_idxs": cfg.attn_layer_idxs,
        "hcm_filter_length": cfg.hcm_filter_length, "hcl_filter_groups": D,
        "hcm_filter_groups": cfg.hcm_filter_groups, "hcs_filter_groups": cfg.hcs_filter_groups,
        "hcs_filter_length": cfg.hcs_filter_length, "num_layers": cfg.num_layers,
        "short_filter_length": cfg.short_filter_length, "num_attention_heads": cfg.num_attention_heads,
        "short_filter_bias": cfg.short_filter_bias, "eps": cfg.eps, "state_size": cfg.state_size,
        "rotary_emb_base": cfg.rotary_emb_base, "rotary_emb_scaling_factor": cfg.rotary_emb_scaling_factor,
        "use_interpolated_rotary_pos_emb": cfg.use_interpolated_rotary_pos_emb,
        "make_vocab_size_divisible_by": 8, "inner_size_multiple_of": cfg.inner_size_multiple_of,
        "inner_mlp_size": cfg.inner_mlp_size, "proj_groups": 1, "hyena_filter_groups": 1,
        "column_split_hyena": False, "column_split": cfg.column_split, "interleave": cfg.interleave,
        "evo2_style_activations": cfg.evo2_style_activations, "model_parallel_size": 1,
        "pipe_parallel_size": 1, "tie_embeddings": cfg.tie_embeddings,
        "mha_out_proj_bias": cfg.mha_out_proj_bias, "hyena_out_proj_bias": cfg.hyena_out_proj_bias,
        "hyena_flip_x1x2": False, "qkv_proj_bias": cfg.qkv_proj_bias,
        "use_fp8_input_projections": False, "max_seqlen": max_seqlen, "max_batch_size": 1,
        "final_norm": cfg.final_norm, "use_flash_attn": False, "use_flash_rmsnorm": False,
        "use_flash_depthwise": False, "use_flashfft": False, "use_laughing_hyena": False,
        "inference_mode": True, "tokenizer_type": "CharLevelTokenizer", "prefill_style": "fft",
        "mlp_activation": "gelu", "print_activations": False,
        "hyena_block_dtype": torch.float32, "attn_block_dtype": torch.float32,
        "mlp_dtype": torch.float32,
    }


def to_checkpoint_layout(model) -> dict:
    """Our state dict with attention Wqkv rows head-interleaved ([h: q k v]), as Evo 2 ships."""
    cfg = model.config
    H, dh = cfg.num_attention_heads, cfg.head_dim
    out = {}
    for key, t in model.state_dict().items():
        t = t.detach().clone()
        if key.endswith("inner_mha_cls.Wqkv.weight"):
            t = t.reshape(3, H, dh, -1).permute(1, 0, 2, 3).reshape(3 * cfg.hidden_size, -1)
        elif key.endswith("inner_mha_cls.Wqkv.bias"):
            t = t.reshape(3, H, dh).permute(1, 0, 2).reshape(-1)
        out[key] = t.contiguous()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vtx-path", default=None, help="folder where vtx 1.1.0 is installed (--target)")
    ap.add_argument("--model", default=str(ROOT / "models" / "evspark-sh2-192"))
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-rope", action="store_true",
                    help="replace vortex's Triton rotary kernel (interpreted on CPU) by plain torch")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "vortex_compare.json"))
    args = ap.parse_args()

    Generator, VortexModel, CharLevelTokenizer, dotdict = import_vortex(args.vtx_path)
    import torch

    if args.torch_rope:
        torch_rope()

    sys.path.insert(0, str(ROOT))
    from evspark_cli.decode.native import decode_native
    from evspark_cli.decode.sampling import SamplerConfig
    from evspark_cli.io.fasta import read_prompts
    from evspark_cli.model.checkpoint import load_model

    torch.set_num_threads(args.threads)
    ours = load_model(args.model).float().eval()
    genome = read_prompts([str(ROOT.parent / "shared" / "data" / "valid" / "ecoli_536.fa.gz")])[0].seq
    prompt = list(genome[100_000: 100_000 + args.prompt_len].encode())
    ids = torch.tensor([prompt])

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        vtx = VortexModel(dotdict(vortex_config(ours.config, args.prompt_len + args.tokens + 8))).float()
        vtx.custom_load_state_dict(to_checkpoint_layout(ours))
    vtx.eval()
    with torch.inference_mode():
        ref = ours(ids)
        got = vtx(ids)[0].float()
    logit_diff = (ref - got).abs().max().item()
    if logit_diff > 1e-3:
        raise SystemExit(f"vortex and EvSpark disagree on the prompt logits (max diff {logit_diff:.3g}); "
                         "the comparison would not be on the same model")

    greedy = SamplerConfig(1.0, 1, 1.0)
    gen = Generator(vtx, CharLevelTokenizer(512), top_k=1, top_p=1.0, temperature=1.0)

    def run_vortex() -> tuple[float, list[int]]:
        t = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            toks, _, _ = gen.generate(device="cpu", input_ids=ids, num_tokens=args.tokens,
                                      cached_generation=True, print_generation=False, verbose=False,
                                      stop_at_eos=False)
        return time.perf_counter() - t, toks[0].tolist()

    def run_ours() -> tuple[float, list[int]]:
        t = time.perf_counter()
        r = decode_native(ours, prompt, args.tokens, greedy)
        return time.perf_counter() - t, r.tokens

    run_vortex(), run_ours()  # warm-up
    times: dict[str, list[float]] = {"vortex": [], "evspark": []}
    tokens: dict[str, list[int]] = {}
    for _ in range(args.reps):
        for name, fn in (("vortex", run_vortex), ("evspark", run_ours)):
            s, toks = fn()
            times[name].append(s)
            tokens[name] = toks
    agree = next((i for i, (a, b) in enumerate(zip(tokens["vortex"], tokens["evspark"])) if a != b), None)
    med = {k: statistics.median(v) for k, v in times.items()}
    res = {
        "benchmark": "vortex_compare", "model": ours.config.model_name,
        "parameters": ours.num_parameters(), "prompt_len": args.prompt_len, "tokens": args.tokens,
        "threads": args.threads, "reps": args.reps, "torch": torch.__version__,
        "python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
        "timing": "wall seconds for prefill + cached greedy generation, median over reps, alternating",
        "prompt_logit_max_diff": logit_diff, "seconds": times, "median_s": med,
        "tok_s": {k: args.tokens / v for k, v in med.items()},
        "evspark_over_vortex_speed": med["vortex"] / med["evspark"],
        "first_token_disagreement": agree,
        "vortex_rope": "plain torch (--torch-rope)" if args.torch_rope else
                       "vortex's Triton kernel, run by Triton's interpreter on CPU",
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(f"| implementation | tok/s (prefill {args.prompt_len} + {args.tokens} greedy tokens) |")
    print("|---|---|")
    for k, v in res["tok_s"].items():
        print(f"| {k} | {v:.1f} |")
    print(f"EvSpark / vortex speed: {res['evspark_over_vortex_speed']:.2f}x; prompt logits max diff "
          f"{logit_diff:.2g}; first token disagreement: {agree}")


if __name__ == "__main__":
    main()
