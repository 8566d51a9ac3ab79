"""The benchmark suite: autograd_magic's overhead against untracked runs and torch.profiler.

Run it with `python -m benchmarks` (or `python benchmarks/run.py`) from the repository root; it
prints a table and rewrites `BENCHMARKS.md`. `--quick` runs everything once at small sizes.
"""
