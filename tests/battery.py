"""Sections of tests/RELIABILITY.md, each rewritten by the test module that produced it.

`EVSPARK_UPDATE_RELIABILITY=1 pytest tests/test_reliability.py tests/test_hostile.py` rewrites
the file from the actual runs; each module owns the text between its two markers.
"""
from __future__ import annotations

import os
from pathlib import Path

FILE = Path(__file__).resolve().parent / "RELIABILITY.md"


def updating() -> bool:
    return bool(os.environ.get("EVSPARK_UPDATE_RELIABILITY"))


def cell(text: str) -> str:
    """Text for one table cell: no pipes, backticks or line breaks."""
    return text.replace("`", "'").replace("|", "\\|").replace("\n", " ")


def write_section(name: str, lines: list[str]) -> None:
    """Replace the section `name` of RELIABILITY.md (or append it) with `lines`."""
    start, end = f"<!-- battery:{name} -->", f"<!-- /battery:{name} -->"
    text = FILE.read_text() if FILE.is_file() else ""
    block = "\n".join([start, *lines, end])
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + ("\n\n" if text else "") + block + "\n"
    FILE.write_text(text)
