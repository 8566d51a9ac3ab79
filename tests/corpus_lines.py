# The loops keep their sources' own style (nested with-blocks, unused loop names), so a user's
# code is what the findings see.
# ruff: noqa: B007, F841, SIM117
"""Corpus family (issue 35): problems on a line of a function the user wrote (a module's
`forward`, an attack function, a forward hook), and crashes or retain_graph whose cause must be
said first. Each loop is shrunk from the public code it names and runs on random data."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from corpus_base import INPLACE, Case, Expect, raises, seed
from markers import marker_lines

import autograd_magic as am

line_of = marker_lines(__file__)


def small_net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))


def batches(n: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(torch.rand(8, 6), torch.randint(0, 3, (8,))) for _ in range(n)]


# ===== adversarial training ======================================================================
def pgd_linf(model, X, y, epsilon=0.1, alpha=0.05, num_iter=3):
    # adversarial-ml tutorial (Kolter & Madry), chapter 4: pgd_linf
    delta = torch.zeros_like(X, requires_grad=True)
    for t in range(num_iter):
        loss = nn.CrossEntropyLoss()(model(X + delta), y)
        loss.backward()
        delta.data = (delta + alpha * delta.grad.detach().sign()).clamp(-epsilon, epsilon)
        delta.grad.zero_()
    return delta.detach()


def pgd_training() -> am.Trace:
    # adversarial-ml tutorial, chapter 4: epoch_adversarial(loader, model, pgd_linf, opt)
    seed()
    model, data = small_net(), batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with am.track() as trace:
        for X, y in data:
            delta = pgd_linf(model, X, y)
            yp = model(X + delta)
            loss = nn.CrossEntropyLoss()(yp, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def fgsm_training() -> am.Trace:
    # locuslab/fast_adversarial CIFAR10/train_fgsm.py: FGSM with a random start
    seed()
    model, data = small_net(), batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    epsilon, alpha = 0.1, 0.125
    with am.track() as trace:
        for X, y in data:
            delta = torch.zeros_like(X).uniform_(-epsilon, epsilon)
            delta.requires_grad = True
            output = model(X + delta)
            loss = F.cross_entropy(output, y)
            loss.backward()
            grad = delta.grad.detach()
            delta.data = torch.clamp(delta + alpha * torch.sign(grad), -epsilon, epsilon)
            delta = delta.detach()
            output = model(X + delta)
            loss = F.cross_entropy(output, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def pgd_shared_input() -> am.Trace:
    # cleverhans-style mixed clean + adversarial loss, with a PGD that forgot to copy its input:
    # `x_adv = x` then `x_adv.data.add_(...)` perturbs the clean batch the clean forward saved
    seed()
    model, data = small_net(), batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def pgd(model, x, y, eps=0.1, alpha=0.05, steps=2):
        x_adv = x
        for _ in range(steps):
            x_adv.requires_grad_(True)
            loss = F.cross_entropy(model(x_adv), y)
            (grad,) = torch.autograd.grad(loss, [x_adv])
            x_adv.data.add_(alpha * grad.sign()).clamp_(0, 1)  # L:PGD_DATA_ADD
        return x_adv.detach()

    with am.track() as trace:
        for x, y in data:
            clean_loss = F.cross_entropy(model(x), y)
            x_adv = pgd(model, x, y)  # L:PGD_CALL
            adv_loss = F.cross_entropy(model(x_adv), y)
            loss = 0.5 * clean_loss + 0.5 * adv_loss
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


def fgsm_inplace_input() -> am.Trace:
    # the same mixed loss with an FGSM that steps the input in place under no_grad (a
    # discuss.pytorch.org "modified by an inplace operation" thread about adversarial training)
    seed()
    model, data = small_net(), batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def fgsm(model, x, y, eps=0.1):
        x.requires_grad_(True)
        loss = F.cross_entropy(model(x), y)
        (grad,) = torch.autograd.grad(loss, [x])
        with torch.no_grad():
            x += eps * grad.sign()  # L:FGSM_STEP
        return x.detach()

    with am.track() as trace:
        with raises(INPLACE):
            for x, y in data:
                clean_loss = F.cross_entropy(model(x), y)
                x_adv = fgsm(model, x, y)  # L:FGSM_CALL
                loss = clean_loss + F.cross_entropy(model(x_adv), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    return trace


# ===== forward hooks =============================================================================
def hook_features_detached() -> am.Trace:
    # discuss.pytorch.org "How can I extract intermediate layer output" (get_activation hook
    # with output.detach()), as torchvision's feature extraction returns features per call
    seed()
    model, data = small_net(), batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    activation = {}

    def get_activation(name):
        def hook(model, input, output):
            activation[name] = output.detach()

        return hook

    handle = model[1].register_forward_hook(get_activation("relu"))
    with am.track() as trace:
        for x, y in data:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mean_act = activation["relu"].mean().item()
    handle.remove()
    return trace


def hook_features_kept() -> am.Trace:
    # the same hook appending `output` itself to a list over the epoch (Grad-CAM-style
    # ActivationsAndGradients without its .detach() and without resetting per call)
    seed()
    model, data = small_net(), batches()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    features = []

    def hook(module, input, output):
        features.append(output)  # L:HOOK_APPEND

    handle = model[1].register_forward_hook(hook)
    with am.track() as trace:
        for x, y in data:
            loss = F.cross_entropy(model(x), y)  # L:HOOK_FORWARD
            opt.zero_grad()
            loss.backward()
            opt.step()
    handle.remove()
    return trace


# ===== in-place ops inside a user module's forward ===============================================
class BasicBlock(nn.Module):
    """torchvision/models/resnet.py BasicBlock, on vectors: `out += identity` then ReLU(inplace)."""

    def __init__(self, n: int = 6) -> None:
        super().__init__()
        self.fc1, self.bn1 = nn.Linear(n, n), nn.BatchNorm1d(n)
        self.relu = nn.ReLU(inplace=True)
        self.fc2, self.bn2 = nn.Linear(n, n), nn.BatchNorm1d(n)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.fc1(x)))
        out = self.bn2(self.fc2(out))
        out += identity
        out = self.relu(out)
        return out


def resnet_block_inplace() -> am.Trace:
    # torchvision resnet BasicBlock trained like pytorch/examples imagenet/main.py train()
    seed()
    model = nn.Sequential(BasicBlock(), nn.Linear(6, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with am.track() as trace:
        for x, y in batches():
            output = model(x)
            loss = F.cross_entropy(output, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return trace


class GatedNet(nn.Module):
    """A forum-style module adding a learned bias in place after a sigmoid gate."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(6, 12)
        self.bias = nn.Parameter(torch.zeros(12))
        self.fc2 = nn.Linear(12, 3)

    def forward(self, x):
        out = torch.sigmoid(self.fc1(x))  # L:GATE_SAVED
        out += self.bias  # L:GATE_ADD
        return self.fc2(out)


def module_bias_inplace() -> am.Trace:
    # discuss.pytorch.org "one of the variables needed for gradient computation has been
    # modified by an inplace operation" with `x += self.bias` in forward
    seed()
    model = GatedNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with am.track() as trace:
        with raises(INPLACE):
            for x, y in batches():
                loss = F.cross_entropy(model(x), y)  # L:GATE_CALL
                opt.zero_grad()
                loss.backward()
                opt.step()
    return trace


class ExpRelu(nn.Module):
    """A module clipping an exponential in place with `relu_` (saved by exp for backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        out = self.fc(x).exp()
        out.relu_()  # L:EXP_RELU
        return out


def module_relu_inplace() -> am.Trace:
    # the same family of threads, with `out.relu_()` after an op that saves its output
    seed()
    model = ExpRelu()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with am.track() as trace:
        with raises(INPLACE):
            for x, y in batches():
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
    return trace


# ===== a crash that skips the rest of the step; retain_graph on several losses ===================
def gan_crash_skips_generator() -> am.Trace:
    # pytorch/examples dcgan/main.py with D's output clamped in place before BCELoss (a
    # discuss.pytorch.org "numerical stability" fix): errD_fake.backward() raises, so the
    # generator step never runs and `fake`'s graph is left unused
    seed()
    netG = nn.Sequential(nn.Linear(4, 8), nn.Tanh())
    netD = nn.Sequential(nn.Linear(8, 1), nn.Sigmoid())
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
    with am.track() as trace:
        with raises(INPLACE):
            for real in [torch.rand(8, 8) for _ in range(2)]:
                netD.zero_grad()
                errD_real = criterion(netD(real), torch.ones(8, 1))
                errD_real.backward()
                fake = netG(torch.randn(8, 4))  # L:CRASH_FAKE
                output = netD(fake.detach())
                output.clamp_(1e-6, 1 - 1e-6)  # L:CRASH_CLAMP
                errD_fake = criterion(output, torch.zeros(8, 1))
                errD_fake.backward()
                optD.step()
                netG.zero_grad()
                errG = criterion(netD(fake), torch.ones(8, 1))
                errG.backward()
                optG.step()
    return trace


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.head_a, self.head_b = nn.Linear(16, 1), nn.Linear(16, 3)

    def forward(self, x):
        h = self.trunk(x)
        return self.head_a(h), self.head_b(h)


def multitask_data():
    seed()
    model = TwoHeads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.randn(8, 6), torch.randn(8, 1), torch.randint(0, 3, (8,))) for _ in range(3)]
    return model, opt, data


def multitask_summed() -> am.Trace:
    # discuss.pytorch.org multi-task answers: one backward over the summed losses, `.item()`
    model, opt, data = multitask_data()
    with am.track() as trace:
        running_loss = 0.0
        for x, ya, yb in data:
            pa, pb = model(x)
            loss = F.mse_loss(pa, ya) + F.cross_entropy(pb, yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            running_loss += loss.item()
    return trace


def multitask_retain_each() -> am.Trace:
    # the same with retain_graph=True on each task's loss and the losses summed as tensors
    model, opt, data = multitask_data()
    with am.track() as trace:
        running_loss = 0.0
        for x, ya, yb in data:
            pa, pb = model(x)
            loss_a = F.mse_loss(pa, ya)
            loss_b = F.cross_entropy(pb, yb)
            opt.zero_grad()
            loss_a.backward(retain_graph=True)
            loss_b.backward(retain_graph=True)  # L:MT_RETAIN
            opt.step()
            running_loss += loss_a + loss_b  # L:MT_SUM
    return trace


CORRECT = [
    Case(
        "pgd-training",
        "adversarial-ml tutorial (Kolter & Madry) ch. 4 pgd_linf",
        pgd_training,
        line_of=line_of,
    ),
    Case(
        "fgsm-training",
        "locuslab/fast_adversarial CIFAR10/train_fgsm.py",
        fgsm_training,
        line_of=line_of,
    ),
    Case(
        "hook-features-detached",
        "discuss.pytorch.org get_activation forward hook with output.detach()",
        hook_features_detached,
        line_of=line_of,
    ),
    Case(
        "resnet-block-inplace",
        "torchvision models/resnet.py BasicBlock",
        resnet_block_inplace,
        line_of=line_of,
    ),
    Case(
        "multitask-summed",
        "discuss.pytorch.org multi-task loss summed once",
        multitask_summed,
        line_of=line_of,
    ),
]

BROKEN = [
    Case(
        "pgd-shared-input",
        "cleverhans-style clean + PGD loss, the attack writing its input through .data",
        pgd_shared_input,
        (Expect("data-bypass", "PGD_DATA_ADD", "x", ("of `pgd`", "called at line")),),
        line_of=line_of,
    ),
    Case(
        "fgsm-inplace-input",
        "discuss.pytorch.org adversarial training, FGSM stepping its input in place",
        fgsm_inplace_input,
        (Expect("inplace-on-saved", "FGSM_STEP", "x", ("`fgsm`", "called at line")),),
        line_of=line_of,
    ),
    Case(
        "hook-features-kept",
        "Grad-CAM-style forward hook appending `output` without .detach()",
        hook_features_kept,
        (Expect("kept-alive", "HOOK_APPEND", "features", (".detach()",)),),
        line_of=line_of,
    ),
    Case(
        "module-bias-inplace",
        "discuss.pytorch.org `x += self.bias` in a module's forward",
        module_bias_inplace,
        (
            Expect(
                "inplace-on-saved",
                "GATE_ADD",
                "out",
                ("`out` in `GatedNet.forward`", "out = out + self.bias"),
                ("tensor#",),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "module-relu-inplace",
        "discuss.pytorch.org `out.relu_()` in a module's forward",
        module_relu_inplace,
        (
            Expect(
                "inplace-on-saved",
                "EXP_RELU",
                "out",
                ("`out` in `ExpRelu.forward`", "out = out.relu()"),
                ("tensor#",),
            ),
        ),
        line_of=line_of,
    ),
    Case(
        "gan-crash-skips-generator",
        "pytorch/examples dcgan/main.py with D's output clamped in place",
        gan_crash_skips_generator,
        (
            Expect("inplace-on-saved", "CRASH_CLAMP", "output", ("output = output.clamp(",)),
            Expect("unused-graph", "CRASH_FAKE", "fake", ("the error",), ("no_grad",)),
        ),
        line_of=line_of,
    ),
    Case(
        "multitask-retain-each",
        "discuss.pytorch.org multi-task loss with retain_graph=True on each loss",
        multitask_retain_each,
        (
            Expect("retained-graph", "MT_RETAIN", "loss_b", ("drop retain_graph=True",)),
            Expect(
                "kept-alive", "MT_SUM", "running_loss", ("retain_graph=True) at line", ".item()")
            ),
        ),
        line_of=line_of,
    ),
]
