"""Model folders and Evo 2 checkpoint conversion: round trips, formats, and refusals.

Every refusal must be a ModelError (exit code 3) with a one-line message naming the tensor or
the problem; nothing in a checkpoint may execute code. The broken and hostile models of
tests/RELIABILITY.md run here too, through `evspark generate` and `evspark convert`.
"""
from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import struct
import sys
from pathlib import Path

import pytest
import torch
from battery import (
    FAST,
    Case,
    Models,
    case_ids,
    check_bad_input,
    fasta_file,
    gen_model,
    ok_fa,
)
from battery import refused as cli_refused
from safetensors.torch import load_file, save_file
from tiny import ORACLE, one_line_error, run_cli

from evspark_cli.errors import ModelError
from evspark_cli.model.checkpoint import (
    CONFIG,
    FP32_KEEP,
    WEIGHTS,
    convert_checkpoint,
    load_model,
    save_model,
)
from evspark_cli.model.config import ModelConfig

torch.set_num_threads(1)


def tiny_cfg(**kw) -> ModelConfig:
    base = dict(hidden_size=32, num_layers=4, num_attention_heads=2, hcs_layer_idxs=[0],
                hcm_layer_idxs=[1], hcl_layer_idxs=[2], attn_layer_idxs=[3], hcs_filter_groups=4,
                hcm_filter_groups=4, state_size=8, inner_mlp_size=48,
                use_interpolated_rotary_pos_emb=True, rotary_emb_scaling_factor=4.0)
    base.update(kw)
    return ModelConfig(**base)


IDS = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def logits_of(model) -> torch.Tensor:
    return model(IDS).float()


def refused(fn, *needles: str) -> str:
    """fn() raises ModelError whose single-line message contains every needle."""
    with pytest.raises(ModelError) as ei:
        fn()
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert ei.value.exit_code == 3
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"
    return msg


# ------------------------------------------------------------------------------ model folders


def test_save_load_round_trip(tmp_path, make_model):
    model = make_model(tiny_cfg(hidden_layers=[1, 3]), seed=1)
    out = save_model(model, tmp_path / "m")
    assert (out / WEIGHTS).is_file() and (out / CONFIG).is_file()
    assert not list(out.glob("*.tmp"))
    loaded = load_model(out, "cpu", torch.float32)
    assert loaded.config == model.config
    assert torch.equal(logits_of(loaded), logits_of(model))
    for (n1, t1), (n2, t2) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(t1, t2), n1
    # saving again over the same folder is fine (atomic replace)
    save_model(loaded, out)
    assert torch.equal(logits_of(load_model(out, "cpu", "float32")), logits_of(model))


def test_bf16_storage_loads_into_fp32(tmp_path, make_model):
    model = make_model(tiny_cfg(), seed=2)
    out = save_model(model, tmp_path / "bf16", dtype=torch.bfloat16)
    stored = load_file(str(out / WEIGHTS))
    for name, t in stored.items():
        want = torch.float32 if name.endswith(FP32_KEEP) else torch.bfloat16
        assert t.dtype == want, name
    loaded = load_model(out, "cpu", torch.float32)
    assert loaded.dtype == torch.float32
    # the same model with its weights rounded to bf16 (poles, residues, inv_freq kept in fp32)
    rounded = make_model(tiny_cfg(), seed=2)
    with torch.no_grad():
        for name, p in list(rounded.named_parameters()) + list(rounded.named_buffers()):
            if not name.endswith(FP32_KEEP):
                p.copy_(p.to(torch.bfloat16).float())
    got, want, orig = logits_of(loaded), logits_of(rounded), logits_of(model)
    assert (got - want).abs().max() <= 1e-5
    assert (got - orig).abs().max() > 1e-4  # the rounding really happened
    # and the bf16 model itself runs (bf16 activations, fp32 filters and states)
    lowp = load_model(out, "cpu", "bf16")
    assert lowp.dtype == torch.bfloat16
    for name, p in lowp.named_parameters():
        assert p.dtype == (torch.float32 if name.endswith(FP32_KEEP) else torch.bfloat16), name
    with torch.no_grad():
        lg = lowp(IDS[:1]).float()
        pl, _, st = lowp.prefill(IDS[:1, :30])
        nxt, _, blk = lowp.extend(st, IDS[:1, 30:34])
        blk.commit(2)
        steps, s = [], st
        for j in range(30, 34):
            lj, _, bj = lowp.extend(s, IDS[:1, j: j + 1])
            steps.append(lj.float())
            s = bj.commit(1)
    assert torch.isfinite(lg).all() and torch.isfinite(nxt).all()
    # bf16 rounds differently along different paths; each stays within a few % of the others
    scale = float(lg.abs().max())
    assert (pl.float() - lg[:, :30]).abs().max() < 0.05 * scale
    assert (nxt.float() - torch.cat(steps, dim=1)).abs().max() < 0.05 * scale
    assert (lg - orig[:1]).abs().max() < 0.1 * orig.abs().max()


def test_bf16_load_keeps_fp32_filters_exact(tmp_path, make_model):
    """Evo 2's precision policy: poles, residues and inv_freq stay fp32 *values*, not bf16 values
    widened back to fp32.

    Checks that cast_model (evspark_cli/model/checkpoint.py) keeps the FP32_KEEP tensors'
    exact fp32 values through a bf16 load: casting the whole model to bf16 and widening those
    tensors back afterwards would round them (on the oracle, log_poles off by up to 1e-3: a pole
    at -1e-3 could move by 100%).
    """
    model = make_model(tiny_cfg(), seed=4)
    out = save_model(model, tmp_path / "m")
    lowp = load_model(out, "cpu", torch.bfloat16)
    want = dict(list(model.named_parameters()) + list(model.named_buffers()))
    got = dict(list(lowp.named_parameters()) + list(lowp.named_buffers()))
    for name in want:
        if name.endswith(FP32_KEEP):
            assert got[name].dtype == torch.float32, name
            assert torch.equal(got[name], want[name].detach()), f"{name} was rounded to bf16"


def test_load_model_refusals(tmp_path, make_model):
    model = make_model(tiny_cfg(), seed=3)
    good = save_model(model, tmp_path / "good")
    tensors = load_file(str(good / WEIGHTS))
    cfg_text = (good / CONFIG).read_text()

    def folder(name: str, weights: dict | bytes | None, config: str | None = cfg_text) -> Path:
        d = tmp_path / name
        d.mkdir()
        if config is not None:
            (d / CONFIG).write_text(config)
        if isinstance(weights, dict):
            save_file(weights, str(d / WEIGHTS))
        elif isinstance(weights, bytes):
            (d / WEIGHTS).write_bytes(weights)
        return d

    refused(lambda: load_model(tmp_path / "nowhere"), "does not exist")
    refused(lambda: load_model(folder("noweights", None)), WEIGHTS)
    refused(lambda: load_model(folder("noconfig", tensors, None)), CONFIG)
    refused(lambda: load_model(folder("badjson", tensors, "{not json")), "config")
    missing = {k: v for k, v in tensors.items() if k != "blocks.2.filter.residues"}
    refused(lambda: load_model(folder("missing", missing)), "missing", "blocks.2.filter.residues")
    bad = dict(tensors, **{"blocks.1.filter.h": torch.zeros(4, 1, 64)})
    refused(lambda: load_model(folder("shape", bad)), "blocks.1.filter.h", "shape")
    nan = dict(tensors)
    nan["blocks.3.mlp.l2.weight"] = nan["blocks.3.mlp.l2.weight"].clone()
    nan["blocks.3.mlp.l2.weight"][3, 5] = float("nan")
    refused(lambda: load_model(folder("nan", nan)), "blocks.3.mlp.l2.weight", "NaN")
    inf = dict(tensors, **{"norm.scale": torch.full((32,), float("inf"))})
    refused(lambda: load_model(folder("inf", inf)), "norm.scale")
    extra = dict(tensors, **{"blocks.9.mlp.l1.weight": torch.zeros(2, 2)})
    refused(lambda: load_model(folder("extra", extra)), "blocks.9.mlp.l1.weight")
    raw = (good / WEIGHTS).read_bytes()
    refused(lambda: load_model(folder("random", os.urandom(4096))), "corrupt")
    refused(lambda: load_model(folder("trunc", raw[: len(raw) // 2])), "corrupt")
    refused(lambda: load_model(folder("empty", b"")), "corrupt")
    # a config that disagrees with the weights
    wrong = json.loads(cfg_text)
    wrong["state_size"] = 4
    refused(lambda: load_model(folder("cfg", tensors, json.dumps(wrong))),
            "blocks.2.filter.log_poles", "shape")
    assert torch.equal(logits_of(load_model(good)), logits_of(model))


# ------------------------------------------------------------------------------ conversion


@pytest.fixture(scope="module")
def oracle_raw(oracle_dir):
    return load_file(str(oracle_dir / "tiny_vtx.safetensors"))


@pytest.fixture(scope="module")
def oracle_ref(oracle_dir):
    return load_file(str(oracle_dir / "tiny_vtx_reference_tensors.safetensors"))


def oracle_logits(folder: Path, ref) -> torch.Tensor:
    model = load_model(folder, "cpu", torch.float32)
    with torch.no_grad():
        return model(ref["prompt_ids"][None])[0]


def write_flat_yaml(config: dict, path: Path) -> Path:
    """An Evo 2 style YAML (as evo2/configs/evo2-7b-1m.yml: flat key: value, inline lists with
    and without spaces, block lists, comments, Python booleans, `eps: 0.000001`)."""
    lines = ["# Evo 2 style config written by the test", ""]
    for i, (k, v) in enumerate(config.items()):
        if isinstance(v, bool):
            lines.append(f"{k}: {'True' if v else 'False'}")
        elif isinstance(v, list) and i % 3 == 0:
            lines.append(f"{k}:")
            lines.extend(f"  - {x}" for x in v)
        elif isinstance(v, list):
            sep = "," if i % 3 == 1 else ", "
            lines.append(f"{k}: [{sep.join(str(x) for x in v)}]")
        elif isinstance(v, str):
            lines.append(f"{k}: {v}  # a comment")
        elif isinstance(v, float):
            lines.append(f"{k}: {f'{v:.12f}'.rstrip('0')}")
        else:
            lines.append(f"{k}: {v}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("parser", ["pyyaml", "fallback"])
def test_evo2_yaml_config(tmp_path, oracle_dir, monkeypatch, parser):
    if parser == "pyyaml":
        pytest.importorskip("yaml")
    else:
        monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    cfg_json = oracle_dir / "tiny_vtx_config.json"
    yml = write_flat_yaml(json.loads(cfg_json.read_text()), tmp_path / "evo2-tiny.yml")
    assert ModelConfig.load(yml) == ModelConfig.load(cfg_json)


@pytest.mark.parametrize("parser", ["pyyaml", "fallback"])
def test_malformed_yaml_is_refused(tmp_path, monkeypatch, parser):
    """A malformed YAML config, or one that is not a mapping, is refused by ModelConfig.load as
    a ModelError (exit code 3) naming the file, with PyYAML's parser as with the fallback one
    (PyYAML raises yaml.YAMLError, not a ValueError: it must not escape as a traceback)."""
    if parser == "pyyaml":
        pytest.importorskip("yaml")
    else:
        monkeypatch.setitem(sys.modules, "yaml", None)
    bad = tmp_path / "bad.yml"
    bad.write_text("hidden_size: [1, 2\n  - : :\n\tx")
    refused(lambda: ModelConfig.load(bad), "bad.yml")
    listy = tmp_path / "list.yml"
    listy.write_text("- 1\n- 2\n")
    refused(lambda: ModelConfig.load(listy), "list.yml")


@pytest.mark.parametrize("parser", ["pyyaml", "fallback"])
def test_yaml_config_types(tmp_path, oracle_dir, monkeypatch, parser):
    """`eps: 1e-6` is a float whichever YAML reader is used (or the config is refused).

    PyYAML reads `1e-6` (YAML 1.1: no dot) as the *string* '1e-6'; the test checks that the
    config still loads with eps the float 1e-6 (or is refused as a ModelError), and never builds
    a model with eps='1e-6' that fails in RMSNorm with a TypeError. The fallback parser reads a
    float.
    """
    if parser == "pyyaml":
        pytest.importorskip("yaml")
    else:
        monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml -> ImportError
    base = json.loads((oracle_dir / "tiny_vtx_config.json").read_text())
    yml = tmp_path / "c.yml"
    yml.write_text("\n".join(f"{k}: {v}" for k, v in dict(base, eps=1e-6).items()) + "\n")
    try:
        cfg = ModelConfig.load(yml)
    except ModelError:
        return  # refusing is acceptable
    assert isinstance(cfg.eps, float) and cfg.eps == 1e-6
    assert cfg == ModelConfig.load(oracle_dir / "tiny_vtx_config.json")


def test_convert_pt_and_safetensors_agree(tmp_path, oracle_dir, oracle_raw, oracle_ref):
    cfg_json = oracle_dir / "tiny_vtx_config.json"
    a = convert_checkpoint(oracle_dir / "tiny_vtx.safetensors", cfg_json, tmp_path / "from_st")
    # the distributed Evo 2 form: a torch.save'd dict with TE _extra_state (BytesIO) entries and
    # the savanna converter's redundant unembed.weight
    d: dict = dict(oracle_raw)
    d["blocks.0.projections._extra_state"] = io.BytesIO(b"fp8 recipe metadata")
    extra = io.BytesIO()
    torch.save(None, extra)  # what Transformer Engine stores when FP8 is off
    d["blocks.4.projections._extra_state"] = extra
    d["unembed.weight"] = oracle_raw["embedding_layer.weight"] + 1.0  # must be ignored (tied)
    torch.save(d, tmp_path / "evo2.pt")
    yml = write_flat_yaml(json.loads(cfg_json.read_text()), tmp_path / "evo2-tiny.yml")
    b = convert_checkpoint(tmp_path / "evo2.pt", yml, tmp_path / "from_pt")
    ta, tb = load_file(str(a / WEIGHTS)), load_file(str(b / WEIGHTS))
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k
    assert not any("_extra_state" in k or k == "unembed.weight" for k in tb)
    assert ModelConfig.load(a / CONFIG) == ModelConfig.load(b / CONFIG)
    assert ModelConfig.load(yml) == ModelConfig.load(cfg_json)
    la = oracle_logits(a, oracle_ref)
    assert (la - oracle_ref["prompt_logits"]).abs().max() <= 1e-4
    assert torch.equal(la, oracle_logits(b, oracle_ref))
    # Wqkv is permuted from the head-interleaved file layout to [q; k; v]
    dh, D = 32, 128  # head size, width (4 heads)
    w_file = oracle_raw["blocks.3.inner_mha_cls.Wqkv.weight"]
    w_ours = ta["blocks.3.inner_mha_cls.Wqkv.weight"]
    assert torch.equal(w_ours[D + 2 * dh: D + 3 * dh], w_file[2 * 3 * dh + dh: 2 * 3 * dh + 2 * dh])
    # a checkpoint nested under "model" (some trainers) converts the same
    torch.save({"model": dict(oracle_raw), "step": 5}, tmp_path / "nested.pt")
    c = convert_checkpoint(tmp_path / "nested.pt", cfg_json, tmp_path / "from_nested")
    assert torch.equal(oracle_logits(c, oracle_ref), la)


def test_convert_without_inv_freq_uses_config_base(tmp_path, oracle_dir, oracle_raw, oracle_ref):
    raw = {k: v for k, v in oracle_raw.items() if not k.endswith("rotary_emb.inv_freq")}
    save_file(raw, str(tmp_path / "noinv.safetensors"))
    out = convert_checkpoint(tmp_path / "noinv.safetensors", oracle_dir / "tiny_vtx_config.json",
                             tmp_path / "out")
    got = oracle_logits(out, oracle_ref)
    assert (got - oracle_ref["prompt_logits"]).abs().max() <= 1e-4


def test_conversion_refusals(tmp_path, oracle_dir, oracle_raw):
    cfg = oracle_dir / "tiny_vtx_config.json"
    n = [0]

    def convert(weights: dict | bytes, suffix: str = ".safetensors", config: Path = cfg):
        n[0] += 1
        path = tmp_path / f"ckpt{n[0]}{suffix}"
        if isinstance(weights, bytes):
            path.write_bytes(weights)
        elif suffix == ".pt":
            torch.save(weights, path)
        else:
            save_file(weights, str(path))
        return lambda: convert_checkpoint(path, config, tmp_path / f"out{n[0]}")

    refused(lambda: convert_checkpoint(tmp_path / "absent.pt", cfg, tmp_path / "o"),
            "does not exist")
    # missing tensor, in both formats
    miss = {k: v for k, v in oracle_raw.items() if k != "blocks.5.filter.D"}
    refused(convert(miss), "missing", "blocks.5.filter.D")
    refused(convert(miss, ".pt"), "missing", "blocks.5.filter.D")
    # mis-shaped tensors (a plain one and the permuted Wqkv)
    bad = dict(oracle_raw, **{"blocks.4.filter.h": torch.zeros(16, 1, 5)})
    refused(convert(bad), "blocks.4.filter.h", "shape")
    badq = dict(oracle_raw, **{"blocks.7.inner_mha_cls.Wqkv.weight": torch.zeros(384, 64)})
    refused(convert(badq), "blocks.7.inner_mha_cls.Wqkv.weight", "shape")
    # NaN weight
    nan = dict(oracle_raw)
    nan["blocks.6.filter.log_poles"] = nan["blocks.6.filter.log_poles"].clone()
    nan["blocks.6.filter.log_poles"][7, 3, 0] = float("nan")
    refused(convert(nan), "blocks.6.filter.log_poles", "NaN")
    refused(convert(nan, ".pt"), "blocks.6.filter.log_poles", "NaN")
    # corrupt files
    raw = (oracle_dir / "tiny_vtx.safetensors").read_bytes()
    refused(convert(os.urandom(8192)), "corrupt")
    refused(convert(os.urandom(8192), ".pt"), "refusing")
    refused(convert(raw[: len(raw) // 3]), "corrupt")
    refused(convert(raw[:5]), "corrupt")
    hlen = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8: 8 + hlen])

    def with_header(h: dict) -> bytes:
        hb = json.dumps(h).encode()
        hb += b" " * (-len(hb) % 8)
        return struct.pack("<Q", len(hb)) + hb + raw[8 + hlen:]

    k = "blocks.0.mlp.l1.weight"
    lie_shape = dict(header, **{k: dict(header[k], shape=[160, 256])})
    refused(convert(with_header(lie_shape)), "corrupt")
    off = header[k]["data_offsets"]
    lie_off = dict(header, **{k: dict(header[k], data_offsets=[off[0], off[1] + 10 ** 9])})
    refused(convert(with_header(lie_off)), "corrupt")
    refused(convert(struct.pack("<Q", 10 ** 12) + raw[8:]), "corrupt")  # header length lies
    refused(convert(b"\x00" * 8 + raw[8:]), "corrupt")  # empty header
    # a .pt holding something other than a dict of tensors
    refused(convert([torch.zeros(3)], ".pt"), "dict")  # type: ignore[arg-type]


class _Exploit:
    target = ""

    def __reduce__(self):
        return (os.system, (f"echo pwned > {self.target}",))


@pytest.mark.parametrize("how", ["torch.save", "pickle", "nested"])
def test_pt_that_runs_code_is_refused(tmp_path, oracle_dir, oracle_raw, how):
    marker = tmp_path / "PWNED"
    _Exploit.target = str(marker)
    path = tmp_path / "evil.pt"
    if how == "torch.save":
        torch.save(_Exploit(), path)
    elif how == "pickle":
        with open(path, "wb") as f:
            pickle.dump(_Exploit(), f)
    else:  # a plausible checkpoint with one poisoned entry
        torch.save(dict(oracle_raw, **{"blocks.0.projections._extra_state": _Exploit()}), path)
    refused(lambda: convert_checkpoint(path, oracle_dir / "tiny_vtx_config.json", tmp_path / "o"),
            "evil.pt")
    assert not marker.exists(), "unpickling the checkpoint executed code"
    assert not (tmp_path / "o" / WEIGHTS).exists()


def test_config_disagreeing_with_tensors(tmp_path, oracle_dir):
    base = json.loads((oracle_dir / "tiny_vtx_config.json").read_text())
    ckpt = oracle_dir / "tiny_vtx.safetensors"

    def with_cfg(name: str, **changes) -> Path:
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(dict(base, **changes)))
        return p

    cases = {
        "hidden": (dict(hidden_size=64), "shape"),
        "layers": (dict(num_layers=6, hcs_layer_idxs=[0, 4], hcm_layer_idxs=[1, 5],
                        hcl_layer_idxs=[2], attn_layer_idxs=[3]), "blocks.6"),
        "swapped": (dict(hcl_layer_idxs=[3, 6], attn_layer_idxs=[2, 7]), "blocks.2.inner_mha_cls"),
        "groups": (dict(hcm_filter_groups=8), "blocks.1.filter.h"),
        "mr_len": (dict(hcm_filter_length=64), "blocks.1.filter.h"),
        "modes": (dict(state_size=8), "blocks.2.filter.log_poles"),
        "mlp": (dict(inner_mlp_size=192), "mlp.l1.weight"),
        "heads": (dict(num_attention_heads=8), "inv_freq"),
    }
    for name, (changes, needle) in cases.items():
        refused(lambda: convert_checkpoint(ckpt, with_cfg(name, **changes), tmp_path / name),
                needle)
        assert not (tmp_path / name / WEIGHTS).exists(), name
    # an inconsistent config is refused before any tensor is read
    refused(lambda: convert_checkpoint(ckpt, with_cfg("cover", attn_layer_idxs=[3]),
                                       tmp_path / "c"),
            "config")
    refused(lambda: convert_checkpoint(ckpt, tmp_path / "nope.yml", tmp_path / "c"), "config")


# ------------------------------------------------- the command line on broken models (battery)


def copy_model(m: Models, d: Path) -> Path:
    return Path(shutil.copytree(m.good, d / "model"))


def truncated_weights(m: Models, d: Path) -> Path:
    folder = copy_model(m, d)
    f = folder / "model.safetensors"
    f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3])
    return folder


def lying_header(m: Models, d: Path) -> Path:
    """The safetensors header claims a tensor's bytes run far past the end of the file."""
    folder = copy_model(m, d)
    f = folder / "model.safetensors"
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    name = max((k for k in header if k != "__metadata__"),
               key=lambda k: header[k]["data_offsets"][1])
    a, b = header[name]["data_offsets"]
    header[name]["data_offsets"] = [a, b + (1 << 20)]  # and so does the shape:
    header[name]["shape"] = [(b - a + (1 << 20)) // 4]
    new = json.dumps(header).encode()
    new += b" " * (-len(new) % 8)
    f.write_bytes(struct.pack("<Q", len(new)) + new + raw[8 + n :])
    return folder


def disagreeing_config(m: Models, d: Path) -> Path:
    folder = copy_model(m, d)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["hidden_size"] = 48
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def nan_weights(m: Models, d: Path) -> Path:
    from safetensors.torch import load_file, save_file

    folder = copy_model(m, d)
    t = load_file(str(folder / "model.safetensors"))
    k = sorted(t)[0]
    t[k] = t[k].clone()
    t[k].view(-1)[0] = float("nan")
    save_file(t, str(folder / "model.safetensors"))
    return folder


class _Payload:
    """Unpickling this runs os.mkdir(marker): it must never happen."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def evil_pt(d: Path, legacy: bool) -> Path:
    import torch

    marker = str(d / "PWNED")
    path = d / "evil.pt"
    obj = {"blocks.0.filter.h": torch.zeros(2), "payload": _Payload(marker)}
    if legacy:  # a bare pickle stream, as old torch.save(_use_new_zipfile_serialization=False)
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=2)
    else:
        torch.save(obj, path)
    return path



BAD_INPUT_CASES: list[Case] = [
    Case("missing model folder",
         lambda d, m: ["generate", ok_fa(d), "--model", d / "nomodel", *FAST],
         3, r"model folder \S*nomodel does not exist"),
    Case("empty model folder",
         gen_model(lambda m, d: (d / "empty_model").mkdir() or d / "empty_model"),
         3, r"has no config\.json"),
    Case("truncated safetensors", gen_model(truncated_weights), 3,
         r"cannot read \S*model\.safetensors: corrupt or not a safetensors file"),
    Case("safetensors header lying about sizes", gen_model(lying_header), 3,
         r"cannot read \S*model\.safetensors: corrupt or not a safetensors file"),
    Case("config disagrees with the tensors", gen_model(disagreeing_config), 3,
         r"model\.safetensors: tensor '[^']+' has shape \(.*\), the config implies \("),
    Case("NaN in the weights", gen_model(nan_weights), 3, r"tensor '[^']+' contains NaN or inf"),
    Case("code-executing .pt to convert (zip)",
         lambda d, m: ["convert", evil_pt(d, legacy=False), "--config", m.good / "config.json",
                       "-o", d / "conv"],
         3, r"refusing to load \S*evil\.pt: not a plain tensor checkpoint", outputs=False),
    Case("code-executing .pt to convert (legacy pickle)",
         lambda d, m: ["convert", evil_pt(d, legacy=True), "--config", m.good / "config.json",
                       "-o", d / "conv"],
         3, r"refusing to load \S*evil\.pt: not a plain tensor checkpoint", outputs=False),
    Case("convert a missing checkpoint",
         lambda d, m: ["convert", d / "none.pt", "--config", m.good / "config.json", "-o",
                       d / "conv"],
         3, r"checkpoint \S*none\.pt does not exist", outputs=False),
]


@pytest.mark.parametrize("case", BAD_INPUT_CASES, ids=case_ids(BAD_INPUT_CASES))
def test_bad_input(case: Case, battery_models: Models, tmp_path: Path):
    """`evspark generate` or `convert` with each broken or hostile model: exit 3, one error
    line, nothing written, no code run."""
    check_bad_input(case, battery_models, tmp_path)


def test_model_given_as_a_file(phix_model: Path, tmp_path: Path):
    cli_refused("--model names a file", ["generate", fasta_file(tmp_path), "--model",
                                         phix_model / "config.json", *FAST, "-n", 4], 3,
                r"config\.json is a file, not a model folder \(give the folder that holds "
                r"config\.json and model\.safetensors\)", tmp_path, MODEL=phix_model)


def test_convert_onto_its_own_folder_is_refused(phix_model: Path, tmp_path: Path):
    folder = Path(shutil.copytree(phix_model, tmp_path / "m"))
    before = (folder / "model.safetensors").read_bytes()
    cli_refused("convert -o the checkpoint's own folder",
                ["convert", folder / "model.safetensors", "--config", folder / "config.json",
                 "-o", folder], 2, r"--output \S*m/model\.safetensors is also an input; it "
                                   r"would be overwritten",
                tmp_path)
    assert (folder / "model.safetensors").read_bytes() == before
    other = tmp_path / "other"
    shutil.copytree(phix_model, other)
    cli_refused("convert -o a folder holding a model",
                ["convert", folder / "model.safetensors", "--config", folder / "config.json",
                 "-o", other], 2, r"other already holds a model \(config\.json\)", tmp_path)


def test_convert_onto_an_existing_file_is_a_usage_error(tmp_path):
    target = tmp_path / "taken"
    target.write_text("keep me")
    r = run_cli(["convert", ORACLE / "tiny_vtx.safetensors", "--config",
                 ORACLE / "tiny_vtx_config.json", "-o", target])
    assert "not a folder" in one_line_error(r, 2)
    assert target.read_text() == "keep me"


def test_integer_weights_in_a_float_slot_are_refused(tmp_path, random_model):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(random_model, bad)
    sd = load_file(bad / "model.safetensors")
    name = next(k for k in sd if k.endswith("mlp.l1.weight"))
    sd[name] = sd[name].to(torch.int32)
    save_file(sd, bad / "model.safetensors")
    with pytest.raises(ModelError, match="int32"):
        load_model(bad)
