"""Training runs through the libraries users train with, each printed as a JSON digest.

`python tests/library_cases.py CASE plain|tracked` runs one case in this fresh process, the whole
case inside `autograd_magic.track()` when tracked, and prints one JSON line last: a sha256 per
result (weights, losses, gradients), the exception (type and message) if one escaped, and every
warning (category and message, counted). tests/test_libraries.py compares the two modes. Models
come from small random configs: nothing is downloaded.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import random
import sys
import tempfile
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

import autograd_magic as am

CASES: dict[str, Callable[[], dict[str, Any]]] = {}


def case(fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    CASES[fn.__name__] = fn
    return fn


def digest(obj: Any) -> str:
    """sha256 over tensors' dtype, shape and bytes, and over the repr of anything else."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous().reshape(-1)
            h.update(f"{t.dtype}{tuple(x.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        elif isinstance(x, dict):
            for key in sorted(x):
                h.update(str(key).encode())
                feed(x[key])
        elif isinstance(x, (list, tuple)):
            for item in x:
                feed(item)
        else:
            h.update(repr(x).encode())

    feed(obj)
    return h.hexdigest()


def state(model: nn.Module) -> dict[str, Any]:
    """Weights and gradients by parameter name."""
    named = list(model.named_parameters())
    return {
        "weights": {n: p for n, p in named},
        "grads": {n: p.grad for n, p in named if p.grad is not None},
    }


def _tiny_gpt2(**overrides: Any) -> Any:
    import transformers

    config = transformers.GPT2Config(
        vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=4, **overrides
    )
    return transformers.GPT2LMHeadModel(config)


def _language_model_steps(model: Any, optimizer: Any, steps: int = 3) -> list[torch.Tensor]:
    """`steps` optimizer steps of next-token loss on one random batch; the losses."""
    ids = torch.randint(0, 100, (4, 16))
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


@case
def hf_gpt2_steps() -> dict[str, Any]:
    """GPT-2 language model, dropout on (train mode), 3 AdamW steps."""
    model = _tiny_gpt2()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = _language_model_steps(model, optimizer)
    try:  # a token id past the vocabulary: the embedding's own error must come through as is
        model(input_ids=torch.tensor([[100]]))
        raised = None
    except IndexError as exc:
        raised = f"IndexError: {exc}"
    return {"losses": losses, "raised": raised, **state(model)}


@case
def hf_bert_masked_lm_steps() -> dict[str, Any]:
    """BERT masked LM with padding and an attention mask, dropout on, clipped SGD steps."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    model = transformers.BertForMaskedLM(config)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ids = torch.randint(1, 120, (4, 12))
    mask = torch.ones_like(ids)
    ids[:, 9:], mask[:, 9:] = 0, 0  # padded tails
    labels = torch.full_like(ids, -100)
    labels[:, 2:5] = ids[:, 2:5]
    losses = []
    for _ in range(3):
        optimizer.zero_grad()
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach())
    return {"losses": losses, **state(model)}


def _trainer_steps(**checkpointing: Any) -> dict[str, Any]:
    import transformers

    model = _tiny_gpt2()
    calls = [0]  # user code in the forward: checkpointing runs it again in backward

    def count(*_: Any) -> None:
        calls[0] += 1

    model.transformer.h[0].mlp.register_forward_pre_hook(count)
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 100, (12, 16))]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=3,
            per_device_train_batch_size=4,
            learning_rate=1e-3,
            gradient_checkpointing=True,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            logging_strategy="no",
            disable_tqdm=True,
            seed=0,
            **checkpointing,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
        result = trainer.train()
    # The Trainer clears gradients after its last step: weights and the loss are what is left.
    return {
        "loss": result.training_loss,
        "checkpointing": model.is_activation_checkpointing,
        "mlp_forward_calls": calls[0],
        **state(model),
    }


@case
def hf_trainer_gradient_checkpointing() -> dict[str, Any]:
    """`transformers.Trainer` for 3 steps with gradient checkpointing, on the CPU."""
    return _trainer_steps()


@case
def hf_trainer_non_reentrant_checkpointing() -> dict[str, Any]:
    """The same with `use_reentrant=False`: PyTorch's checkpoint then packs every saved
    tensor with its own hooks and recomputes the forward when one is unpacked."""
    return _trainer_steps(gradient_checkpointing_kwargs={"use_reentrant": False})


@case
def lightning_fit() -> dict[str, Any]:
    """A Lightning module with dropout fitted for 4 steps on the CPU."""
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 1))
            self.losses: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.detach())
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    module = Regressor()
    with tempfile.TemporaryDirectory() as root:
        trainer = pl.Trainer(
            max_steps=4,
            accelerator="cpu",
            devices=1,
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(module, loader)
    return {"losses": module.losses, **state(module)}


@case
def accelerate_prepare_backward() -> dict[str, Any]:
    """`accelerate.Accelerator` prepares model, optimizer and loader; 4 steps through its
    `backward`, with gradient clipping."""
    import accelerate

    accelerator = accelerate.Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.detach())
    return {"losses": losses, **state(accelerator.unwrap_model(model))}


@case
def peft_lora_steps() -> dict[str, Any]:
    """peft LoRA adapters on a tiny GPT-2; only the adapters train, 3 steps."""
    import peft

    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["c_attn"])
    model = peft.get_peft_model(_tiny_gpt2(), config)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-2)
    losses = _language_model_steps(model, optimizer)
    return {"losses": losses, "trainable": len(trainable), **state(model)}


def run(name: str, tracked: bool) -> dict[str, Any]:
    """Run one case, seeded, and summarize what a user could see."""
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    report: dict[str, Any] = {"digests": None, "error": None, "trace": None}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        block = am.track() if tracked else contextlib.nullcontext()
        try:
            with block as trace:
                results = CASES[name]()
            report["digests"] = {key: digest(value) for key, value in results.items()}
        except Exception as exc:
            report["error"] = [type(exc).__name__, str(exc)]
        if tracked:
            report["trace"] = {"error": trace.error, "backward_calls": len(trace.backward_calls)}
    seen = collections.Counter(f"{w.category.__name__}: {w.message}" for w in caught)
    report["warnings"] = sorted(f"{n} x {text}" for text, n in seen.items())
    return report


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.set_num_threads(1)  # both modes alike; keeps the comparison free of thread timing
    print(json.dumps(run(sys.argv[1], tracked=sys.argv[2] == "tracked")))
