"""A GPT-like token model and a batch of next-token data, for scripts/export_model.py.

Embedding with learned positions, pre-norm Transformer encoder layers under a causal mask, and a
head; 20 samples of 16 tokens, each target the token after its input (views of one sequence,
as a data loader slices them).
"""
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from example_gpt import gpt  # noqa: E402  (the same model as the example, smaller)

VOCAB, WIDTH, HEADS, SEQ, LAYERS, SAMPLES = 50, 32, 4, 16, 2, 20


def build():
    model = gpt(VOCAB, WIDTH, HEADS, SEQ, LAYERS)
    text = torch.randint(VOCAB, (SAMPLES, SEQ + 1))
    return model, (text[:, :-1], text[:, 1:])
