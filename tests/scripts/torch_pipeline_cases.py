"""Builders for torch_pipeline_test.py: a small MLP of seven children in float64, so that the
pipelined run and one device agree to rounding, and a batch of 8; and the same with its first
and fifth children holding one weight (tied, as a language model's embedding and head)."""
import torch


def build():
    torch.manual_seed(0)
    layers = [torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
              torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)]
    layers = [layer.double() for layer in layers]
    g = torch.Generator().manual_seed(1)
    return layers, (torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))


class TiedHead(torch.nn.Module):
    """x W: reuses the first child's matrix W (32 x 16), 32 -> 16."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x):
        return x.matmul(self.weight)


def build_tied():
    torch.manual_seed(0)
    first = torch.nn.Linear(16, 32, bias=False).double()
    layers = [first, torch.nn.ReLU(), torch.nn.Linear(32, 32).double(), torch.nn.Tanh(), TiedHead(first.weight),
              torch.nn.ReLU(), torch.nn.Linear(16, 4).double()]
    g = torch.Generator().manual_seed(1)
    return layers, (torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g))


class Sleep(torch.autograd.Function):
    """Sleeps a known time in its forward and in its backward: the trace's spans' truth."""

    @staticmethod
    def forward(ctx, x, forward_s, backward_s):
        import time
        time.sleep(forward_s)
        ctx.backward_s = backward_s
        return x * 1.0

    @staticmethod
    def backward(ctx, grad):
        import time
        time.sleep(ctx.backward_s)
        return grad * 1.0, None, None


class Sleepy(torch.nn.Module):
    FORWARD_S, BACKWARD_S = 0.02, 0.04

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return Sleep.apply(self.linear(x), self.FORWARD_S, self.BACKWARD_S)


def build_sleepy():
    """Four children, each sleeping 20 ms forward and 40 ms backward."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return [Sleepy() for _ in range(4)], (torch.randn(4, 8, generator=g), torch.randint(0, 8, (4,), generator=g))


def build_sleepy_frozen_stem():
    """build_sleepy's children, the first two frozen (transfer learning's stem)."""
    children, batch = build_sleepy()
    for child in children[:2]:
        child.requires_grad_(False)
    return children, batch


def build_dropout():
    """A linear layer, dropout, a linear head: on a CPU eager dropout saves a float32 mask."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return ([torch.nn.Linear(8, 8), torch.nn.Dropout(0.5), torch.nn.Linear(8, 4)],
            (torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)))


def build_inplace():
    """A linear layer, an in-place ReLU, a linear head: a stage that starts at the ReLU is one
    torch refuses (it hands a stage's input as a leaf)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    return ([torch.nn.Linear(16, 32).double(), torch.nn.ReLU(inplace=True), torch.nn.Linear(32, 4).double()],
            (torch.randn(8, 16, generator=g, dtype=torch.float64), torch.randint(0, 4, (8,), generator=g)))


def build_zero_bubble():
    """A linear layer; two linear layers around a GELU as one child; a layer norm without
    weights; a linear head; float64: what torch's zero-bubble I keeps and frees of each child,
    and what its W frees as it goes, counted by hand in eager_profile_test.py."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    middle = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 8))
    return ([torch.nn.Linear(8, 16).double(), middle.double(),
             torch.nn.LayerNorm(8, elementwise_affine=False).double(), torch.nn.Linear(8, 4).double()],
            (torch.randn(4, 8, generator=g, dtype=torch.float64), torch.randint(0, 4, (4,), generator=g)))
