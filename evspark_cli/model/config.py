"""Model configuration: one dataclass, stored as config.json, Evo 2 field names where they exist."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import ModelError, literal
from ..files import read_bounded


@dataclass
class ModelConfig:
    """StripedHyena 2 hyper-parameters.

    Field names follow Evo 2's YAML configs (``evo2/configs/*.yml``) so a vortex config can be read
    directly; fields Evo 2 does not have (``hidden_layers``, ``prefill_chunk``) are EvSpark's own.
    """

    model_name: str = "stripedhyena2"
    vocab_size: int = 512
    hidden_size: int = 128
    num_layers: int = 8
    num_attention_heads: int = 4
    hcs_layer_idxs: list[int] = field(default_factory=lambda: [0, 4])
    hcm_layer_idxs: list[int] = field(default_factory=lambda: [1, 5])
    hcl_layer_idxs: list[int] = field(default_factory=lambda: [2, 6])
    attn_layer_idxs: list[int] = field(default_factory=lambda: [3, 7])
    hcs_filter_length: int = 7
    hcs_filter_groups: int = 16
    hcm_filter_length: int = 128
    hcm_filter_groups: int = 16
    state_size: int = 16
    short_filter_length: int = 3
    inner_mlp_size: int | None = None
    inner_size_multiple_of: int = 16
    eps: float = 1e-6
    rotary_emb_base: float = 10000.0
    rotary_emb_scaling_factor: float = 1.0
    use_interpolated_rotary_pos_emb: bool = False
    max_seqlen: int = 8192
    evo2_style_activations: bool = True
    tie_embeddings: bool = True
    final_norm: bool = True
    mha_out_proj_bias: bool = True
    hyena_out_proj_bias: bool = True
    qkv_proj_bias: bool = False
    short_filter_bias: bool = False
    interleave: bool = True
    column_split: bool = True
    # EvSpark additions
    hidden_layers: list[int] | None = None  # residual-stream outputs exposed to drafters
    prefill_chunk: int = 8192  # tokens per chunk of a long prefill (bounds memory)
    trained_context: int | None = None  # the longest window it was trained on (None: as long
    #                                     as max_seqlen, as an Evo 2 config's context is)

    @property
    def known_context(self) -> int:
        """The longest prompt the model was trained to read: longer ones run (up to
        max_seqlen) but are extrapolation, and a run warns about them."""
        return min(self.trained_context or self.max_seqlen, self.max_seqlen)

    # ------------------------------------------------------------------ derived
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def mlp_size(self) -> int:
        if self.inner_mlp_size:
            return int(self.inner_mlp_size)
        m = self.inner_size_multiple_of
        return -(-(8 * self.hidden_size // 3) // m) * m  # integers: exact at any size

    @property
    def rope_scale(self) -> float:
        if not self.use_interpolated_rotary_pos_emb:
            return 1.0
        return float(self.rotary_emb_scaling_factor)

    def block_type(self, i: int) -> str:
        for name, idxs in (("attn", self.attn_layer_idxs), ("hcl", self.hcl_layer_idxs),
                           ("hcm", self.hcm_layer_idxs), ("hcs", self.hcs_layer_idxs)):
            if i in idxs:
                return name
        raise ModelError(f"config: layer {i} is in none of attn/hcl/hcm/hcs_layer_idxs")

    @property
    def layer_pattern(self) -> list[str]:
        """Each layer's kind, in one pass over the index lists (as `block_type` decides a layer
        named twice), so even a config with a million layers is judged at once."""
        kinds: dict[int, str] = {}
        for name, idxs in (("attn", self.attn_layer_idxs), ("hcl", self.hcl_layer_idxs),
                           ("hcm", self.hcm_layer_idxs), ("hcs", self.hcs_layer_idxs)):
            for i in idxs:
                kinds.setdefault(i, name)
        missing = next((i for i in range(self.num_layers) if i not in kinds), None)
        if missing is not None:
            raise ModelError(f"config: layer {missing} is in none of attn/hcl/hcm/hcs_layer_idxs")
        return [kinds[i] for i in range(self.num_layers)]

    @property
    def drafter_layers(self) -> list[int]:
        """Layers whose outputs `extend` returns; default: 4 spread over depth, last included."""
        if self.hidden_layers is not None:
            return list(self.hidden_layers)
        n = self.num_layers
        picks = sorted({max(0, round(n * f) - 1) for f in (0.25, 0.5, 0.75, 1.0)})
        return picks

    def validate(self) -> None:
        """Refuse (ModelError, one line) a config no model can be built from: wrong types,
        sizes below 1, NaN or infinite numbers, layer lists that do not cover the layers."""
        if not isinstance(self.model_name, str):
            raise ModelError(f"config: model_name must be a string, got {self.model_name!r}")
        fields = vars(self)  # the dataclass's values by field name
        for name in _BOOLS:
            v = fields[name]
            if not isinstance(v, bool):
                raise ModelError(f"config: {name} must be true or false, got {v!r}")
        for name in _FLOATS:
            v = fields[name]
            if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                    or v <= 0):
                raise ModelError(f"config: {name} must be a finite number > 0, got {v!r}")
        for name in ("hcs_layer_idxs", "hcm_layer_idxs", "hcl_layer_idxs", "attn_layer_idxs"):
            v = fields[name]
            if not isinstance(v, list) or not all(_is_int(i) for i in v):
                raise ModelError(f"config: {name} must be a list of layer indices, got "
                                 f"{_short(v)}")
        if self.hidden_layers is not None and (
                not isinstance(self.hidden_layers, list) or not self.hidden_layers
                or not all(_is_int(i) for i in self.hidden_layers)):
            raise ModelError("config: hidden_layers must be null or a non-empty list of layer "
                             f"indices, got {_short(self.hidden_layers)}")
        for name in _SIZES:
            v = fields[name]
            if not _is_int(v) or v < 1:
                raise ModelError(f"config: {name} must be an integer >= 1, got {_short(v)}")
        if self.trained_context is not None and (not _is_int(self.trained_context)
                                                 or self.trained_context < 1):
            raise ModelError("config: trained_context must be null or an integer >= 1, got "
                             f"{_short(self.trained_context)}")
        if self.inner_mlp_size is not None and (not _is_int(self.inner_mlp_size)
                                                or self.inner_mlp_size < 1):
            raise ModelError("config: inner_mlp_size must be null or an integer >= 1, got "
                             f"{_short(self.inner_mlp_size)}")
        if self.vocab_size < 256:
            raise ModelError("config: vocab_size must be >= 256 (byte tokenizer), "
                             f"got {self.vocab_size!r}")
        d = self.hidden_size
        if d % self.num_attention_heads or self.head_dim % 2:
            raise ModelError("config: hidden_size must split into attention heads of even size")
        for g, name in ((self.hcs_filter_groups, "hcs"), (self.hcm_filter_groups, "hcm")):
            if d % g:
                raise ModelError(f"config: {name}_filter_groups={g} does not divide "
                                 f"hidden_size={d}")
        seen = (self.hcs_layer_idxs + self.hcm_layer_idxs + self.hcl_layer_idxs
                + self.attn_layer_idxs)
        # lengths first: num_layers = 10**30 must not build a list of that many indices
        if len(seen) != self.num_layers or sorted(seen) != list(range(self.num_layers)):
            raise ModelError("config: the layer index lists must cover 0..num_layers-1 exactly "
                             "once")
        for i in self.drafter_layers:
            if not 0 <= i < self.num_layers:
                raise ModelError(f"config: hidden_layers entry {i} out of range")

    # ------------------------------------------------------------------ io
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Build from an EvSpark or Evo 2 config dict (checked: `validate`); unknown Evo 2
        fields are ignored."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw = {k: _coerce(k, v, str(fields[k].type)) for k, v in d.items() if k in fields}
        if "num_layers" not in kw:
            raise ModelError("config: missing num_layers")
        cfg = cls(**kw)
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, path: str | Path) -> "ModelConfig":
        """Read config.json, or an Evo 2 YAML (flat key: value file, `parse_yaml`) by
        extension."""
        p = Path(path)
        kind = "YAML" if p.suffix in (".yml", ".yaml") else "JSON"
        raw = read_bounded(p, MAX_CONFIG_BYTES, f"config {p}", "model config")
        try:
            text = raw.decode("utf-8-sig")
            data = parse_yaml(text) if kind == "YAML" else json.loads(text)
        except (ValueError, RecursionError) as e:  # RecursionError: absurdly deep nesting
            why = "nested too deeply" if isinstance(e, RecursionError) else " ".join(
                str(e).split())[:200]
            raise ModelError(f"config {p} is not valid {kind}: {why}") from None
        if not isinstance(data, dict):
            raise ModelError(f"config {p} is not a mapping")
        if data.get("kind") == "dspark":  # a drafter's config: say so, not "missing num_layers"
            raise drafter_not_model(p.parent, data.get("target_name"))
        return cls.from_dict(data)


def drafter_not_model(folder: Path, target: object = None) -> ModelError:
    """The error for a drafter folder given where a model folder goes: how to pass both."""
    of = f" ({target})" if isinstance(target, str) and target else ""
    return ModelError(literal(f"{folder} is a drafter folder, not a model folder: pass its "
                              f"target{of} with ") + "{0} and this folder with {1}",
                      "model", "drafter")


MAX_CONFIG_BYTES = 64 << 20
"""The largest config file read (a million-layer config is ~10 MiB of JSON)."""

_BOOLS = ("use_interpolated_rotary_pos_emb", "evo2_style_activations", "tie_embeddings",
          "final_norm", "mha_out_proj_bias", "hyena_out_proj_bias", "qkv_proj_bias",
          "short_filter_bias", "interleave", "column_split")
_FLOATS = ("eps", "rotary_emb_base", "rotary_emb_scaling_factor")
_SIZES = ("vocab_size", "num_layers", "hidden_size", "num_attention_heads", "hcs_filter_length",
          "hcs_filter_groups", "hcm_filter_length", "hcm_filter_groups", "state_size",
          "short_filter_length", "max_seqlen", "prefill_chunk", "inner_size_multiple_of")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(v: Any) -> str:
    """A value for a one-line message (a config can hold megabytes in one field)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _coerce(name: str, value: Any, typ: str) -> Any:
    """YAML readers leave e.g. `eps: 1e-06` as a string: convert by the field's declared type."""
    try:
        if typ.startswith("float") and not isinstance(value, bool):
            return float(value)
        if typ.startswith("int") and isinstance(value, (str, float)) and value is not None:
            f = float(value)
            if f != int(f):
                raise ValueError
            return int(f)
        if typ.startswith("bool") and isinstance(value, str):
            return {"true": True, "false": False}[value.lower()]
    except (ValueError, TypeError, KeyError, OverflowError):
        raise ModelError(f"config: field {name} has an invalid value {_short(value)}") from None
    return value


def parse_yaml(text: str) -> Any:
    """An Evo 2 YAML config (``evo2/configs/*.yml``: flat ``key: value`` lines, inline and block
    lists, comments) read by PyYAML's safe loader; ValueError (one line) when it is not YAML.
    `ModelConfig.load` refuses what is not a mapping, and `from_dict` converts the values by
    field type (YAML 1.1 reads `1e-6` as a string)."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(" ".join(str(e).split())) from None
