"""Traces display themselves in IPython (recorded or loaded from JSON), and `show()` shows one
trace as its panel or several side by side; outside a kernel the text report is shown."""

from __future__ import annotations

import pytest
import torch
from comm.base_comm import BaseComm
from IPython.core.interactiveshell import InteractiveShell
from IPython.utils.capture import capture_output

import autograd_magic
from autograd_magic import display  # how traces display themselves in IPython
from autograd_magic.model import trace as model

WIDGET = "application/vnd.jupyter.widget-view+json"


class SilentComm(BaseComm):
    def publish_msg(self, msg_type, data=None, metadata=None, buffers=None, **keys):
        pass


@pytest.fixture
def shell():
    ip = InteractiveShell.instance()
    ip.extension_manager.load_extension("autograd_magic")
    return ip


@pytest.fixture
def kernel(monkeypatch):
    import comm

    monkeypatch.setattr(comm, "create_comm", SilentComm)
    monkeypatch.setattr(display, "_in_kernel", lambda shell: True)


def leaky_trace(steps: int) -> autograd_magic.Trace:
    with autograd_magic.track() as trace:
        w = torch.ones(4, requires_grad=True)
        kept = [(w * i).exp().sum() for i in range(steps)]
    del kept
    return trace


def test_a_loaded_trace_as_a_cell_value_shows_the_panel(shell, kernel):
    loaded = autograd_magic.Trace.from_json(leaky_trace(3).to_json())
    data, _ = shell.display_formatter.format(loaded)
    assert WIDGET in data
    assert "`kept` holds 3 tensors" in data["text/html"]
    assert data["text/html"].count("data:image/png;base64,") == 2
    assert data["text/plain"].startswith("autograd_magic trace (finished)")


def test_outside_a_kernel_a_trace_shows_its_text_report(shell):
    data, _ = shell.display_formatter.format(leaky_trace(2))
    assert list(data) == ["text/plain"] and "`kept` holds 2 tensors" in data["text/plain"]


def test_show_several_traces_side_by_side(shell, kernel):
    before, after = leaky_trace(2), leaky_trace(5)
    with capture_output() as captured:
        autograd_magic.show(before, after, names=["before", "after"])
    (output,) = captured.outputs
    page = output.data["text/html"]
    assert WIDGET in output.data and "Traces side by side" in page
    assert "<h2>before</h2>" in page and "<h2>after</h2>" in page
    assert "`kept` holds 2 tensors" in page and "`kept` holds 5 tensors" in page
    assert "before" in output.data["text/plain"] and "after" in output.data["text/plain"]


def test_show_outside_ipython_prints_text(capsys, monkeypatch):
    monkeypatch.setattr(display, "_shell", lambda: None)
    autograd_magic.show(leaky_trace(2))
    assert "`kept` holds 2 tensors" in capsys.readouterr().out
    with pytest.raises(TypeError, match="Trace objects, not int"):
        autograd_magic.show(3)


def test_importing_in_a_running_ipython_registers_the_display(shell):
    formatter = shell.display_formatter.mimebundle_formatter
    formatter.pop(model.Trace)  # registered for the records' class: users' traces subclass it
    assert shell.display_formatter.format(leaky_trace(2))[0].keys() == {"text/plain"}
    assert "holds" not in shell.display_formatter.format(leaky_trace(2))[0]["text/plain"]
    autograd_magic._register_in_running_ipython()
    assert (
        "`kept` holds 2 tensors" in shell.display_formatter.format(leaky_trace(2))[0]["text/plain"]
    )
