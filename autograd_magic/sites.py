"""Line attribution: the innermost frame outside torch, autograd_magic and the standard library.

One short walk up the stack per recorded event; results are interned so repeated lines cost a
dict lookup. No frame object is kept (frames hold the user's locals).
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import CodeType

import torch

from autograd_magic.records import UNKNOWN_SITE, Site

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_PREFIXES: tuple[str, ...] = tuple(
    {
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        _PACKAGE_DIR + os.sep,
        sysconfig.get_paths()["stdlib"] + os.sep,
        sysconfig.get_paths()["platstdlib"] + os.sep,
        "<frozen ",
    }
)
# Not user code either: frames of the notebook machinery around a cell.
_TOOLING_PACKAGES = ("IPython", "ipykernel", "traitlets", "tornado", "zmq", "jupyter_client")


def is_library_file(filename: str) -> bool:
    """True for files whose frames never count as the user's line."""
    if filename.startswith(_LIBRARY_PREFIXES):
        return True
    parts = filename.split(os.sep)
    return "site-packages" in parts and any(p in parts for p in _TOOLING_PACKAGES)


class SiteFinder:
    """Finds and interns the user's source position for the event being recorded."""

    def __init__(self, home_code: CodeType | None = None) -> None:
        self.home_code = home_code
        self._library: dict[str, bool] = {}
        self._interned: dict[tuple[str, str, int, int | None], Site] = {}
        self._home_sites: dict[int, Site] = {}

    def here(self, skip: int = 1) -> Site:
        """The site of the calling event, looked up `skip` frames above this call."""
        frame = sys._getframe(skip + 1)
        library = self._library
        while frame is not None:
            filename = frame.f_code.co_filename
            hit = library.get(filename)
            if hit is None:
                hit = library[filename] = is_library_file(filename)
            if not hit:
                break
            frame = frame.f_back
        if frame is None:
            return UNKNOWN_SITE
        code = frame.f_code
        line = frame.f_lineno
        home = self.home_code
        if code is home:
            # The common case (an op on a line of the traced code itself): no key to build.
            by_line = self._home_sites
            site = by_line.get(line)
            if site is None:
                site = by_line[line] = Site(code.co_filename, line, code.co_name, None)
            return site
        outer = None
        if home is not None:
            outer_frame = frame.f_back
            while outer_frame is not None and outer_frame.f_code is not home:
                outer_frame = outer_frame.f_back
            if outer_frame is not None:
                outer = outer_frame.f_lineno
        key = (code.co_filename, code.co_name, line, outer)
        site = self._interned.get(key)
        if site is None:
            site = self._interned[key] = Site(key[0], key[2], key[1], outer)
        return site
