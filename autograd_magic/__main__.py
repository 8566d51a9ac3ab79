"""`python -m autograd_magic run|report ...`: see `autograd_magic.cli`."""

from __future__ import annotations

import sys

from autograd_magic.cli import main

if __name__ == "__main__":
    sys.exit(main())
