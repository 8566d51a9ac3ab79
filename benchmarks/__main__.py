"""`python -m benchmarks`: run the suite (see `benchmarks.run`)."""

from __future__ import annotations

from benchmarks.run import main

raise SystemExit(main())
