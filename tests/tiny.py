"""Tiny models for tests: random ones, and one briefly trained on phiX174 so it writes DNA."""
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from evspark_cli.model.checkpoint import save_model
from evspark_cli.model.config import ModelConfig
from evspark_cli.model.model import StripedHyena

ROOT = Path(__file__).resolve().parents[1]


def find_shared() -> Path:
    """The optional shared data folder (large genomes, the prompt suite): $EVSPARK_SHARED, else
    `shared/` beside this checkout, else beside the local checkout this one was cloned from."""
    if os.environ.get("EVSPARK_SHARED"):
        return Path(os.environ["EVSPARK_SHARED"])
    here = ROOT.parent / "shared"
    if here.is_dir():
        return here
    import subprocess

    url = subprocess.run(["git", "-C", str(ROOT), "config", "--get", "remote.origin.url"],
                         capture_output=True, text=True).stdout.strip()
    origin = Path(url) if url and "://" not in url and ":" not in url.split("/")[0] else None
    if origin is not None and (origin.resolve().parent / "shared").is_dir():
        return origin.resolve().parent / "shared"
    return here


SHARED = find_shared()
FIXTURES = ROOT / "tests" / "fixtures"
PHIX = FIXTURES / "phiX174.fa.gz"
ORACLE = FIXTURES / "oracle"


def needs_shared(*parts: str):
    """Mark a test whose input is in the optional shared folder (`SHARED / parts`), skipped when
    that is absent: the suite itself needs only what `tests/fixtures` holds."""
    import pytest

    path = SHARED.joinpath(*parts)
    skip = pytest.mark.skipif(not path.exists(), reason=f"optional shared input {path} not found "
                              "(set EVSPARK_SHARED to a shared/ folder to run it)")
    return lambda test: pytest.mark.shared(skip(test))


def phix_genome() -> str:
    """phiX174 as one upper-case string (5,386 bases)."""
    import gzip

    with gzip.open(PHIX, "rt") as f:
        return "".join(line.strip() for line in f if not line.startswith(">")).upper()


def tiny_config(**kw) -> ModelConfig:
    base = dict(model_name="tiny-test", hidden_size=32, num_layers=4, num_attention_heads=2,
                hcs_layer_idxs=[0], hcm_layer_idxs=[1], hcl_layer_idxs=[2], attn_layer_idxs=[3],
                hcs_filter_groups=4, hcm_filter_groups=4, hcm_filter_length=16, state_size=4,
                inner_mlp_size=64, evo2_style_activations=False, max_seqlen=4096,
                hidden_layers=[1, 3])
    base.update(kw)
    return ModelConfig(**base)


def stripe_config(pattern: list[str], **kw) -> ModelConfig:
    """`tiny_config` with the layer kinds of `pattern` (e.g. ["hcs", "attn", "hcm", "hcl"])."""
    idx = {k: [i for i, p in enumerate(pattern) if p == k] for k in ("hcs", "hcm", "hcl", "attn")}
    return tiny_config(num_layers=len(pattern), hcs_layer_idxs=idx["hcs"],
                       hcm_layer_idxs=idx["hcm"], hcl_layer_idxs=idx["hcl"],
                       attn_layer_idxs=idx["attn"], **kw)


def trained_tiny_dir(out: Path, steps: int = 60, seed: int = 0) -> Path:
    """A tiny target trained for a few seconds on phiX174 (outputs are DNA letters)."""
    from evspark_cli.train.pretrain import TrainConfig, Trainer

    cfg = TrainConfig(out_dir=str(out / "run"), model=tiny_config().to_dict(), train=[str(PHIX)],
                      valid=[], window=128, batch_size=8, steps=steps, lr=1e-2, warmup=5,
                      eval_every=0, ckpt_every=10_000, seed=seed)
    torch.manual_seed(seed)
    tr = Trainer(cfg)
    tr.run()
    folder = tr.export(out / "model")
    # trained on 128-base windows, it would warn about every longer test prompt: the tests that
    # check that warning set a trained context of their own
    cfg_model = ModelConfig.load(folder / "config.json")
    assert cfg_model.trained_context == 128  # what `evspark train` records
    cfg_model.trained_context = None
    cfg_model.save(folder / "config.json")
    return folder


def random_tiny_dir(out: Path, seed: int = 0, **kw) -> Path:
    from evspark_cli.train.pretrain import init_weights

    torch.manual_seed(seed)
    m = StripedHyena(tiny_config(**kw))
    init_weights(m, seed)
    return save_model(m, out)


class CliResult(NamedTuple):
    code: int
    out: str
    err: str


def one_line_error(r: "CliResult", code: int) -> str:
    """The one `evspark: error:` line of a failed run with exit `code` (no traceback); warning
    lines about the input (`evspark: warning:`) and a run's summary line may come before it."""
    lines = [ln for ln in r.err.strip().splitlines() if not ln.startswith("evspark: warning:")
             and not re.match(r"evspark: (generate|verify|score|embed|train|distill|bench): ", ln)]
    assert r.code == code, r.err
    assert len(lines) == 1 and lines[0].startswith("evspark: error:"), r.err
    assert "internal error" not in r.err and "Traceback" not in r.err, r.err
    return lines[0]


def run_cli(args: list, stdin: bytes = b"") -> CliResult:
    """`evspark ARGS` in this process (torch imported once); stdin is a peekable byte stream."""
    from evspark_cli import cli

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv, sys.stdin
    sys.argv = ["evspark", *map(str, args)]
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.BytesIO(stdin)), encoding="utf-8")
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv, sys.stdin = saved
    return CliResult(code, out.getvalue(), err.getvalue())


def shared_trained_tiny(tmp_path_factory) -> Path:
    """The phiX-trained tiny model, trained once per test run and shared by test files."""
    base = tmp_path_factory.getbasetemp() / "evspark_trained_tiny"
    model_dir = base / "model"
    if not (model_dir / "config.json").is_file():
        trained_tiny_dir(base)
    return model_dir


def cgroup_tree(tmp_path: Path, proc: str, files: dict[str, str]) -> tuple[Path, Path]:
    """A fake cgroup mount (files relative to its root) and a /proc/self/cgroup naming `proc`:
    (the proc file, the root), for the readers of cgroups.py."""
    root = tmp_path / "cgroup"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "proc_cgroup").write_text(proc)
    return tmp_path / "proc_cgroup", root


def at_round(monkeypatch, n: int, act=None):
    """Make the batched decoder's n-th round run `act()` first (default: raise
    KeyboardInterrupt, a Ctrl-C mid-run); returns what puts the real round back."""
    from evspark_cli.decode.batch import BatchDecoder

    real, calls = BatchDecoder._round, []

    def interrupt() -> None:
        raise KeyboardInterrupt

    def patched(self):
        calls.append(1)
        if len(calls) == n:
            (act or interrupt)()
        return real(self)

    monkeypatch.setattr(BatchDecoder, "_round", patched)
    return lambda: monkeypatch.setattr(BatchDecoder, "_round", real)
