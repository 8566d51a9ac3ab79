"""Training through the libraries users train with (Hugging Face transformers and its Trainer,
Lightning, accelerate, peft), each run untracked and tracked in fresh processes: the same weights,
losses and gradients bit for bit, the same exception and the same warnings.

The runs live in tests/library_cases.py; each prints a digest. A case whose library is not
installed is skipped (none of them is a dependency). Tests from a random config: no download.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Fresh processes per case: part of CI; `-m "not slow"` leaves them out while developing.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
CASES = REPO / "tests" / "library_cases.py"

# case name -> the packages it needs (any one of a tuple will do)
NEEDS: dict[str, list[tuple[str, ...]]] = {
    "hf_gpt2_steps": [("transformers",)],
    "hf_bert_masked_lm_steps": [("transformers",)],
    "hf_trainer_gradient_checkpointing": [("transformers",), ("accelerate",)],
    "hf_trainer_non_reentrant_checkpointing": [("transformers",), ("accelerate",)],
    "lightning_fit": [("lightning", "pytorch_lightning")],
    "accelerate_prepare_backward": [("accelerate",)],
    "peft_lora_steps": [("transformers",), ("peft",)],
}


def _skip_without(needs: list[tuple[str, ...]]) -> None:
    # find_spec, not importorskip: importing these libraries into the test process would cost
    # seconds and patch torch for every later test; the cases import them in their own process.
    for choices in needs:
        if not any(importlib.util.find_spec(name) is not None for name in choices):
            pytest.skip(f"{' or '.join(choices)} is not installed")


def _run(case: str, mode: str) -> dict:
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [sys.executable, str(CASES), case, mode],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"{case} {mode} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", sorted(NEEDS))
def test_a_library_training_run_is_the_same_tracked(case: str) -> None:
    """GIVEN a seeded training run through a library, in a fresh process
    WHEN it runs once untracked and once inside `autograd_magic.track()`
    THEN weights, losses and gradients hash alike, and exceptions and warnings are the same."""
    _skip_without(NEEDS[case])
    plain, tracked = _run(case, "plain"), _run(case, "tracked")
    assert plain["error"] is None, plain["error"]
    assert tracked["error"] == plain["error"]
    assert tracked["warnings"] == plain["warnings"]
    assert tracked["digests"] == plain["digests"]
    assert tracked["trace"]["error"] is None
    assert tracked["trace"]["backward_calls"] > 0  # the block did record the training
