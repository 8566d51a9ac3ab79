"""Corpus family (issue 35): embeddings nobody here wrote. Sparse embeddings trained with
SparseAdam and max_norm embeddings used one forward per backward (correct), and max_norm's
in-place renormalization of a weight a live graph saved (broken: PyTorch's in-place error,
raised from inside `F.embedding`)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import INPLACE, Case, Expect, raises, seed
from markers import marker_lines

import autograd_magic as am

line_of = marker_lines(__file__)


class SkipGramModel(nn.Module):
    """Andras7/word2vec-pytorch word2vec/model.py SkipGramModel (negative sampling), shrunk."""

    def __init__(self, emb_size: int = 30, emb_dimension: int = 8) -> None:
        super().__init__()
        self.u_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        self.v_embeddings = nn.Embedding(emb_size, emb_dimension, sparse=True)
        nn.init.uniform_(self.u_embeddings.weight.data, -1.0 / emb_dimension, 1.0 / emb_dimension)
        nn.init.constant_(self.v_embeddings.weight.data, 0)

    def forward(self, pos_u, pos_v, neg_v):
        emb_u = self.u_embeddings(pos_u)
        emb_v = self.v_embeddings(pos_v)
        emb_neg_v = self.v_embeddings(neg_v)
        score = torch.clamp(torch.sum(torch.mul(emb_u, emb_v), dim=1), max=10, min=-10)
        score = -F.logsigmoid(score)
        neg_score = torch.bmm(emb_neg_v, emb_u.unsqueeze(2)).squeeze()
        neg_score = torch.clamp(neg_score, max=10, min=-10)
        neg_score = -torch.sum(F.logsigmoid(-neg_score), dim=1)
        return torch.mean(score + neg_score)


def skipgram_sparse_adam() -> am.Trace:
    # Andras7/word2vec-pytorch word2vec/trainer.py: sparse embeddings trained with SparseAdam
    seed()
    model = SkipGramModel()
    optimizer = torch.optim.SparseAdam(list(model.parameters()), lr=0.01)
    batches = [
        (torch.randint(0, 30, (8,)), torch.randint(0, 30, (8,)), torch.randint(0, 30, (8, 5)))
        for _ in range(3)
    ]
    with am.track() as trace:
        running_loss = 0.0
        for pos_u, pos_v, neg_v in batches:
            optimizer.zero_grad()
            loss = model.forward(pos_u, pos_v, neg_v)
            loss.backward()
            optimizer.step()
            running_loss = running_loss * 0.9 + loss.item() * 0.1
    return trace


class MaxNormSkipGram(nn.Module):
    """OlgaChernytska/word2vec-pytorch utils/model.py SkipGram_Model (max_norm embeddings)."""

    def __init__(self, vocab_size: int = 30, embed_dimension: int = 8) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(vocab_size, embed_dimension, max_norm=1)
        self.linear = nn.Linear(embed_dimension, vocab_size)

    def forward(self, inputs_):
        return self.linear(self.embeddings(inputs_))


def skipgram_max_norm() -> am.Trace:
    # OlgaChernytska/word2vec-pytorch utils/trainer.py _train_epoch: one forward per backward,
    # so the in-place renorm never touches a tensor a live graph saved
    seed()
    model = MaxNormSkipGram()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.025)
    criterion = nn.CrossEntropyLoss()
    data = [(torch.randint(0, 30, (8,)), torch.randint(0, 30, (8,))) for _ in range(3)]
    with am.track() as trace:
        model.train()
        running_loss = []
        for inputs, labels in data:
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
            running_loss.append(loss.item())
    return trace


def max_norm_without_clone() -> am.Trace:
    # The PyTorch docs' nn.Embedding max_norm example without the `.clone()` it asks for
    seed()
    n, d, m = 3, 5, 7
    embedding = nn.Embedding(n, d, max_norm=1.0)
    W = torch.randn((m, d), requires_grad=True)
    idx = torch.tensor([1, 2])
    with am.track() as trace:
        a = embedding.weight @ W.t()  # L:MAXNORM_SAVED
        b = embedding(idx) @ W.t()  # L:MAXNORM_CALL
        out = a.unsqueeze(0) + b.unsqueeze(1)
        loss = out.sigmoid().prod()
        with raises(INPLACE):
            loss.backward()  # L:MAXNORM_BACKWARD
    return trace


class TiedLM(nn.Module):
    """pytorch/examples word_language_model/model.py RNNModel with --tied, the encoder given
    max_norm (a GRU, shrunk)."""

    def __init__(self, ntoken: int = 20, nhid: int = 8) -> None:
        super().__init__()
        self.encoder = nn.Embedding(ntoken, nhid, max_norm=1.0)
        self.rnn = nn.GRU(nhid, nhid)
        self.decoder = nn.Linear(nhid, ntoken)
        self.decoder.weight = self.encoder.weight

    def forward(self, input, hidden):
        emb = self.encoder(input)  # L:TIED_ENCODER
        output, hidden = self.rnn(emb, hidden)
        return F.log_softmax(self.decoder(output).view(-1, 20), dim=1), hidden


def tied_max_norm_two_chunks() -> am.Trace:
    # Losses of two chunks summed before one backward (truncated BPTT over a longer window)
    seed()
    model = TiedLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data = torch.randint(0, 20, (9, 2))
    with am.track() as trace:
        hidden = torch.zeros(1, 2, 8)
        loss = 0
        for i in range(0, 8, 4):
            output, hidden = model(data[i : i + 4], hidden)  # L:TIED_CALL
            loss = loss + F.nll_loss(output, data[i + 1 : i + 5].reshape(-1))
        opt.zero_grad()
        with raises(INPLACE):
            loss.backward()
        opt.step()
    return trace


CORRECT = [
    Case(
        "skipgram-sparse-adam",
        "Andras7/word2vec-pytorch word2vec/model.py + trainer.py (sparse=True, SparseAdam)",
        skipgram_sparse_adam,
        line_of=line_of,
    ),
    Case(
        "skipgram-max-norm",
        "OlgaChernytska/word2vec-pytorch utils/model.py + trainer.py (max_norm=1)",
        skipgram_max_norm,
        line_of=line_of,
    ),
]

BROKEN = [
    Case(
        "max-norm-without-clone",
        "PyTorch docs nn.Embedding max_norm note, without the .clone() it asks for",
        max_norm_without_clone,
        (
            Expect(
                "inplace-on-saved",
                "MAXNORM_CALL",
                "embedding.weight",
                ("max_norm", "embedding.weight.clone()"),
                ("Use the out-of-place form",),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "tied-max-norm-two-chunks",
        "pytorch/examples word_language_model/model.py --tied, encoder with max_norm, two chunks",
        tied_max_norm_two_chunks,
        (
            Expect(
                "inplace-on-saved",
                "TIED_ENCODER",
                "model.encoder.weight",
                ("max_norm", "before calling `model.encoder` again"),
                ("Use the out-of-place form",),
            ),
        ),
        line_of=line_of,
    ),
]
