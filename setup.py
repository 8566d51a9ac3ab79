"""Builds the optional compiled recorder (autograd_magic/_native.c); everything else is in
pyproject.toml.

The extension is optional: where it cannot be compiled (no compiler, no Python headers, an
unusual platform) the install goes on without it, says so in one warning, and autograd_magic
runs its pure-Python recorder, which records the same traces.
"""

from __future__ import annotations

import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """`build_ext` that never fails the install: a failed build leaves the pure-Python recorder."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # no compiler at all fails here, before any extension
            _fell_back(error)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            _fell_back(error)


def _fell_back(error: Exception) -> None:
    message = (
        "WARNING: autograd_magic's compiled recorder (autograd_magic._native) could not be "
        f"built ({type(error).__name__}: {error}); installing the pure-Python recorder, which "
        "records the same traces, only slower. Install a C compiler and the Python headers, "
        "then reinstall, to get the compiled one."
    )
    print(message, file=sys.stderr)


setup(
    ext_modules=[
        Extension(
            "autograd_magic._native",
            sources=["autograd_magic/_native.c"],
            optional=True,
        ),
        Extension(
            "autograd_magic._counted",
            sources=["autograd_magic/_counted.c"],
            optional=True,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
