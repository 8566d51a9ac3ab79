"""Issue 10: watching must not change code nobody here wrote (namespaces, generators, signals,
torch.func, user modes and subclasses, exceptions). Each test compares against untracked runs."""

from __future__ import annotations

import weakref

import torch

import autograd_magic as am


# ----- 1. the user's namespace is never written --------------------------------------------------
def _hyperparameters(tracked: bool, lr: float = 0.1) -> dict:
    hp = locals()
    x = torch.ones(2, requires_grad=True)
    if tracked:
        with am.track():
            (x * 2).sum().backward()
    else:
        (x * 2).sum().backward()
    return {k: v for k, v in hp.items() if k != "tracked"}


def test_locals_snapshot_taken_before_the_block_is_left_as_it_was():
    assert _hyperparameters(True) == _hyperparameters(False)


def _freed_after_del(tracked: bool, snapshot_first: bool) -> list[str]:
    log: list[str] = []
    x = torch.randn(3, requires_grad=True)
    if snapshot_first:
        locals()
    weakref.finalize(x, log.append, "x died")
    if tracked:
        with am.track():
            y = x.exp()
    else:
        y = x.exp()
    del y
    log.append("y dropped")
    del x
    log.append("x dropped")
    return log


def test_reading_names_does_not_extend_a_local_tensor_life(gc_disabled):
    for snapshot_first in (False, True):
        assert _freed_after_del(True, snapshot_first) == _freed_after_del(False, snapshot_first)


def test_locals_of_a_function_still_name_what_they_hold():
    def run() -> am.Trace:
        weights = torch.ones(3, requires_grad=True)
        with am.track() as trace:
            kept = weights.exp()
        del kept
        return trace

    trace = run()
    assert [h.path for h in trace.holders] == ["kept"]
