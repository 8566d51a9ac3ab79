"""Run PyTorch's own test/test_autograd.py twice, plainly and with every test inside
`autograd_magic.track()`, and list the tests whose outcome or failure text differs tracked.

Not collected by pytest (its name does not start with `test_`) and not run in CI: PyTorch's test
file is not part of this repository; pass its path. Usage, from the repository root:

    python tests/torch_suite/run_test_autograd.py PATH/test_autograd.py [--out DIR]
        [--timeout SECONDS] [-k EXPR] [--budget SECONDS]

The file is copied into a scratch folder beside an empty pytest.ini (so this project's pytest
settings do not apply) and handed to tests/suites/run_suite.py, which runs it in two fresh pytest
processes (the tracked one with tests/suites/track_plugin.py) and compares them test by test;
`summary.json` and `summary.md` land in the output folder.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "suites"))

from run_suite import compare_suite  # tests/suites is not a package: found by the path above


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_file", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--timeout", type=int, default=300, help="per test, seconds")
    parser.add_argument("--budget", type=int, default=2400, help="per run, seconds")
    parser.add_argument("-k", default="")
    args = parser.parse_args()
    work = (args.out or Path(tempfile.mkdtemp(prefix="torch_suite_"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.test_file, work / "test_autograd.py")
    (work / "pytest.ini").write_text("[pytest]\n")
    pytest_args = ["test_autograd.py", *(["-k", args.k] if args.k else [])]
    opts = {"timeout": args.timeout, "budget": args.budget, "source": str(args.test_file)}
    compare_suite(pytest_args, work, work, **opts)
    print((work / "summary.md").read_text())
    print(f"logs and JUnit XML in {work}")


if __name__ == "__main__":
    main()
