"""Small models for export_model_test.py: each reproduces, with torch alone, a way a library's
module fails to script (keyword-only arguments with defaults, *args, **kwargs), to trace
faithfully, or to fit pipetune (a tuple returned, two inputs, a tied weight). Each builder
returns (model, (inputs, targets)) as scripts/export_model.py expects."""
from typing import Optional

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


def tied_frozen():
    """tied()'s weight frozen (fine-tuning with the embedding fixed), a layer between that trains."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(10, 4)
    embed.weight.requires_grad_(False)
    return ([embed, torch.nn.Linear(4, 4), TracedHead(embed.weight)],
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


class FloorMasked(torch.nn.Module):
    """*args stops the script; the mask value is torch.tensor() of a Python float, which the
    tracer warns it keeps as a constant (transformers' GPT-Neo attention): right at every size."""

    def forward(self, x, *args):
        floor = torch.tensor(torch.finfo(x.dtype).min, dtype=x.dtype, device=x.device)
        return torch.softmax(torch.where(x > 0.5, floor, x), dim=-1)


def tensor_constant():
    torch.manual_seed(0)
    return [torch.nn.Linear(6, 4), FloorMasked()], (torch.randn(5, 6), torch.randint(0, 4, (5,)))


class PerSample(torch.nn.Module):
    """As FloorMasked, but the constant counts the batch: the trace keeps the example's."""

    def forward(self, x, *args):
        return x / torch.tensor(len(x.unbind(0)), dtype=x.dtype)


def tensor_of_the_batch_size():
    return [torch.nn.Linear(6, 4), PerSample()], (torch.randn(4, 6), torch.randn(4, 4))


class ItemScaled(torch.nn.Module):
    """As FloorMasked, but the constant is read from the input's data: the tracer warns as the
    value becomes a Python number."""

    def forward(self, x, *args):
        return x / torch.tensor(x.abs().max().item())


def tensor_of_the_data():
    return [torch.nn.Linear(6, 4), ItemScaled()], (torch.randn(4, 6), torch.randn(4, 4))


class HalfSquare(torch.autograd.Function):
    """A Python autograd function (transformers' Bloom trains its GELU through one)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 0.5 * x * x

    @staticmethod
    def backward(ctx, gradient):
        (x,) = ctx.saved_tensors
        return gradient * x


class CallsAFunction(torch.nn.Module):
    def forward(self, x, *args):
        return HalfSquare.apply(x)


def python_function():
    return [torch.nn.Linear(6, 4), CallsAFunction()], (torch.randn(4, 6), torch.randn(4, 4))


class IgnoredBranch(torch.nn.Module):
    """Scripts, but a branch it never takes calls a method marked torch.jit.ignore, which the
    script keeps as a call into Python and cannot save (as timm's MobileViT-v2 attention). Its
    trace records the branch taken."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    @torch.jit.ignore
    def crossed(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * other

    def forward(self, x: torch.Tensor, other: Optional[torch.Tensor] = None) -> torch.Tensor:
        if other is None:
            return torch.relu(self.linear(x))
        return self.crossed(x, other)


def ignored_branch():
    torch.manual_seed(0)
    return [torch.nn.Linear(6, 4), IgnoredBranch()], (torch.randn(5, 6), torch.randn(5, 4))


class ZeroThenDropout(torch.nn.Module):
    """A dropout of p = 0 in training mode, then one of p = 0.3, as transformers' OPT layer has
    (attention dropout 0, then residual dropout). The graph executor's optimised path rewrites
    dropout as native_dropout, which draws a mask even at p = 0, so from a trace's second run on
    the later mask differs from Python's under the same seed; run as the graph is written, it is
    the same. Keyword-only argument: it does not script."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x, *, scale: float = 1.0):
        h = torch.nn.functional.dropout(torch.tanh(self.linear(x)), p=0.0, training=self.training)
        return x + torch.nn.functional.dropout(self.norm(h), p=0.3, training=self.training) * scale


def zero_then_dropout():
    torch.manual_seed(0)
    return [torch.nn.Linear(6, 8), ZeroThenDropout(), torch.nn.Linear(8, 3)], (torch.randn(6, 6), torch.randint(0, 3, (6,)))


class CheckedEmbedding(torch.nn.Module):
    """Token and learned position embeddings in one child, as a user wraps a library's (OPT's
    positions do not script). nn.Embedding with a padding index checks it against the table's
    size, a branch the tracer warns about; its only effect is to raise, so it cannot bake an
    output. The child's own check below is the same kind."""

    def __init__(self):
        super().__init__()
        self.tokens = torch.nn.Embedding(10, 8, padding_idx=1)
        self.positions = torch.nn.Embedding(16, 8)

    def forward(self, ids, *args):
        if ids.size(1) > self.positions.num_embeddings:
            raise ValueError("sequence longer than the position table")
        places = torch.arange(ids.size(1), device=ids.device)
        return self.tokens(ids) + self.positions(places)


def checked_embedding():
    torch.manual_seed(0)
    return [CheckedEmbedding(), torch.nn.Tanh(), torch.nn.Linear(8, 10)], (torch.randint(0, 10, (4, 5)), torch.randint(0, 10, (4, 5)))


class NormedKeywordOnly(torch.nn.Module):
    """Batch norm inside a child that does not script: F.batch_norm checks that a channel holds
    more than one value, a check that only raises; the trace updates the running statistics as
    Python does, which the proof compares at every size (one sample: Python refuses, skipped)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.BatchNorm1d(8)

    def forward(self, x, *, scale: float = 1.0):
        return torch.relu(self.norm(self.linear(x))) * scale


def traced_batch_norm():
    torch.manual_seed(0)
    return [torch.nn.Linear(6, 8), NormedKeywordOnly(), torch.nn.Linear(8, 3)], (torch.randn(6, 6), torch.randint(0, 3, (6,)))


class Frequencies(torch.nn.Module):
    """A table no forward changes (a rotary embedding's frequencies), as a model's one module."""

    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.linspace(0.5, 2.0, 8), persistent=False)

    def forward(self, x):
        return torch.sin(x * self.table)


class Block(torch.nn.Module):
    """A block wrapper handed the model's one Frequencies module, as users wrap transformers'
    layers with its one rotary embedding."""

    def __init__(self, shared):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.shared = shared

    def forward(self, x):
        return torch.tanh(self.linear(x)) + self.shared(x)


def shared_constant_buffer():
    torch.manual_seed(0)
    shared = Frequencies()
    return ([torch.nn.Linear(6, 8), Block(shared), Block(shared), torch.nn.Linear(8, 3)],
            (torch.randn(4, 6), torch.randint(0, 3, (4,))))


def shared_batch_norm():
    """One BatchNorm1d in two children: its running statistics change in every forward."""
    torch.manual_seed(0)
    norm = torch.nn.BatchNorm1d(8)
    return ([torch.nn.Linear(6, 8), norm, torch.nn.Tanh(), norm, torch.nn.Linear(8, 3)],
            (torch.randn(4, 6), torch.randint(0, 3, (4,))))


def reused_activation():
    """One GELU instance at two places, as `nn.Sequential(linear, act, linear, act)` is often
    written: both uses are layers (named_children() would give it once)."""
    torch.manual_seed(0)
    act = torch.nn.GELU()
    return ([torch.nn.Linear(6, 8), act, torch.nn.Linear(8, 3), act],
            (torch.randn(4, 6), torch.randint(0, 3, (4,))))


class Whole(torch.nn.Module):
    """A model whose parts a user splits, as a library's model is built."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)])
        self.head = torch.nn.Linear(8, 3)


class Front(torch.nn.Module):
    """A wrapper that keeps the whole model to call its first part."""

    def __init__(self, whole):
        super().__init__()
        self.model = whole

    def forward(self, x):
        return self.model.embed(x)


class Back(torch.nn.Module):
    def __init__(self, whole):
        super().__init__()
        self.model = whole

    def forward(self, x):
        return self.model.head(x)


def whole_model_wrappers():
    """Front and Back each hold every parameter; the blocks are children of their own. Front does
    not use 6 tensors other children train (the blocks' 2 × (64 + 8) floats, the head's 24 + 3):
    684 bytes; Back 6 (the embedding's 32 + 8, the blocks'): 736 bytes."""
    torch.manual_seed(0)
    whole = Whole()
    return ([Front(whole), whole.blocks[0], whole.blocks[1], Back(whole)],
            (torch.randn(4, 4), torch.randint(0, 3, (4,))))


class WithSpare(torch.nn.Module):
    """Holds a layer its forward never calls (64 + 8 floats: 288 bytes)."""

    def __init__(self):
        super().__init__()
        self.used, self.spare = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.zero = torch.nn.Parameter(torch.ones(8))  # reached, with a gradient of zero

    def forward(self, x):
        return torch.relu_(self.used(x)) + 0 * self.zero


def spare_parameters():
    torch.manual_seed(0)
    return ([torch.nn.Linear(4, 8), WithSpare(), torch.nn.Linear(8, 3)],
            (torch.randn(4, 4), torch.randint(0, 3, (4,))))


class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.tanh(self.b(torch.tanh(self.a(x))))


def one_block_at_every_depth():
    """ALBERT's sharing: one module (4 parameters) at four places of the list."""
    torch.manual_seed(0)
    block = TwoLinear()
    return ([torch.nn.Linear(4, 8), block, block, block, block, torch.nn.Linear(8, 3)],
            (torch.randn(4, 4), torch.randint(0, 3, (4,))))


class HalvesBySize(torch.nn.Module):
    """As GPT-J's rotary embedding: torch.split at half a traced size. The tracer warns inside
    torch's own Tensor.split (`int(split_size)`), not at this line, which the refusal names."""

    def forward(self, x, *args):
        first, second = torch.split(x, x.shape[-1] // 2, dim=-1)
        return torch.cat([second, first], dim=-1)


def warns_inside_torch():
    return [torch.nn.Linear(6, 4), HalvesBySize()], (torch.randn(4, 6), torch.randn(4, 4))


class BadlyCalled(torch.nn.Module):
    """A method called with an argument of the type its annotation does not say (Python does
    not mind): TorchScript refuses the class, and
    keeps it half-registered, so a second child of the same class fails with "Can't redefine
    method" instead (transformers' DeBERTa-v2 attention, whose trace is then refused for a branch
    on a size, as CallsBadly's)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def scaled(self, x, scale: torch.Tensor):
        return self.linear(x) * scale

    def forward(self, x):
        return self.scaled(x, scale=2.0)  # a float where TorchScript expects a tensor


class CallsBadly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = BadlyCalled()

    def forward(self, x):
        if x.size(-1) != 4:  # DeBERTa-v2 compares query and key lengths so
            x = x[..., :4]
        return torch.tanh(self.inner(x))


def same_class_fails_twice():
    torch.manual_seed(0)
    return [CallsBadly(), CallsBadly()], (torch.randn(4, 4), torch.randn(4, 4))
