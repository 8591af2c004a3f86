"""Models for the exporter's end-to-end test: a regression MLP given as a list of modules, and
one whose second child TorchScript cannot compile."""
import torch


def build():
    torch.manual_seed(0)
    model = [torch.nn.Linear(6, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2)]
    x = torch.randn(64, 6)
    y = torch.stack([x[:, :3].sum(1), x[:, 3:].prod(1)], 1)
    return model, (x, y)


class ToNumpy(torch.nn.Module):
    def forward(self, x):
        return torch.from_numpy(x.numpy())


def unscriptable():
    return [torch.nn.Linear(6, 4), ToNumpy()], (torch.randn(8, 6), torch.randn(8, 4))
