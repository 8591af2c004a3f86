"""Builders for torch_pipeline_test.py: a small MLP of seven children in float64, so that the
pipelined run and one device agree to rounding, and a batch of 8."""
import torch


def build():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
              torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)]
    layers = [layer.double() for layer in layers]
    g = torch.Generator().manual_seed(1)
    return layers, (torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))
