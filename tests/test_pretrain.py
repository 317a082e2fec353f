"""Pretraining: loss goes down, resume is exact, the bundled target loads and scores DNA well;
`evspark train` refuses configs, options and checkpoints it cannot train with in one line, and a
resume drops the log rows written after its checkpoint."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny import FIXTURES, PHIX, ROOT, one_line_error, run_cli, tiny_config

from evspark_cli.bundled import default_model_dir
from evspark_cli.model.checkpoint import load_model
from evspark_cli.train.pretrain import TrainConfig, Trainer, keep_poles_stable, lr_at


def cfg(tmp_path: Path, steps: int = 12, **kw) -> TrainConfig:
    return TrainConfig(out_dir=str(tmp_path / "run"), model=tiny_config().to_dict(),
                       train=[str(PHIX)],
                       valid=[], window=64, batch_size=4, steps=steps, lr=1e-2, warmup=2,
                       eval_every=0, ckpt_every=4, seed=3, **kw)


def test_training_lowers_the_loss(tmp_path):
    tr = Trainer(cfg(tmp_path, steps=30))
    losses = tr.run()
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.3  # from ~6.2 nats (uniform over 512)


def test_resume_gives_the_same_next_losses(tmp_path):
    full = Trainer(cfg(tmp_path / "a")).run()
    first = Trainer(cfg(tmp_path / "b"))
    first.run(stop_at=8)  # checkpoint at step 8
    resumed = Trainer(cfg(tmp_path / "b"))
    assert resumed.resume() and resumed.step == 8
    rest = resumed.run()
    assert rest == pytest.approx(full[8:], abs=1e-6)


def test_filters_and_their_ffts_stay_fp32_under_bf16_autocast(monkeypatch):
    """Training on CUDA runs under bf16 autocast; einsum/matmul there would hand the FFTs bf16,
    which they reject on CUDA (CPU autocast upcasts them, so the dtypes are checked here)."""
    from evspark_cli.model.model import StripedHyena

    torch.manual_seed(0)
    model = StripedHyena(tiny_config())  # every Hyena kind; 128 tokens take the FFT paths
    seen: list[torch.dtype] = []
    real = torch.fft.rfft

    def spy(x, *a, **kw):
        seen.append(x.dtype)
        return real(x, *a, **kw)

    monkeypatch.setattr(torch.fft, "rfft", spy)
    ids = torch.randint(0, 4, (2, 128))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids).float().logsumexp(-1).mean()
    loss.backward()
    assert seen and all(d == torch.float32 for d in seen), seen


def test_schedule_and_pole_projection():
    c = TrainConfig(out_dir="x", steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(c, 0) == pytest.approx(0.1) and lr_at(c, 9) == pytest.approx(1.0)
    assert lr_at(c, 99) == pytest.approx(0.1, abs=1e-3)
    from evspark_cli.model.model import StripedHyena

    m = StripedHyena(tiny_config())
    with torch.no_grad():
        m.blocks[2].filter.log_poles.fill_(0.3)  # an unstable pole (|p| > 1)
    keep_poles_stable(m)
    assert (m.blocks[2].filter.log_poles < 0).all()


@pytest.mark.slow
def test_train_command_exports_a_model(tmp_path):
    c = cfg(tmp_path, steps=4)
    path = tmp_path / "train_config.json"
    path.write_text(json.dumps(c.__dict__))
    r = subprocess.run([sys.executable, "-m", "evspark_cli.cli", "train", "--config", str(path),
                        "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1].startswith("evspark: train: steps 0 to 4 of 4 in "), r.stderr
    m = load_model(tmp_path / "run" / "model")
    assert m.config.hidden_size == 32


@pytest.mark.slow
def test_bundled_target_loads_and_scores_dna():
    """The bundled target is a real DNA model: well under 2 bits/nt on a held-out genome window."""
    folder = default_model_dir()
    m = load_model(folder)
    assert m.num_parameters() > 1_000_000
    pattern = m.layer_kinds()
    for kind in ("hcs", "hcm", "hcl", "attn"):
        assert pattern.count(kind) >= 2
    window = FIXTURES / "ecoli_536_window.fa.gz"  # NC_008253.1:100001-104096
    r = subprocess.run([sys.executable, "-m", "evspark_cli.cli", "score", str(window),
                        "--context", "2048", "--window", "2048",
                        "--threads", "1", "--quiet"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    row = r.stdout.strip().splitlines()[1].split("\t")
    assert int(row[1]) == 4096
    assert 1.0 < float(row[2]) < 2.0


# ------------------------------------------------ `evspark train` on inputs it cannot train on


Q = ["-q"]


def write_config(tmp_path: Path, name: str = "c.json", **kw) -> Path:
    cfg = dict(out_dir=str(tmp_path / "run"), model=tiny_config().to_dict(), train=[str(PHIX)],
               valid=[], window=32, batch_size=2, steps=5, lr=1e-2, warmup=1, eval_every=0,
               ckpt_every=100, threads=1, seed=0)
    cfg.update(kw)
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("field,value", [
    ("steps", 0), ("batch_size", 0), ("lr", -1.0), ("lr", "abc"), ("ckpt_every", 0),
    ("rc_prob", 2.0), ("threads", -1), ("window", 10_000_000), ("bf16_autocast", "maybe"),
    ("bogus", 1),
])
def test_train_config_values_that_cannot_train(tmp_path, field, value):
    cfg = write_config(tmp_path, **{field: value})
    one_line_error(run_cli(["train", "--config", cfg, *Q]), 2)


def test_train_config_not_json_or_not_an_object(tmp_path):
    (tmp_path / "a.json").write_text("{bad")
    (tmp_path / "b.json").write_text("[1, 2]")
    one_line_error(run_cli(["train", "--config", tmp_path / "a.json", *Q]), 2)
    one_line_error(run_cli(["train", "--config", tmp_path / "b.json", *Q]), 2)


def test_train_options_out_of_range_and_outputs_that_are_files(tmp_path):
    cfg = write_config(tmp_path)
    one_line_error(run_cli(["train", "--config", cfg, "--steps", "0", *Q]), 2)
    one_line_error(run_cli(["train", "--config", cfg, "--stop-at", "-1", *Q]), 2)
    (tmp_path / "afile").write_text("x")
    one_line_error(run_cli(["train", "--config", cfg, "--export", tmp_path / "afile", *Q]), 2)
    one_line_error(run_cli(["train", "--config", write_config(tmp_path, "d.json", out_dir=str(
        tmp_path / "afile")), *Q]), 2)
    # nothing trained yet: exporting would write an untrained model
    one_line_error(run_cli(["train", "--config", cfg, "--export-only", *Q]), 2)


def test_train_corrupt_or_mismatched_checkpoint_is_a_model_error(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "ckpt.pt").write_text("garbage")
    cfg = write_config(tmp_path)
    one_line_error(run_cli(["train", "--config", cfg, *Q]), 3)
    assert run_cli(["train", "--config", cfg, "--stop-at", "1", *Q]).code == 3
    (run / "ckpt.pt").unlink()
    assert run_cli(["train", "--config", cfg, "--stop-at", "1", *Q]).code == 0
    other = write_config(tmp_path, "o.json", model=tiny_config(hidden_size=48).to_dict())
    one_line_error(run_cli(["train", "--config", other, *Q]), 3)


def test_train_resume_drops_log_rows_past_the_checkpoint(tmp_path):
    cfg = write_config(tmp_path)
    assert run_cli(["train", "--config", cfg, "--stop-at", "3", *Q]).code == 0
    log = tmp_path / "run" / "log.jsonl"
    # rows written after the last checkpoint by a run that was then killed
    with open(log, "a") as f:
        f.write(json.dumps({"step": 4, "loss": 9.0}) + "\n" + '{"step": 5, "lo')
    r = run_cli(["train", "--config", cfg, *Q])
    assert r.code == 0, r.err
    steps = [json.loads(x)["step"] for x in log.read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5]
    assert json.loads(log.read_text().splitlines()[3])["loss"] != 9.0
