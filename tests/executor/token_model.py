"""A GPT-like token model and a batch of next-token data, for scripts/export_model.py.

Embedding with learned positions, pre-norm Transformer encoder layers under a causal mask, and a
head; 20 samples of 16 tokens, each target the token after its input (views of one sequence,
as a data loader slices them).
"""
import collections

import torch

VOCAB, WIDTH, HEADS, SEQ, LAYERS, SAMPLES = 50, 32, 4, 16, 2, 20


class Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.token = torch.nn.Embedding(VOCAB, WIDTH)
        self.position = torch.nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.token(tokens) + self.position[: tokens.size(1)]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True,
                                                      norm_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.size(1)
        future = torch.triu(torch.full((s, s), float("-inf"), dtype=x.dtype, device=x.device), diagonal=1)
        return self.layer(x, src_mask=future)


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.out = torch.nn.Linear(WIDTH, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def build():
    torch.manual_seed(0)
    layers = [("embed", Embed())] + [(f"block{i}", Block()) for i in range(LAYERS)] + [("head", Head())]
    model = torch.nn.Sequential(collections.OrderedDict(layers))
    text = torch.randint(VOCAB, (SAMPLES, SEQ + 1))
    return model, (text[:, :-1], text[:, 1:])
