"""Writes a scripted nn.Sequential for the executor's bring-your-own-model test."""
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)
)
torch.jit.script(model).save(sys.argv[1])
