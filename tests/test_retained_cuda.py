"""On CUDA, retained bytes match the allocator: deleting a graph's only root frees exactly what
`trace.retained_bytes` claimed (issue 21). Needs a GPU, so it never runs in CI; run it on a CUDA
machine with `PYTHONPATH=. python -m pytest tests/test_retained_cuda.py`. Cases and numbers are
benchmark row 8's (benchmarks/accuracy.py): a conv net, BERT-base and GPT-2 small from random
configs with dropout on, BERT-base under bf16 autocast, a conv net under fp16 autocast."""

from __future__ import annotations

import pytest
import torch

from benchmarks import accuracy

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("case", accuracy.CASES, ids=lambda c: c.name)
def test_retained_bytes_are_what_the_allocator_frees(case):
    result = accuracy.measure_case(case, quick=False)
    if result is None:
        pytest.skip("transformers not installed")
    retained, drop = result
    assert drop > 0
    assert retained == pytest.approx(drop, rel=0.01)
