"""The recorder: instruments autograd while a block runs and writes what happens into a Trace."""

from autograd_magic.recorder.core import Recorder
from autograd_magic.recorder.writer import TraceWriter

__all__ = ["Recorder", "TraceWriter"]
