"""A failing `%%trackgraph` cell shows the traceback a plain cell shows: the user's frames and
PyTorch's, never the recorder's, nor torch's dispatch to the recorder's mode."""

from __future__ import annotations

import re

import pytest
from IPython.utils.capture import capture_output

SAVED_TENSOR_WRITTEN = """\
x = torch.ones(3, requires_grad=True)
y = x.exp()
y.add_(1)
y.sum().backward()
"""
BAD_DIM_IN_A_PYTHON_TORCH_FUNCTION = """\
x = torch.ones(3, requires_grad=True)
y = torch.nn.functional.softmax(x * 2, dim=4)
"""
ERROR_IN_A_HOOK = """\
x = torch.ones(3, requires_grad=True)
y = x * 2
y.register_hook(lambda grad: 1 / 0)
y.sum().backward()
"""


# The frame of IPython's own code that calls every cell magic. IPython 8 shows it in the
# traceback of any cell magic that raises (`%%writefile` into a missing folder, a magic that
# execs its cell: `Cell In[n], line 1`, then this frame, then the magic's); IPython 9 leaves
# every frame of IPython's own modules out of a traceback (VerboseTB.get_records).
RUN_CELL_MAGIC = re.compile(
    r"File \S+[/\\]IPython[/\\]core[/\\]interactiveshell\.py:\d+, "
    r"in InteractiveShell\.run_cell_magic\("
)


def _frames(shell, cell: str) -> list[str]:
    """Where the traceback of `cell` points, frame by frame ('Cell In[n]' made cell-neutral),
    without IPython 8's frame of `InteractiveShell.run_cell_magic` (IPython's, for any magic)."""
    with capture_output() as captured:
        shell.run_cell(cell)
    text = captured.stdout + captured.stderr
    frames = re.findall(r"^(?:File \S+:\d+, in \S+|Cell In\[\d+\], line \d+)", text, re.M)
    assert frames, text
    return [re.sub(r"Cell In\[\d+\]", "Cell", f) for f in frames if not RUN_CELL_MAGIC.match(f)]


@pytest.mark.parametrize(
    "cell", [SAVED_TENSOR_WRITTEN, BAD_DIM_IN_A_PYTHON_TORCH_FUNCTION, ERROR_IN_A_HOOK]
)
def test_a_failing_cell_shows_the_frames_a_plain_cell_shows(shell, cell):
    """GIVEN a cell that fails in backward (a saved tensor written in place, a user hook) or in a
    torch function written in Python WHEN it runs under %%trackgraph THEN its traceback lists the
    same frames as the plain cell's, after the one line that calls the magic."""
    plain = _frames(shell, cell)
    tracked = _frames(shell, "%%trackgraph --text\n" + cell)
    assert tracked[0] == "Cell, line 1"  # get_ipython().run_cell_magic(...)
    assert tracked[1:] == plain
    assert not [f for f in tracked if "autograd_magic" in f or "overrides.py" in f]
