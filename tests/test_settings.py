"""User values are checked once, in the library, and named by the option the user typed.

The library names a bad value by its Python name (`max_new_tokens`); the command line shows the
same message with the option (`--max-new-tokens`), including where the two names differ.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import PHIX, one_line_error, run_cli, tiny_config  # noqa: E402

from evspark_cli.api import DecodeOptions  # noqa: E402
from evspark_cli.errors import InputError, SettingError  # noqa: E402
from evspark_cli.eval.bench import PRESETS, bench_config  # noqa: E402
from evspark_cli.eval.verify import VerifyOptions  # noqa: E402
from evspark_cli.io.shard import parse_shard  # noqa: E402
from evspark_cli.train.distill import CacheConfig, DistillConfig  # noqa: E402
from evspark_cli.train.pretrain import RunOptions, load_train_config  # noqa: E402


@pytest.mark.parametrize("kwargs,message", [
    ({"max_new_tokens": 0}, "max_new_tokens must be >= 1, got 0"),
    ({"gamma": 0}, "gamma must be >= 1, got 0"),
    ({"samples": 0}, "samples must be >= 1, got 0"),
    ({"seed": -1}, "seed must be an integer in [0, 2**63), got -1"),
    ({"seed": 1.5}, "seed must be an integer, got 1.5"),
    ({"rollback": "undo"}, "rollback must be slice or replay, got 'undo'"),
    ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0"),
])
def test_decode_options_cannot_hold_a_bad_value(kwargs, message):
    with pytest.raises(InputError) as e:
        DecodeOptions(**kwargs)
    assert str(e.value) == message


def test_decode_options_largest_draft_and_sampler():
    o = DecodeOptions(max_new_tokens=5, gamma=12, top_k=1)
    assert o.largest_draft == 4 and o.sampler.greedy
    assert DecodeOptions(max_new_tokens=64, gamma=12).largest_draft == 12


def test_a_setting_error_renders_names_and_keeps_braces():
    e = SettingError.of("out_dir", "{weird} is a file, not a folder")
    assert str(e) == "out_dir {weird} is a file, not a folder"
    assert e.render(lambda s: "--output") == "--output {weird} is a file, not a folder"
    two = SettingError("{0} and {1} must be >= 1", "context", "window")
    assert two.render(lambda s: "--" + s) == "--context and --window must be >= 1"


def test_other_option_objects_check_their_values():
    with pytest.raises(SettingError, match="tie_tolerance must be >= 0"):
        VerifyOptions(DecodeOptions(), tie_tolerance=-1.0)
    with pytest.raises(SettingError, match="gamma must be <= 16"):
        DistillConfig(cache="", out_dir="", gamma=17)
    with pytest.raises(SettingError, match="width must be a positive multiple of 4"):
        DistillConfig(cache="", out_dir="", width=30)
    with pytest.raises(SettingError, match="natural_windows plus onpolicy_windows"):
        CacheConfig(target="", out_dir="", natural_windows=0, onpolicy_windows=0)
    with pytest.raises(SettingError, match="stop_at must be >= 1"):
        RunOptions(stop_at=0)
    assert parse_shard((2, 5)) == (2, 5)
    with pytest.raises(InputError, match="--shard 3/2: need 1 <= I <= N"):
        parse_shard((3, 2))


def test_bench_config_applies_overrides_to_a_preset():
    cfg = bench_config("full", "p.fa", n_prompts=2, seeds="0,2", gammas="2,4", rollbacks="slice",
                       baselines="", skip="tvd,depth", depth=0)
    assert cfg.n_prompts == 2 and cfg.seeds == [0, 2] and cfg.gamma_sweep == [2, 4]
    assert cfg.rollback_modes == ["slice"] and cfg.baselines == [] and cfg.skip == ["tvd", "depth"]
    assert cfg.new_tokens == PRESETS["full"]["new_tokens"] and cfg.depth_tokens == 0
    assert bench_config("quick", "p.fa").gamma_sweep == [4, 8, 12]
    with pytest.raises(SettingError) as e:
        bench_config("quick", "p.fa", contexts="1k")
    assert e.value.settings == ("gamma_sweep", "contexts")


def test_train_steps_from_the_option_or_the_file_are_named_as_such(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"out_dir": str(tmp_path / "run"), "steps": 0}))
    with pytest.raises(InputError) as e:
        load_train_config(path)
    assert str(e.value) == "train config: steps must be >= 1, got 0"
    assert not isinstance(e.value, SettingError)  # the file's value: no option to name
    assert load_train_config(path, steps=3).steps == 3
    with pytest.raises(SettingError, match="steps must be >= 1, got -2"):
        load_train_config(path, steps=-2)


@pytest.mark.parametrize("args,message", [
    (["generate", "-", "-n", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["generate", "-", "--rollback", "x"], "--rollback must be slice or replay, got 'x'"),
    (["verify", "--tie-tolerance", "-1"], "--tie-tolerance must be >= 0, got -1.0"),
    (["score", "-", "--window", "0"], "--context and --window must be >= 1"),
    (["bench", "-n", "0"], "--max-new-tokens must be >= 1, got 0"),
    (["bench", "--gammas", "0,2"], "--gammas and --contexts take integers >= 1"),
    (["bench", "--depth", "-1"], "--seeds and --depth must be >= 0"),
    (["bench", "--rollbacks", "undo"], "--rollbacks must list slice and/or replay, got 'undo'"),
    (["bench", "--skip", "tvd,nope"], "--skip: unknown section(s) nope"),
    (["distill", "--prefix", "0"], "--prefix must be >= 1, got 0"),
    (["distill", "--natural-windows", "0", "--onpolicy-windows", "0"],
     "--natural-windows plus --onpolicy-windows must be >= 1"),
    (["generate", "-", "--threads", "-1"], "--threads must be >= 0, got -1"),
])
def test_the_command_line_names_the_option(tmp_path, args, message):
    r = run_cli([*args, "--model", tmp_path / "no-model", "-q"] if args[0] != "score"
                else [*args, "-q"], stdin=b">r\nACGT\n")
    assert one_line_error(r, 2) == f"evspark: error: {message}"


def test_train_options_are_named_as_options(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"out_dir": str(tmp_path / "run"), "train": [str(PHIX)],
                                "model": tiny_config().to_dict(), "window": 64}))
    r = run_cli(["train", "--config", path, "--steps", "0", "-q"])
    assert one_line_error(r, 2) == "evspark: error: --steps must be >= 1, got 0"
    r = run_cli(["train", "--config", path, "--export-only", "--no-resume", "-q"])
    assert one_line_error(r, 2).startswith("evspark: error: --export-only: no checkpoint ")
    assert r.err.strip().endswith("to export (without --no-resume)")
