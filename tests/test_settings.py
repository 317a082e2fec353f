"""User values are checked once, in the library, and named by the option the user typed.

The library names a bad value by its Python name (`max_new_tokens`); the command line shows the
same message with the option (`--max-new-tokens`), including where the two names differ. The
bad option values of tests/RELIABILITY.md run here too, through `evspark generate`.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import (  # noqa: E402
    FAST,
    Case,
    Models,
    case_ids,
    check_bad_input,
    fasta_file,
    gen,
    refused,
)
from tiny import PHIX, one_line_error, run_cli, tiny_config  # noqa: E402

from evspark_cli.api import DecodeOptions  # noqa: E402
from evspark_cli.errors import InputError, SettingError  # noqa: E402
from evspark_cli.eval.bench import PRESETS, bench_config  # noqa: E402
from evspark_cli.eval.verify import VerifyOptions  # noqa: E402
from evspark_cli.io.shard import parse_shard  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402
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
    with pytest.raises(SettingError, match="^shard 3/2: need 1 <= I <= N"):
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


# ------------------------------------------------- the command line on bad option values (battery)


BAD_INPUT_CASES: list[Case] = [
    Case("-n 0", gen("-n", 0), 2, r"--max-new-tokens must be >= 1, got 0"),
    Case("-n -5", gen("-n", -5), 2, r"--max-new-tokens must be >= 1, got -5"),
    Case("-n not a number", gen("-n", "ten"), 2, r"Invalid value for '-n' / '--max-new-tokens'"),
    Case("--gamma 0", gen("--gamma", 0), 2, r"--gamma must be >= 1, got 0"),
    Case("--top-p 1.5", gen("--top-p", 1.5), 2, r"--top-p must be in \(0, 1\], got 1\.5"),
    Case("--temperature -1", gen("--temperature", -1), 2,
         r"--temperature must be a finite number >= 0"),
    Case("--top-k -1", gen("--top-k", -1), 2, r"--top-k must be an integer >= 0"),
    Case("--samples 0", gen("--samples", 0), 2, r"--samples must be >= 1"),
    Case("--shard 3/2", gen("--shard", "3/2"), 2, r"--shard 3/2: need 1 <= I <= N"),
    Case("--shard malformed", gen("--shard", "half"), 2, r"--shard must look like I/N"),
    Case("--prompt-tail 0", gen("--prompt-tail", 0), 2, r"--prompt-tail must be an integer >= 1"),
    Case("--rollback unknown", gen("--rollback", "undo"), 2, r"--rollback must be slice or replay"),
    Case("unknown drafter", gen("--drafter", "gpt"), 2, r"--drafter 'gpt': not a drafter name"),
    Case("unknown option", gen("--frobnicate"), 2, r"No such option: --frobnicate"),
]


@pytest.mark.parametrize("case", BAD_INPUT_CASES, ids=case_ids(BAD_INPUT_CASES))
def test_bad_input(case: Case, battery_models: Models, tmp_path: Path):
    """`evspark generate` with each bad option value: the exit code, one error line naming the
    option, nothing written."""
    check_bad_input(case, battery_models, tmp_path)


def test_top_p_below_fp32_is_refused(phix_model: Path, tmp_path: Path):
    refused("--top-p 1e-46", ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST,
                              "-n", 4, "--top-p", "1e-46", "-o", tmp_path / "o.fa"], 2,
            r"--top-p must be at least 1\.2e-38 \(the smallest probability the fp32 sampler "
            r"represents\), got 1e-46", tmp_path, MODEL=phix_model)
    assert not list(tmp_path.glob("o.fa*"))


@pytest.mark.parametrize("opt", [["--device", "tpu"], ["--dtype", "float16"], ["--seed", "-5"]])
def test_bad_option_values_are_usage_errors(random_model, masked_fa, opt):
    r = run_cli(["generate", masked_fa, "--model", random_model, "-n", 4, *opt, *FAST])
    one_line_error(r, 2)


def test_api_generate_rejects_bad_token_ids_and_seeds(random_model):
    import evspark_cli as evs

    m = load_model(random_model)
    for prompt in ([65, 600], [-1, 65]):
        with pytest.raises(InputError, match="vocabulary"):
            evs.generate(m, prompt, max_new_tokens=2, drafter="kmer")
    with pytest.raises(InputError, match="seed"):
        evs.generate(m, "ACGT", max_new_tokens=2, seed=-1)
    with pytest.raises(InputError, match="max_new_tokens"):
        evs.generate(m, "ACGT", max_new_tokens=2.0)
    limit = m.config.max_seqlen
    with pytest.raises(InputError, match="context"):
        evs.generate(m, "ACGT", max_new_tokens=limit - 3, drafter="kmer")


def test_api_prompts_are_checked_like_the_command_line(random_model):
    """`generate_many` takes a string as one prompt, upper-cases letters, refuses letters outside
    the IUPAC alphabet (naming the prompt and position) and wrong types with an InputError."""
    import evspark_cli as evs

    m = load_model(random_model)
    kw = dict(max_new_tokens=3, drafter="kmer", gamma=2)
    one = evs.generate_many(m, "ACGTACGT", **kw)
    assert len(one) == 1
    assert one[0].tokens == evs.generate_many(m, ["ACGTACGT"], **kw)[0].tokens
    assert one[0].tokens == evs.generate(m, "ACGTACGT", **kw).tokens
    lower = evs.generate_many(m, ["acgtNNacgu", "GGCC"], **kw)
    upper = evs.generate_many(m, ["ACGTNNACGT", "GGCC"], **kw)
    assert [o.tokens for o in lower] == [o.tokens for o in upper]
    assert evs.generate(m, "acgt", **kw).tokens == evs.generate(m, "ACGT", **kw).tokens
    ids = [65, 67, 71, 84]  # token ids stay accepted as they are
    assert evs.generate_many(m, [ids], **kw)[0].tokens == evs.generate(m, "ACGT", **kw).tokens
    for prompts, message in [
        (["ACGT", "ACJT"], r"^prompts\[1\]: invalid character 'J' at position 3$"),
        ({"r1": "AC-T"}, r"^prompt 'r1': invalid character '-' at position 3 \(alignment gaps"),
        (["ACGT", ""], r"^prompts\[1\]: empty sequence$"),
        (5, r"^prompts must be a list of prompts .* got int$"),
        (None, r"^prompts must be a list .* got NoneType$"),
        ([65, 67], r"^prompts\[0\] must be .* got int \(a list of token ids is one prompt"),
        ([None], r"^prompts\[0\] must be a string of bases or a sequence of token ids, got "
                 r"NoneType$"),
        ([["A", "C"]], r"^prompts\[0\]: token 1 is not an integer token id \(str\)"),
        ([[65, 1.5]], r"^prompts\[0\]: token 2 is not an integer token id \(float\)"),
        ({"r1": 5}, r"^prompt 'r1' must be .* got int$"),
        ({"r1": None}, r"^prompt 'r1' must be .* got NoneType$"),
        ({7: "ACGT"}, r"^a prompt's id must be a non-empty string, got 7$"),
    ]:
        with pytest.raises(InputError, match=message):
            evs.generate_many(m, prompts, **kw)
    for prompt in (None, 5, {"a": "ACGT"}, "AC GT"):
        with pytest.raises(InputError, match="^prompt"):
            evs.generate(m, prompt, **kw)
