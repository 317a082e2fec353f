"""What a generation asks for, checked once: `DecodeOptions` and the rules that follow from it.

A `DecodeOptions` cannot be built from values that have no meaning; `check_context` and
`check_gamma` judge it against a model and a drafter. The command line builds the same objects
and only maps their errors to exit codes (a `SettingError` names the setting; the CLI shows the
flag).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import defaults
from ..decode.batch import ROLLBACKS
from ..decode.drafters.base import Drafter
from ..decode.jobs import largest_draft, row_reserve
from ..decode.sampling import SamplerConfig
from ..errors import InputError, SettingError, at_least
from ..model.config import ModelConfig

DRAFT_LENGTHS = ("fixed", "confidence")
CPU_BATCH = 32  # the most tokens/s for the bundled target on a 2-core CPU (docs/performance.md)
CUDA_BATCH = 64  # a GPU's decode step reads the weights once for all rows


def default_batch_size(device: torch.device) -> int:
    """The batch size a run uses when none is given, by device (docs/batching.md)."""
    return CUDA_BATCH if device.type == "cuda" else CPU_BATCH


MAX_SAMPLES = 1_000_000
"""The most continuations of one record: a million sequences take days to decode already, and a
larger count is a typo whose jobs alone would fill the memory."""
MAX_TREE_ROWS = 64
"""The most branch rows one job may take: more than the useful alternatives of a round (3
other letters at each of at most 16 draft slots, then branches of branches) and more than a
batch's free rows on a CPU."""
MAX_NEW_TOKENS = 10 ** 9
"""The most new tokens per sequence before a model is known (no model's context is longer);
the model's own context bounds it further (`check_context`)."""


def _integer(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SettingError.of(name, f"must be an integer, got {value!r}")


def at_most(name: str, value: int, high: int, why: str) -> None:
    """Refuse `value > high` as `{name} must be <= {high} ({why}), got {value}`: a size that
    no run could hold, refused before anything is built for it."""
    if value > high:
        raise SettingError.of(name, f"must be <= {high:,} ({why}), got {value}")


@dataclass(frozen=True)
class DecodeOptions:
    """What a generation asks for; checked when built, so an instance always holds valid values.

    Defaults are the command line's and the API's alike (evspark_cli/defaults.py).
    """

    max_new_tokens: int = defaults.MAX_NEW_TOKENS
    gamma: int = defaults.GAMMA
    temperature: float = defaults.TEMPERATURE
    top_k: int = defaults.TOP_K
    top_p: float = defaults.TOP_P
    seed: int = defaults.SEED
    samples: int = defaults.SAMPLES  # continuations per record
    rollback: str = defaults.ROLLBACK
    rule: str = defaults.RULE  # how tokens are drawn from p̃: residual or coupled (sampling.py)
    draft_length: str = defaults.DRAFT_LENGTH  # fixed, or confidence (decode/schedule.py)
    alphabet: str = defaults.ALPHABET  # all, or acgt: what sampling may draw (sampling.py)
    tree_rows: int = defaults.TREE_ROWS  # branch rows a job may take from free rows (tree.py)

    def __post_init__(self) -> None:
        _integer("max_new_tokens", self.max_new_tokens)
        _integer("gamma", self.gamma)
        _integer("seed", self.seed)
        _integer("samples", self.samples)
        _integer("tree_rows", self.tree_rows)
        if not 0 <= self.seed < 2 ** 63:
            raise SettingError.of("seed", f"must be an integer in [0, 2**63), got {self.seed}")
        at_least("max_new_tokens", self.max_new_tokens, 1)
        at_least("gamma", self.gamma, 1)
        at_least("samples", self.samples, 1)
        at_least("tree_rows", self.tree_rows, 0)
        at_most("tree_rows", self.tree_rows, MAX_TREE_ROWS, "branch rows of one job")
        at_most("max_new_tokens", self.max_new_tokens, MAX_NEW_TOKENS, "no model's context is "
                "that long")
        at_most("samples", self.samples, MAX_SAMPLES, "continuations of one record")
        if self.rollback not in ROLLBACKS:
            raise SettingError.of("rollback", f"must be {' or '.join(ROLLBACKS)}, "
                                              f"got {self.rollback!r}")
        self.sampler.validate()
        if self.draft_length not in DRAFT_LENGTHS:
            raise SettingError.of("draft_length", f"must be {' or '.join(DRAFT_LENGTHS)}, "
                                                  f"got {self.draft_length!r}")
        if self.draft_length == "confidence" and not (self.sampler.greedy
                                                      or self.sampler.coupled):
            raise SettingError("{0} confidence needs greedy decoding or {1} coupled: under the "
                               "residual rule a sampled token depends on the drafts it is "
                               "tested against", "draft_length", "rule")
        if self.tree_rows and not (self.sampler.greedy or self.sampler.coupled):
            raise SettingError("{0} needs greedy decoding or {1} coupled: under the residual "
                               "rule a sampled token depends on the drafts it is tested "
                               "against", "tree_rows", "rule")
        if self.tree_rows and self.rollback != "slice":
            raise SettingError("{0} needs {1} slice (branch rows follow their job by slicing "
                               "its block)", "tree_rows", "rollback")

    @property
    def adaptive(self) -> bool:
        """Draft length chosen per round by confidence (greedy or coupled only)."""
        return self.draft_length == "confidence"

    @property
    def sampler(self) -> SamplerConfig:
        return SamplerConfig(self.temperature, self.top_k, self.top_p, self.rule, self.alphabet)

    @property
    def largest_draft(self) -> int:
        """The most drafts a round proposes: rounds never draft past the tokens still asked."""
        return largest_draft(self.gamma, self.max_new_tokens)

    def block(self, speculative: bool) -> int:
        """Tokens one verification block holds: the anchor and the largest draft (1 natively)."""
        return 1 + (self.largest_draft if speculative else 0)

    def row_capacity(self, prompt_len: int, speculative: bool = True) -> int:
        """KV positions a row of a `prompt_len`-token prompt reserves for the whole run."""
        draft = self.largest_draft if speculative else 0
        return prompt_len + row_reserve(self.max_new_tokens, draft)


def check_context(config: ModelConfig, prompt_len: int, new_tokens: int, record_id: str) -> None:
    """A prompt and its continuation must fit in the model's context (its config's)."""
    limit = config.max_seqlen
    if prompt_len + new_tokens > limit:
        rid = record_id.replace("{", "{{").replace("}", "}}")
        raise SettingError(f"record '{rid}': prompt of {prompt_len} bases + {new_tokens} new "
                           f"tokens exceeds the model's context of {limit}; use {{0}} N",
                           "prompt_tail")


def check_gamma(drafter: Drafter | None, gamma: int) -> None:
    """Refuse a draft length the drafter cannot propose (a dspark drafter has gamma_max slots).
    Callers pass the largest draft a round will use (`DecodeOptions.largest_draft`)."""
    limit = drafter.gamma_limit if drafter is not None else None
    if limit is not None and gamma > limit:
        raise InputError(f"gamma {gamma}: this drafter proposes at most {limit} tokens per round")
