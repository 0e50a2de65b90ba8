"""The README's generated parts match the code."""

from __future__ import annotations

import os
from pathlib import Path

from tracelog.emit.support import render_into

README = Path(__file__).parent.parent / "README.md"


def test_op_support_table_is_current() -> None:
    text = README.read_text()
    fresh = render_into(text)
    if os.environ.get("TRACELOG_UPDATE_DOCS"):
        README.write_text(fresh)
        text = fresh
    assert (
        text == fresh
    ), "README's op table is stale: TRACELOG_UPDATE_DOCS=1 pytest tests/test_docs.py"
