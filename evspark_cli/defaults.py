"""The defaults of the settings the command line and the Python API share, in one place, so
that `evs.generate(model, prompt)` and `evspark generate --prompt PROMPT` ask for the same run.

Torch-free: the command line reads them for its options before anything heavy is imported.
`verify` checks 256 tokens by default (a check, not a run), its one difference.
"""
from __future__ import annotations

MAX_NEW_TOKENS = 1024
GAMMA = 12
TEMPERATURE = 1.0
TOP_K = 4
TOP_P = 1.0
SEED = 0
SAMPLES = 1
DRAFTER = "auto"
ROLLBACK = "slice"
RULE = "residual"
DRAFT_LENGTH = "fixed"
TREE_ROWS = 0
ALPHABET = "all"
DEVICE = "auto"

EMBED_SPAN = 8192
"""`evspark embed`: positions per pass, and the bases each pass starts earlier (eval/embed.py)."""

PROMPT_CACHE_MB = 512
"""`evspark serve --prompt-cache-mb`: memory for prefilled prompts kept for requests that send
the same prompt again (serve/engine.py)."""
