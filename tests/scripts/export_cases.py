"""Small models for export_model_test.py: each reproduces, with torch alone, a way a library's
module fails to script (keyword-only arguments with defaults, *args, **kwargs), to trace
faithfully, or to fit pipetune (a tuple returned, two inputs, a tied weight). Each builder
returns (model, (inputs, targets)) as scripts/export_model.py expects."""
import torch


class KeywordOnly(torch.nn.Module):
    """TorchScript refuses keyword-only arguments with defaults (as in a transformers block);
    the trace is faithful. Dropout inside, so the proof must fix the random state."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)
        self.drop = torch.nn.Dropout(0.25)

    def forward(self, x, *, scale: float = 2.0, mask=None):
        return self.drop(self.norm(torch.tanh(self.linear(x)) * scale))


def traced():
    torch.manual_seed(0)
    model = [torch.nn.Linear(6, 8), KeywordOnly(), torch.nn.Linear(8, 3)]
    return model, (torch.randn(5, 6), torch.randint(0, 3, (5,)))


class SizeBranch(torch.nn.Module):
    """**kwargs stops the script; the branch on the batch size makes the tracer warn."""

    def forward(self, x, **kwargs):
        if x.size(0) > 2:
            return x * 2
        return x


def size_branch():
    return [torch.nn.Linear(6, 4), SizeBranch()], (torch.randn(4, 6), torch.randn(4, 4))


class BakedSize(torch.nn.Module):
    """*args stops the script; the batch size, counted in Python, goes into the trace as a constant
    without a tracer warning, so the trace fails at any other size."""

    def forward(self, x, *args):
        samples = len(x.unbind(0))
        return x.reshape(samples, 2, -1).sum(1)


def baked_size():
    return [torch.nn.Linear(6, 4), BakedSize()], (torch.randn(4, 6), torch.randn(4, 2))


class SilentBranch(torch.nn.Module):
    """As BakedSize, but the baked count picks a branch: the trace runs at every size, wrongly
    below three samples."""

    def forward(self, x, *args):
        if len(x.unbind(0)) > 2:
            return x * 2
        return x


def silent_branch():
    return [torch.nn.Linear(6, 4), SilentBranch()], (torch.randn(4, 6), torch.randn(4, 4))


class Pair(torch.nn.Module):
    def forward(self, x):
        return x, x.sum(-1)


def returns_tuple():
    return [torch.nn.Linear(6, 4), Pair()], (torch.randn(4, 6), torch.randn(4, 4))


class Named(torch.nn.Module):
    def forward(self, x):
        return {"last_hidden_state": x, "pooled": x.mean(-1)}


def returns_dict():
    return [torch.nn.Linear(6, 4), Named()], (torch.randn(4, 6), torch.randn(4, 4))


class Masked(torch.nn.Module):
    def forward(self, x, mask):
        return x * mask


def two_inputs():
    return [torch.nn.Linear(6, 4), Masked()], (torch.randn(4, 6), torch.randn(4, 4))


class Fails(torch.nn.Module):
    def forward(self, x):
        raise RuntimeError("this child must never run")


class TracedHead(torch.nn.Module):
    """An output projection reusing the embedding's matrix, with a keyword-only argument so
    that it does not script: the tie must survive tracing."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight

    def forward(self, x, *, scale: float = 1.0):
        return x.matmul(self.weight.t()) * scale


def tied():
    """An embedding and an output projection holding one weight: kept as one."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(10, 4)
    return ([embed, torch.nn.Tanh(), TracedHead(embed.weight)],
            (torch.randint(0, 10, (4, 3)), torch.randint(0, 10, (4, 3))))


def tied_view():
    """A projection holding a view of the embedding's weight (another tensor over its storage):
    it would train apart. The child that fails when run shows that the refusal comes first."""
    embed, head = torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False)
    head.weight = torch.nn.Parameter(embed.weight.detach()[:])
    return [embed, Fails(), head], (torch.randint(0, 10, (4, 3)), torch.randint(0, 10, (4, 3)))


class Untraceable(torch.nn.Module):
    def forward(self, x, *args):
        if torch.jit.is_tracing():
            raise RuntimeError("no tracing here")
        return x


def neither():
    return [torch.nn.Linear(6, 4), Untraceable()], (torch.randn(4, 6), torch.randn(4, 4))
