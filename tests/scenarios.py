"""Differential harness: run one scenario untracked and tracked, and record what a user could see.

A scenario is `fn(probe) -> dict` of results. The `Probe` logs, in order, every checkpoint the
scenario asks for and every death of a watched tensor, array or autograd node (node deaths are
seen through a sentinel stored in `node.metadata`, which dies with the C++ node). Two runs with
the same seed must produce the same log, the same results bit for bit and the same exceptions.
"""

from __future__ import annotations

import contextlib
import gc
import random
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import autograd_magic as am


class _Sentinel:
    """Lives in a node's metadata; its finalizer fires when the C++ node is destroyed."""


class Probe:
    """What a scenario exposes to the comparison: checkpoints, deaths, caught errors."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self._refs: dict[str, Any] = {}

    def watch(self, name: str, obj: Any) -> Any:
        """Log the moment `obj` (a tensor or array) dies; returns `obj` for inline use."""
        self._refs[name] = weakref.ref(obj)
        weakref.finalize(obj, self.log.append, ("died", name))
        return obj

    def watch_graph(self, name: str, tensor: torch.Tensor) -> None:
        """Log the moment the autograd node that produced `tensor` is destroyed."""
        sentinel = _Sentinel()
        tensor.grad_fn.metadata[f"probe:{name}"] = sentinel
        self._refs[name] = weakref.ref(sentinel)
        weakref.finalize(sentinel, self.log.append, ("died", name))

    def alive(self) -> list[str]:
        return sorted(name for name, ref in self._refs.items() if ref() is not None)

    def check(self, step: str) -> None:
        """Log which watched objects are alive at this step."""
        self.log.append(("at", step, tuple(self.alive())))

    @contextlib.contextmanager
    def catch(self, step: str) -> Iterator[None]:
        """Run a block expected to raise; log the exception's type and exact message."""
        try:
            yield
        except Exception as exc:
            self.log.append(("raised", step, type(exc).__name__, str(exc)))
        else:
            self.log.append(("raised", step, None, None))


def _frees_what_a_caught_exception_held() -> bool:
    """Whether this interpreter frees at once a local of a frame whose exception a
    `@contextmanager` caught (as `Probe.catch` does). From Python 3.12 on, contextlib leaves a
    frame cycle that lives until the cycle collector runs: there, with gc off, such a scenario's
    graph stays alive after the run, untracked as tracked."""

    class Local:
        pass

    caught: list[str] = []

    @contextlib.contextmanager
    def catch() -> Iterator[None]:
        try:
            yield
        except Exception as exc:  # as Probe.catch does
            caught.append(type(exc).__name__)

    def run() -> weakref.ref[Local]:
        local = Local()
        with catch():
            raise ValueError(local)
        return weakref.ref(local)

    enabled = gc.isenabled()
    gc.disable()
    try:
        return run()() is None
    finally:
        if enabled:
            gc.enable()


# True on Python 3.10 and 3.11; False on 3.12 and 3.13 (see above). Expectations that a run leaves
# nothing alive hold only where it is True; tracked must always leave what untracked leaves.
FREES_AFTER_CAUGHT_EXCEPTIONS = _frees_what_a_caught_exception_held()


@dataclass
class Run:
    """Everything one run of a scenario showed."""

    results: dict[str, Any] | None
    error: tuple[str, str] | None
    log: list[tuple]
    alive_after: list[str]
    trace: am.Trace | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def run_untracked(scenario: Callable[[Probe], dict], seed: int = 0) -> Run:
    probe = Probe()
    seed_all(seed)
    results, error = None, None
    try:
        results = scenario(probe)
    except BaseException as exc:  # KeyboardInterrupt included: it is part of the comparison
        error = (type(exc).__name__, str(exc))
    kept = _freeze(results)
    results = None
    return Run(kept, error, probe.log, probe.alive())


def run_tracked(scenario: Callable[[Probe], dict], seed: int = 0) -> Run:
    probe = Probe()
    seed_all(seed)
    results, error, trace = None, None, None
    try:
        with am.track() as trace:
            results = scenario(probe)
    except BaseException as exc:
        error = (type(exc).__name__, str(exc))
    kept = _freeze(results)
    results = None
    # The trace stays alive here: whatever it holds must not keep the user's objects alive.
    return Run(kept, error, probe.log, probe.alive(), trace)


def _freeze(value: Any) -> Any:
    """Results with tensors cloned (so the originals can die) and arrays copied."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_freeze(v) for v in value)
    return value


def assert_same(expected: Any, actual: Any, path: str = "results") -> None:
    """Bit-for-bit equality of nested results (tensors by `torch.equal` plus dtype/shape)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), path
        assert expected.dtype == actual.dtype and expected.shape == actual.shape, path
        assert torch.equal(expected, actual), f"{path} differs when tracked"
    elif isinstance(expected, np.ndarray):
        assert np.array_equal(expected, actual), f"{path} differs when tracked"
    elif isinstance(expected, dict):
        assert expected.keys() == actual.keys(), path
        for key in expected:
            assert_same(expected[key], actual[key], f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), path
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            assert_same(e, a, f"{path}[{i}]")
    else:
        assert expected == actual, f"{path}: {expected!r} != {actual!r}"


def grads(module: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    return {name: p.grad for name, p in module.named_parameters()}


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return dict(module.named_parameters())
