"""Lines of a test file found by marker comments, so tests assert on lines without hard-coding
numbers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def marker_lines(path: str) -> Callable[[str], int]:
    """`line_of(marker)`: the 1-based line of `path` that ends with the comment `# L:<marker>`."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()

    def line_of(marker: str) -> int:
        hits = [i for i, text in enumerate(lines, 1) if text.rstrip().endswith(f"# L:{marker}")]
        assert len(hits) == 1, f"marker {marker!r} found {len(hits)} times"
        return hits[0]

    return line_of
