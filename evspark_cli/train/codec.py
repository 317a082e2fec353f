"""fp32-scale codec for teacher hidden states, and safetensors shards to store them.

Why: residual streams of hybrid (StripedHyena 2 / Evo 2) models reach magnitudes ~1e11, far
beyond fp16's 65504, while other rows sit near 1e-3. A plain fp16 cast overflows to inf and a
single shared scale flushes the small rows to zero. Storing, per row (one position x one
layer; the last dim is the feature dim), an fp32 scale = absmax(row) and a low-precision payload
of row / scale keeps every row at its own precision.

Error bounds (per element of a row with s = absmax(row), x̂ = decode(encode(x)) in float32):

* ``"bf16"``: ``|x̂ - x| <= 2**-8 * s``. The payload y = x / s lies in [-1, 1]; bf16 has an
  8-bit significand, so rounding y costs at most half an ulp of [0.5, 1), i.e. 2**-9, and the
  fp32 division/multiplication add O(2**-24 * s); 2**-8 * s is the bound the tests verify
  (elements equal to ±s decode exactly).
* ``"int8"``: ``|x̂ - x| <= s / 254 + 2**-22 * s``: the payload round(y * 127) is off by at most
  half a step of 1/127, plus fp32 rounding of the decode.

Bounds are relative to the row's absmax, not to each element: an element many orders of
magnitude below its row's absmax may decode to 0 (that is what the row scale buys and costs).
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import torch
from safetensors import safe_open
from safetensors.torch import save_file

KINDS: tuple[str, ...] = ("bf16", "int8")
_PAYLOAD_DTYPE: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "int8": torch.int8}
_INT8_MAX = 127.0
_FP32_MAX = torch.finfo(torch.float32).max
BF16_ABS_ERROR = 2.0**-8
"""Verified bound on |x̂ - x| / absmax(row) for the bf16 payload."""
INT8_ABS_ERROR = 1.0 / 254.0 + 2.0**-22
"""Verified bound on |x̂ - x| / absmax(row) for the int8 payload."""


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown codec kind {kind!r}; expected one of {KINDS}")


@dataclass
class EncodedRows:
    """Rows stored as a low-precision payload times a per-row fp32 scale."""

    payload: torch.Tensor
    scale: torch.Tensor
    kind: str

    def __post_init__(self) -> None:
        _check_kind(self.kind)
        if self.payload.dtype != _PAYLOAD_DTYPE[self.kind]:
            raise ValueError(
                f"{self.kind} payload must be {_PAYLOAD_DTYPE[self.kind]}, got {self.payload.dtype}"
            )
        if self.scale.dtype != torch.float32:
            raise ValueError(f"scale must be float32, got {self.scale.dtype}")
        if self.payload.dim() < 1 or tuple(self.scale.shape) != tuple(self.payload.shape[:-1]):
            raise ValueError(
                f"scale shape {tuple(self.scale.shape)} must equal payload shape without its "
                f"feature dim, payload is {tuple(self.payload.shape)}"
            )

    @property
    def shape(self) -> torch.Size:
        """Shape of the decoded tensor."""
        return self.payload.shape

    @property
    def nbytes(self) -> int:
        """Bytes held by payload and scales (what storage costs)."""
        return (
            self.payload.numel() * self.payload.element_size()
            + self.scale.numel() * self.scale.element_size()
        )

    def __getitem__(self, index: Any) -> EncodedRows:
        """Select rows by indexing the leading (non-feature) dims."""
        scale = self.scale[index]
        payload = self.payload[index]
        return EncodedRows(payload=payload, scale=scale, kind=self.kind)


def _row_scales(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 absmax per row, plus that scale in the working dtype (>= every |x| of its row).

    float64 inputs are divided in float64 by the fp32 scale; the fp32 scale is rounded *up* if
    needed so that |x / scale| <= 1 always holds.
    """
    if x.dtype == torch.float64:
        absmax = x.abs().amax(dim=-1)
        if bool((absmax > _FP32_MAX).any()):
            raise ValueError(f"row absmax exceeds the float32 range ({_FP32_MAX:.3e})")
        scale32 = absmax.to(torch.float32)
        low = scale32.to(torch.float64) < absmax
        if bool(low.any()):
            bumped = torch.nextafter(scale32, torch.full_like(scale32, float("inf")))
            scale32 = torch.where(low, bumped, scale32)
        return scale32, scale32.to(torch.float64)
    xf = x.to(torch.float32)
    scale32 = xf.abs().amax(dim=-1)
    return scale32, scale32


def encode(x: torch.Tensor, kind: str = "bf16") -> EncodedRows:
    """Encode ``x`` row-wise (last dim = features) as fp32 absmax scale + ``kind`` payload."""
    _check_kind(kind)
    if not x.is_floating_point():
        raise ValueError(f"encode expects a floating-point tensor, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"encode needs a non-empty feature (last) dim, got shape {tuple(x.shape)}")
    bad = int((~torch.isfinite(x)).sum())
    if bad:
        raise ValueError(f"cannot encode {bad} non-finite value(s) (nan/inf)")
    work_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    scale32, scale_w = _row_scales(x)
    divisor = torch.where(scale_w > 0, scale_w, torch.ones_like(scale_w)).unsqueeze(-1)
    y = x.to(work_dtype) / divisor
    if kind == "bf16":
        payload = y.to(torch.bfloat16)
    else:
        payload = torch.round(y * _INT8_MAX).clamp_(-_INT8_MAX, _INT8_MAX).to(torch.int8)
    return EncodedRows(payload=payload.contiguous(), scale=scale32.contiguous(), kind=kind)


def decode(e: EncodedRows, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rebuild rows as ``payload * scale`` (computed in float32, or float64 if asked for)."""
    work = torch.float64 if dtype == torch.float64 else torch.float32
    y = e.payload.to(work)
    if e.kind == "int8":
        y = y / _INT8_MAX
    out = y * e.scale.to(work).unsqueeze(-1)
    return out if out.dtype == dtype else out.to(dtype)


# --------------------------------------------------------------------------------------------
# Shards
# --------------------------------------------------------------------------------------------

INDEX_NAME = "index.json"
FORMAT = "evspark-shards/1"
_PAYLOAD_SUFFIX = ".payload"
_SCALE_SUFFIX = ".scale"

Batch = Mapping[str, Union[torch.Tensor, EncodedRows]]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_DTYPES: dict[str, torch.dtype] = {_dtype_name(d): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}
"""The dtypes a shard index may name (what safetensors stores), by their index names."""


def _dtype_named(name: object) -> torch.dtype:
    """The dtype an index names; ValueError for any other name."""
    dtype = _DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise ValueError(f"shard index: unknown dtype {name!r}")
    return dtype


class ShardWriter:
    """Append rows of named tensors; write them as fixed-size safetensors shards + index.json.

    A "row" here is one entry along dim 0 shared by every tensor of a batch (e.g. one position:
    hidden states (layers, d), target probabilities (V,), token id ()). Tensors given as
    :class:`EncodedRows`, or named in ``encode``, are stored as ``name.payload`` + ``name.scale``;
    the rest are stored as-is. Each shard is written to a temporary name and renamed, and the
    index last, so a crash never leaves a half-written file under a final name.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        prefix: str = "shard",
        max_rows_per_shard: int = 4096,
        *,
        encode: Mapping[str, str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        if max_rows_per_shard < 1:
            raise ValueError("max_rows_per_shard must be >= 1")
        if not prefix or "/" in prefix or os.sep in prefix:
            raise ValueError(f"bad shard prefix {prefix!r}")
        for kind in (encode or {}).values():
            _check_kind(kind)
        self.directory = Path(directory)
        self.prefix = prefix
        self.max_rows_per_shard = int(max_rows_per_shard)
        self._encode = dict(encode or {})
        self._metadata = dict(metadata or {})
        self.directory.mkdir(parents=True, exist_ok=True)
        stale = sorted(self.directory.glob(f"{prefix}-*.safetensors"))
        index = self.directory / INDEX_NAME
        if (stale or index.exists()) and not overwrite:
            raise FileExistsError(f"{self.directory} already holds shards/index; "
                                  "pass overwrite=True")
        for p in stale + ([index] if index.exists() else []):
            p.unlink()
        self._schema: dict[str, dict[str, Any]] | None = None
        self._buffer: dict[str, list[torch.Tensor]] = {}
        self._buffered = 0
        self._shards: list[dict[str, Any]] = []
        self._closed = False

    # -- schema ---------------------------------------------------------------------------
    def _flatten(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, Any]]]:
        flat: dict[str, torch.Tensor] = {}
        schema: dict[str, dict[str, Any]] = {}
        for name, value in batch.items():
            if name.endswith((_PAYLOAD_SUFFIX, _SCALE_SUFFIX)):
                raise ValueError(f"tensor name {name!r} uses a reserved suffix")
            if isinstance(value, torch.Tensor) and name in self._encode:
                value = encode(value, self._encode[name])
            if isinstance(value, EncodedRows):
                if value.payload.dim() < 2:
                    raise ValueError(f"encoded {name!r} needs a row dim and a feature dim")
                flat[name + _PAYLOAD_SUFFIX] = value.payload
                flat[name + _SCALE_SUFFIX] = value.scale
                schema[name] = {
                    "kind": value.kind,
                    "shape": list(value.payload.shape[1:]),
                    "dtype": _dtype_name(value.payload.dtype),
                }
            elif isinstance(value, torch.Tensor):
                if value.dim() < 1:
                    raise ValueError(f"plain tensor {name!r} needs a row (leading) dim")
                flat[name] = value
                schema[name] = {
                    "kind": "plain",
                    "shape": list(value.shape[1:]),
                    "dtype": _dtype_name(value.dtype),
                }
            else:
                raise TypeError(f"{name!r}: expected Tensor or EncodedRows, "
                                f"got {type(value).__name__}")
        return flat, schema

    def append(self, batch: Batch | None = None, /, **tensors: torch.Tensor | EncodedRows) -> None:
        """Add rows; all tensors share dim 0 and the schema of the first call."""
        if self._closed:
            raise RuntimeError("ShardWriter is closed")
        items: dict[str, torch.Tensor | EncodedRows] = dict(batch or {})
        items.update(tensors)
        if not items:
            raise ValueError("append needs at least one tensor")
        flat, schema = self._flatten(items)
        rows = {int(t.shape[0]) for t in flat.values()}
        if len(rows) != 1:
            raise ValueError(f"tensors disagree on the row count (dim 0): {sorted(rows)}")
        if self._schema is None:
            self._schema = schema
            self._buffer = {k: [] for k in flat}
        elif schema != self._schema:
            raise ValueError(f"batch schema {schema} differs from the first batch {self._schema}")
        n = rows.pop()
        if n == 0:
            return
        for k, t in flat.items():
            self._buffer[k].append(t.detach().cpu())
        self._buffered += n
        while self._buffered >= self.max_rows_per_shard:
            self._flush(self.max_rows_per_shard)

    def _flush(self, n: int) -> None:
        taken: dict[str, torch.Tensor] = {}
        for k, parts in self._buffer.items():
            whole = parts[0] if len(parts) == 1 else torch.cat(parts)
            taken[k] = whole[:n].contiguous().clone()
            rest = whole[n:]
            self._buffer[k] = [rest] if rest.shape[0] else []
        self._buffered -= n
        name = f"{self.prefix}-{len(self._shards):05d}.safetensors"
        final = self.directory / name
        tmp = self.directory / (name + ".tmp")
        save_file(taken, str(tmp), metadata={"format": FORMAT, "rows": str(n)})
        os.replace(tmp, final)
        self._shards.append({"file": name, "rows": n})

    def close(self) -> Path:
        """Write the last partial shard and index.json; returns the index path."""
        if self._closed:
            return self.directory / INDEX_NAME
        if self._buffered:
            self._flush(self._buffered)
        index = {
            "format": FORMAT,
            "prefix": self.prefix,
            "max_rows_per_shard": self.max_rows_per_shard,
            "total_rows": sum(s["rows"] for s in self._shards),
            "tensors": self._schema or {},
            "kinds": sorted({v["kind"] for v in (self._schema or {}).values()} - {"plain"}),
            "shards": self._shards,
            "metadata": self._metadata,
        }
        path = self.directory / INDEX_NAME
        tmp = self.directory / (INDEX_NAME + ".tmp")
        tmp.write_text(json.dumps(index, indent=1, sort_keys=True))
        os.replace(tmp, path)
        self._closed = True
        return path

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.close()


Row = dict[str, Union[torch.Tensor, EncodedRows]]


class ShardReader:
    """Read rows written by :class:`ShardWriter`, decoding encoded tensors on the way out."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        path = self.directory / INDEX_NAME
        try:
            self.index: dict[str, Any] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"cannot read shard index {path}: {exc}") from exc
        if self.index.get("format") != FORMAT:
            raise ValueError(f"{path}: unknown format {self.index.get('format')!r}")
        self.tensors: dict[str, dict[str, Any]] = self.index["tensors"]
        self.metadata: dict[str, Any] = self.index.get("metadata", {})
        self._files = [self.directory / s["file"] for s in self.index["shards"]]
        missing = [str(p) for p in self._files if not p.exists()]
        if missing:
            raise ValueError(f"missing shard file(s): {missing}")
        counts = torch.tensor([int(s["rows"]) for s in self.index["shards"]], dtype=torch.int64)
        self._starts = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)])
        self._handles: dict[int, Any] = {}

    def __len__(self) -> int:
        return int(self._starts[-1])

    @property
    def num_shards(self) -> int:
        return len(self._files)

    def _handle(self, i: int) -> Any:
        if i not in self._handles:
            self._handles[i] = safe_open(str(self._files[i]), framework="pt")
        return self._handles[i]

    def _finish(self, raw: dict[str, torch.Tensor], decoded: bool, dtype: torch.dtype) -> Row:
        out: Row = {}
        for name, info in self.tensors.items():
            if info["kind"] == "plain":
                out[name] = raw[name]
                continue
            e = EncodedRows(raw[name + _PAYLOAD_SUFFIX], raw[name + _SCALE_SUFFIX], info["kind"])
            out[name] = decode(e, dtype) if decoded else e
        return out

    def _keys(self) -> list[str]:
        keys: list[str] = []
        for name, info in self.tensors.items():
            plain = info["kind"] == "plain"
            keys += [name] if plain else [name + _PAYLOAD_SUFFIX, name + _SCALE_SUFFIX]
        return keys

    def _slice(self, shard: int, lo: int, hi: int) -> dict[str, torch.Tensor]:
        h = self._handle(shard)
        return {k: h.get_slice(k)[lo:hi] for k in self._keys()}

    def shard(self, i: int, *, decoded: bool = True, dtype: torch.dtype = torch.float32) -> Row:
        """All rows of shard ``i``."""
        if not 0 <= i < self.num_shards:
            raise IndexError(f"shard {i} out of range (0..{self.num_shards - 1})")
        h = self._handle(i)
        return self._finish({k: h.get_tensor(k) for k in self._keys()}, decoded, dtype)

    def iter_shards(self, *, decoded: bool = True, dtype: torch.dtype = torch.float32
                    ) -> Iterator[Row]:
        """Shards in order, each as a dict of row-batched tensors."""
        for i in range(self.num_shards):
            yield self.shard(i, decoded=decoded, dtype=dtype)

    def __iter__(self) -> Iterator[Row]:
        """Single rows in order (decoded to float32)."""
        for batch in self.iter_shards():
            n = next(iter(batch.values())).shape[0]
            for j in range(n):
                yield {k: v[j] for k, v in batch.items()}  # type: ignore[index]

    def rows(
        self,
        indices: Sequence[int] | torch.Tensor,
        *,
        decoded: bool = True,
        dtype: torch.dtype = torch.float32,
    ) -> Row:
        """Random access: the given global rows, batched along dim 0 in the order asked."""
        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        n = len(self)
        if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
            raise IndexError(f"row index out of range for {n} rows")
        idx = torch.where(idx < 0, idx + n, idx)
        order = torch.argsort(idx, stable=True)
        sorted_idx = idx[order]
        parts: dict[str, list[torch.Tensor]] = {k: [] for k in self._keys()}
        shard_of = torch.searchsorted(self._starts, sorted_idx, right=True) - 1
        i = 0
        m = int(sorted_idx.numel())
        while i < m:  # read runs of consecutive rows within one shard with one slice each
            s = int(shard_of[i])
            j = i
            while (j + 1 < m and int(shard_of[j + 1]) == s
                   and int(sorted_idx[j + 1]) <= int(sorted_idx[j]) + 1):
                j += 1
            lo = int(sorted_idx[i]) - int(self._starts[s])
            hi = int(sorted_idx[j]) - int(self._starts[s]) + 1
            chunk = self._slice(s, lo, hi)
            local = sorted_idx[i : j + 1] - sorted_idx[i]
            for k, t in chunk.items():
                parts[k].append(t[local])
            i = j + 1
        raw: dict[str, torch.Tensor] = {}
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        for k, ps in parts.items():
            if ps:
                raw[k] = torch.cat(ps)[inverse]
            else:
                info = self._info_for_key(k)
                raw[k] = torch.empty((0, *info[0]), dtype=info[1])
        return self._finish(raw, decoded, dtype)

    def _info_for_key(self, key: str) -> tuple[list[int], torch.dtype]:
        for name, info in self.tensors.items():
            if key in (name, name + _PAYLOAD_SUFFIX):
                return info["shape"], _dtype_named(info["dtype"])
            if key == name + _SCALE_SUFFIX:
                return info["shape"][:-1], torch.float32
        raise KeyError(key)

    def __getitem__(self, i: int) -> Row:
        """One row (decoded to float32), without the leading row dim."""
        batch = self.rows([i])
        return {k: v[0] for k, v in batch.items()}  # type: ignore[index]
