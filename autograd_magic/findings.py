"""Findings: what the records mean for the user, as plain sentences naming variables and lines."""

from __future__ import annotations

from typing import Any

from autograd_magic.records import Finding
from autograd_magic.trace import Trace


def analyze(
    trace: Trace, recorder: Any = None, namespace: dict[str, Any] | None = None
) -> list[Finding]:
    """The findings for a finished trace."""
    return []
