"""Types of the compiled per-event helpers (autograd_magic/_native.c)."""

from types import CodeType
from typing import TypeVar

from autograd_magic.model.records import Site

_T = TypeVar("_T")

STAND_IN_NAME: str

def untrack(record: _T) -> _T: ...

class NodeTag:
    node_id: int
    def __getitem__(self, index: int) -> object: ...
    def __len__(self) -> int: ...

def node_tag(writer_ref: object, node_id: int) -> NodeTag: ...
def set_death_reporter(report: object) -> None: ...

class SiteCache:
    home_code: CodeType | None
    def __init__(
        self,
        home_code: CodeType | None,
        library: dict[str, bool],
        is_library: object,
        interned: dict[tuple[str, str, int, int | None], Site],
        site_type: type[Site],
        unknown: Site,
    ) -> None: ...
    def here(self, skip: int = 1) -> Site: ...
    def clear(self) -> None: ...
    def size(self) -> int: ...
