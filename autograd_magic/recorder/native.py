"""Whether the compiled per-event helpers (`autograd_magic._native`) are in use, and why not.

The extension is optional: a build without a compiler, an unusual platform, or
`AUTOGRAD_MAGIC_PURE_PYTHON=1` in the environment leaves the pure-Python recorder, which records
the same `Trace` (tests/test_native.py runs the differential suite both ways). A missing build
says so in one warning, at import (pip shows the build's own warning only with -v); forcing the
fallback with the variable is silent. `STATUS` says which recorder runs.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from types import ModuleType

from autograd_magic.recorder.caller import STAND_IN_NAME
from autograd_magic.recorder.frames import PACKAGE_DIR

PURE_PYTHON_ENV = "AUTOGRAD_MAGIC_PURE_PYTHON"


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None, f"pure Python ({PURE_PYTHON_ENV} is set)"
    try:
        _native = importlib.import_module("autograd_magic._native")
        counted = importlib.import_module("autograd_magic._counted")
    except ImportError as error:
        return None, f"pure Python (the compiled recorder was not built or does not load: {error})"
    if _native.STAND_IN_NAME != STAND_IN_NAME or not hasattr(counted, "Packer"):
        # a stale build from another version
        return None, "pure Python (the compiled recorder is stale: reinstall autograd_magic)"
    global COUNTED
    COUNTED = counted
    return _native, "compiled (autograd_magic._native)"


def _importer_level() -> int:
    """The `stacklevel` of the first frame outside this package: the user's `import
    autograd_magic` (or `%load_ext`), where the warning belongs. The import machinery's frames
    are not counted: `warnings` skips them itself."""
    level, frame = 2, sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not ("importlib" in name and "_bootstrap" in name):
            if not name.startswith(PACKAGE_DIR):
                break
            level += 1
        frame = frame.f_back  # type: ignore[assignment]
    return level


# The compiled counted steps (autograd_magic._counted, built with _native): set by `_load`.
COUNTED: ModuleType | None = None
NATIVE, STATUS = _load()
if NATIVE is None and "not built" in STATUS:
    warnings.warn(
        f"autograd_magic's compiled recorder is not in use: {STATUS}. Recording works and gives "
        "the same traces, only slower; reinstall with a C compiler to get it back.",
        RuntimeWarning,
        stacklevel=_importer_level(),
    )
