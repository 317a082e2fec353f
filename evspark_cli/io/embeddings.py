"""Embedding outputs: safetensors (one tensor per record and layer) or .npy, with a TSV index.

Records go to `OUTPUT.partial` as they finish, as frames (a JSON line naming the record and
its tensors, then their raw bytes) after a first line holding the run's settings; `finish()`
writes OUTPUT and the index from it. A failed or interrupted run keeps the partial, and
`--resume` continues it only with the same settings (layers, pooling, windows, dtype, model).

Tensor names: the record id with one layer, `ID/LAYER` with several. A `.npy` holds one array:
(records, layers, D) pooled, or every position's rows (positions, layers, D) with `none`; the
index says which rows of it (`first_row`, `rows`) or which tensor is each record's. The run's
settings are the safetensors metadata entry `evspark` (JSON).
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError, SettingError
from .writers import _PartialOutput, _replace_with, _write_all

FORMATS = (".safetensors", ".npy")
INDEX_COLUMNS = ("record_id", "length", "layer", "tensor", "first_row", "rows")
MAGIC = "EVSPARK-EMBEDDINGS 1 "


def embedding_format(path: str) -> str:
    """The output's format from its name (SettingError for any other)."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise SettingError.of("output", f"{path}: use a {' or '.join(FORMATS)} file name")
    return ext


def default_index(path: str) -> str:
    """OUTPUT's index beside it: `emb.safetensors` -> `emb.index.tsv`."""
    return os.path.splitext(path)[0] + ".index.tsv"


def check_embedding_output(path: str, dtype: str) -> str:
    """The output's format, checked before any work: a known name, and a dtype it can hold."""
    fmt = embedding_format(path)
    if fmt == ".npy" and dtype == "bfloat16":
        raise SettingError("{0} bfloat16 has no .npy type: use float16, float32 or a "
                           ".safetensors output", "embed_dtype")
    return fmt


class EmbeddingOutput(_PartialOutput):
    """`write(record_id, length, tensors)` per record; `finish(order)` writes OUTPUT + index."""

    def __init__(self, path: str, index: str, settings: Mapping[str, Any],
                 resume: bool = False) -> None:
        self.format = check_embedding_output(path, str(settings["dtype"]))
        self.index_path = index
        self.settings = dict(settings)
        self.dtype = getattr(torch, str(self.settings["dtype"]))
        super().__init__(path, resume)

    def _preamble(self) -> str:
        return MAGIC + json.dumps(self.settings, sort_keys=True) + "\n"

    def write(self, record_id: str, length: int, tensors: Mapping[str, Tensor]) -> None:
        specs, blobs = [], []
        for layer, t in tensors.items():
            t = t.to(self.dtype).contiguous().cpu()
            blob = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            specs.append({"layer": layer, "shape": list(t.shape), "nbytes": len(blob)})
            blobs.append(blob)
        head = json.dumps({"id": record_id, "length": length, "tensors": specs},
                          ensure_ascii=False) + "\n"
        self._emit(head.encode("utf-8") + b"".join(blobs), record_id)

    # -- the partial's frames
    def _frames(self, data: bytes) -> tuple[int, list[tuple[dict[str, Any], int, int]]]:
        """(bytes of complete frames, [(header, frame start, data start)]) after the preamble."""
        pre = self._preamble().encode("utf-8")
        if not data.startswith(pre):
            if pre.startswith(data):  # torn first line: start over
                return 0, []
            raise self._corrupt("it was written with other settings (layers, pooling, windows, "
                                "dtype or model) than this run's", "resume")
        at, out = len(pre), []
        while at < len(data):
            nl = data.find(b"\n", at)
            if nl < 0:
                break
            try:
                head = json.loads(data[at:nl])
                size = sum(int(s["nbytes"]) for s in head["tensors"])
            except (ValueError, KeyError, TypeError):
                raise self._corrupt(f"a record header at byte {at} does not parse") from None
            if nl + 1 + size > len(data):
                break  # torn last frame
            out.append((head, at, nl + 1))
            at = nl + 1 + size
        return at, out

    def _scan(self, data: bytes) -> tuple[int, list[str]]:
        keep, frames = self._frames(data)
        return keep, [str(h["id"]) for h, _, _ in frames]

    def _records(self, data: bytes) -> list[tuple[str, int, int]]:
        _, frames = self._frames(data)
        ends = [a for _, a, _ in frames[1:]] + [len(data)]
        return [(str(h["id"]), a, e) for (h, a, _), e in zip(frames, ends)]

    def _rewrites(self) -> bool:
        return True

    def _publish(self, order: Sequence[str] | None) -> None:
        assert self.partial is not None and self.path is not None
        with open(self.partial, "rb") as f:
            data = f.read()
        data = self._ordered(data, order) or data
        _, frames = self._frames(data)
        records = []  # (id, length, [(layer, tensor)])
        for head, _, at in frames:
            tensors = []
            for spec in head["tensors"]:
                n = int(spec["nbytes"])
                raw = bytearray(data[at: at + n])
                t = (torch.frombuffer(raw, dtype=self.dtype) if n else
                     torch.empty(0, dtype=self.dtype)).reshape(spec["shape"])
                tensors.append((str(spec["layer"]), t))
                at += n
            records.append((str(head["id"]), int(head["length"]), tensors))
        rows = (self._write_npy if self.format == ".npy" else self._write_safetensors)(records)
        lines = ["\t".join(INDEX_COLUMNS)] + ["\t".join(str(c) for c in r) for r in rows]
        text = ("\n".join(lines) + "\n").encode("utf-8")
        _replace_with(self.index_path, lambda fd: _write_all(fd, text))

    def _write_safetensors(self, records: list) -> list[tuple]:
        from safetensors.torch import save

        several = len(self.settings["layers"]) > 1
        tensors, rows = {}, []
        for rid, length, layers in records:
            for layer, t in layers:
                key = f"{rid}/{layer}" if several else rid
                if key in tensors:
                    raise InputError(f"two records are named {rid!r}: tensor names must differ")
                tensors[key] = t
                rows.append((rid, length, layer, key, 0, t.shape[0] if t.dim() == 2 else 1))
        # one metadata entry: safetensors writes several in a random order, and the same run
        # must give the same bytes
        meta = {"evspark": json.dumps(self.settings, sort_keys=True)}
        blob = save(tensors, metadata=meta)
        _replace_with(self.path or "", lambda fd: _write_all(fd, blob))
        return rows

    def _write_npy(self, records: list) -> list[tuple]:
        blocks, rows, first = [], [], 0
        for rid, length, layers in records:
            stacked = torch.stack([t.reshape(-1, t.shape[-1]) for _, t in layers], dim=1)
            blocks.append(stacked)  # (rows, layers, D)
            for layer, _ in layers:
                rows.append((rid, length, layer, "", first, stacked.shape[0]))
            first += stacked.shape[0]
        width = (len(self.settings["layers"]), int(self.settings["hidden"]))
        array = (torch.cat(blocks) if blocks else torch.empty(0, *width, dtype=self.dtype)).numpy()

        def write(fd: int) -> None:
            with os.fdopen(os.dup(fd), "wb") as f:
                np.save(f, array)
        _replace_with(self.path or "", write)
        return rows
