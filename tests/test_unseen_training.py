"""`evspark train`, `distill` and `bench` on inputs they were not developed against.

Bad train-config values, corrupt or mismatched checkpoints in the run folder, an out_dir that is a
file, a resume after rows were logged past the last checkpoint, a teacher cache of another target,
drafter shapes that cannot be built, bench option values out of range: each is one
`evspark: error:` line and the documented exit code (or, for resume, a clean log).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import PHIX, one_line_error, random_tiny_dir, run_cli, tiny_config  # noqa: E402

Q = ["-q"]


def write_config(tmp_path: Path, name: str = "c.json", **kw) -> Path:
    cfg = dict(out_dir=str(tmp_path / "run"), model=tiny_config().to_dict(), train=[str(PHIX)],
               valid=[], window=32, batch_size=2, steps=5, lr=1e-2, warmup=1, eval_every=0,
               ckpt_every=100, threads=1, seed=0)
    cfg.update(kw)
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return p


# ----------------------------------------------------------------------------------- train


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


# --------------------------------------------------------------------------------- distill


@pytest.mark.parametrize("opt", [["--width", "30"], ["--width", "0"], ["--layers", "0"],
                                 ["--prefix", "-1"],
                                 ["--natural-windows", "0", "--onpolicy-windows", "0"]])
def test_distill_shapes_that_cannot_be_built(tmp_path, opt):
    r = run_cli(["distill", "--model", tmp_path / "none", "--train", PHIX, "--cache",
                 tmp_path / "c", "-o", tmp_path / "d", *opt, *Q])
    one_line_error(r, 2)
    assert not (tmp_path / "c").exists()


def test_distill_refuses_a_cache_of_another_target_and_leaves_no_half_cache(tmp_path):
    a = random_tiny_dir(tmp_path / "a", seed=0)
    b = random_tiny_dir(tmp_path / "b", seed=1)
    small = ["--natural-windows", "2", "--onpolicy-windows", "0", "--window", "64", "--steps", "1",
             "--batch", "2", "--gamma", "2", "--width", "16", "--layers", "1", "--prefix", "8",
             "--threads", "1", *Q]
    # a window longer than every record: one line, and no half-built cache folder
    r = run_cli(["distill", "--model", a, "--train", PHIX, "--cache", tmp_path / "c0",
                 "-o", tmp_path / "d0", *small, "--window", "100000"])
    one_line_error(r, 2)
    assert not (tmp_path / "c0").exists()
    r = run_cli(["distill", "--model", a, "--train", PHIX, "--cache", tmp_path / "c",
                 "-o", tmp_path / "da", *small])
    assert r.code == 0, r.err
    r = run_cli(["distill", "--model", b, "--cache", tmp_path / "c", "-o", tmp_path / "db", *small])
    one_line_error(r, 2)
    assert not (tmp_path / "db").exists()
    # resuming with another drafter shape
    r = run_cli(["distill", "--model", a, "--cache", tmp_path / "c", "-o", tmp_path / "da",
                 *small, "--width", "32", "--steps", "2"])
    one_line_error(r, 3)
    # a resumed distill replays the log rows past its checkpoint instead of duplicating them
    log = tmp_path / "da.run" / "log.jsonl"
    assert [json.loads(x)["step"] for x in log.read_text().splitlines()] == [1]
    with open(log, "a") as f:
        f.write(json.dumps({"step": 2, "loss": 9.0}) + "\n" + '{"step": 3, "lo')
    r = run_cli(["distill", "--model", a, "--cache", tmp_path / "c", "-o", tmp_path / "da",
                 *small, "--steps", "2"])
    assert r.code == 0, r.err
    rows = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["step"] for x in rows] == [1, 2] and rows[1]["loss"] != 9.0


# ----------------------------------------------------------------------------------- bench


@pytest.mark.parametrize("opt", [["-n", "0"], ["--n-prompts", "0"], ["-g", "0"],
                                 ["--gammas", "0,2"], ["--contexts", "-5"], ["--seeds", "-1"]])
def test_bench_values_out_of_range(tmp_path, opt):
    r = run_cli(["bench", "--model", tmp_path / "none", "-o", tmp_path / "out", *opt, *Q])
    one_line_error(r, 2)


def test_bench_output_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    one_line_error(run_cli(["bench", "--model", tmp_path / "none", "-o", tmp_path / "afile", *Q]),
                   2)
