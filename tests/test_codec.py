"""fp32-scale codec: the three claims (round trip, fp16 overflow, shared scale flattens), shards."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from evspark_cli.train.codec import (
    BF16_ABS_ERROR,
    INT8_ABS_ERROR,
    EncodedRows,
    ShardReader,
    ShardWriter,
    decode,
    encode,
)

BOUND = {"bf16": BF16_ABS_ERROR, "int8": INT8_ABS_ERROR}


def mixed_rows(seed: int = 0) -> torch.Tensor:
    """(positions=8, layers=4, d=64): alternate rows of magnitude ~1e11 and ~1e-3."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 4, 64, generator=g)
    mag = torch.ones(8, 4, 1)
    mag[:, 0::2] = 1e11
    mag[:, 1::2] = 1e-3
    return x * mag


def per_row_error(x: torch.Tensor, xhat: torch.Tensor) -> torch.Tensor:
    """max |x̂ - x| / absmax(row), per row (float64)."""
    x64, xh64 = x.double(), xhat.double()
    return ((xh64 - x64).abs().amax(-1) / x64.abs().amax(-1))


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_huge_and_tiny_rows_round_trip(kind: str) -> None:
    x = mixed_rows()
    e = encode(x, kind)
    assert e.scale.dtype == torch.float32 and e.scale.shape == x.shape[:-1]
    assert e.payload.dtype == (torch.bfloat16 if kind == "bf16" else torch.int8)
    xhat = decode(e)
    assert xhat.dtype == torch.float32 and torch.isfinite(xhat).all()
    err = per_row_error(x, xhat)
    assert (err <= BOUND[kind]).all(), err.max()
    # both the ~1e11 and the ~1e-3 rows keep their precision
    assert err[:, 1::2].max() <= BOUND[kind] and err[:, 0::2].max() <= BOUND[kind]
    # the element that sets the scale decodes exactly
    arg = x.abs().argmax(-1, keepdim=True)
    assert torch.equal(xhat.gather(-1, arg), x.gather(-1, arg))
    # nbytes: payload + 4 bytes per row
    per = 2 if kind == "bf16" else 1
    assert e.nbytes == x.numel() * per + 4 * x[..., 0].numel()


def test_plain_fp16_cast_overflows() -> None:
    x = mixed_rows()
    h = x.to(torch.float16)
    assert torch.isinf(h[:, 0::2]).any()
    assert not torch.isfinite(h).all()


@pytest.mark.parametrize("payload", ["int8", "fp16"])
def test_shared_scale_flattens_small_rows(payload: str) -> None:
    x = mixed_rows()
    s = x.abs().max()  # one scale for the whole tensor
    y = x / s  # small rows are now ~1e-14
    if payload == "fp16":  # 16-bit payload without bf16's exponent range
        xhat = y.to(torch.float16).float() * s
    else:
        xhat = torch.round(y * 127).clamp(-127, 127).to(torch.int8).float() / 127 * s
    small, small_hat = x[:, 1::2], xhat[:, 1::2]
    assert (small_hat == 0).all()  # every small row becomes zero...
    rel = (small_hat - small).abs().amax(-1) / small.abs().amax(-1)
    assert torch.equal(rel, torch.ones_like(rel))  # ...i.e. 100% relative error
    # while the per-row codec keeps them
    kind = "int8" if payload == "int8" else "bf16"
    assert per_row_error(small, decode(encode(x, kind))[:, 1::2]).max() <= BOUND[kind]


def test_shared_scale_bf16_payload_is_not_what_breaks() -> None:
    """Recorded fact: bf16 has fp32's exponent range, so a shared scale only costs bf16 the
    small rows once they fall below ~1e-38 relative to the tensor absmax; at 1e-14 they survive.
    The per-row scale is what makes int8 (and fp16) payloads usable."""
    x = mixed_rows()
    s = x.abs().max()
    xhat = (x / s).to(torch.bfloat16).float() * s
    assert (per_row_error(x, xhat) <= BF16_ABS_ERROR).all()
    tiny = torch.tensor([[1e30, 1.0], [1e-12, 2e-12]])  # 1e-42 relative: below bf16's normals
    t = tiny / tiny.abs().max()
    assert (t.to(torch.bfloat16).float()[1] * tiny.abs().max() == 0).all()
    assert per_row_error(tiny, decode(encode(tiny, "bf16")))[1] <= BF16_ABS_ERROR


def test_extreme_magnitudes_and_float64_input() -> None:
    x = torch.tensor([[1e30, -3e29, 7.0], [1e-30, 2e-31, 0.0], [3.3e38, 1.0, -3.3e38]],
                     dtype=torch.float64)
    for kind in ("bf16", "int8"):
        e = encode(x, kind)
        assert torch.isfinite(e.scale).all()
        assert (e.scale.double() >= x.abs().amax(-1)).all()  # scale never below the true absmax
        assert (per_row_error(x, decode(e, torch.float64)) <= BOUND[kind]).all()
    with pytest.raises(ValueError, match="float32 range"):
        encode(torch.tensor([[1e39, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_zero_rows_decode_to_zeros(kind: str) -> None:
    x = torch.zeros(3, 5)
    x[1] = torch.arange(5.0)
    e = encode(x, kind)
    assert e.scale[0] == 0 and e.scale[2] == 0
    xhat = decode(e)
    assert torch.equal(xhat[0], torch.zeros(5)) and torch.equal(xhat[2], torch.zeros(5))
    assert not torch.isnan(xhat).any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_rejected(bad: float) -> None:
    x = torch.ones(4, 8)
    x[0, 0] = bad
    x[2, 3] = bad
    with pytest.raises(ValueError, match=r"\b2 non-finite"):
        encode(x)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError):
        encode(torch.ones(3, 4), "fp8")
    with pytest.raises(ValueError):
        encode(torch.ones(3, 4, dtype=torch.int64))
    with pytest.raises(ValueError):
        encode(torch.ones(3, 0))
    with pytest.raises(ValueError):
        EncodedRows(torch.zeros(3, 4, dtype=torch.bfloat16), torch.zeros(4), "bf16")


def test_low_precision_inputs_and_output_dtype() -> None:
    x = mixed_rows()[..., :16]
    xb = x.to(torch.bfloat16)
    e = encode(xb, "bf16")
    assert (per_row_error(xb.float(), decode(e)) <= BF16_ABS_ERROR).all()
    assert decode(e, torch.bfloat16).dtype == torch.bfloat16


@settings(max_examples=60, deadline=None)
@given(
    exps=st.lists(st.floats(min_value=-6.0, max_value=30.0), min_size=1, max_size=6),
    d=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**31 - 1),
    kind=st.sampled_from(["bf16", "int8"]),
)
def test_property_random_magnitudes(exps: list[float], d: int, seed: int, kind: str) -> None:
    g = torch.Generator().manual_seed(seed)
    mags = torch.tensor([10.0**e for e in exps], dtype=torch.float64).unsqueeze(-1)
    x = (torch.randn(len(exps), d, generator=g, dtype=torch.float64) * mags).float()
    x[x.abs().amax(-1) == 0] = 1.0  # keep rows non-zero for the relative check
    xhat = decode(encode(x, kind))
    assert torch.isfinite(xhat).all()
    assert (per_row_error(x, xhat) <= BOUND[kind]).all()


# ------------------------------------------------------------------------------------------
# Shards
# ------------------------------------------------------------------------------------------


def make_batch(n: int, start: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, 3, 16, generator=g) * torch.logspace(-3, 11, 3).view(1, 3, 1)
    probs = torch.softmax(torch.randn(n, 4, generator=g), -1)
    ids = torch.arange(start, start + n, dtype=torch.int64)
    return {"hidden": hidden, "probs": probs, "ids": ids}


@pytest.mark.parametrize("kind", ["bf16", "int8"])
def test_shard_round_trip(tmp_path: Path, kind: str) -> None:
    batches = [make_batch(n, s, i) for i, (n, s) in enumerate([(7, 0), (12, 7), (1, 19), (5, 20)])]
    with ShardWriter(tmp_path, "teacher", max_rows_per_shard=8, encode={"hidden": kind},
                     metadata={"layers": [3, 12, 24]}) as w:
        for b in batches:
            w.append(b)
        w.append(**make_batch(0, 25, 9))  # empty batch is a no-op
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["index.json"] + [f"teacher-{i:05d}.safetensors" for i in range(4)]
    index = json.loads((tmp_path / "index.json").read_text())
    assert [s["rows"] for s in index["shards"]] == [8, 8, 8, 1]
    assert index["total_rows"] == 25 and index["kinds"] == [kind]
    assert index["tensors"]["hidden"] == {"kind": kind, "shape": [3, 16],
                                          "dtype": "bfloat16" if kind == "bf16" else "int8"}
    assert index["tensors"]["ids"] == {"kind": "plain", "shape": [], "dtype": "int64"}

    r = ShardReader(tmp_path)
    assert len(r) == 25 and r.num_shards == 4 and r.metadata == {"layers": [3, 12, 24]}
    full = {k: torch.cat([b[k] for b in batches]) for k in batches[0]}
    got = {k: torch.cat([s[k] for s in r.iter_shards()]) for k in full}  # type: ignore[misc]
    assert torch.equal(got["ids"], full["ids"]) and torch.equal(got["probs"], full["probs"])
    assert (per_row_error(full["hidden"], got["hidden"]) <= BOUND[kind]).all()

    # random access across shards, any order, duplicates, negatives
    idx = [24, 3, 9, 8, 10, 3, 0, -1, 16]
    sel = r.rows(idx)
    want = torch.tensor([i % 25 for i in idx])
    assert torch.equal(sel["ids"], want)
    assert torch.equal(sel["hidden"], got["hidden"][want])
    row = r[13]
    assert int(row["ids"]) == 13 and row["hidden"].shape == (3, 16)
    assert [int(x["ids"]) for x in r] == list(range(25))
    enc = r.rows([1, 2], decoded=False)["hidden"]
    assert isinstance(enc, EncodedRows) and enc.kind == kind and enc.scale.shape == (2, 3)
    assert r.rows([])["ids"].shape == (0,)
    with pytest.raises(IndexError):
        r.rows([25])


def test_shard_writer_accepts_encoded_and_checks_schema(tmp_path: Path) -> None:
    w = ShardWriter(tmp_path, "x", max_rows_per_shard=100)
    w.append(h=encode(torch.randn(4, 8), "int8"), t=torch.arange(4))
    with pytest.raises(ValueError, match="schema"):
        w.append(h=encode(torch.randn(4, 8), "bf16"), t=torch.arange(4))
    with pytest.raises(ValueError, match="row count"):
        w.append(h=encode(torch.randn(4, 8), "int8"), t=torch.arange(3))
    w.close()
    assert len(ShardReader(tmp_path)) == 4
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(FileExistsError):
        ShardWriter(tmp_path, "x")
    with ShardWriter(tmp_path, "x", overwrite=True) as w2:
        w2.append(t=torch.arange(2))
    assert len(ShardReader(tmp_path)) == 2 and sorted(p.name for p in tmp_path.iterdir()) == [
        "index.json", "x-00000.safetensors"]


def test_shard_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ShardReader(tmp_path)
    with ShardWriter(tmp_path, "y", max_rows_per_shard=2) as w:
        w.append(t=torch.arange(5))
    (tmp_path / "y-00001.safetensors").unlink()
    with pytest.raises(ValueError, match="missing"):
        ShardReader(tmp_path)
