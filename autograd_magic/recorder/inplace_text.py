"""PyTorch's errors for a saved tensor changed after saving, worded as this torch release words
them.

While saved-tensor hooks are set PyTorch skips these checks, so the recorder's unpack hook makes
them itself (see `saved`). The words come from this release: at import, a few tiny graphs are
broken on purpose without hooks and PyTorch's own messages are kept as templates, the values in
them replaced by markers. A release whose message cannot be taken apart that way gets the words
of torch 2.13, the release this project is tested with.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections.abc import Callable

import torch

# Markers for the values in a learned message (never in PyTorch's text).
_TYPE, _SIZES, _NODE, _OUTPUT, _CURRENT, _EXPECTED = (f"\x00{c}\x00" for c in "TSNOCE")


class InplaceWording:
    """Templates of PyTorch's in-place error: with and without the producer clause, and the
    hint with and without anomaly mode."""

    def __init__(
        self, with_node: str, without_node: str, hint: str, anomaly_hint: str, full_names: bool
    ) -> None:
        self.with_node = with_node
        self.without_node = without_node
        self.hint = hint
        self.anomaly_hint = anomaly_hint
        self.full_names = full_names  # 'ExpBackward0' (True) or 'Exp' (False) in the message

    def version_error(
        self,
        type_name: str,
        sizes: str,
        node_name: str | None,
        output_nr: int,
        current: int,
        expected: int,
    ) -> str:
        """The message for a saved tensor at version `current` that was saved at `expected`."""
        template = self.without_node if node_name is None else self.with_node
        if node_name is not None and not self.full_names:
            node_name = re.sub(r"Backward\d*$", "", node_name)
        hint = self.anomaly_hint if torch.is_anomaly_enabled() else self.hint
        return (
            template.replace(_TYPE, type_name)
            .replace(_SIZES, sizes)
            .replace(_NODE, node_name or "")
            .replace(_OUTPUT, str(output_nr))
            .replace(_CURRENT, str(current))
            .replace(_EXPECTED, str(expected))
            + hint
        )


# torch 2.13's words: what a release whose messages cannot be learned gets.
_FALLBACK = InplaceWording(
    with_node=(
        "one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: [{_TYPE} [{_SIZES}]], which is output {_OUTPUT} of {_NODE}, is at version "
        f"{_CURRENT}; expected version {_EXPECTED} instead."
    ),
    without_node=(
        "one of the variables needed for gradient computation has been modified by an inplace "
        f"operation: [{_TYPE} [{_SIZES}]] is at version {_CURRENT}; expected version "
        f"{_EXPECTED} instead."
    ),
    hint=(
        " Hint: enable anomaly detection to find the operation that failed to compute its "
        "gradient, with torch.autograd.set_detect_anomaly(True, check_nan=False)."
    ),
    anomaly_hint=(
        " Hint: the backtrace further above shows the operation that failed to compute its "
        "gradient. The variable in question was changed in there or anywhere later. Good luck!"
    ),
    full_names=False,
)
_FALLBACK_DETACHED = (
    "Trying to use a saved tensor that has been detached in-place, i.e. with .detach_()."
    "This is not supported, please use out-of-place `.detach()` instead"
)


def _message_of(break_graph: Callable[[], None], anomaly: bool = False) -> str:
    """The RuntimeError PyTorch raises for `break_graph`, with no hooks and grad on."""
    with (
        torch.inference_mode(False),
        torch.enable_grad(),
        torch.autograd.set_detect_anomaly(anomaly),
        warnings.catch_warnings(),
    ):
        warnings.simplefilter("ignore")  # anomaly mode warns with the forward's traceback
        try:
            break_graph()
        except RuntimeError as error:
            return str(error)
    raise LookupError("the probe did not fail")


def _written_after_saving(leaf: bool) -> Callable[[], None]:
    """A [5, 6] float tensor saved at version 3 and backward run at version 7: the values are
    told apart from each other and from the output number (0) by their digits."""

    def run() -> None:
        base = torch.ones(5, 6, requires_grad=True)
        x = base if leaf else base * 1
        for _ in range(3):
            with torch.no_grad() if leaf else contextlib.nullcontext():
                x.add_(1)
        y = x.sin()
        for _ in range(4):
            with torch.no_grad() if leaf else contextlib.nullcontext():
                x.add_(1)
        y.sum().backward()

    return run


def _detached_after_saving() -> None:
    x = torch.ones(2, requires_grad=True) * 1
    y = x.sin()
    x.detach_()
    y.sum().backward()


def _mark(message: str, value: str, marker: str, whole_word: bool = False) -> str:
    pattern = rf"(?<![\w.]){re.escape(value)}(?![\w])" if whole_word else re.escape(value)
    marked, count = re.subn(pattern, marker.replace("\\", r"\\"), message)
    if count != 1:
        raise LookupError(f"{value!r} appears {count} times in {message!r}")
    return marked


def _split_hint(marked: str) -> tuple[str, str]:
    """(the sentence up to the expected version, the hint after it)."""
    end = marked.index(".", marked.index(_EXPECTED)) + 1
    return marked[:end], marked[end:]


def _learn() -> tuple[InplaceWording, str]:
    with_node = _message_of(_written_after_saving(leaf=False))
    full_names = "AddBackward0" in with_node
    marked = _mark(with_node, "AddBackward0" if full_names else "Add", _NODE)
    marked = _mark(marked, "0", _OUTPUT, whole_word=True)
    without_node = _message_of(_written_after_saving(leaf=True))
    templates = []
    for text in (marked, without_node):
        text = _mark(text, "torch.FloatTensor", _TYPE)
        text = _mark(text, "5, 6", _SIZES)
        text = _mark(text, "7", _CURRENT, whole_word=True)
        templates.append(_mark(text, "3", _EXPECTED, whole_word=True))
    (body, hint), (leaf_body, leaf_hint) = map(_split_hint, templates)
    anomaly = _message_of(_written_after_saving(leaf=False), anomaly=True)
    anomaly_hint = _split_hint(_mark(anomaly, "3", _EXPECTED, whole_word=True))[1]
    if hint != leaf_hint or _OUTPUT not in body:
        raise LookupError("the two messages do not share their hint")
    wording = InplaceWording(body, leaf_body, hint, anomaly_hint, full_names)
    return wording, _message_of(_detached_after_saving)


def _learn_or_fall_back() -> tuple[InplaceWording, str, str]:
    """(the wording, the detached-in-place message, where they came from)."""
    try:
        wording, detached = _learn()
    except Exception as error:  # any release, any wording: never fail the import
        return _FALLBACK, _FALLBACK_DETACHED, f"torch 2.13's words ({error})"
    return wording, detached, "learned from this torch"


WORDING, DETACHED_MESSAGE, SOURCE = _learn_or_fall_back()
