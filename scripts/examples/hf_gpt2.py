"""A Hugging Face transformers GPT-2, built from a config (no weights downloaded), as pipetune
takes it: token and position embeddings, the blocks, then the final norm and the head.

    pip install transformers
    python scripts/export_model.py scripts/examples/hf_gpt2.py:build --out gpt2

The blocks do not script (keyword-only arguments with defaults), so export_model.py traces
them and proves each trace. A block returns a tuple in some transformers versions and takes an
attention mask, so each is wrapped to take and return one tensor. Eager attention: the SDPA
path decides `is_causal` with a Python branch on the sequence length, which the tracer warns
about (and the exporter refuses), and without the mask it would not be causal at all. GPT-2
ties its head to the token embedding, and the tie is kept: the first and the last child hold
one parameter, which pipetune trains as one tensor on any balance (a stage holding it gets a
copy, and the copies' gradients are summed before each step, as on one device).
"""
import torch
from transformers import GPT2Config, GPT2LMHeadModel

SEQ, VOCAB, SAMPLES = 32, 1000, 8


class Embeddings(torch.nn.Module):
    def __init__(self, transformer):
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.wte(ids) + self.wpe(positions))


class Block(torch.nn.Module):
    """One transformer block taking and returning one tensor. The causal mask, which GPT2Model
    builds for all blocks, is built here, from the sequence length the input has."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, hidden_states):
        length = hidden_states.shape[1]
        future = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
        mask = torch.zeros(length, length, dtype=hidden_states.dtype, device=hidden_states.device)
        mask = mask.masked_fill(future, torch.finfo(hidden_states.dtype).min)
        out = self.block(hidden_states, attention_mask=mask[None, None])
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, norm, head):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, hidden_states):
        return self.head(self.norm(hidden_states))


def build():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=128, n_head=4, n_positions=SEQ, vocab_size=VOCAB,
                        bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    gpt = GPT2LMHeadModel(config)
    assert gpt.lm_head.weight is gpt.transformer.wte.weight  # tied, as GPT-2 is
    transformer = gpt.transformer
    model = [Embeddings(transformer)] + [Block(b) for b in transformer.h] + [Head(transformer.ln_f, gpt.lm_head)]
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1))
    return model, (tokens[:, :-1], tokens[:, 1:])  # next-token prediction


def build_without_dropout():
    """The same model with every dropout at 0. On CPU, eager dropout keeps a float32 mask the
    size of its input for its backward, where the profile's TorchScript keeps a one-byte one:
    without dropout the two runtimes keep the same tensors (docs/validation.md)."""
    model, batch = build()
    for child in model:
        for module in child.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
    return model, batch
