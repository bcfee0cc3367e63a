#!/usr/bin/env python3
"""Rewrite the flag table of docs/migrating-from-triton.md from the code (every
tritonserver 2.51 flag and what it does here); tests/test_triton_flags.py fails when
the page and the code disagree."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mini_triton.cli import build_parser  # noqa: E402
from mini_triton.cli.triton_flags import markdown_table  # noqa: E402

PAGE = ROOT / "docs" / "migrating-from-triton.md"
BEGIN, END = "<!-- flag table: begin -->\n", "<!-- flag table: end -->\n"


def page_with_table(text: str) -> str:
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + BEGIN + markdown_table(build_parser()) + END + tail


if __name__ == "__main__":
    PAGE.write_text(page_with_table(PAGE.read_text()))
