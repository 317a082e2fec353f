"""Embeddings (eval/embed.py, io/embeddings.py, `evspark embed`, `evs.embed`): a layer's
activations are what a forward hook on the model's module sees, from a pass whose logits are
the model's own; windows, pooling, names, outputs, resume and refusals."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors import safe_open
from tiny import PHIX, one_line_error, phix_genome, run_cli, tiny_config

from evspark_cli.errors import SettingError
from evspark_cli.eval.embed import embed_record, embed_windows, layer_names, resolve_layer
from evspark_cli.io.embeddings import EmbeddingOutput

FAST = ["--threads", "1", "-q"]
REGIONS = ["NC_001422.1:101-400", "NC_001422.1:1001-1040", "NC_001422.1:2001-2600"]


@pytest.fixture(scope="module")
def model(make_model):
    return make_model(tiny_config(), seed=3)


def _hooked(model, names, ids):
    """What forward hooks on the named modules see while `activations` runs (blocks.N, which
    the pass reads rather than calls as a module, is left out)."""
    seen, handles = {}, []
    for name in names:
        mod = model.get_submodule(name)
        handles.append(mod.register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, o.detach().clone())))
    try:
        model.activations(ids, names)
    finally:
        for h in handles:
            h.remove()
    return seen


@pytest.mark.parametrize("length", [1, 9, 300])
def test_activations_are_the_hooked_modules_outputs_of_the_models_own_pass(model, length):
    ids = torch.randint(0, 256, (2, length))
    hookable = ["embedding_layer", "blocks.1.pre_norm", "blocks.2.post_norm", "blocks.3.mlp.l3",
                "norm"]
    logits, acts = model.activations(ids, [*hookable, "blocks.2"])
    with torch.inference_mode():
        assert torch.equal(logits, model(ids))  # the recording pass is the model's pass
        x = model.embedding_layer(ids)
        for blk in model.blocks[:3]:
            x, _ = blk.forward(x, None, (0,) * 2)
    assert torch.equal(acts["blocks.2"], x)  # the fast path's block output
    seen = _hooked(model, hookable, ids)
    assert set(seen) == set(hookable)
    for name in hookable:
        assert torch.equal(seen[name], acts[name]), name


def test_mlp_output_is_the_block_output_less_its_residual(model):
    ids = torch.randint(0, 256, (1, 50))
    _, acts = model.activations(ids, ["blocks.1", "blocks.1.post_norm", "blocks.1.mlp.l3"])
    with torch.inference_mode():
        mlp = model.blocks[1].mlp
        want = mlp.forward(acts["blocks.1.post_norm"])  # the MLP as the fast path runs it
    assert torch.equal(acts["blocks.1.mlp.l3"], want)
    assert float((acts["blocks.1"] - acts["blocks.1.mlp.l3"]).abs().max()) > 0


def test_layer_names_map_both_namings(model, make_model):
    assert resolve_layer(model, "blocks.3.mlp.l3") == "blocks.3.mlp.l3"
    assert resolve_layer(model, "block.3.mlp") == "blocks.3.mlp.l3"
    assert resolve_layer(model, "blocks.3.mlp") == "blocks.3.mlp.l3"
    assert resolve_layer(model, "block.-1") == "blocks.3"
    assert resolve_layer(model, "final") == "norm" and resolve_layer(model, "embedding") == \
        "embedding_layer"
    listed = dict(layer_names(model))
    assert listed["blocks.0.pre_norm"] == "block.0.pre_norm" and listed["norm"] == "final"
    assert all(resolve_layer(model, short) == name for name, short in layer_names(model))
    for bad in ("blocks.4", "block.-5", "blocks.1.mixer", "attention", ""):
        with pytest.raises(SettingError, match="not a layer"):
            resolve_layer(model, bad)
    bare = make_model(tiny_config(final_norm=False))
    assert resolve_layer(bare, "final") == "blocks.3"
    with pytest.raises(SettingError):
        resolve_layer(bare, "norm")


def test_windows_keep_every_position_once_and_match_one_pass(model):
    for n, w, c in [(10, 3, 0), (10, 3, 5), (7, 7, 2), (1, 4, 4)]:
        kept = [p for _, first, stop in embed_windows(n, w, c) for p in range(first, stop)]
        assert kept == list(range(n))
        assert all(b == max(0, f - c) for b, f, _ in embed_windows(n, w, c))
    ids = torch.randint(0, 256, (700,))
    whole = embed_record(model, ids, ["blocks.3"], "none", window=700, context=0)["blocks.3"]
    _, acts = model.activations(ids[None], ["blocks.3"])
    assert torch.equal(whole, acts["blocks.3"][0])
    # windows whose context reaches the record's start see what one pass sees
    tiled = embed_record(model, ids, ["blocks.3"], "none", window=128, context=700)["blocks.3"]
    torch.testing.assert_close(tiled, whole, rtol=1e-4, atol=1e-4)
    mean = embed_record(model, ids, ["blocks.3"], "mean", window=128, context=700)["blocks.3"]
    last = embed_record(model, ids, ["blocks.3"], "last", window=128, context=700)["blocks.3"]
    torch.testing.assert_close(mean, whole.mean(0), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(last, whole[-1], rtol=1e-4, atol=1e-5)
    short = embed_record(model, ids, ["blocks.3"], "none", window=128, context=16)["blocks.3"]
    assert not torch.allclose(short[300:], whole[300:], atol=1e-3)  # less context, other numbers


def test_a_float16_overflow_is_an_error_not_inf(model):
    ids = torch.randint(0, 256, (20,))
    with torch.no_grad():
        model.blocks[0].mlp.l3.weight.mul_(1e6)
    try:
        with pytest.raises(Exception, match="overflow float16"):
            embed_record(model, ids, ["blocks.0.mlp.l3"], "mean", dtype="float16")
    finally:
        with torch.no_grad():
            model.blocks[0].mlp.l3.weight.div_(1e6)


def _regions():
    return [a for r in REGIONS for a in ("--region", r)]


def test_embed_command_writes_safetensors_npy_and_index(tmp_path, phix_model):
    import evspark_cli as evs

    st, npy = tmp_path / "e.safetensors", tmp_path / "e.npy"
    r = run_cli(["embed", PHIX, "--model", phix_model, *FAST, *_regions(), "--layer", "block.1",
                 "--layer", "blocks.1.mlp.l3", "--pool", "last", "--window", 128,
                 "--context", 64, "-o", st])
    assert r.code == 0, r.err
    index = (tmp_path / "e.index.tsv").read_text().splitlines()
    assert index[0].split("\t") == ["record_id", "length", "layer", "tensor", "first_row",
                                    "rows"]
    assert [ln.split("\t")[3] for ln in index[1:3]] == [f"{REGIONS[0]}/blocks.1",
                                                       f"{REGIONS[0]}/blocks.1.mlp.l3"]
    genome = phix_genome()
    m = evs.load_model(phix_model)
    with safe_open(str(st), "pt") as f:
        assert set(f.keys()) == {f"{r}/{layer}" for r in REGIONS
                                 for layer in ("blocks.1", "blocks.1.mlp.l3")}
        for reg in REGIONS:
            a, b = (int(x) for x in reg.split(":")[1].split("-"))
            want = evs.embed(m, genome[a - 1:b], ["block.1", "block.1.mlp"], pool="last",
                             window=128, context=64)
            assert torch.equal(f.get_tensor(f"{reg}/blocks.1"), want["blocks.1"])
            assert torch.equal(f.get_tensor(f"{reg}/blocks.1.mlp.l3"), want["blocks.1.mlp.l3"])
    r = run_cli(["embed", PHIX, "--model", phix_model, *FAST, *_regions(), "--layer", "final",
                 "--pool", "none", "--embed-dtype", "float16", "-o", npy,
                 "--index", tmp_path / "n.tsv"])
    assert r.code == 0, r.err
    array = np.load(npy)
    rows = [ln.split("\t") for ln in (tmp_path / "n.tsv").read_text().splitlines()[1:]]
    lengths = [300, 40, 600]
    assert array.shape == (sum(lengths), 1, m.config.hidden_size) and array.dtype == np.float16
    assert [(int(x[4]), int(x[5])) for x in rows] == [(0, 300), (300, 40), (340, 600)]
    a, b = 1001, 1040
    want = evs.embed(m, genome[a - 1:b], "final", pool="none", dtype="float16")["norm"]
    assert np.array_equal(array[300:340, 0], want.numpy())


def test_resume_keeps_finished_records_and_refuses_other_settings(tmp_path, phix_model):
    out = tmp_path / "e.safetensors"
    args = ["embed", PHIX, "--model", phix_model, *FAST, *_regions(), "--layer", "block.2",
            "-o", out]
    assert run_cli(args).code == 0
    whole = out.read_bytes()
    out.unlink()
    # an interrupted run: its first record in the partial, then half of the next one's frame
    import evspark_cli as evs
    from evspark_cli.eval.embed import embed_settings, embed_spans, resolve_layers

    m = evs.load_model(phix_model)
    window, context = embed_spans(m.config, None, None)  # the command's defaults
    assert (window, context) == (2048, 2048)  # half each of the model's 4,096
    settings = embed_settings(m, resolve_layers(m, ["block.2"]), "mean", "float32", window,
                              context)
    genome = phix_genome()
    w = EmbeddingOutput(str(out), str(tmp_path / "e.index.tsv"), settings)
    w.write(REGIONS[0], 300, evs.embed(m, genome[100:400], "block.2"))
    w.close()
    partial = tmp_path / "e.safetensors.partial"
    partial.write_bytes(partial.read_bytes() + b'{"id": "NC_001422.1:1001-1040", "len')
    r = run_cli(args)
    assert "--resume" in one_line_error(r, 2)
    r = run_cli([*args[:-2], "--pool", "last", "-o", out, "--resume"])
    assert "other settings" in one_line_error(r, 2)
    r = run_cli([*args, "--resume"])
    assert r.code == 0, r.err
    assert out.read_bytes() == whole and not partial.exists()


@pytest.mark.parametrize("extra, needle", [
    (["--layer", "blocks.99"], "not a layer"),
    (["--layer", "final", "--pool", "max"], "--pool"),
    (["--layer", "final", "--embed-dtype", "int8"], "--embed-dtype"),
    (["--layer", "final", "--window", "0"], "--window"),
])
def test_bad_settings_are_one_line_errors(tmp_path, phix_model, extra, needle):
    r = run_cli(["embed", PHIX, "--model", phix_model, *FAST, "-o", tmp_path / "e.safetensors",
                 *extra])
    assert needle in one_line_error(r, 2)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name, needle", [("e.txt", ".safetensors or .npy"),
                                          ("e.npy", "bfloat16")])
def test_bad_outputs_are_refused_before_work(tmp_path, phix_model, name, needle):
    r = run_cli(["embed", PHIX, "--model", phix_model, *FAST, "--layer", "final",
                 "--embed-dtype", "bfloat16", "-o", tmp_path / name])
    assert needle in one_line_error(r, 2)
    assert not list(tmp_path.iterdir())
