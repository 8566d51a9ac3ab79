"""Types of the compiled counted-step hooks (autograd_magic/_counted.c)."""

from types import FrameType
from typing import Any

import torch

class Packer:
    frame: FrameType | None
    module: str
    packed: int
    released: int
    packed_bytes: int
    released_bytes: int
    peak: int
    roots_died: int
    pile_limit: int
    on_pile: Any
    def root_tag(self) -> object: ...
    def __init__(self, live: dict[int, list[Any]], peek: Any) -> None: ...
    def __call__(self, tensor: torch.Tensor) -> CountedSaved: ...

class CountedSaved:
    version: int
    buffer_id: int
    @property
    def tensor(self) -> torch.Tensor: ...
    @property
    def held_in_slot(self) -> bool: ...

def configure(**hooks: Any) -> None: ...
def unpack(packed: Any) -> torch.Tensor: ...
