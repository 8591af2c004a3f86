"""Writes a scripted nn.Sequential for the executor's bring-your-own-model tests.

make_torchscript.py OUT.pt [--dropout]: with --dropout, two of its children draw dropout masks
(one a Dropout child, one a block with dropout inside), from torch's global generator.
"""
import sys

import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(16, 16)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x):
        return torch.tanh(self.drop(self.linear(x)))


torch.manual_seed(0)
if "--dropout" in sys.argv[2:]:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), Block(), torch.nn.ReLU(), torch.nn.Linear(16, 4)
    )
else:
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
    )
torch.jit.script(model).save(sys.argv[1])
