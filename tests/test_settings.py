"""User values are checked once, in the library, and named by the option the user typed.

The library names a bad value by its Python name (`max_new_tokens`); the command line shows the
same message with the option (`--max-new-tokens`), including where the two names differ. The
bad option values of tests/RELIABILITY.md run here too, through `evspark generate`.
"""
from __future__ import annotations

import json
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from battery import (  # noqa: E402
    ADDRESS_LIMIT,
    FAST,
    GIB,
    Case,
    Models,
    bounded,
    case_ids,
    check_bad_input,
    child_env,
    fasta_file,
    gen,
    only_error_line,
    record,
    refused,
    run_child,
    shorten,
    show,
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
    ({"tree_rows": -1, "rule": "coupled"}, "tree_rows must be >= 0, got -1"),
    ({"tree_rows": 2.5, "rule": "coupled"}, "tree_rows must be an integer, got 2.5"),
    ({"samples": 10 ** 9},
     "samples must be <= 1,000,000 (continuations of one record), got 1000000000"),
    ({"max_new_tokens": 10 ** 12},
     "max_new_tokens must be <= 1,000,000,000 (no model's context is that long), got "
     "1000000000000"),
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
        DistillConfig(cache="", out_dir="", gamma=17, gamma_max=16)
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
     "--natural-windows plus --onpolicy-windows plus --greedy-windows must be >= 1"),
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
    Case("--samples 10^9", gen("--samples", 10 ** 9), 2,
         r"^evspark: error: --samples must be <= 1,000,000 \(continuations of one record\), got "
         r"1000000000$"),
    Case("-n 10^12", gen("-n", 10 ** 12), 2,
         r"^evspark: error: --max-new-tokens must be <= 1,000,000,000 \(no model's context is "
         r"that long\), got 1000000000000$"),
    Case("--tree-rows -1", gen("--tree-rows", -1, "--rule", "coupled"), 2,
         r"^evspark: error: --tree-rows must be >= 0, got -1$"),
    Case("--tree-rows 10^9", gen("--tree-rows", 10 ** 9, "--rule", "coupled"), 2,
         r"^evspark: error: --tree-rows must be <= 64 \(branch rows of one job\), got "
         r"1000000000$"),
    Case("--tree-rows with residual sampling", gen("--tree-rows", 2), 2,
         r"^evspark: error: --tree-rows needs greedy decoding or --rule coupled"),
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


# ------------------------------------- every size a user sets is bounded before any allocation

ROOT = Path(__file__).resolve().parents[1]
BUNDLED_DRAFTER = ROOT / "models" / "evspark-sh2-192" / "drafters" / "seed0"


def in_child(case: str, args: list, d: Path, normal: int, code: int = 0, pattern: str = "",
             result: str = "", env: dict[str, str] | None = None, **names: Path) -> str:
    """`evspark ARGS` in a child process (battery.run_child: its address space limited, a
    timeout) with `env` set: exit `code` within 1 GiB of a normal run's peak; a refusal is one
    error line matching `pattern`, a run that works is recorded as `result`. Its stderr."""
    env = env or {}
    rc, err, peak = run_child(args, d, **env)
    extra = max(peak - normal, 0) >> 20
    what = shorten(only_error_line(err), d, **names) if code else result
    shown = "".join(f"{k}={v} " for k, v in env.items()) + show(args, d, **names)
    record("hostile", case, shown, rc, f"{what} [bounded: peak {extra} MiB above a normal run's]")
    assert rc == code, err
    assert re.search(pattern, what), f"{what!r} does not match {pattern!r}"
    assert "Traceback" not in err and "internal error" not in err, err
    assert peak < normal + GIB, f"peak {peak / GIB:.2f} GiB vs a normal run's {normal / GIB:.2f}"
    return err


def test_generate_sizes_are_bounded(phix_model, tmp_path, normal_peak):
    """A batch above the sequences is clamped to them, as is a --gamma above the tokens asked
    (the confidence schedule was sized by it); --samples far above what memory holds is refused
    before a single job is built."""
    src = fasta_file(tmp_path)
    base = ["generate", src, "--model", phix_model, *FAST, "-n", 4]
    bounded("generate --samples 10^9", [*base, "--samples", 10 ** 9], 2,
            r"--samples must be <= 1,000,000", tmp_path, normal_peak, MODEL=phix_model)
    in_child("generate --samples 10^6 in 1 GiB (EVSPARK_MAX_MEMORY)",
             [*base, "--samples", 10 ** 6, "-o", tmp_path / "o.fa"], tmp_path, normal_peak, 2,
             r"^evspark: error: 3 records x --samples 1,000,000 are 3,000,000 sequences; their "
             r"bookkeeping alone needs about 2\.86 GiB of memory, 1\.00 GiB is available; use "
             r"fewer --samples or records$", env={"EVSPARK_MAX_MEMORY": "1G"}, MODEL=phix_model)
    assert not list(tmp_path.glob("o.fa*"))
    err = in_child("generate -b 10^9", [*base, "-b", 10 ** 9], tmp_path, normal_peak,
                   result="3 sequences decoded in one batch of 3 rows", MODEL=phix_model)
    assert ", batch 3" in err.strip().splitlines()[-1], err
    err = in_child("generate --draft-length confidence --gamma 10^9",
                   [*base, "--drafter", "kmer", "--top-k", 1, "--draft-length", "confidence",
                    "--gamma", 10 ** 9, "-b", 10 ** 9], tmp_path, normal_peak,
                   result="works: the schedule is sized by the drafts a round can use (3)",
                   MODEL=phix_model)
    assert "3 sequences written" in err, err
    err = in_child("generate -b 10^9 --tree-rows 64 --rule coupled",
                   [*base, "--rule", "coupled", "--tree-rows", 64, "-b", 10 ** 9], tmp_path,
                   normal_peak, result="works: 3 sequences and their branch rows in one batch",
                   MODEL=phix_model)
    assert "3 sequences written" in err, err


def test_verify_and_score_sizes_are_bounded(phix_model, tmp_path, normal_peak):
    src = fasta_file(tmp_path)
    in_child("verify -b 10^9 --draft-length confidence --gamma 10^9",
             ["verify", src, "--model", phix_model, *FAST, "-n", 4, "--drafter", "kmer",
              "-b", 10 ** 9, "--draft-length", "confidence", "--gamma", 10 ** 9], tmp_path,
             normal_peak, result="0 non-tie divergences (the batch clamped to the 3 prompts)",
             MODEL=phix_model)
    bounded("score --context 10^12", ["score", src, "--model", phix_model, *FAST,
                                      "--context", 10 ** 12], 2,
            r"--context 1,000,000,000,000: a base can see at most 4,095 earlier bases",
            tmp_path, normal_peak, MODEL=phix_model)


def _bench(model: Path, d: Path, *extra) -> list:
    """A bench run of the throughput section alone, as small as it gets."""
    return ["bench", "--model", model, "--prompts", fasta_file(d), "--n-prompts", 2, "-o",
            d / "bench", "--seeds", 0, "--baselines", "kmer", "--rollbacks", "slice", "--rules",
            "residual", "--skip", "speed,tvd,gamma,context,depth,mixed", "--throughput-tokens",
            4, "--samples", 1, *FAST, *extra]


def test_bench_sizes_are_refused_up_front(phix_model, tmp_path, normal_peak):
    for case, extra, pattern in [
        ("bench --samples 10^9", ["--samples", 10 ** 9], r"--samples must be <= 1,000,000"),
        ("bench -n 10^12", ["-n", 10 ** 12], r"--max-new-tokens must be <= 1,000,000,000"),
        ("bench --throughput-tokens past the context", ["--throughput-tokens", 5000],
         r"^evspark: error: --throughput-tokens 5,000: a prompt of 22 bases \(the throughput "
         r"section\) and that many new tokens exceed the model's context of 4,096$"),
    ]:
        bounded(case, _bench(phix_model, tmp_path, *extra), 2, pattern, tmp_path, normal_peak,
                MODEL=phix_model)
        assert not (tmp_path / "bench").exists()


@pytest.mark.slow
def test_bench_batch_and_gamma_are_clamped(phix_model, tmp_path, normal_peak):
    in_child("bench -b 10^9", _bench(phix_model, tmp_path, "-b", 10 ** 9), tmp_path,
             normal_peak, result="measured (and reported) as a batch of the 2 jobs",
             MODEL=phix_model)
    got = json.loads((tmp_path / "bench" / "results.json").read_text())["throughput"]
    assert got["headline_batch_size"] == 2
    assert sorted(m["batch_size"] for m in got["modes"].values()) == [1, 1, 2, 2]
    args = [*_bench(phix_model, tmp_path, "--gamma", 10 ** 9, "--gammas", f"2,{10 ** 9}", "-n",
                    4)]
    args[args.index("--skip") + 1] = "tvd,context,depth,throughput,mixed"
    in_child("bench --gamma 10^9", args, tmp_path, normal_peak,
             result="works: each round drafts at most the tokens asked", MODEL=phix_model)


API_CHILD = """
import resource, sys, torch
torch.set_num_threads(1)
import evspark_cli as evs
from evspark_cli.errors import SettingError
model = evs.load_model(sys.argv[1])
for call in ("batch_size=10**9", "samples=10**9", "max_new_tokens=10**12", "samples=10**6"):
    name, _, value = call.partition("=")
    kw = {"max_new_tokens": 4, "drafter": "kmer", name: eval(value)}
    try:
        outs = evs.generate_many(model, ["ACGTACGTAC", "GGCCAATTGG"], **kw)
        print(f"{call}\t{len(outs)} outputs")
    except SettingError as e:
        print(f"{call}\tSettingError: {e}")
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def test_api_sizes_are_bounded(phix_model, tmp_path, normal_peak):
    """`generate_many` clamps a batch to its jobs and refuses, naming the setting, samples and
    tokens no run could hold, and outputs (all kept until it returns) that would not fit."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_LIMIT, ADDRESS_LIMIT))

    p = subprocess.run([sys.executable, "-c", API_CHILD, str(phix_model)], capture_output=True,
                       text=True, timeout=240, cwd=tmp_path, preexec_fn=limit,
                       env=child_env(EVSPARK_MAX_MEMORY="1G"))
    assert p.returncode == 0, p.stderr
    *lines, peak = p.stdout.strip().splitlines()
    got = dict(line.split("\t") for line in lines)
    assert list(got.values())[:3] == [
        "2 outputs",
        "SettingError: samples must be <= 1,000,000 (continuations of one record), got "
        "1000000000",
        "SettingError: max_new_tokens must be <= 1,000,000,000 (no model's context is that long), "
        "got 1000000000000"], p.stdout
    assert re.fullmatch(r"SettingError: 2 records x samples 1,000,000 are 2,000,000 sequences; "
                        r"their outputs need about \d+\.\d\d GiB of memory, 1\.00 GiB is "
                        r"available; use fewer samples or records", got["samples=10**6"]), p.stdout
    assert int(peak) < normal_peak + GIB
    for call, result in got.items():
        tokens = "" if call.startswith("max_new_tokens") else "max_new_tokens=4, "
        record("hostile", f"generate_many({call})",
               f"EVSPARK_MAX_MEMORY=1G python: evs.generate_many(model, ['ACGTACGTAC', "
               f"'GGCCAATTGG'], {tokens}drafter='kmer', {call})",
               2 if result.startswith("SettingError") else 0, result)  # its exit_code


def test_info_describes_a_drafter_folder(phix_drafter, tmp_path):
    """`evspark info DRAFTER` (or `--model DRAFTER`) describes the drafter and how to use it,
    instead of failing on a model config's missing fields."""
    home = BUNDLED_DRAFTER.parent.parent
    for args in (["info", BUNDLED_DRAFTER], ["info", "--model", BUNDLED_DRAFTER]):
        r = run_cli(args)
        assert r.code == 0, r.err
        lines = r.out.splitlines()
        assert lines[0] == f"drafter        dspark  ({BUNDLED_DRAFTER})"
        assert lines[1].startswith("parameters     ") and "width 128  layers 2" in lines[2]
        assert lines[2].endswith("Markov order 3  (tables from the trunk)")
        assert "up to 16 a round (--gamma 16 at most)" in lines[3]
        assert lines[4].startswith("target         evspark-sh2-192: hidden 192, 4 conditioning "
                                   "layers, vocabulary 512, weights sha256 1e3ee3156f59")
        assert lines[5] == f"bundled with   {home}"
        assert lines[6] == (f"use            evspark generate IN.fa --model {home} --drafter "
                            f"{BUNDLED_DRAFTER}")
        assert lines[7].startswith("training       seed 0, steps 4800")
    r = run_cli(["info", phix_drafter])
    assert r.code == 0, r.err
    assert "target         tiny-test: hidden 32" in r.out and "bundled with" not in r.out
    assert f"--model TARGET --drafter {phix_drafter}" in r.out
    model = run_cli(["info", home])
    assert model.code == 0 and model.out == run_cli(["info", "--model", home]).out
    assert model.out.startswith("model          evspark-sh2-192")
    r = run_cli(["info", home, "--model", home])
    assert one_line_error(r, 2) == "evspark: error: give the folder once: as FOLDER or with --model"


def test_a_drafter_folder_given_as_the_model_says_so(phix_drafter, tmp_path):
    refused("a drafter folder as --model",
            ["generate", fasta_file(tmp_path), "--model", phix_drafter, *FAST, "-n", 4], 3,
            r"^evspark: error: \S+ is a drafter folder, not a model folder: pass its target "
            r"\(tiny-test\) with --model and this folder with --drafter$", tmp_path,
            DRAFTER=phix_drafter)
