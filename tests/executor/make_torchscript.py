"""Writes a scripted nn.Sequential for the executor's bring-your-own-model tests.

make_torchscript.py OUT.pt [--dropout | --attention | --zero-dropout | --tied | --shared-block | --in-place |
--in-place-dropout | --index-buffer | --drop-path | --batch-norm | --frozen-stem]: with
--dropout, two of its
children draw dropout masks (one a Dropout child, one a block with dropout inside), from torch's
global generator; with --attention, one child draws them inside fused attention
(scaled_dot_product_attention with dropout_p), as library transformer blocks do; with
--zero-dropout, the same children as --dropout with p = 0, which draw nothing (timm and
transformers leave such dropouts in their blocks); with --tied, the first child (an embedding-like
projection) and the fourth (an output projection) hold one weight, as tied language models do;
with --shared-block, children 1 to 4 hold one Linear (weight and bias), as ALBERT repeats one
layer at every depth;
with --in-place, the second child adds to its input in place and the third is ReLU(inplace=True)
(torchvision's blocks), so a stage may start with a layer that changes its own input; with
--in-place-dropout, a Flatten (a view of its input) then Dropout(inplace=True) (torchvision's
classifiers), which changes its input in training mode only; with --index-buffer, a child that
reorders its features by an int64 buffer of indices and scales them by a float buffer (as
transformers' BERT keeps its position ids); with --drop-path, two residual blocks that drop their
branch per sample with `bernoulli_` (timm's drop path, torchvision's stochastic depth); with
--batch-norm, a BatchNorm1d child and a block holding one, whose running statistics each
training-mode forward updates (torchvision's and timm's convolutional nets); with --frozen-stem,
the default model with its first three children's parameters frozen (transfer learning's stem).
"""
import sys

import torch


class Block(torch.nn.Module):
    def __init__(self, p=0.3):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x):
        return torch.tanh(self.drop(self.linear(x)))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.linear(x).view(x.size(0), 4, 4)
        attended = torch.nn.functional.scaled_dot_product_attention(h, h, h, dropout_p=0.3)
        return attended.reshape(x.size(0), 16)


class ShiftInPlace(torch.nn.Module):
    """x += 0.5, in place: applied twice (a recompute on an input already changed) it shows."""

    def forward(self, x):
        x.add_(0.5)
        return x


class TiedHead(torch.nn.Module):
    """x W: the projection that reuses the embedding's matrix W (6 x 8), 6 -> 8."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return x.matmul(self.weight)


class SharedBlock(torch.nn.Module):
    """tanh(x A + b) with A and b one Linear that every SharedBlock holds (ALBERT's one layer
    at every depth)."""

    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Reorder(torch.nn.Module):
    """The features reversed by an int64 buffer of indices, then halved by a float buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("order", torch.arange(15, -1, -1))
        self.register_buffer("scale", torch.full((16,), 0.5))

    def forward(self, x):
        return x.gather(1, self.order.expand(x.size(0), -1)) * self.scale


class DropPath(torch.nn.Module):
    """x + branch(x), the branch kept per sample with probability 0.7 and scaled by 1 / 0.7."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        branch = torch.tanh(self.linear(x))
        if self.training:
            keep = x.new_empty(x.size(0), 1).bernoulli_(0.7)
            branch = branch * keep / 0.7
        return x + branch


class NormBlock(torch.nn.Module):
    """tanh(batch_norm(x W)): a block that updates running statistics inside."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.norm = torch.nn.BatchNorm1d(16)

    def forward(self, x):
        return torch.tanh(self.norm(self.linear(x)))


torch.manual_seed(0)
if "--tied" in sys.argv[2:]:
    embed = torch.nn.Linear(8, 6, bias=False)
    model = torch.nn.Sequential(
        embed, torch.nn.Tanh(), torch.nn.Linear(6, 6), TiedHead(embed.weight), torch.nn.Linear(8, 4)
    )
elif "--shared-block" in sys.argv[2:]:
    shared = torch.nn.Linear(6, 6)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 6), SharedBlock(shared), SharedBlock(shared), SharedBlock(shared), SharedBlock(shared),
        torch.nn.Linear(6, 4)
    )
elif "--in-place" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), ShiftInPlace(), torch.nn.ReLU(inplace=True), torch.nn.Linear(16, 16),
        torch.nn.Tanh(), torch.nn.Linear(16, 4)
    )
elif "--in-place-dropout" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Flatten(1), torch.nn.Dropout(0.5, inplace=True), torch.nn.Tanh(),
        torch.nn.Linear(16, 4)
    )
elif "--index-buffer" in sys.argv[2:]:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), Reorder(), torch.nn.Tanh(), torch.nn.Linear(16, 4))
elif "--drop-path" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), DropPath(), torch.nn.ReLU(), DropPath(), torch.nn.Linear(16, 4)
    )
elif "--batch-norm" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), NormBlock(), torch.nn.Linear(16, 4)
    )
elif "--dropout" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), Block(), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
elif "--zero-dropout" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.0), Block(0.0), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
elif "--attention" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), Attention(), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
    )
else:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
    )
if "--frozen-stem" in sys.argv[2:]:
    for child in list(model)[:3]:
        child.requires_grad_(False)
torch.jit.script(model).save(sys.argv[1])
