"""Re-run the library suites recorded in BASELINE.md: each library's own tests, at the commit of
its release tag, untracked twice and tracked once (run_suite.py), with the subset the baseline
used. Not collected by pytest and not run in CI: the tests come from the libraries' repositories.

    python tests/suites/run_libraries.py CHECKOUTS [--out DIR] [NAME ...]

CHECKOUTS holds one folder per library (einops, torchmetrics, opacus, tensordict, captum), each the
library's repository at the commit below (`git archive COMMIT | tar x -C CHECKOUTS/NAME`; for
tensordict only `test` and `pytest.ini`). Run it with a
Python that has torch, autograd_magic, pytest, pytest-xdist, pytest-timeout and the libraries at
the versions below installed (BASELINE.md lists the commands).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from run_suite import compare_suite, render

# Fewer and fixed hypothesis examples for opacus: the two runs draw the same inputs and the suite
# fits a few minutes (its own settings draw 100 random examples per test).
OPACUS_CONFTEST = """from hypothesis import settings

settings.register_profile("suite", max_examples=5, derandomize=True, deadline=None)
settings.load_profile("suite")
"""

# Their files that import torchvision: no torchvision build matches torch 2.13.0 here.
OPACUS_IGNORED = [
    "grad_sample_module_fast_gradient_clipping_test.py",
    "grad_sample_module_test.py",
    "gradient_accumulation_test.py",
    "module_validator_test.py",
    "privacy_engine_test.py",
]

CAPTUM_FILES = [
    "deeplift_basic",
    "guided_backprop",
    "deconvolution",
    "hook_removal",
    "integrated_gradients_basic",
    "saliency",
    "input_x_gradient",
    "gradient_shap",
    "lrp",
    "guided_grad_cam",
]

# name -> (version, commit of its tests, pytest arguments, environment)
SUITES: dict[str, tuple[str, str, list[str], dict[str, str]]] = {
    "einops": (
        "0.8.2",
        "8e911db71f2e693a0c434b041180388c685ed06f",
        ["einops/tests"],
        {"EINOPS_TEST_BACKENDS": "torch,numpy"},
    ),
    "torchmetrics": (
        "1.9.0",
        "700261d3683ba77517e9650043f62a8313027437",
        [
            "--color=no",
            "tests/unittests/bases",
            "--ignore=tests/unittests/bases/test_ddp.py",
            "tests/unittests/regression/test_cosine_similarity.py",
            "tests/unittests/regression/test_explained_variance.py",
            "tests/unittests/regression/test_r2.py",
        ],
        {},
    ),
    "opacus": (
        "1.5.4",
        "f3752c3ad0fcac0f0a2690e67e8cc3ff14c133e4",
        ["opacus/tests", *(f"--ignore=opacus/tests/{name}" for name in OPACUS_IGNORED)],
        {},
    ),
    # Only test/ and pytest.ini of its checkout: its package folder would shadow the installed
    # build (with the compiled tensordict._C).
    "tensordict": (
        "0.14.0",
        "54a510733bbe3901821b0c958b9f59ad12d2ba24",
        [
            "test/nn/test_functorch.py",
            "test/nn/test_nn.py",
            "test/tensordict/test_generic.py",
            "test/tensorclass/test_tensorclass.py",
        ],
        {},
    ),
    "captum": (
        "0.8.0",
        "fc17d5070c5447593749ce28f9602c7ae58d54ac",
        [f"tests/attr/test_{name}.py" for name in CAPTUM_FILES],
        {},
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", type=Path)
    parser.add_argument("--out", type=Path, default=Path("suites_out"))
    parser.add_argument("names", nargs="*", default=list(SUITES))
    args = parser.parse_intermixed_args()
    for name in args.names:
        if name == "opacus":
            (args.checkouts / name / "conftest.py").write_text(OPACUS_CONFTEST)
        version, commit, pytest_args, env = SUITES[name]
        os.environ.update(env)
        source = f"{name} {version}, tests at {commit}"
        cwd, out = (args.checkouts / name).resolve(), (args.out / name).resolve()
        result = compare_suite(pytest_args, cwd, out, plain_twice=True, source=source)
        print(render(result, source))


if __name__ == "__main__":
    main()
