"""Shared pytest fixtures (kept generic: paths and a tiny random-model factory)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import pytest
import torch
from tiny import SHARED  # noqa: E402  (tests/ is on sys.path: pytest's rootdir conftest)

ORACLE_DIR = SHARED / "oracle"


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tests run on one torch thread: small models are faster so, and results are reproducible."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    """The tiny vtx oracle (weights, config, reference tensors); a missing oracle is a failure."""
    if not (ORACLE_DIR / "tiny_vtx_reference_tensors.safetensors").is_file():
        pytest.fail(f"oracle files not found in {ORACLE_DIR} "
                    "(set EVSPARK_SHARED to the shared/ folder)")
    return ORACLE_DIR


def randomize_model(model, seed: int = 0):
    """Give every parameter a non-trivial random value so that every path of the model matters.

    `init_weights` gives a sensible starting point; on top of it linears get O(1/sqrt(fan_in))
    weights (so mixers are not drowned by the residual), biases, skips (D) and filters get noise,
    LI log-poles are log-uniform in -[1e-3, 1] and the embedding has unit scale (large logits).
    """
    from evspark_cli.train.pretrain import init_weights

    init_weights(model, seed)
    g = torch.Generator().manual_seed(10_000 + seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "embedding_layer.weight":
                p.copy_(randn(*p.shape))
            elif name.endswith("norm.scale"):
                p.copy_(1.0 + 0.2 * randn(*p.shape))
            elif name.endswith(".weight") and p.dim() == 2:
                p.copy_(randn(*p.shape) / math.sqrt(p.shape[1]))
            elif name.endswith(".bias"):
                p.copy_(0.1 * randn(*p.shape))
            elif name.endswith("filter.D"):
                p.copy_(0.5 * randn(*p.shape))
            elif name.endswith("filter.log_poles"):
                u = torch.rand(p.shape, generator=g)
                p.copy_(-torch.exp(math.log(1e-3) + u * (0.0 - math.log(1e-3))))
            elif name.endswith("filter.residues"):
                lam = dict(model.named_parameters())[name.replace("residues", "log_poles")][..., 0]
                p.copy_(randn(*p.shape) * (lam.abs().sqrt() + 0.05))
            elif name.endswith("short_filter_weight") or name.endswith("filter.h"):
                p.add_(0.2 * randn(*p.shape) * p.abs().mean().clamp(min=0.05))
            else:
                p.add_(0.05 * randn(*p.shape))
    return model.eval()


@pytest.fixture(scope="session")
def make_model() -> Callable:
    """Factory: make_model(ModelConfig, seed=0) -> a randomized fp32 StripedHyena in eval mode."""
    from evspark_cli.model.model import StripedHyena

    def make(cfg, seed: int = 0):
        torch.manual_seed(seed)
        return randomize_model(StripedHyena(cfg), seed)

    return make
