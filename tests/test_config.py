"""Model and drafter configs: every config.json either loads or is refused in one line.

Values that cannot work (a layer list that is not one, zero heads, another vocabulary, NaN, a
flag that is not true/false, the wrong type), configs nested too deeply to parse, and configs
that describe far more parameters than their weights hold (refused before anything is built, in
a child process whose peak memory is measured against a normal run's) are each one
`evspark: error:` line and exit 3. Then a fuzz target: Hypothesis mutates config dicts in this
process (parsing and validation, fast), and a seeded mutator loads a few hundred mutated model
and drafter folders for real in a child process whose address space is limited, reporting its
peak memory against a clean load's: never another exception, never a huge allocation.
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from battery import FAST, bounded, fasta_file, refused
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import one_line_error, run_cli, shared_trained_tiny, tiny_config

from evspark_cli.errors import ModelError
from evspark_cli.model.checkpoint import load_model

ROOT = Path(__file__).resolve().parents[1]
GIB = 1 << 30

# ------------------------------------------------------------ values that cannot work


@pytest.mark.parametrize("field,value", [
    ("attn_layer_idxs", None), ("num_attention_heads", 0), ("hidden_layers", []),
    ("prefill_chunk", 0), ("vocab_size", 16), ("max_seqlen", 0),
])
def test_config_values_that_cannot_work_are_model_errors(tmp_path, random_model, masked_fa, field,
                                                         value):
    bad = tmp_path / "bad"
    shutil.copytree(random_model, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg[field] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError):
        load_model(bad)
    r = run_cli(["generate", masked_fa, "--model", bad, "--drafter", "kmer", "-n", 4, *FAST])
    assert field in one_line_error(r, 3)


def _config_folder(phix_model: Path, d: Path, name: str, change) -> Path:
    folder = Path(shutil.copytree(phix_model, d / name))
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("case,change,pattern", [
    ("config eps NaN", lambda c: c.update(eps=float("nan")),
     r"config: eps must be a finite number > 0, got nan"),
    ("config inner_mlp_size -5", lambda c: c.update(inner_mlp_size=-5),
     r"config: inner_mlp_size must be null or an integer >= 1, got -5"),
    ("config hcs_filter_groups [4]", lambda c: c.update(hcs_filter_groups=[4]),
     r"config: hcs_filter_groups must be an integer >= 1, got \[4\]"),
    ("config a flag that is not true/false", lambda c: c.update(final_norm=[1]),
     r"config: final_norm must be true or false, got \[1\]"),
], ids=["nan", "negative", "list", "flag"])
def test_model_configs_with_bad_values_are_refused(phix_model, tmp_path, case, change, pattern):
    folder = _config_folder(phix_model, tmp_path, "m", change)
    refused(case, ["generate", fasta_file(tmp_path), "--model", folder, *FAST, "-n", 4], 3, pattern,
            tmp_path)


def _drafter_folder(phix_drafter: Path, d: Path, change) -> Path:
    folder = Path(shutil.copytree(phix_drafter, d / "dr"))
    cfg = json.loads((folder / "config.json").read_text())
    change(cfg)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize("case,change,pattern", [
    ("drafter \"heads\": \"4\"", lambda c: c.update(heads="4"),
     r"config\.json: heads must be an integer >= 1, got '4'"),
    ("drafter alphabet outside the vocabulary", lambda c: c.update(alphabet=[65, 9999]),
     r"alphabet must be distinct token ids below vocab_size 512"),
], ids=["heads", "alphabet"])
def test_drafter_configs_with_wrong_types_are_refused(phix_model, phix_drafter, tmp_path, case,
                                                      change, pattern):
    folder = _drafter_folder(phix_drafter, tmp_path, change)
    refused(case, ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
                   "--drafter", folder], 3, pattern, tmp_path, MODEL=phix_model)


def test_deeply_nested_configs_are_refused(phix_model, phix_drafter, tmp_path):
    folder = Path(shutil.copytree(phix_model, tmp_path / "m"))
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    refused("deeply nested config.json", ["generate", fasta_file(tmp_path), "--model", folder,
                                          *FAST, "-n", 4], 3,
            r"config \S*config\.json is not valid JSON: nested too deeply", tmp_path)
    dr = Path(shutil.copytree(phix_drafter, tmp_path / "dr"))
    (dr / "config.json").write_text('{"kind": ' + "[" * 100_000 + "]" * 100_000 + "}")
    refused("deeply nested drafter config.json",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
             "--drafter", dr],
            3, r"config\.json: not valid JSON \(nested too deeply\)", tmp_path, MODEL=phix_model)


# ------------------------------------------------ configs too big: refused before building


def _million_layers(cfg: dict) -> None:
    n = 10 ** 6
    cfg.update(num_layers=n, hidden_layers=None, hcs_layer_idxs=list(range(0, n, 4)),
               hcm_layer_idxs=list(range(1, n, 4)), hcl_layer_idxs=list(range(2, n, 4)),
               attn_layer_idxs=list(range(3, n, 4)))


@pytest.mark.slow
@pytest.mark.parametrize("name,change,pattern", [
    ("hidden_size 16384", lambda c: c.update(hidden_size=16384, num_attention_heads=16),
     r"its config implies [\d,]+ parameters but its weights file holds [\d,]+ numbers"),
    ("num_layers 10^6", _million_layers,
     r"its config implies [\d,]+ parameters but its weights file holds [\d,]+ numbers"),
], ids=["hidden_size", "num_layers"])
def test_configs_too_big_are_refused_before_building(phix_model, tmp_path, normal_peak, name,
                                                     change, pattern):
    folder = _config_folder(phix_model, tmp_path, "m", change)
    bounded(f"config with {name}", ["generate", fasta_file(tmp_path), "--model", folder, *FAST,
                                    "-n", 4], 3, pattern, tmp_path, normal_peak)


@pytest.mark.slow
def test_drafter_with_a_huge_vocabulary_is_refused_unbuilt(phix_model, phix_drafter, tmp_path,
                                                           normal_peak):
    folder = _drafter_folder(phix_drafter, tmp_path, lambda c: c.update(vocab_size=500_000_000))
    bounded("drafter config with vocab_size 5e8",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
             "--drafter", folder],
            3, r"drafter \S*dr has vocab_size 500000000, its target 512", tmp_path, normal_peak,
            MODEL=phix_model)
    folder = _drafter_folder(phix_drafter, tmp_path / "x", lambda c: c.update(prefix_len=10 ** 9))
    bounded("drafter config with prefix_len 10^9",
            ["generate", fasta_file(tmp_path), "--model", phix_model, *FAST, "-n", 4,
             "--drafter", folder],
            3, r"describes a drafter of [\d,]+ parameters, far more than its weights hold",
            tmp_path, normal_peak, MODEL=phix_model)


# ----------------------------------------------------- the fuzz target: configs in this process


NUMBERS = [0, -1, -5, 1, 2, 3, 4, 7, 16, 64, 255, 1024, 16384, 10 ** 6, 5 * 10 ** 8, 10 ** 9,
           2 ** 63, 10 ** 30, 0.5, 1.5, 1e-300, 1e300, -0.0]
ODD = [float("nan"), float("inf"), -float("inf"), True, False, None, "", "4", "wide", "nan",
       "1e9", [], [0], [1, 2], [[1]], ["a"], {}, {"a": 1}, [0] * 5]
VALUES = NUMBERS + ODD

json_value = st.recursive(
    st.one_of(st.sampled_from(VALUES), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=4),
                            st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=8)


def mutated(base: dict, data: st.DataObject) -> dict:
    """`base` with a few fields set to odd values, deleted, or added."""
    cfg = dict(base)
    for _ in range(data.draw(st.integers(1, 3))):
        key = data.draw(st.sampled_from(sorted(cfg) + ["unknown_field"]))
        if data.draw(st.booleans()) and key in cfg and key not in ("kind",):
            del cfg[key]
        else:
            cfg[key] = data.draw(json_value)
    return cfg


def one_line(e: Exception) -> None:
    msg = str(e)
    assert msg and "\n" not in msg and len(msg) < 400, msg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_model_config_dicts(data):
    from evspark_cli.errors import ModelError
    from evspark_cli.model.config import ModelConfig
    from evspark_cli.model.memory import Budget, check_load_fits, parameter_count

    raw = mutated(tiny_config().to_dict(), data)
    try:
        cfg = ModelConfig.from_dict(json.loads(json.dumps(raw)))
    except ModelError as e:
        one_line(e)
        return
    n = parameter_count(cfg)  # defined (and quick) for every config that validates
    assert n > 0 and len(cfg.layer_pattern) == cfg.num_layers
    try:  # against the tiny model's weights and a 1 GiB budget: refused or fits
        check_load_fits(cfg, parameter_count(tiny_config()), 1 << 20, Budget(GIB, "a test"))
    except ModelError as e:
        one_line(e)
        return
    assert n * 4 <= GIB


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_drafter_config_dicts(data):
    from evspark_cli.decode.drafters.dspark import DSparkConfig
    from evspark_cli.errors import ModelError

    raw = mutated({"target_hidden": 32, "target_layers": 2, "width": 32, "layers": 1,
                   "heads": 2, "mlp_ratio": 2, "prefix_len": 8, "gamma_max": 16,
                   "alphabet": [65, 67, 71, 84], "vocab_size": 512, "target_hash": "",
                   "target_name": "", "training": {}}, data)
    try:
        cfg = DSparkConfig.from_dict(json.loads(json.dumps(raw)))
    except ModelError as e:
        one_line(e)
        return
    assert cfg.parameter_count() > 0 and cfg.memory_bytes() > 0


def test_fuzz_config_texts_parse_or_refuse(tmp_path: Path):
    """Broken JSON text (cut, nested, huge, not text) is refused in one line."""
    from evspark_cli.errors import ModelError
    from evspark_cli.model.config import ModelConfig

    good = json.dumps(tiny_config().to_dict())
    texts = [good[:n] for n in range(0, len(good), 37)] + [
        "[" * 50_000 + "]" * 50_000, '{"num_layers": ' + "9" * 5000 + "}", "\xff\xfe{}", "null",
        '{"num_layers": 4, "eps": NaN}', " " * (70 << 20)]
    for text in texts:
        p = tmp_path / "config.json"
        p.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
        try:
            ModelConfig.load(p)
        except ModelError as e:
            one_line(e)


def test_oversized_or_unreadable_configs_are_refused_before_being_read_whole(tmp_path: Path):
    """Model and drafter configs are read through one bounded reader: past its limit, or not a
    readable file, a config is refused in one line naming it, without reading it all."""
    from evspark_cli.decode.drafters.dspark import MAX_CONFIG_BYTES as DRAFTER_MAX
    from evspark_cli.decode.drafters.dspark import _read_config
    from evspark_cli.errors import ModelError
    from evspark_cli.model.config import MAX_CONFIG_BYTES, ModelConfig

    big = tmp_path / "config.json"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)
    with pytest.raises(ModelError, match=r"^config .*config\.json is larger than 64 MiB: not a "
                                         r"model config$"):
        ModelConfig.load(big)
    drafter = tmp_path / "drafter.json"
    drafter.write_text(" " * (DRAFTER_MAX + 1))
    with pytest.raises(ModelError, match=r"drafter\.json is larger than 1 MiB: not a drafter "
                                         r"config$"):
        _read_config(drafter)
    with pytest.raises(ModelError, match=r"^cannot read config .*: Is a directory$"):
        ModelConfig.load(tmp_path)
    drafter.write_text(" " * DRAFTER_MAX)  # exactly at the limit: read whole, then parsed
    with pytest.raises(ModelError, match="not valid JSON"):
        _read_config(drafter)


# ---------------------------------------------- the fuzz target: the seeded mutator, for real

CHILD = r"""
import json, os, random, resource, shutil, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from evspark_cli.decode.drafters.dspark import load_drafter
from evspark_cli.errors import InputError, ModelError
from evspark_cli.model.checkpoint import load_model

model_dir, drafter_dir, work, seed, count = Path(sys.argv[1]), Path(sys.argv[2]), \
    Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
values = json.loads(sys.argv[6])
rng = random.Random(seed)

def peak():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

def mutate(cfg):
    cfg = dict(cfg)
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(sorted(cfg))
        if key == "kind":
            continue
        if rng.random() < 0.15:
            del cfg[key]
        elif key.endswith("_idxs") and rng.random() < 0.3:  # a consistent big layer count
            n = rng.choice([10 ** 5, 10 ** 6])
            for i, k in enumerate(("hcs", "hcm", "hcl", "attn")):
                cfg[k + "_layer_idxs"] = list(range(i, n, 4))
            cfg["num_layers"], cfg["hidden_layers"] = n, None
        else:
            cfg[key] = rng.choice(values)
    return cfg

target = load_model(model_dir)
clean = peak()
m_cfg = json.loads((model_dir / "config.json").read_text())
d_cfg = json.loads((drafter_dir / "config.json").read_text())
m_copy, d_copy = work / "m", work / "d"
shutil.copytree(model_dir, m_copy)
shutil.copytree(drafter_dir, d_copy)
results = []
for i in range(count):
    which = "model" if i % 2 == 0 else "drafter"
    folder = m_copy if which == "model" else d_copy
    text = json.dumps(mutate(m_cfg if which == "model" else d_cfg))
    if rng.random() < 0.05:
        text = text[: rng.randrange(len(text))]
    (folder / "config.json").write_text(text)
    try:
        if which == "model":
            load_model(folder)
        else:
            load_drafter(folder, target)
        results.append([which, "ok", ""])
    except (ModelError, InputError) as e:
        results.append([which, "refused", str(e)])
    except BaseException as e:
        why = type(e).__name__ + ": " + str(e)[:200]
        results.append([which, "other", why + " | " + text[:300]])
print(json.dumps({"clean": clean, "peak": peak(), "results": results}))
"""


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    import torch

    from evspark_cli.decode.drafters.dspark import DSparkConfig, DSparkNet, save_drafter
    from evspark_cli.model.checkpoint import weights_hash

    model = shared_trained_tiny(tmp_path_factory)
    torch.manual_seed(0)
    cfg = DSparkConfig(target_hidden=32, target_layers=2, width=32, layers=1, heads=2,
                       prefix_len=8, target_hash=weights_hash(model))
    return model, save_drafter(DSparkNet(cfg), tmp_path_factory.mktemp("fuzzd") / "d")


@pytest.mark.slow
def test_fuzz_mutated_folders_load_or_refuse_in_bounded_memory(folders, tmp_path: Path):
    model, drafter = folders
    values = NUMBERS + ODD  # JSON carries NaN and Infinity too

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (6 * GIB, 6 * GIB))

    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-c", CHILD, str(model), str(drafter), str(tmp_path),
                        "23", "240", json.dumps(values)],
                       capture_output=True, text=True, env=env, timeout=600, preexec_fn=limit)
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout.strip().splitlines()[-1])
    others = [r for r in report["results"] if r[1] == "other"]
    assert not others, others[:3]
    for _which, outcome, msg in report["results"]:
        if outcome == "refused":
            assert msg and "\n" not in msg and len(msg) < 400, msg
    kinds = {(w, o) for w, o, _m in report["results"]}
    assert {("model", "refused"), ("drafter", "refused")} <= kinds  # the mutations bite
    assert report["peak"] < report["clean"] + GIB, report["peak"] / GIB
