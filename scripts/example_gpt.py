"""An example for scripts/export_model.py: a small byte-level GPT trained on pipetune's own docs.

    python scripts/export_model.py scripts/example_gpt.py:build --out gpt

The model is an nn.Sequential of an embedding with learned positions, pre-norm Transformer
encoder layers under a causal mask, and a head; the data every 64-byte window of docs/*.md, each
target the byte after its input. Change the constants for a larger model. No dropout: TorchScript
draws its masks from torch's global generator, so a checkpointed stage's recompute would not
see the forward's masks (the zoo's models draw theirs per stage and micro-batch).
"""
import collections
import pathlib

import torch

VOCAB, WIDTH, HEADS, SEQ, LAYERS = 256, 128, 4, 64, 4


class Embed(torch.nn.Module):
    def __init__(self, vocab: int, width: int, seq: int):
        super().__init__()
        self.token = torch.nn.Embedding(vocab, width)
        self.position = torch.nn.Parameter(torch.randn(seq, width) * 0.02)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.token(tokens) + self.position[: tokens.size(1)]


class Block(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0, batch_first=True,
                                                      norm_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.size(1)
        future = torch.triu(torch.full((s, s), float("-inf"), dtype=x.dtype, device=x.device), diagonal=1)
        return self.layer(x, src_mask=future)


class Head(torch.nn.Module):
    def __init__(self, width: int, vocab: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.out = torch.nn.Linear(width, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


def gpt(vocab: int, width: int, heads: int, seq: int, layers: int) -> torch.nn.Sequential:
    """The Sequential: embed, `layers` blocks, head (seeded, so every call builds the same one)."""
    torch.manual_seed(0)
    children = [("embed", Embed(vocab, width, seq))]
    children += [(f"block{i}", Block(width, heads)) for i in range(layers)]
    children += [("head", Head(width, vocab))]
    return torch.nn.Sequential(collections.OrderedDict(children))


def build():
    model = gpt(VOCAB, WIDTH, HEADS, SEQ, LAYERS)
    docs = sorted((pathlib.Path(__file__).resolve().parent.parent / "docs").glob("*.md"))
    text = torch.tensor(list(b"".join(p.read_bytes() for p in docs)), dtype=torch.long)
    windows = text[: (len(text) - 1) // SEQ * SEQ + 1].unfold(0, SEQ + 1, SEQ)
    return model, (windows[:, :-1], windows[:, 1:])
