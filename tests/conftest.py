"""Shared pytest fixtures: paths, a tiny random-model factory, the tiny models and folders the
test files share (trained or built once per run), and the reliability battery's table."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable

import battery  # noqa: E402  (tests/ is on sys.path: pytest's rootdir conftest)
import pytest
import torch
from tiny import ORACLE, random_tiny_dir, shared_trained_tiny, trained_tiny_dir  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _own_cache_folder(tmp_path_factory):
    """Measured block costs (decode/schedule.py) go to a folder of the test run, not ~/.cache;
    child processes inherit it."""
    mp = pytest.MonkeyPatch()
    mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tests run on one torch thread: small models are faster so, and results are reproducible."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.fixture(scope="session")
def oracle_dir() -> Path:
    """The tiny vtx oracle (weights, config, reference tensors) in tests/fixtures; a missing
    oracle is a failure."""
    if not (ORACLE / "tiny_vtx_reference_tensors.safetensors").is_file():
        pytest.fail(f"oracle files not found in {ORACLE}")
    return ORACLE


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


# ------------------------------------------------------------- models and folders the files share


@pytest.fixture(scope="session")
def phix_model(tmp_path_factory) -> Path:
    """The tiny model trained on phiX174 (tiny.shared_trained_tiny): it writes DNA letters."""
    return shared_trained_tiny(tmp_path_factory)


@pytest.fixture(scope="session")
def short_model(tmp_path_factory) -> Path:
    """A random tiny model with a context of 64 tokens."""
    return random_tiny_dir(tmp_path_factory.mktemp("short") / "m", max_seqlen=64)


@pytest.fixture(scope="session")
def phix_drafter(phix_model: Path, tmp_path_factory) -> Path:
    """A dspark drafter folder for `phix_model` (random weights: lossless whatever they are)."""
    from evspark_cli.decode.drafters.dspark import DSparkConfig, DSparkNet, save_drafter
    from evspark_cli.model.checkpoint import weights_hash

    torch.manual_seed(0)
    cfg = DSparkConfig(target_hidden=32, target_layers=2, width=32, layers=1, heads=2,
                       prefix_len=8, target_hash=weights_hash(phix_model), target_name="tiny-test")
    return save_drafter(DSparkNet(cfg), tmp_path_factory.mktemp("drafter") / "d")


@pytest.fixture(scope="session")
def normal_peak(phix_model: Path, tmp_path_factory) -> int:
    """The peak RSS of an ordinary generate run with `phix_model`: the footprint the bounded
    cases of the battery (battery.bounded) are measured against."""
    d = tmp_path_factory.mktemp("normal")
    code, err, peak = battery.run_child(["generate", battery.fasta_file(d), "--model", phix_model,
                                         *battery.FAST, "-n", 4], d)
    assert code == 0, err
    return peak


@pytest.fixture(scope="session")
def battery_models(tmp_path_factory, short_model: Path) -> battery.Models:
    """The bad-input cases' models: one trained a few seconds on phiX174, `short_model`."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("models")
    return battery.Models(trained_tiny_dir(root / "good", steps=20), short_model)


@pytest.fixture(scope="session")
def random_model(tmp_path_factory) -> Path:
    """A random tiny model folder (context 4,096)."""
    return random_tiny_dir(tmp_path_factory.mktemp("random") / "model")


@pytest.fixture()
def masked_fa(tmp_path) -> Path:
    """in.fa: two records, the second partly lower case (a warning, not an error)."""
    p = tmp_path / "in.fa"
    p.write_text(">r1\nACGTACGTAAGG\n>r2\nttgacaGGCA\n")
    return p


def pytest_unconfigure(config) -> None:
    """When the test run ends: with EVSPARK_UPDATE_RELIABILITY=1 the battery's rows of this run
    go into RELIABILITY.md."""
    if battery.updating():
        battery.write_recorded()
