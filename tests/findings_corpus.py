# The loops keep their sources' own style (zip without strict=, nested with-blocks, unused
# unpacked names), so a user's code is what the findings see.
# ruff: noqa: B905, SIM117, RUF059
"""A corpus of training loops nobody here wrote (issue 22), shrunk to run in well under a second
on random data, with the findings an expert expects: none for correct code; for the broken
variants (forum-style mistakes) the kind, line, holder and the words of a fix that fits.

Each case names where its code came from. Lines are found by `# L:<MARKER>` comments. A case is
a function returning the trace of its loop; `CASES` lists them with their expectations.
"""

from __future__ import annotations

import importlib
import math
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import INPLACE, TWICE, Case, Expect, raises, seed
from markers import marker_lines
from torch.distributions import Categorical
from torch.utils.checkpoint import checkpoint

import autograd_magic as am

line_of = marker_lines(__file__)


# ===== correct loops ==============================================================================
class MnistNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.dropout = nn.Dropout(0.25)
        self.fc = nn.Linear(4 * 5 * 5, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = self.dropout(torch.flatten(x, 1))
        return F.log_softmax(self.fc(x), dim=1)


def mnist_train() -> am.Trace:
    # pytorch/examples mnist/main.py: train() and test()
    seed()
    model = MnistNet()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    data = [(torch.randn(8, 1, 12, 12), torch.randint(0, 10, (8,))) for _ in range(3)]
    with am.track() as trace:
        model.train()
        for batch_idx, (x, target) in enumerate(data):
            optimizer.zero_grad()
            output = model(x)
            loss = F.nll_loss(output, target)
            loss.backward()
            optimizer.step()
            if batch_idx % 2 == 0:
                print(f"Train step {batch_idx} loss {loss.item():.4f}")
        model.eval()
        test_loss, correct = 0.0, 0
        with torch.no_grad():
            for x, target in data:
                output = model(x)
                test_loss += F.nll_loss(output, target, reduction="sum").item()
                pred = output.argmax(dim=1, keepdim=True)
                correct += pred.eq(target.view_as(pred)).sum().item()
    return trace


def mnist_counts_without_item() -> am.Trace:
    # pytorch/examples imagenet/main.py accuracy() pattern, summed as tensors (no grad: argmax)
    seed()
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    data = [(torch.randn(8, 12), torch.randint(0, 10, (8,))) for _ in range(3)]
    with am.track() as trace:
        correct = torch.zeros(())
        for x, y in data:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            correct += (logits.argmax(1) == y).sum()
    return trace


class Generator(nn.Module):
    def __init__(self, nz: int = 8) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(nz, 32), nn.BatchNorm1d(32), nn.ReLU(True), nn.Linear(32, 16), nn.Tanh()
        )

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(16, 32), nn.LeakyReLU(0.2, inplace=True), nn.Linear(32, 1), nn.Sigmoid()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.main(x).view(-1)


def gan_models():
    seed()
    netG, netD = Generator(), Discriminator()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    return netG, netD, optD, optG, [torch.randn(8, 16) for _ in range(3)]


def dcgan() -> am.Trace:
    # pytorch/examples dcgan/main.py: the training loop (fake.detach() for D, fake for G)
    netG, netD, optimizerD, optimizerG, data = gan_models()
    criterion = nn.BCELoss()
    with am.track() as trace:
        for real_cpu in data:
            netD.zero_grad()
            label = torch.full((8,), 1.0)
            output = netD(real_cpu)
            errD_real = criterion(output, label)
            errD_real.backward()
            D_x = output.mean().item()
            noise = torch.randn(8, 8)
            fake = netG(noise)
            label.fill_(0.0)
            output = netD(fake.detach())
            errD_fake = criterion(output, label)
            errD_fake.backward()
            D_G_z1 = output.mean().item()
            errD = errD_real + errD_fake
            optimizerD.step()
            netG.zero_grad()
            label.fill_(1.0)
            output = netD(fake)
            errG = criterion(output, label)
            errG.backward()
            D_G_z2 = output.mean().item()
            optimizerG.step()
            print(f"Loss_D {errD.item():.3f} Loss_G {errG.item():.3f} {D_x:.2f} {D_G_z1:.2f}")
            print(D_G_z2)
    return trace


def gan_generator_detached() -> am.Trace:
    # eriklindernoren/PyTorch-GAN implementations/wgan/wgan.py: fake_imgs = generator(z).detach()
    netG, netD, optD, optG, data = gan_models()
    with am.track() as trace:
        for i, real_imgs in enumerate(data):
            optD.zero_grad()
            z = torch.randn(8, 8)
            fake_imgs = netG(z).detach()
            loss_D = -torch.mean(netD(real_imgs)) + torch.mean(netD(fake_imgs))
            loss_D.backward()
            optD.step()
            for p in netD.parameters():
                p.data.clamp_(-0.01, 0.01)
            if i % 1 == 0:
                optG.zero_grad()
                gen_imgs = netG(z)
                loss_G = -torch.mean(netD(gen_imgs))
                loss_G.backward()
                optG.step()
    return trace


def wgan_gp() -> am.Trace:
    # eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py: compute_gradient_penalty
    netG, netD, optD, optG, data = gan_models()

    def compute_gradient_penalty(D, real_samples, fake_samples):
        alpha = torch.rand(real_samples.size(0), 1)
        interpolates = (alpha * real_samples + (1 - alpha) * fake_samples).requires_grad_(True)
        d_interpolates = D(interpolates)
        fake = torch.ones(real_samples.shape[0])
        gradients = torch.autograd.grad(
            outputs=d_interpolates,
            inputs=interpolates,
            grad_outputs=fake,
            create_graph=True,
            retain_graph=True,
            only_inputs=True,
        )[0]
        return ((gradients.norm(2, dim=1) - 1) ** 2).mean()

    with am.track() as trace:
        for real_imgs in data:
            optD.zero_grad()
            z = torch.randn(8, 8)
            fake_imgs = netG(z)
            real_validity = netD(real_imgs)
            fake_validity = netD(fake_imgs)
            gradient_penalty = compute_gradient_penalty(netD, real_imgs.data, fake_imgs.data)
            d_loss = -torch.mean(real_validity) + torch.mean(fake_validity) + 10 * gradient_penalty
            d_loss.backward()
            optD.step()
            optG.zero_grad()
            fake_imgs = netG(z)
            g_loss = -torch.mean(netD(fake_imgs))
            g_loss.backward()
            optG.step()
    return trace


def vae() -> am.Trace:
    # pytorch/examples vae/main.py: VAE, loss_function, train() with train_loss += loss.item()
    seed()

    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc21, self.fc22 = nn.Linear(16, 8), nn.Linear(8, 2), nn.Linear(8, 2)
            self.fc3, self.fc4 = nn.Linear(2, 8), nn.Linear(8, 16)

        def reparameterize(self, mu, logvar):
            std = torch.exp(0.5 * logvar)
            eps = torch.randn_like(std)
            return mu + eps * std

        def forward(self, x):
            h1 = F.relu(self.fc1(x))
            mu, logvar = self.fc21(h1), self.fc22(h1)
            z = self.reparameterize(mu, logvar)
            return torch.sigmoid(self.fc4(F.relu(self.fc3(z)))), mu, logvar

    def loss_function(recon_x, x, mu, logvar):
        BCE = F.binary_cross_entropy(recon_x, x, reduction="sum")
        KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return BCE + KLD

    model = VAE()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    data = [torch.rand(8, 16) for _ in range(3)]
    with am.track() as trace:
        model.train()
        train_loss = 0
        for x in data:
            optimizer.zero_grad()
            recon_batch, mu, logvar = model(x)
            loss = loss_function(recon_batch, x, mu, logvar)
            loss.backward()
            train_loss += loss.item()
            optimizer.step()
        with torch.no_grad():
            sample = model.fc4(F.relu(model.fc3(torch.randn(4, 2))))
            print(sample.shape, train_loss)
    return trace


class Policy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, 16)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(16, 2)
        self.saved_log_probs: list[torch.Tensor] = []
        self.rewards: list[float] = []

    def forward(self, x):
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=1)


def reinforce() -> am.Trace:
    # pytorch/examples reinforcement_learning/reinforce.py: select_action, finish_episode
    seed()
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    eps = np.finfo(np.float32).eps.item()

    def select_action(state):
        state = torch.from_numpy(state).float().unsqueeze(0)
        probs = policy(state)
        m = Categorical(probs)
        action = m.sample()
        policy.saved_log_probs.append(m.log_prob(action))
        return action.item()

    def finish_episode():
        R, policy_loss, returns = 0, [], deque()
        for r in policy.rewards[::-1]:
            R = r + 0.99 * R
            returns.appendleft(R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + eps)
        for log_prob, R in zip(policy.saved_log_probs, returns):
            policy_loss.append(-log_prob * R)
        optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()
        optimizer.step()
        del policy.rewards[:]
        del policy.saved_log_probs[:]

    with am.track() as trace:
        for _episode in range(3):
            state = np.random.randn(4).astype(np.float32)
            for _t in range(5):
                action = select_action(state)
                state = np.random.randn(4).astype(np.float32) + action
                policy.rewards.append(float(np.random.rand()))
            finish_episode()
    return trace


def actor_critic() -> am.Trace:
    # pytorch/examples reinforcement_learning/actor_critic.py: SavedAction, finish_episode
    seed()

    class ActorCritic(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.affine1 = nn.Linear(4, 16)
            self.action_head, self.value_head = nn.Linear(16, 2), nn.Linear(16, 1)
            self.saved_actions: list = []
            self.rewards: list[float] = []

        def forward(self, x):
            x = F.relu(self.affine1(x))
            return F.softmax(self.action_head(x), dim=-1), self.value_head(x)

    model = ActorCritic()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-2)

    def select_action(state):
        probs, state_value = model(torch.from_numpy(state).float())
        m = Categorical(probs)
        action = m.sample()
        model.saved_actions.append((m.log_prob(action), state_value))
        return action.item()

    def finish_episode():
        R, policy_losses, value_losses, returns = 0, [], [], []
        for r in model.rewards[::-1]:
            R = r + 0.99 * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + 1e-8)
        for (log_prob, value), R in zip(model.saved_actions, returns):
            advantage = R - value.item()
            policy_losses.append(-log_prob * advantage)
            value_losses.append(F.smooth_l1_loss(value, torch.tensor([R])))
        optimizer.zero_grad()
        loss = torch.stack(policy_losses).sum() + torch.stack(value_losses).sum()
        loss.backward()
        optimizer.step()
        del model.rewards[:]
        del model.saved_actions[:]

    with am.track() as trace:
        for _episode in range(3):
            state = np.random.randn(4).astype(np.float32)
            for _t in range(5):
                action = select_action(state)
                state = np.random.randn(4).astype(np.float32) * (action + 1)
                model.rewards.append(float(np.random.rand()))
            finish_episode()
    return trace


class RNNModel(nn.Module):
    """pytorch/examples word_language_model/model.py RNNModel (LSTM), shrunk."""

    def __init__(self, ntoken: int = 20, ninp: int = 8, nhid: int = 8) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nhid = nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, 20)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz: int):
        weight = next(self.parameters())
        return (weight.new_zeros(1, bsz, self.nhid), weight.new_zeros(1, bsz, self.nhid))


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def lm_data():
    seed()
    return RNNModel(), torch.randint(0, 20, (13, 2))


def word_language_model() -> am.Trace:
    # pytorch/examples word_language_model/main.py: train() (manual SGD through p.data) and
    # evaluate() under no_grad
    model, train_data = lm_data()
    criterion = nn.NLLLoss()
    lr = 20
    with am.track() as trace:
        model.train()
        total_loss = 0.0
        hidden = model.init_hidden(2)
        for i in range(0, train_data.size(0) - 1, 4):
            data, targets = train_data[i : i + 4], train_data[i + 1 : i + 5].reshape(-1)
            model.zero_grad()
            hidden = repackage_hidden(hidden)
            output, hidden = model(data[: len(targets) // 2], hidden)
            loss = criterion(output, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            for p in model.parameters():
                p.data.add_(p.grad, alpha=-lr)
            total_loss += loss.item()
        model.eval()
        ppl = []
        with torch.no_grad():
            hidden = model.init_hidden(2)
            output, hidden = model(train_data[:4], hidden)
            ppl.append(math.exp(F.nll_loss(output, train_data[1:5].reshape(-1)).item()))
    return trace


def perplexity_logging() -> am.Trace:
    # huggingface/transformers examples/pytorch/language-modeling/run_clm_no_trainer.py:
    # perplexity = math.exp(loss) logged while training; here as ppl.append(loss.exp().item())
    model, train_data = lm_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with am.track() as trace:
        ppl = []
        hidden = model.init_hidden(2)
        for i in range(0, 12, 4):
            hidden = repackage_hidden(hidden)
            output, hidden = model(train_data[i : i + 4], hidden)
            loss = F.nll_loss(output, train_data[i + 1 : i + 5].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            ppl.append(loss.exp().item())
    return trace


def time_sequence_prediction() -> am.Trace:
    # pytorch/examples time_sequence_prediction/train.py: Sequence (two LSTMCells), LBFGS closure
    seed()

    class Sequence(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm1, self.lstm2 = nn.LSTMCell(1, 8), nn.LSTMCell(8, 8)
            self.linear = nn.Linear(8, 1)

        def forward(self, input, future=0):
            outputs = []
            h_t = torch.zeros(input.size(0), 8)
            c_t = torch.zeros(input.size(0), 8)
            h_t2 = torch.zeros(input.size(0), 8)
            c_t2 = torch.zeros(input.size(0), 8)
            for input_t in input.split(1, dim=1):
                h_t, c_t = self.lstm1(input_t, (h_t, c_t))
                h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
                output = self.linear(h_t2)
                outputs += [output]
            for _ in range(future):
                h_t, c_t = self.lstm1(output, (h_t, c_t))
                h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
                output = self.linear(h_t2)
                outputs += [output]
            return torch.cat(outputs, dim=1)

    seq = Sequence()
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8, max_iter=3)
    data = torch.sin(torch.linspace(0, 6, 4 * 9)).view(4, 9)
    input, target = data[1:, :-1], data[1:, 1:]
    test_input, test_target = data[:1, :-1], data[:1, 1:]
    with am.track() as trace:
        for _i in range(2):

            def closure():
                optimizer.zero_grad()
                out = seq(input)
                loss = criterion(out, target)
                print("loss:", loss.item())
                loss.backward()
                return loss

            optimizer.step(closure)
            with torch.no_grad():
                future = 3
                pred = seq(test_input, future=future)
                loss = criterion(pred[:, :-future], test_target)
                y = pred.detach().numpy()
                print(loss.item(), y.shape)
    return trace


def regression() -> am.Trace:
    # pytorch/examples regression/main.py: manual update param.data.add_(-0.1 * param.grad)
    seed()
    fc = nn.Linear(4, 1)
    with am.track() as trace:
        for _batch_idx in range(3):
            batch_x, batch_y = torch.randn(8, 4), torch.randn(8, 1)
            fc.zero_grad()
            output = F.smooth_l1_loss(fc(batch_x), batch_y)
            loss = output.item()
            output.backward()
            for param in fc.parameters():
                param.data.add_(-0.1 * param.grad)
            if loss < 1e-3:
                break
    return trace


def forward_forward() -> am.Trace:
    # pytorch/examples mnist_forward_forward/main.py: Layer.train per layer, h_pos.detach()
    seed()

    class Layer(nn.Linear):
        def __init__(self, in_features, out_features):
            super().__init__(in_features, out_features)
            self.relu = nn.ReLU()
            self.opt = torch.optim.Adam(self.parameters(), lr=0.03)
            self.threshold = 2.0

        def forward(self, x):
            x_direction = x / (x.norm(2, 1, keepdim=True) + 1e-4)
            return self.relu(torch.mm(x_direction, self.weight.T) + self.bias.unsqueeze(0))

        def train_layer(self, x_pos, x_neg):
            for _i in range(3):
                g_pos = self.forward(x_pos).pow(2).mean(1)
                g_neg = self.forward(x_neg).pow(2).mean(1)
                loss = torch.log(
                    1 + torch.exp(torch.cat([-g_pos + self.threshold, g_neg - self.threshold]))
                ).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
            return self.forward(x_pos).detach(), self.forward(x_neg).detach()

    layers = [Layer(12, 16), Layer(16, 16)]
    x_pos, x_neg = torch.randn(8, 12), torch.randn(8, 12)
    with am.track() as trace:
        h_pos, h_neg = x_pos, x_neg
        for layer in layers:
            h_pos, h_neg = layer.train_layer(h_pos, h_neg)
    return trace


def siamese() -> am.Trace:
    # pytorch/examples siamese_network/main.py: SiameseNetwork, BCELoss on the pair
    seed()

    class SiameseNetwork(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(12, 16), nn.ReLU())
            self.fc = nn.Sequential(nn.Linear(32, 8), nn.ReLU(), nn.Linear(8, 1))
            self.sigmoid = nn.Sigmoid()

        def forward(self, input1, input2):
            output = torch.cat((self.net(input1), self.net(input2)), 1)
            return self.sigmoid(self.fc(output))

    model = SiameseNetwork()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    criterion = nn.BCELoss()
    data = [(torch.randn(8, 12), torch.randn(8, 12), torch.randint(0, 2, (8, 1))) for _ in "ab"]
    with am.track() as trace:
        for images_1, images_2, targets in data:
            optimizer.zero_grad()
            outputs = model(images_1, images_2).squeeze()
            loss = criterion(outputs, targets.squeeze().float())
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            pred = torch.where(model(images_1, images_2) > 0.5, 1, 0)
            print(pred.eq(targets.view_as(pred)).sum().item())
    return trace


def gcn() -> am.Trace:
    # pytorch/examples gcn/main.py: GraphConv (adjacency @ (x @ W)), full-batch training
    seed()

    class GraphConv(nn.Module):
        def __init__(self, i: int, o: int) -> None:
            super().__init__()
            self.kernel = nn.Parameter(torch.randn(i, o) * 0.1)
            self.bias = nn.Parameter(torch.zeros(o))

        def forward(self, x, adj):
            return torch.sparse.mm(adj, x @ self.kernel) + self.bias

    adj = (torch.rand(10, 10) > 0.7).float().to_sparse()
    features, labels = torch.randn(10, 6), torch.randint(0, 3, (10,))
    l1, l2 = GraphConv(6, 8), GraphConv(8, 3)
    optimizer = torch.optim.Adam([*l1.parameters(), *l2.parameters()], lr=0.01, weight_decay=5e-4)
    with am.track() as trace:
        for _epoch in range(3):
            optimizer.zero_grad()
            output = F.log_softmax(l2(F.dropout(F.relu(l1(features, adj)), 0.5), adj), dim=1)
            loss = F.nll_loss(output[:6], labels[:6])
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                val_acc = (output[6:].argmax(1) == labels[6:]).float().mean()
                print(f"loss {loss.item():.3f} acc {val_acc.item():.2f}")
    return trace


def swa() -> am.Trace:
    # pytorch docs, torch.optim "Stochastic Weight Averaging" (AveragedModel, SWALR, update_bn)
    seed()
    from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

    model = nn.Sequential(nn.Linear(6, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    swa_model = AveragedModel(model)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=4)
    swa_scheduler = SWALR(optimizer, swa_lr=0.05)
    loader = [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(2)]
    with am.track() as trace:
        for epoch in range(3):
            for x, y in loader:
                optimizer.zero_grad()
                F.mse_loss(model(x), y).backward()
                optimizer.step()
            if epoch >= 1:
                swa_model.update_parameters(model)
                swa_scheduler.step()
            else:
                scheduler.step()
        update_bn(((x,) for x, _ in loader), swa_model)
    return trace


def distillation() -> am.Trace:
    # pytorch/tutorials beginner_source/knowledge_distillation_tutorial.py: train_knowledge_
    # distillation (teacher under no_grad, soft targets with temperature T)
    seed()
    teacher = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 10))
    student = nn.Sequential(nn.Linear(12, 8), nn.ReLU(), nn.Linear(8, 10))
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-3)
    ce_loss, T = nn.CrossEntropyLoss(), 2
    loader = [(torch.randn(8, 12), torch.randint(0, 10, (8,))) for _ in range(3)]
    with am.track() as trace:
        teacher.eval()
        student.train()
        running_loss = 0.0
        for inputs, labels in loader:
            optimizer.zero_grad()
            with torch.no_grad():
                teacher_logits = teacher(inputs)
            student_logits = student(inputs)
            soft_targets = F.softmax(teacher_logits / T, dim=-1)
            soft_prob = F.log_softmax(student_logits / T, dim=-1)
            soft_targets_loss = torch.sum(soft_targets * (soft_targets.log() - soft_prob)) / 8
            soft_targets_loss = soft_targets_loss * (T**2)
            label_loss = ce_loss(student_logits, labels)
            loss = 0.25 * soft_targets_loss + 0.75 * label_loss
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return trace


def simclr() -> am.Trace:
    # sthalles/SimCLR simclr.py: info_nce_loss and train(); accuracy() in utils.py (no_grad)
    seed()
    model = nn.Sequential(nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 8))
    optimizer = torch.optim.Adam(model.parameters(), 3e-4)
    criterion = nn.CrossEntropyLoss()

    def info_nce_loss(features, batch_size=4, n_views=2, temperature=0.07):
        labels = torch.cat([torch.arange(batch_size) for i in range(n_views)], dim=0)
        labels = (labels.unsqueeze(0) == labels.unsqueeze(1)).float()
        features = F.normalize(features, dim=1)
        similarity_matrix = torch.matmul(features, features.T)
        mask = torch.eye(labels.shape[0], dtype=torch.bool)
        labels = labels[~mask].view(labels.shape[0], -1)
        similarity_matrix = similarity_matrix[~mask].view(similarity_matrix.shape[0], -1)
        positives = similarity_matrix[labels.bool()].view(labels.shape[0], -1)
        negatives = similarity_matrix[~labels.bool()].view(similarity_matrix.shape[0], -1)
        logits = torch.cat([positives, negatives], dim=1) / temperature
        return logits, torch.zeros(logits.shape[0], dtype=torch.long)

    def accuracy(output, target, topk=(1,)):
        with torch.no_grad():
            _, pred = output.topk(max(topk), 1, True, True)
            correct = pred.t().eq(target.view(1, -1).expand_as(pred.t()))
            return [correct[:k].reshape(-1).float().sum(0, keepdim=True) for k in topk]

    with am.track() as trace:
        for _step in range(3):
            images = torch.cat([torch.randn(4, 12), torch.randn(4, 12)], dim=0)
            features = model(images)
            logits, labels = info_nce_loss(features)
            loss = criterion(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            top1 = accuracy(logits, labels)
            print(loss.item(), top1[0].item())
    return trace


class LoRALinear(nn.Linear):
    """microsoft/LoRA loralib/layers.py Linear: frozen weight plus scaling * B @ A."""

    def __init__(self, i: int, o: int, r: int = 2, lora_alpha: int = 4) -> None:
        super().__init__(i, o)
        self.lora_A = nn.Parameter(torch.zeros(r, i))
        self.lora_B = nn.Parameter(torch.zeros(o, r))
        self.scaling = lora_alpha / r
        self.weight.requires_grad = False
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))
        self.lora_dropout = nn.Dropout(0.1)

    def forward(self, x):
        result = F.linear(x, self.weight, bias=self.bias)
        return result + (self.lora_dropout(x) @ self.lora_A.T @ self.lora_B.T) * self.scaling


def lora() -> am.Trace:
    # microsoft/LoRA loralib/layers.py and utils.py mark_only_lora_as_trainable
    seed()
    model = nn.Sequential(LoRALinear(12, 16), nn.GELU(), LoRALinear(16, 4))
    for n, p in model.named_parameters():
        if "lora_" not in n:
            p.requires_grad = False
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with am.track() as trace:
        for _ in range(3):
            x, y = torch.randn(8, 12), torch.randn(8, 4)
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


class TinyGPT(nn.Module):
    """karpathy/nanoGPT model.py, one attention block with a key/value cache."""

    def __init__(self, vocab: int = 16, d: int = 8) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.lm_head = nn.Linear(d, vocab)

    def forward(self, idx, past=None):
        q, k, v = self.c_attn(self.wte(idx)).split(8, dim=2)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(8)
        y = F.softmax(att, dim=-1) @ v
        return self.lm_head(y), (k, v)


def kv_cache_generate() -> am.Trace:
    # karpathy/nanoGPT model.py generate() (under @torch.no_grad()), with a key/value cache as in
    # huggingface/transformers generation
    seed()
    model = TinyGPT()
    idx = torch.randint(0, 16, (1, 3))
    with am.track() as trace:
        with torch.no_grad():
            logits, past = model(idx)
            for _ in range(6):
                probs = F.softmax(logits[:, -1, :] / 0.8, dim=-1)
                idx_next = torch.multinomial(probs, num_samples=1)
                idx = torch.cat((idx, idx_next), dim=1)
                logits, past = model(idx_next, past)
    return trace


def maml() -> am.Trace:
    # tristandeleu/pytorch-maml maml/metalearners/maml.py and dragen1860/MAML-Pytorch meta.py:
    # fast weights from torch.autograd.grad(create_graph=True), meta-loss over the query set
    seed()
    w1, b1 = torch.randn(4, 16) * 0.3, torch.zeros(16)
    w2, b2 = torch.randn(16, 1) * 0.3, torch.zeros(1)
    params = [p.requires_grad_() for p in (w1, b1, w2, b2)]
    meta_optim = torch.optim.Adam(params, lr=1e-3)

    def net(x, weights):
        return F.relu(x @ weights[0] + weights[1]) @ weights[2] + weights[3]

    with am.track() as trace:
        for _step in range(2):
            meta_loss = 0
            for _task in range(3):
                x_spt, y_spt, x_qry, y_qry = (torch.randn(5, 4), torch.randn(5, 1)) * 2
                loss = F.mse_loss(net(x_spt, params), y_spt)
                grad = torch.autograd.grad(loss, params, create_graph=True)
                fast_weights = [p - 0.01 * g for g, p in zip(grad, params)]
                loss_q = F.mse_loss(net(x_qry, fast_weights), y_qry)
                meta_loss = meta_loss + loss_q
            meta_optim.zero_grad()
            (meta_loss / 3).backward()
            meta_optim.step()
    return trace


def seq2seq() -> am.Trace:
    # pytorch/tutorials intermediate_source/seq2seq_translation_tutorial.py (the older train()):
    # EncoderRNN / DecoderRNN with GRU, greedy decoding with decoder_input = topi.squeeze().detach()
    seed()
    hidden_size, n_words = 8, 12
    embedding = nn.Embedding(n_words, hidden_size)
    encoder = nn.GRU(hidden_size, hidden_size, batch_first=True)
    dec_embedding = nn.Embedding(n_words, hidden_size)
    decoder = nn.GRU(hidden_size, hidden_size, batch_first=True)
    out = nn.Linear(hidden_size, n_words)
    params = [*embedding.parameters(), *encoder.parameters(), *dec_embedding.parameters()]
    params += [*decoder.parameters(), *out.parameters()]
    optimizer = torch.optim.SGD(params, lr=0.01)
    criterion = nn.NLLLoss()
    pairs = [(torch.randint(0, n_words, (1, 5)), torch.randint(0, n_words, (4,))) for _ in "ab"]
    with am.track() as trace:
        for input_tensor, target_tensor in pairs:
            optimizer.zero_grad()
            encoder_outputs, encoder_hidden = encoder(embedding(input_tensor))
            decoder_input = torch.tensor([[0]])
            decoder_hidden = encoder_hidden
            loss = 0
            for di in range(target_tensor.size(0)):
                output, decoder_hidden = decoder(
                    F.relu(dec_embedding(decoder_input)), decoder_hidden
                )
                decoder_output = F.log_softmax(out(output[:, 0]), dim=1)
                topv, topi = decoder_output.topk(1)
                decoder_input = topi.squeeze().detach().view(1, 1)
                loss += criterion(decoder_output, target_tensor[di].view(1))
            loss.backward()
            optimizer.step()
            print(loss.item() / target_tensor.size(0))
    return trace


def grad_accumulation_amp() -> am.Trace:
    # karpathy/nanoGPT train.py: gradient_accumulation_steps, autocast, clip_grad_norm_,
    # lr schedule, loss.item() * gradient_accumulation_steps for logging
    seed()
    model = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 12))
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4)
    accum = 2
    with am.track() as trace:
        for it in range(3):
            for param_group in optimizer.param_groups:
                param_group["lr"] = 6e-4 * (it + 1) / 3
            for _micro_step in range(accum):
                X, Y = torch.randn(4, 12), torch.randn(4, 12)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.mse_loss(model(X).float(), Y)
                    loss = loss / accum
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            lossf = loss.item() * accum
            print(f"iter {it}: loss {lossf:.4f}")
    return trace


def mean_teacher_ema() -> am.Trace:
    # CuriousAI/mean-teacher pytorch/main.py update_ema_variables (and BYOL/MoCo momentum
    # encoders): ema_param.data.mul_(alpha).add_(param.data, alpha=1 - alpha)
    seed()
    student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    teacher = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    teacher.load_state_dict(student.state_dict())
    for p in teacher.parameters():
        p.detach_()
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1)
    with am.track() as trace:
        for _step in range(3):
            x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
            out, ema_out = student(x), teacher(x + 0.1 * torch.randn_like(x))
            consistency = F.mse_loss(F.softmax(out, 1), F.softmax(ema_out, 1))
            loss = F.cross_entropy(out, y) + consistency
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            for ema_param, param in zip(teacher.parameters(), student.parameters()):
                ema_param.data.mul_(0.99).add_(param.data, alpha=0.01)
    return trace


def checkpointed_transformer() -> am.Trace:
    # pytorch/examples language_translation/src/model.py (nn.Transformer) with
    # torch.utils.checkpoint per layer, as Hugging Face's gradient_checkpointing does
    seed()
    layers = nn.ModuleList(nn.TransformerEncoderLayer(8, 2, 16, 0.1) for _ in range(2))
    head = nn.Linear(8, 5)
    opt = torch.optim.Adam([*layers.parameters(), *head.parameters()], lr=1e-3)
    with am.track() as trace:
        for _ in range(2):
            h = torch.randn(6, 2, 8)
            for layer in layers:
                h = checkpoint(layer, h, use_reentrant=False)
            loss = F.cross_entropy(head(h).view(-1, 5), torch.randint(0, 5, (12,)))
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def fast_neural_style() -> am.Trace:
    # pytorch/examples fast_neural_style/neural_style/neural_style.py train(): frozen VGG
    # features, gram_matrix of the style image computed once, style/content loss
    seed()

    def gram_matrix(y):
        (b, ch, h, w) = y.size()
        features = y.view(b, ch, w * h)
        return features.bmm(features.transpose(1, 2)) / (ch * h * w)

    transformer = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 3, 1))
    vgg = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU()).requires_grad_(False)
    optimizer = torch.optim.Adam(transformer.parameters(), 1e-3)
    style = torch.rand(1, 3, 8, 8)
    features_style = vgg(style)
    gram_style = gram_matrix(features_style)
    with am.track() as trace:
        agg_content_loss = 0.0
        for _batch in range(3):
            x = torch.rand(2, 3, 8, 8)
            optimizer.zero_grad()
            y = transformer(x)
            features_y, features_x = vgg(y), vgg(x)
            content_loss = 1e5 * F.mse_loss(features_y, features_x)
            style_loss = 1e10 * F.mse_loss(gram_matrix(features_y), gram_style.expand(2, 6, 6))
            total_loss = content_loss + style_loss
            total_loss.backward()
            optimizer.step()
            agg_content_loss += content_loss.item()
    return trace


CORRECT = [
    Case("mnist", "pytorch/examples mnist/main.py", mnist_train),
    Case("accuracy-tensor", "pytorch/examples imagenet/main.py", mnist_counts_without_item),
    Case("dcgan", "pytorch/examples dcgan/main.py", dcgan),
    Case(
        "wgan", "eriklindernoren/PyTorch-GAN implementations/wgan/wgan.py", gan_generator_detached
    ),
    Case("wgan-gp", "eriklindernoren/PyTorch-GAN implementations/wgan_gp/wgan_gp.py", wgan_gp),
    Case("vae", "pytorch/examples vae/main.py", vae),
    Case("reinforce", "pytorch/examples reinforcement_learning/reinforce.py", reinforce),
    Case("actor-critic", "pytorch/examples reinforcement_learning/actor_critic.py", actor_critic),
    Case("word-lm", "pytorch/examples word_language_model/main.py", word_language_model),
    Case("perplexity", "transformers run_clm_no_trainer.py", perplexity_logging),
    Case(
        "time-seq", "pytorch/examples time_sequence_prediction/train.py", time_sequence_prediction
    ),
    Case("regression", "pytorch/examples regression/main.py", regression),
    Case("forward-forward", "pytorch/examples mnist_forward_forward/main.py", forward_forward),
    Case("siamese", "pytorch/examples siamese_network/main.py", siamese),
    Case("gcn", "pytorch/examples gcn/main.py", gcn),
    Case("swa", "pytorch docs torch.optim Stochastic Weight Averaging", swa),
    Case("distillation", "pytorch/tutorials knowledge_distillation_tutorial.py", distillation),
    Case("simclr", "sthalles/SimCLR simclr.py", simclr),
    Case("lora", "microsoft/LoRA loralib/layers.py", lora),
    Case("kv-cache", "karpathy/nanoGPT model.py generate()", kv_cache_generate),
    Case("maml", "tristandeleu/pytorch-maml maml/metalearners/maml.py", maml),
    Case("seq2seq", "pytorch/tutorials seq2seq_translation_tutorial.py", seq2seq),
    Case("grad-accum", "karpathy/nanoGPT train.py", grad_accumulation_amp),
    Case("mean-teacher", "CuriousAI/mean-teacher pytorch/main.py", mean_teacher_ema),
    Case(
        "checkpoint",
        "pytorch/examples language_translation + utils.checkpoint",
        checkpointed_transformer,
    ),
    Case("fast-style", "pytorch/examples fast_neural_style/neural_style.py", fast_neural_style),
]


# ===== broken loops (forum-style mistakes on the loops above) =====================================
def mlp_data():
    seed()
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, opt, [(torch.randn(8, 6), torch.randn(8, 1)) for _ in range(3)]


def total_loss_tensor() -> am.Trace:
    # discuss.pytorch.org "CUDA memory continuously increases" (total_loss += loss); the PyTorch
    # FAQ "My model reports cuda runtime error(2): out of memory" names this exact line
    model, opt, data = mlp_data()
    with am.track() as trace:
        total_loss = 0
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total_loss += loss  # L:TOTAL_LOSS
    return trace


def loss_history() -> am.Trace:
    # discuss.pytorch.org "Memory leak when appending loss to a list" (losses.append(loss))
    model, opt, data = mlp_data()
    with am.track() as trace:
        losses = []
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss)  # L:LOSS_HISTORY
    return trace


def kept_logits() -> am.Trace:
    # imagenet/main.py validate() written without torch.no_grad(), outputs kept for a final
    # torch.cat(...).argmax accuracy (discuss.pytorch.org "memory grows during validation")
    model, opt, data = mlp_data()
    with am.track() as trace:
        for x, y in data:
            opt.zero_grad()
            F.mse_loss(model(x), y).backward()
            opt.step()
        all_outputs = []
        for x, _y in data:
            output = model(x)  # L:KEPT_LOGITS_MODEL
            all_outputs.append(output)  # L:KEPT_LOGITS
        preds = torch.cat(all_outputs).argmax(1)
        print(preds.shape)
    return trace


def word_lm_no_repackage() -> am.Trace:
    # word_language_model/main.py train() with `hidden = repackage_hidden(hidden)` removed
    # (discuss.pytorch.org "Trying to backward through the graph a second time" with LSTMs)
    model, train_data = lm_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with am.track() as trace:
        hidden = model.init_hidden(2)
        with raises(TWICE):
            for i in range(0, 12, 4):
                output, hidden = model(train_data[i : i + 4], hidden)  # L:WLM_HIDDEN
                loss = F.nll_loss(output, train_data[i + 1 : i + 5].reshape(-1))
                opt.zero_grad()
                loss.backward()  # L:WLM_BACKWARD
                opt.step()
    return trace


def word_lm_retain_graph() -> am.Trace:
    # the same, "fixed" with loss.backward(retain_graph=True) as the error message suggests
    model, train_data = lm_data()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    with am.track() as trace:
        hidden = model.init_hidden(2)
        with raises(INPLACE):
            for i in range(0, 12, 4):
                output, hidden = model(train_data[i : i + 4], hidden)  # L:WLMR_HIDDEN
                loss = F.nll_loss(output, train_data[i + 1 : i + 5].reshape(-1))
                opt.zero_grad()
                loss.backward(retain_graph=True)  # L:WLMR_BACKWARD
                opt.step()  # L:WLMR_STEP
    return trace


def gru_cell_no_detach() -> am.Trace:
    # time_sequence_prediction/train.py style, state carried across batches in the loop
    # (stackoverflow "Trying to backward through the graph a second time" with GRUCell)
    seed()
    cell, head = nn.GRUCell(4, 8), nn.Linear(8, 1)
    opt = torch.optim.Adam([*cell.parameters(), *head.parameters()], lr=1e-2)
    xs, ys = torch.randn(3, 2, 4), torch.randn(3, 2, 1)
    with am.track() as trace:
        state = torch.zeros(2, 8)
        with raises(TWICE):
            for x, y in zip(xs, ys):
                state = cell(x, state)  # L:GRU_STATE
                loss = F.mse_loss(head(state), y)
                opt.zero_grad()
                loss.backward()  # L:GRU_BACKWARD
                opt.step()
    return trace


def single_loss_retain_graph() -> am.Trace:
    # discuss.pytorch.org threads where retain_graph=True is passed "to be safe" in a plain loop
    model, opt, data = mlp_data()
    with am.track() as trace:
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward(retain_graph=True)  # L:SINGLE_RETAIN
            opt.step()
    return trace


def gan_stale_output() -> am.Trace:
    # dcgan/main.py with the generator step reusing D's output computed before optimizerD.step()
    # (discuss.pytorch.org "GAN: one of the variables needed for gradient computation has been
    # modified by an inplace operation")
    netG, netD, optimizerD, optimizerG, data = gan_models()
    criterion = nn.BCELoss()
    with am.track() as trace:
        with raises(INPLACE):
            for real in data:
                optimizerD.zero_grad()
                fake = netG(torch.randn(8, 8))
                d_fake = netD(fake)  # L:STALE_D
                errD = criterion(netD(real), torch.ones(8)) + criterion(d_fake, torch.zeros(8))
                errD.backward(retain_graph=True)  # L:STALE_RETAIN
                optimizerD.step()  # L:STALE_STEP
                optimizerG.zero_grad()
                errG = criterion(d_fake, torch.ones(8))
                errG.backward()  # L:STALE_BACKWARD
                optimizerG.step()
    return trace


def clamp_in_helper() -> am.Trace:
    # a helper that clamps probabilities in place before a BCE (discuss.pytorch.org "inplace
    # operation" with clamp_), called from the loop
    model, opt, data = mlp_data()

    def clamp_probs(p):
        p.clamp_(1e-6, 1 - 1e-6)  # L:CLAMP_INNER
        return p

    with am.track() as trace:
        with raises(INPLACE):
            for x, y in data:
                p = torch.sigmoid(model(x))
                p = clamp_probs(p)  # L:CLAMP_CALL
                loss = F.binary_cross_entropy(p, (y > 0).float())
                opt.zero_grad()
                loss.backward()
                opt.step()
    return trace


def masked_attention_inplace() -> am.Trace:
    # an attention map masked in place after softmax (discuss.pytorch.org "inplace operation"
    # with masked attention; nanoGPT masks the scores before the softmax instead)
    seed()
    qkv = nn.Linear(8, 24)
    opt = torch.optim.Adam(qkv.parameters(), lr=1e-3)
    mask = torch.tril(torch.ones(5, 5))
    with am.track() as trace:
        with raises(INPLACE):
            for _ in range(2):
                q, k, v = qkv(torch.randn(2, 5, 8)).split(8, dim=2)
                att = F.softmax(q @ k.transpose(1, 2), dim=-1)
                att.mul_(mask)  # L:ATT_MUL
                loss = (att @ v).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
    return trace


def sigmoid_inplace() -> am.Trace:
    # a gate computed with torch.tanh then squashed in place with sigmoid_ (forum "sigmoid_
    # inplace operation" questions)
    model, opt, data = mlp_data()
    with am.track() as trace:
        with raises(INPLACE):
            for x, y in data:
                out = torch.tanh(model(x))
                out.sigmoid_()  # L:SIGMOID
                loss = F.mse_loss(out, y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    return trace


class RunningNorm(nn.Module):
    """A hand-written normaliser that tracks statistics like BatchNorm, but keeps their graph."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(n))
        self.proj = nn.Linear(n, n)

    def forward(self, x):
        h = self.proj(x)
        self.running_mean = 0.9 * self.running_mean + 0.1 * h.mean(0)  # L:RUNNING_MEAN
        return h - h.mean(0)


def module_running_stat() -> am.Trace:
    # discuss.pytorch.org "memory leak in custom batchnorm" (running stats assigned with grad)
    seed()
    norm, head = RunningNorm(6), nn.Linear(6, 1)
    opt = torch.optim.SGD([*norm.parameters(), *head.parameters()], lr=0.1)
    with am.track() as trace:
        for _ in range(3):
            x, y = torch.randn(8, 6), torch.randn(8, 1)
            loss = F.mse_loss(head(norm(x)), y)  # L:RUNNING_CALL
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


class Logger:
    """A metrics logger whose log() keeps what it is given (wandb/tensorboard-style wrappers)."""

    def __init__(self) -> None:
        self.history: list = []

    def log(self, value) -> None:
        self.history.append(value)  # L:LOGGER_APPEND


def logger_keeps_loss() -> am.Trace:
    # a logger called with the loss tensor instead of loss.item()
    model, opt, data = mlp_data()
    logger = Logger()
    with am.track() as trace:
        for x, y in data:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            logger.log(loss)  # L:LOGGER_CALL
    return trace


def reinforce_not_cleared() -> am.Trace:
    # reinforce.py with `del policy.saved_log_probs[:]` forgotten in finish_episode()
    seed()
    policy = Policy()
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)

    def finish_episode():
        returns = torch.tensor(policy.rewards[::-1])
        policy_loss = [-lp * R for lp, R in zip(policy.saved_log_probs, returns)]
        optimizer.zero_grad()
        policy_loss = torch.cat(policy_loss).sum()
        policy_loss.backward()  # L:REINFORCE_BACKWARD
        optimizer.step()
        del policy.rewards[:]

    with am.track() as trace:
        with raises(TWICE):
            for _episode in range(2):
                for _t in range(4):
                    probs = policy(torch.randn(1, 4))
                    m = Categorical(probs)
                    action = m.sample()
                    policy.saved_log_probs.append(m.log_prob(action))  # L:REINFORCE_APPEND
                    policy.rewards.append(float(action))
                finish_episode()  # L:REINFORCE_CALL
    return trace


def eval_without_no_grad() -> am.Trace:
    # mnist/main.py test() written without `with torch.no_grad():`
    model, opt, data = mlp_data()
    with am.track() as trace:
        test_loss = 0.0
        for x, y in data:
            output = model(x)  # L:EVAL_MODEL
            test_loss += F.mse_loss(output, y).item()
    return trace


def generate_without_no_grad() -> am.Trace:
    # nanoGPT generate() called without its @torch.no_grad() decorator: the cache keeps graphs
    seed()
    model = TinyGPT()
    idx = torch.randint(0, 16, (1, 3))
    with am.track() as trace:
        logits, past = model(idx)
        for _ in range(6):
            probs = F.softmax(logits[:, -1, :], dim=-1)
            idx_next = torch.multinomial(probs, num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
            logits, past = model(idx_next, past)  # L:GENERATE
    return trace


def numpy_observation_buffer() -> am.Trace:
    # an RL rollout that reuses one NumPy observation buffer shared with a tensor via
    # torch.from_numpy and refills it before backward (discuss.pytorch.org "from_numpy shares
    # memory" gradient questions)
    seed()
    policy = nn.Linear(4, 2)
    opt = torch.optim.SGD(policy.parameters(), lr=0.1)
    obs_buf = np.zeros((1, 4), dtype=np.float32)
    with am.track() as trace:
        obs = torch.from_numpy(obs_buf)
        for _episode in range(2):
            logps = []
            for _t in range(5):
                obs_buf[:] = np.random.randn(1, 4)  # L:OBS_WRITE
                logps.append(F.log_softmax(policy(obs), -1)[0, 0])
            loss = -torch.stack(logps).sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def moco_queue_with_grad() -> am.Trace:
    # facebookresearch/moco moco/builder.py _dequeue_and_enqueue, with the key encoder's
    # torch.no_grad() forgotten: the queue written in place keeps every step's key graph
    seed()
    encoder_q = nn.Linear(8, 4)
    encoder_k = nn.Linear(8, 4)
    opt = torch.optim.SGD(encoder_q.parameters(), lr=0.1)
    queue = torch.zeros(4, 12)
    with am.track() as trace:
        with raises(TWICE):
            for step in range(3):
                x = torch.randn(4, 8)
                q = F.normalize(encoder_q(x), dim=1)
                k = F.normalize(encoder_k(x + 0.1), dim=1)
                l_neg = q @ queue
                loss = -(q * k).sum(1).mean() + l_neg.logsumexp(1).mean()
                opt.zero_grad()
                loss.backward()  # L:MOCO_BACKWARD
                opt.step()
                queue[:, step * 4 : step * 4 + 4] = k.T  # L:MOCO_QUEUE
    return trace


BROKEN = [
    Case(
        "total-loss",
        "PyTorch FAQ (total_loss += loss)",
        total_loss_tensor,
        (Expect("kept-alive", "TOTAL_LOSS", "total_loss", ("total_loss += loss.item()",)),),
    ),
    Case(
        "loss-history",
        "discuss.pytorch.org losses.append(loss)",
        loss_history,
        (Expect("kept-alive", "LOSS_HISTORY", "losses", (".item()",)),),
    ),
    Case(
        "kept-logits",
        "pytorch/examples imagenet/main.py validate() without no_grad",
        kept_logits,
        (Expect("kept-alive", "KEPT_LOGITS", "all_outputs", ("no_grad",), ("loss.item()",)),),
    ),
    Case(
        "word-lm-no-repackage",
        "pytorch/examples word_language_model/main.py without repackage_hidden",
        word_lm_no_repackage,
        (
            Expect(
                "backward-through-freed",
                "WLM_BACKWARD",
                "loss",
                ("hidden = tuple(t.detach() for t in hidden)",),
            ),
        ),
    ),
    Case(
        "word-lm-retain-graph",
        "pytorch/examples word_language_model/main.py, retain_graph=True instead of detach",
        word_lm_retain_graph,
        (
            Expect(
                "graph-growth",
                "WLMR_HIDDEN",
                "hidden",
                ("hidden = tuple(t.detach() for t in hidden)",),
            ),
            Expect(
                "retained-graph",
                "WLMR_BACKWARD",
                "hidden",
                ("drop retain_graph=True", "as long as `hidden`"),
            ),
            Expect("inplace-on-saved", "WLMR_STEP", "opt", ("Detaching `hidden`",)),
        ),
    ),
    Case(
        "gru-cell-no-detach",
        "time_sequence_prediction-style GRUCell state carried across batches",
        gru_cell_no_detach,
        (Expect("backward-through-freed", "GRU_BACKWARD", "loss", ("state = state.detach()",)),),
    ),
    Case(
        "single-loss-retain",
        "discuss.pytorch.org retain_graph=True in a plain loop",
        single_loss_retain_graph,
        (Expect("retained-graph", "SINGLE_RETAIN", "loss", ("drop retain_graph=True",)),),
    ),
    Case(
        "gan-stale-output",
        "pytorch/examples dcgan/main.py reusing D's output after optimizerD.step()",
        gan_stale_output,
        (
            Expect(
                "inplace-on-saved",
                "STALE_STEP",
                "optimizerD",
                ("after",),
                ("drop retain_graph",),
            ),
        ),
    ),
    Case(
        "clamp-in-helper",
        "discuss.pytorch.org clamp_ in place before BCE",
        clamp_in_helper,
        (Expect("inplace-on-saved", "CLAMP_INNER", "p", ("p = p.clamp(",)),),
    ),
    Case(
        "masked-attention",
        "discuss.pytorch.org attention masked in place after softmax",
        masked_attention_inplace,
        (Expect("inplace-on-saved", "ATT_MUL", "att", ("att = att.mul(",)),),
    ),
    Case(
        "sigmoid-inplace",
        "discuss.pytorch.org sigmoid_ in place",
        sigmoid_inplace,
        (Expect("inplace-on-saved", "SIGMOID", "out", ("out = out.sigmoid()",)),),
    ),
    Case(
        "running-stat",
        "discuss.pytorch.org custom batchnorm running stats with grad",
        module_running_stat,
        (
            Expect(
                "kept-alive",
                "RUNNING_MEAN",
                "norm.running_mean",
                (".detach()",),
                (".item()",),
            ),
        ),
    ),
    Case(
        "logger",
        "a logger's log(loss) keeping the tensor",
        logger_keeps_loss,
        (Expect("kept-alive", "LOGGER_APPEND", "logger.history", (".item()",)),),
    ),
    Case(
        "reinforce-not-cleared",
        "pytorch/examples reinforcement_learning/reinforce.py without del saved_log_probs[:]",
        reinforce_not_cleared,
        (
            Expect(
                "backward-through-freed",
                "REINFORCE_BACKWARD",
                "policy_loss",
                ("policy.saved_log_probs",),
                ("detach",),
            ),
        ),
    ),
    Case(
        "eval-without-no-grad",
        "pytorch/examples mnist/main.py test() without no_grad",
        eval_without_no_grad,
        (Expect("unused-graph", "EVAL_MODEL", "output", ("no_grad",)),),
    ),
    Case(
        "generate-without-no-grad",
        "karpathy/nanoGPT generate() without @torch.no_grad()",
        generate_without_no_grad,
        (Expect("kept-alive", "GENERATE", "past", ("no_grad",), (".item()",)),),
    ),
    Case(
        "numpy-obs-buffer",
        "RL rollout refilling a from_numpy observation buffer",
        numpy_observation_buffer,
        (Expect("data-bypass", "OBS_WRITE", "obs", ()),),
        known_gap="the recorder notices a NumPy write at the next torch op, not at the write",
    ),
    Case(
        "moco-queue",
        "facebookresearch/moco moco/builder.py without no_grad on the key encoder",
        moco_queue_with_grad,
        (
            Expect(
                "backward-through-freed",
                "MOCO_BACKWARD",
                "loss",
                ("k = k.detach()",),
                ("retain_graph=True to",),
            ),
        ),
    ),
]


def _gather_families() -> None:
    """Add each `tests/corpus_<family>.py` module's `CORRECT` and `BROKEN` cases."""
    for path in sorted(Path(__file__).parent.glob("corpus_*.py")):
        if path.stem != "corpus_base":
            family = importlib.import_module(path.stem)
            CORRECT.extend(family.CORRECT)
            BROKEN.extend(family.BROKEN)


_gather_families()
CASES = {case.name: case for case in CORRECT + BROKEN}
assert len(CASES) == len(CORRECT) + len(BROKEN), "two corpus cases share a name"


def lines_of(case: Case) -> Callable[[str], int]:
    """The marker lookup of the file the case's loop is written in."""
    return case.line_of or line_of
