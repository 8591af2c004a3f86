"""Writes a scripted nn.Sequential for the executor's bring-your-own-model tests.

make_torchscript.py OUT.pt [--dropout | --attention | --zero-dropout | --tied | --in-place]: with
--dropout, two of its
children draw dropout masks (one a Dropout child, one a block with dropout inside), from torch's
global generator; with --attention, one child draws them inside fused attention
(scaled_dot_product_attention with dropout_p), as library transformer blocks do; with
--zero-dropout, the same children as --dropout with p = 0, which draw nothing (timm and
transformers leave such dropouts in their blocks); with --tied, the first child (an embedding-like
projection) and the fourth (an output projection) hold one weight, as tied language models do;
with --in-place, the second child adds to its input in place and the third is ReLU(inplace=True)
(torchvision's blocks), so a stage may start with a layer that changes its own input.
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


torch.manual_seed(0)
if "--tied" in sys.argv[2:]:
    embed = torch.nn.Linear(8, 6, bias=False)
    model = torch.nn.Sequential(
        embed, torch.nn.Tanh(), torch.nn.Linear(6, 6), TiedHead(embed.weight), torch.nn.Linear(8, 4)
    )
elif "--in-place" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), ShiftInPlace(), torch.nn.ReLU(inplace=True), torch.nn.Linear(16, 16),
        torch.nn.Tanh(), torch.nn.Linear(16, 4)
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
torch.jit.script(model).save(sys.argv[1])
