"""Hugging Face `transformers` models from random configs (no download), built and trained inside
a block: they run exactly as untracked and the trace names their layers. Skipped without the
package (it is not a dependency)."""

from __future__ import annotations

import contextlib

import pytest
import torch

import autograd_magic as am

transformers = pytest.importorskip("transformers")


def _bert_steps(tracked: bool) -> tuple[list[float], list[torch.Tensor], am.Trace | None]:
    """Build a small BERT classifier and run 3 AdamW steps, all inside one block if `tracked`."""
    torch.manual_seed(0)
    recorder = am.track() if tracked else contextlib.nullcontext()
    with recorder as trace:
        config = transformers.BertConfig(
            vocab_size=200,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
        )
        model = transformers.BertForSequenceClassification(config)  # embeddings with padding_idx
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        ids = torch.randint(0, 200, (4, 16))
        labels = torch.randint(0, 2, (4,))
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()], trace


def test_a_bert_built_and_trained_inside_a_block_runs_as_untracked():
    losses, params, _ = _bert_steps(tracked=False)
    tracked_losses, tracked_params, trace = _bert_steps(tracked=True)
    assert tracked_losses == losses
    assert all(torch.equal(a, b) for a, b in zip(tracked_params, params, strict=True))
    assert trace is not None and trace.error is None
    assert trace.blindspots == [] and trace.findings == []  # a correct loop: nothing to report
    assert len(trace.backward_calls) == 3
    assert "model.bert.encoder.layer.0.attention.self" in {m.path for m in trace.modules()}
    # The loss module BERT makes inside each forward has no name: one row by its class.
    assert trace.module_calls["CrossEntropyLoss"] == 3
    assert not [path for path in trace.module_calls if path.startswith("<")]
