"""Inputs the project was not developed against, as an outside reviewer tries them.

Checkpoints with other vocabularies or broken config values, options out of range, outputs that
would clobber inputs, a 1-base record to score, a closed stdout pipe: each is one
`evspark: error:` line and the documented exit code, never a traceback or an internal error.
"""
from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny import SHARED, one_line_error, random_tiny_dir, run_cli  # noqa: E402

from evspark_cli.errors import InputError, ModelError  # noqa: E402
from evspark_cli.model.checkpoint import load_model  # noqa: E402

FAST = ["--threads", "1", "-q"]
ORACLE = SHARED / "oracle"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return random_tiny_dir(tmp_path_factory.mktemp("unseen") / "model")


@pytest.fixture()
def fasta(tmp_path) -> Path:
    p = tmp_path / "in.fa"
    p.write_text(">r1\nACGTACGTAAGG\n>r2\nttgacaGGCA\n")
    return p


# ------------------------------------------------------------------------- checkpoints


@pytest.mark.parametrize("field,value", [
    ("attn_layer_idxs", None), ("num_attention_heads", 0), ("hidden_layers", []),
    ("prefill_chunk", 0), ("vocab_size", 16), ("max_seqlen", 0),
])
def test_config_values_that_cannot_work_are_model_errors(tmp_path, model_dir, fasta, field, value):
    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    cfg = json.loads((bad / "config.json").read_text())
    cfg[field] = value
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError):
        load_model(bad)
    r = run_cli(["generate", fasta, "--model", bad, "--drafter", "kmer", "-n", 4, *FAST])
    assert field in one_line_error(r, 3)


def test_integer_weights_in_a_float_slot_are_refused(tmp_path, model_dir):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(model_dir, bad)
    sd = load_file(bad / "model.safetensors")
    name = next(k for k in sd if k.endswith("mlp.l1.weight"))
    sd[name] = sd[name].to(torch.int32)
    save_file(sd, bad / "model.safetensors")
    with pytest.raises(ModelError, match="int32"):
        load_model(bad)


def test_kmer_drafter_follows_the_model_vocabulary(tmp_path, fasta):
    m = random_tiny_dir(tmp_path / "v256", vocab_size=256)
    for drafter in ("kmer", "auto"):
        r = run_cli(["verify", fasta, "--model", m, "--drafter", drafter, "-n", 12, "-g", 4, *FAST])
        assert r.code == 0, r.err
        assert "non_tie_divergences=0" in r.out


def test_convert_onto_an_existing_file_is_a_usage_error(tmp_path):
    target = tmp_path / "taken"
    target.write_text("keep me")
    r = run_cli(["convert", ORACLE / "tiny_vtx.safetensors", "--config",
                 ORACLE / "tiny_vtx_config.json", "-o", target])
    assert "not a folder" in one_line_error(r, 2)
    assert target.read_text() == "keep me"


# ------------------------------------------------------------------------- options / outputs


@pytest.mark.parametrize("opt", [["--device", "tpu"], ["--dtype", "float16"], ["--seed", "-5"]])
def test_bad_option_values_are_usage_errors(model_dir, fasta, opt):
    r = run_cli(["generate", fasta, "--model", model_dir, "-n", 4, *opt, *FAST])
    one_line_error(r, 2)


def test_outputs_never_overwrite_an_input_or_each_other(tmp_path, model_dir, fasta):
    before = fasta.read_text()
    r = run_cli(["generate", fasta, "--model", model_dir, "-n", 4, "-o", fasta, *FAST])
    assert "also an input" in one_line_error(r, 2)
    assert fasta.read_text() == before
    same = tmp_path / "o.tsv"
    r = run_cli(["generate", fasta, "--model", model_dir, "-n", 4, "-o", same, "--stats", same,
                 *FAST])
    assert "same file" in one_line_error(r, 2)
    r = run_cli(["score", fasta, "--model", model_dir, "-o", same, "--logits", same, *FAST])
    assert "same file" in one_line_error(r, 2)
    r = run_cli(["verify", fasta, "--model", model_dir, "-n", 4, "--report", fasta, *FAST])
    assert "also an input" in one_line_error(r, 2)
    assert fasta.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fa"]


def test_score_of_a_one_base_record_is_nan_not_perfect(tmp_path, model_dir):
    fa = tmp_path / "one.fa"
    fa.write_text(">one\nA\n>two\nACGTAC\n")
    lg = tmp_path / "lg.safetensors"
    r = run_cli(["score", fa, "--model", model_dir, "--logits", lg, *FAST])
    assert r.code == 0, r.err
    rows = dict(line.split("\t")[0::2] for line in r.out.splitlines()[1:])
    assert math.isnan(float(rows["one"])) and math.isfinite(float(rows["two"]))
    from safetensors.torch import load_file

    saved = load_file(lg)
    assert tuple(saved["one"].shape) == (0, 512) and saved["two"].shape[0] == 5


def test_closed_stdout_pipe_stops_quietly(model_dir, fasta):
    """`evspark generate in.fa | head -1`: no 'internal error: BrokenPipeError' line."""
    from evspark_cli import cli

    class ClosedPipe(io.StringIO):
        def write(self, s):
            raise BrokenPipeError(32, "Broken pipe")

    err = io.StringIO()
    saved = sys.argv, sys.stdout
    sys.argv = ["evspark", "generate", str(fasta), "--model", str(model_dir), "-n", "4", *FAST]
    sys.stdout = ClosedPipe()
    try:
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ei:
            cli.main()
    finally:
        sys.argv, sys.stdout = saved
    assert ei.value.code == 141
    # nothing but the warning about the input's lower-case bases: no error, no summary
    assert [ln.split(":")[1] for ln in err.getvalue().splitlines()] == [" warning"]


# ------------------------------------------------------------------------- Python API


def test_api_generate_rejects_bad_token_ids_and_seeds(model_dir):
    import evspark_cli as evs

    m = load_model(model_dir)
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


def test_verify_table_shows_whole_record_ids(tmp_path, model_dir):
    rid = "NZ_CP012345.1_region_1000000-1000200_sample"
    fa = tmp_path / "long.fa"
    fa.write_text(f">{rid}\nACGTACGTAAGGCCTA\n")
    r = run_cli(["verify", fa, "--model", model_dir, "-n", 4, "--drafter", "kmer", *FAST])
    assert r.code == 0, r.err
    assert any(line.split()[0] == rid for line in r.out.splitlines()), r.out


def test_gamma_beyond_the_drafters_slots_is_refused_up_front(tmp_path):
    """The bundled dspark drafter has 16 slots: gamma 17 is a usage error before any record
    (it used to fail every record and leave a .partial that --resume could not finish)."""
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "o.fa"
    for cmd in (["generate", "-o", out], ["verify"]):
        r = run_cli([cmd[0], root / "examples" / "prompts.fa", "-n", 32, "--gamma", 17,
                     "--drafter", "dspark", *cmd[1:], *FAST])
        assert "at most 16" in one_line_error(r, 2)
    assert list(tmp_path.iterdir()) == []
    ok = run_cli(["generate", root / "examples" / "prompts.fa", "-n", 8, "--gamma", 17,
                  "--drafter", "dspark", *FAST])  # a round of 8 new tokens drafts at most 7
    assert ok.code == 0, ok.err
    r = run_cli(["bench", "-n", 32, "--n-prompts", 1, "-g", 17, "-o", tmp_path / "b", *FAST])
    assert "at most 16" in one_line_error(r, 2)
    assert list(tmp_path.iterdir()) == []
