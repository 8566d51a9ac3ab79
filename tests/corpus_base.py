"""What a corpus case is (issue 22): a loop nobody here wrote, shrunk to run in well under a
second, with the findings an expert expects. `tests/findings_corpus.py` holds the first families
and gathers every `tests/corpus_*.py` family module's `CORRECT` and `BROKEN` lists."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

import autograd_magic as am


@dataclass(frozen=True)
class Expect:
    """One expected finding: its kind, the marker of its line, its holder, and the words its
    advice must (`fix`) and must not (`never`) contain."""

    kind: str
    marker: str
    holder: str | None
    fix: tuple[str, ...] = ()
    never: tuple[str, ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    source: str  # where the code came from
    loop: Callable[[], am.Trace]
    expected: tuple[Expect, ...] = ()  # () for a correct loop
    known_gap: str = ""  # why the findings still miss this case (the test expects the miss)
    line_of: Callable[[str], int] | None = None  # the markers' file; None: findings_corpus.py


@contextlib.contextmanager
def raises(text: str) -> Iterator[None]:
    """The loop is expected to stop with PyTorch's error containing `text`."""
    try:
        yield
    except RuntimeError as exc:
        assert text in str(exc), exc
    else:
        raise AssertionError(f"expected an error with {text!r}")


INPLACE = "modified by an inplace operation"
TWICE = "backward through the graph a second time"


def seed() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
