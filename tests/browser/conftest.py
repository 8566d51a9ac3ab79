"""The JupyterLab server and Chromium page fixtures of test_lab.py, for every browser test here."""

from test_lab import lab, page  # noqa: F401 (fixtures, found by name)
