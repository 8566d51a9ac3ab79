# The loops keep their sources' own style (zip without strict=), as the findings corpus does.
# ruff: noqa: B905
"""Corpus family `live` (issue 35, class 9): loops whose live autograd nodes vary from step to
step for good reasons (sequences of varying length, a warm-up, gradient accumulation, an
evaluation every few steps, normalising layers that rebuild a weight at every forward, a
no-grad key encoder and queue), run for 8 steps or more so that the live growth hint can be
timed on them, plus two growth bugs of the same families. Each names its public source."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import Case, Expect, seed
from markers import marker_lines
from torch.nn.utils.parametrizations import spectral_norm, weight_norm
from torch.nn.utils.rnn import pack_padded_sequence

import autograd_magic as am

line_of = marker_lines(__file__)
STEPS = 8


# ----- MoCo v2: a momentum key encoder and a queue of keys, both without grad -----------------
def moco_v2() -> am.Trace:
    # facebookresearch/moco moco/builder.py: _momentum_update_key_encoder and
    # _dequeue_and_enqueue under @torch.no_grad(), logits against the queue, CE on label 0
    seed()
    encoder_q = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    encoder_k = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    encoder_k.load_state_dict(encoder_q.state_dict())
    encoder_k.requires_grad_(False)
    queue = F.normalize(torch.randn(8, 32), dim=0)
    ptr = 0
    optimizer = torch.optim.SGD(encoder_q.parameters(), lr=0.03, momentum=0.9)
    with am.track() as trace:
        for _ in range(STEPS):
            x = torch.randn(4, 8)
            q = F.normalize(encoder_q(x + 0.1 * torch.randn_like(x)), dim=1)
            with torch.no_grad():
                for param_q, param_k in zip(encoder_q.parameters(), encoder_k.parameters()):
                    param_k.data = param_k.data * 0.999 + param_q.data * 0.001
                k = F.normalize(encoder_k(x + 0.1 * torch.randn_like(x)), dim=1)
            l_pos = torch.einsum("nc,nc->n", [q, k]).unsqueeze(-1)
            l_neg = torch.einsum("nc,ck->nk", [q, queue.clone().detach()])
            logits = torch.cat([l_pos, l_neg], dim=1) / 0.07
            loss = F.cross_entropy(logits, torch.zeros(4, dtype=torch.long))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                queue[:, ptr : ptr + 4] = k.T
                ptr = (ptr + 4) % 32
    return trace


# ----- packed variable-length sequences ---------------------------------------------------------
class PackedClassifier(nn.Module):
    """bentrevett/pytorch-sentiment-analysis "Upgraded Sentiment Analysis": an LSTM over packed
    padded sequences."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 8, padding_idx=0)
        self.rnn = nn.LSTM(8, 8, batch_first=True)
        self.fc = nn.Linear(8, 1)

    def forward(self, text: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        packed = pack_padded_sequence(self.embedding(text), lengths, batch_first=True)
        _, (hidden, _) = self.rnn(packed)
        return self.fc(hidden[-1]).squeeze(1)


def packed_batches() -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Batches of 4 sequences, 2 to 12 tokens long, sorted by length as pack_padded wants."""
    seed()
    batches = []
    for _ in range(STEPS):
        lengths = torch.from_numpy(np.sort(np.random.randint(2, 13, size=4))[::-1].copy())
        text = torch.randint(1, 20, (4, int(lengths[0])))
        batches.append((text, lengths, torch.randint(0, 2, (4,)).float()))
    return batches


def packed_sequences() -> am.Trace:
    model, data = PackedClassifier(), packed_batches()
    optimizer = torch.optim.Adam(model.parameters())
    with am.track() as trace:
        epoch_loss = 0.0
        for text, lengths, label in data:
            optimizer.zero_grad()
            predictions = model(text, lengths)
            loss = F.binary_cross_entropy_with_logits(predictions, label)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
    return trace


def packed_sequences_kept_logits() -> am.Trace:
    # the same loop collecting each batch's predictions for an epoch metric without .detach()
    # (discuss.pytorch.org "GPU memory keeps increasing when storing outputs for metrics")
    model, data = PackedClassifier(), packed_batches()
    optimizer = torch.optim.Adam(model.parameters())
    with am.track() as trace:
        all_predictions = []
        for text, lengths, label in data:
            optimizer.zero_grad()
            predictions = model(text, lengths)
            loss = F.binary_cross_entropy_with_logits(predictions, label)
            loss.backward()
            optimizer.step()
            all_predictions.append(predictions)  # L:LIVE_KEPT_PREDICTIONS
        accuracy = ((torch.cat(all_predictions) > 0).float().mean()).item()
        print(f"accuracy {accuracy:.2f}")
    return trace


# ----- AWD-LSTM: truncated BPTT of a varying length, repackaged hidden state -------------------
def awd_lstm_variable_bptt() -> am.Trace:
    # salesforce/awd-lstm-lm main.py train(): seq_len = max(5, int(np.random.normal(bptt, 5))),
    # lr scaled by seq_len / bptt, hidden = repackage_hidden(hidden), clip_grad_norm_
    seed()
    encoder, rnn, decoder = nn.Embedding(20, 8), nn.LSTM(8, 8), nn.Linear(8, 20)
    params = [*encoder.parameters(), *rnn.parameters(), *decoder.parameters()]
    optimizer = torch.optim.SGD(params, lr=1.0)
    train_data = torch.randint(0, 20, (120, 2))
    with am.track() as trace:
        hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
        i = 0
        while i < train_data.size(0) - 12 and i < 90:
            bptt = 8 if np.random.random() < 0.95 else 4
            seq_len = max(5, int(np.random.normal(bptt, 5)))
            data, targets = train_data[i : i + seq_len], train_data[i + 1 : i + 1 + seq_len]
            optimizer.param_groups[0]["lr"] = 1.0 * seq_len / bptt
            hidden = tuple(h.detach() for h in hidden)
            output, hidden = rnn(encoder(data), hidden)
            loss = F.cross_entropy(decoder(output).view(-1, 20), targets.reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 0.25)
            optimizer.step()
            i += seq_len
    return trace


# ----- normalising layers: weight_norm, spectral_norm, BatchNorm, LayerNorm --------------------
def weight_norm_convs() -> am.Trace:
    # jik876/hifi-gan models.py: Conv1d layers wrapped in weight_norm (the parametrized weight is
    # recomputed at every forward), leaky_relu between them, L1 loss on the output
    seed()
    convs = nn.Sequential(
        weight_norm(nn.Conv1d(1, 4, 3, padding=1)),
        nn.LeakyReLU(0.1),
        weight_norm(nn.Conv1d(4, 1, 3, padding=1)),
    )
    optimizer = torch.optim.AdamW(convs.parameters(), lr=2e-4, betas=(0.8, 0.99))
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.999)
    with am.track() as trace:
        for _ in range(STEPS):
            x = torch.randn(2, 1, 16)
            loss = F.l1_loss(convs(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
    return trace


def sngan_hinge() -> am.Trace:
    # christiancosgrove/pytorch-spectral-normalization-gan main.py: spectral_norm discriminator,
    # hinge loss, D updated on fake.detach(), then G (two backward calls a step)
    seed()
    disc = nn.Sequential(spectral_norm(nn.Linear(6, 16)), nn.LeakyReLU(0.1))
    disc.append(spectral_norm(nn.Linear(16, 1)))
    gen = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))
    optim_disc = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.0, 0.9))
    optim_gen = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.0, 0.9))
    with am.track() as trace:
        for _ in range(STEPS):
            data, z = torch.randn(8, 6), torch.randn(8, 4)
            optim_disc.zero_grad()
            disc_loss = F.relu(1.0 - disc(data)).mean() + F.relu(1.0 + disc(gen(z).detach())).mean()
            disc_loss.backward()
            optim_disc.step()
            optim_gen.zero_grad()
            gen_loss = -disc(gen(z)).mean()
            gen_loss.backward()
            optim_gen.step()
    return trace


def batchnorm_eval_every_k() -> am.Trace:
    # pytorch/examples mnist/main.py train() + test(): BatchNorm and Dropout, Adam (its state is
    # made at the first step), a linear warm-up (transformers get_linear_schedule_with_warmup),
    # and an evaluation under no_grad every 3 steps with model.eval()/model.train()
    seed()
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Dropout(0.25)
    )
    model.append(nn.Linear(4 * 6 * 6, 10))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 4))
    x_val, y_val = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    with am.track() as trace:
        for step in range(STEPS + 1):
            model.train()
            x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % 3 == 2:
                model.eval()
                with torch.no_grad():
                    val_loss = F.cross_entropy(model(x_val), y_val, reduction="sum").item()
                print(f"step {step} val {val_loss:.3f}")
    return trace


class PreNormBlock(nn.Module):
    """A pre-LayerNorm transformer block (karpathy/nanoGPT model.py Block)."""

    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(8), nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


def trainer_accumulation(keep_graph: bool = False) -> am.Trace:
    # huggingface/transformers Trainer._inner_training_loop: loss / gradient_accumulation_steps,
    # backward at each micro-batch, clip and step every 4, tr_loss += tr_loss_step.detach()
    seed()
    model = PreNormBlock()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    accumulation = 4
    with am.track() as trace:
        tr_loss = torch.tensor(0.0)
        for step in range(3 * accumulation):
            inputs = torch.randn(2, 5, 8)
            loss = F.mse_loss(model(inputs), inputs) / accumulation
            loss.backward()
            if keep_graph:
                tr_loss += loss  # L:LIVE_TR_LOSS
            else:
                tr_loss += loss.detach()
            if (step + 1) % accumulation == 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                optimizer.zero_grad()
        print(f"train loss {tr_loss.item() / 3:.4f}")
    return trace


CORRECT = [
    Case("moco-v2", "facebookresearch/moco moco/builder.py", moco_v2, line_of=line_of),
    Case(
        "packed-sequences",
        "bentrevett/pytorch-sentiment-analysis packed padded sequences",
        packed_sequences,
        line_of=line_of,
    ),
    Case(
        "awd-lstm-bptt",
        "salesforce/awd-lstm-lm main.py variable-length BPTT",
        awd_lstm_variable_bptt,
        line_of=line_of,
    ),
    Case(
        "weight-norm", "jik876/hifi-gan models.py weight_norm", weight_norm_convs, line_of=line_of
    ),
    Case(
        "sngan",
        "christiancosgrove/pytorch-spectral-normalization-gan main.py",
        sngan_hinge,
        line_of=line_of,
    ),
    Case(
        "batchnorm-eval-every-k",
        "pytorch/examples mnist/main.py with BatchNorm, warm-up, eval every 3 steps",
        batchnorm_eval_every_k,
        line_of=line_of,
    ),
    Case(
        "trainer-accumulation",
        "huggingface/transformers Trainer gradient accumulation",
        trainer_accumulation,
        line_of=line_of,
    ),
]
BROKEN = [
    Case(
        "trainer-accumulation-tr-loss",
        "transformers Trainer's tr_loss summed without .detach() (forum-style)",
        lambda: trainer_accumulation(keep_graph=True),
        (Expect("kept-alive", "LIVE_TR_LOSS", "tr_loss", (".item()",)),),
        line_of=line_of,
    ),
    Case(
        "packed-kept-predictions",
        "discuss.pytorch.org predictions stored for an epoch metric without detach",
        packed_sequences_kept_logits,
        (Expect("kept-alive", "LIVE_KEPT_PREDICTIONS", "all_predictions", (".detach()",)),),
        line_of=line_of,
    ),
]
