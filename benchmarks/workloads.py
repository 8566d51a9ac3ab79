"""The timed workloads: tiny-op loop, MLP, small CNN and LSTM steps on CPU, a larger CNN on CUDA.

Each builder returns a `Workload` whose `step()` runs one unit of work (models, optimizers and
inputs are built once, outside the timing). `quick=True` gives the same code at toy sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Workload:
    """One unit of work to time: `step()` runs it once; `device` is where it runs."""

    key: str
    title: str
    details: str
    step: Callable[[], None]
    device: str = "cpu"


def tiny_loop(quick: bool = False) -> Workload:
    """2,000 elementwise ops on a 16-element tensor (mul, add, sin, tanh), then backward."""
    ops = 40 if quick else 2000
    x = torch.randn(16, requires_grad=True)

    def step() -> None:
        y = x
        for _ in range(ops // 4):
            y = (y * 1.0001 + 0.001).sin().tanh()
        y.sum().backward()
        x.grad = None

    details = f"{ops} elementwise ops (mul, add, sin, tanh cycled) on 16 floats, then backward"
    return Workload("1", "tiny-op loop", details, step)


def _training_step(
    model: nn.Module, inputs: torch.Tensor, loss_of: Callable[[torch.Tensor], torch.Tensor]
) -> Callable[[], None]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model(inputs))
        loss.backward()
        optimizer.step()

    return step


def mlp(quick: bool = False) -> Workload:
    """MLP training step: batch 64, three Linear(512, 512) layers with ReLU, MSE, SGD."""
    batch, width = (8, 32) if quick else (64, 512)
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
    )
    inputs, target = torch.randn(batch, width), torch.randn(batch, width)
    step = _training_step(model, inputs, lambda out: F.mse_loss(out, target))
    details = f"batch {batch}, 3 x Linear({width}, {width}) + ReLU, MSE loss, SGD step"
    return Workload("2", "MLP training step", details, step)


def _cnn(channels: tuple[int, int, int], image: int, classes: int = 10) -> nn.Module:
    c0, c1, c2 = channels
    return nn.Sequential(
        nn.Conv2d(3, c0, 3, padding=1),
        nn.BatchNorm2d(c0),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c0, c1, 3, padding=1),
        nn.BatchNorm2d(c1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(c2, classes),
    )


def cnn(quick: bool = False) -> Workload:
    """Small CNN training step: batch 16, 3x32x32 images, 3 conv blocks, cross-entropy, SGD."""
    batch, image, channels = (2, 8, (4, 8, 8)) if quick else (16, 32, (32, 64, 128))
    torch.manual_seed(0)
    model = _cnn(channels, image)
    inputs, labels = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    step = _training_step(model, inputs, lambda out: F.cross_entropy(out, labels))
    details = (
        f"batch {batch}, 3x{image}x{image} images, conv {channels} with BatchNorm/ReLU/MaxPool, "
        "linear head, cross-entropy, SGD step"
    )
    return Workload("3", "small CNN training step", details, step)


def lstm(quick: bool = False) -> Workload:
    """Truncated-BPTT LSTM step: seq 35, batch 20, hidden 200; hidden state carried, detached."""
    seq, batch, hidden, vocab = (4, 2, 8, 50) if quick else (35, 20, 200, 1000)
    torch.manual_seed(0)
    embed, rnn, head = (
        nn.Embedding(vocab, hidden),
        nn.LSTM(hidden, hidden),
        nn.Linear(hidden, vocab),
    )
    params = [*embed.parameters(), *rnn.parameters(), *head.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.1)
    tokens = torch.randint(0, vocab, (seq + 1, batch))
    state = [torch.zeros(1, batch, hidden), torch.zeros(1, batch, hidden)]

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        h, c = (t.detach() for t in state)  # truncated BPTT: cut the graph at the window edge
        out, (h, c) = rnn(embed(tokens[:-1]), (h, c))
        loss = F.cross_entropy(head(out).view(-1, vocab), tokens[1:].reshape(-1))
        loss.backward()
        nn.utils.clip_grad_norm_(params, 0.25)
        optimizer.step()
        state[:] = [h, c]

    details = (
        f"seq {seq}, batch {batch}, 1-layer LSTM hidden {hidden}, embedding and head over "
        f"{vocab} tokens, hidden state detached each step, grad clipping, SGD"
    )
    return Workload("4", "LSTM truncated-BPTT step", details, step)


def cuda_cnn(quick: bool = False) -> Workload:
    """The CNN, larger, on CUDA: batch 64, 3x64x64 images; the step ends with a synchronize."""
    batch, image, channels = (2, 8, (4, 8, 8)) if quick else (64, 64, (64, 128, 256))
    torch.manual_seed(0)
    model = _cnn(channels, image).cuda()
    inputs = torch.randn(batch, 3, image, image, device="cuda")
    labels = torch.randint(0, 10, (batch,), device="cuda")
    train = _training_step(model, inputs, lambda out: F.cross_entropy(out, labels))

    def step() -> None:
        train()
        torch.cuda.synchronize()

    details = f"batch {batch}, 3x{image}x{image} images, conv {channels}, on {gpu_name()}"
    return Workload("5", "CNN training step on CUDA", details, step, device="cuda")


def gpu_name() -> str:
    """The CUDA device's name, or '' without one."""
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""


def transformer(quick: bool = False) -> Workload:
    """Transformer training step from torch's own modules: nn.TransformerEncoder, 4 layers,
    d_model 128, batch 8 x 64 tokens, Adam (module attribution on: every op is in a module)."""
    layers, width, batch, tokens = (1, 16, 2, 4) if quick else (4, 128, 8, 64)
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(width, 4, 4 * width, batch_first=True, dropout=0.1)
    model = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    inputs = torch.randn(batch, tokens, width)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(inputs).pow(2).mean().backward()
        optimizer.step()

    details = (
        f"nn.TransformerEncoder, {layers} layers, d_model {width}, batch {batch} x {tokens} "
        "tokens, dropout 0.1, Adam step"
    )
    return Workload("9", "transformer training step", details, step)


def bert(quick: bool = False) -> Workload | None:
    """Hugging Face BERT training step from a random config (no download): 4 layers, hidden 128,
    batch 8 x 64 tokens, AdamW. None when `transformers` is not installed."""
    try:
        import transformers
    except ImportError:
        return None
    layers, hidden, batch, tokens = (1, 32, 2, 8) if quick else (4, 128, 8, 64)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=1000,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * hidden,
        max_position_embeddings=max(tokens, 64),
    )
    model = transformers.BertForMaskedLM(config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, 1000, (batch, tokens))

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()

    details = (
        f"Hugging Face BertForMaskedLM (random config), {layers} layers, hidden {hidden}, batch "
        f"{batch} x {tokens} tokens, AdamW; transformers {transformers.__version__}"
    )
    return Workload("11", "BERT training step (Hugging Face)", details, step)


# Issue 23's CUDA rows: (key, title, model family, layers, hidden, heads, batch, tokens).
HUGGING_FACE_CUDA: tuple[tuple[str, str, str, int, int, int, int, int], ...] = (
    ("13", "BERT-base training step on CUDA", "bert", 12, 768, 12, 16, 128),
    ("14", "GPT-2 small training step on CUDA", "gpt2", 12, 768, 12, 8, 256),
    ("15", "small BERT training step on CUDA", "bert", 4, 128, 4, 8, 64),
)


def hugging_face_cuda(key: str, quick: bool = False) -> Workload | None:
    """A Hugging Face model from a random config (no download) trained on CUDA with AdamW, as
    issue 23 measured it: the step ends with a synchronize. None without `transformers`."""
    try:
        import transformers
    except ImportError:
        return None
    _, title, family, layers, hidden, heads, batch, tokens = next(
        row for row in HUGGING_FACE_CUDA if row[0] == key
    )
    if quick:
        layers, hidden, heads, batch, tokens = 1, 32, 2, 2, 8
    torch.manual_seed(0)
    if family == "bert":
        vocab = transformers.BertConfig().vocab_size
        config = transformers.BertConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            intermediate_size=4 * hidden,
        )
        model = transformers.BertForMaskedLM(config)
    else:
        vocab = transformers.GPT2Config().vocab_size
        config = transformers.GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads)
        model = transformers.GPT2LMHeadModel(config)
    model = model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (batch, tokens), device="cuda")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        torch.cuda.synchronize()

    details = (
        f"Hugging Face {type(model).__name__} (random config), {layers} layers, hidden {hidden}, "
        f"batch {batch} x {tokens} tokens, AdamW, on {gpu_name()}; transformers "
        f"{transformers.__version__}"
    )
    return Workload(key, title, details, step, device="cuda")


def long_loop(quick: bool = False) -> Workload:
    """A small model's training step, timed as 1,000 steps in one block (a cell holding a long
    loop): per-event cost must not grow with the block."""
    width = 8 if quick else 64
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 1))
    inputs, target = torch.randn(16, width), torch.randn(16, 1)
    step = _training_step(model, inputs, lambda out: F.mse_loss(out, target))
    details = f"batch 16, Linear({width}) + ReLU + Linear, MSE, SGD; 1,000 steps per sample"
    return Workload("10", "1,000-step loop (small MLP)", details, step)


CPU_WORKLOADS: tuple[Callable[[bool], Workload], ...] = (
    tiny_loop,
    mlp,
    cnn,
    lstm,
    transformer,
    long_loop,
)
