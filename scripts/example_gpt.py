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
    docs = sorted((pathlib.Path(__file__).resolve().parent.parent / "docs").glob("*.md"))
    text = torch.tensor(list(b"".join(p.read_bytes() for p in docs)), dtype=torch.long)
    windows = text[: (len(text) - 1) // SEQ * SEQ + 1].unfold(0, SEQ + 1, SEQ)
    return model, (windows[:, :-1], windows[:, 1:])
