"""A Hugging Face transformers Llama, built from a tiny config (no weights downloaded), as pipetune
takes it: the token embedding, the decoder layers, then the final RMS norm and the head.

    pip install transformers
    python scripts/export_model.py scripts/examples/hf_llama.py:build --out llama

The decoder layers do not script (keyword arguments, **kwargs, a tuple of tensors for the rotary
embeddings), so export_model.py traces them and proves each trace. LlamaModel computes the
rotary embeddings (cos, sin) and the causal mask once for all layers and passes them in, so
each layer is wrapped to compute both itself and take and return one tensor. Eager attention:
the SDPA path branches in Python on the query length (`q_length == 1`, and `q_length > 1` to
decide `is_causal`), which the tracer warns about (and the exporter refuses). Grouped-query
attention (4 heads, 2 key-value heads) as in Llama 2 70B and Llama 3. The head is tied to the
token embedding, as in Llama 3.2 (see build()).
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

SEQ, VOCAB, SAMPLES = 32, 256, 8


class Embeddings(torch.nn.Module):
    def __init__(self, embed_tokens):
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, ids):
        return self.embed_tokens(ids)  # no position embedding: RoPE rotates q and k in each layer


class Block(torch.nn.Module):
    """One decoder layer taking and returning one tensor. The rotary embeddings and the causal
    mask, which LlamaModel builds for all layers, are built here, from the sequence length the
    input has. Each block has its own LlamaRotaryEmbedding (one shared by all would be a buffer,
    inv_freq, shared between children, which the exporter would copy into each)."""

    def __init__(self, layer, config):
        super().__init__()
        self.layer = layer
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(self, hidden_states):
        length = hidden_states.shape[1]
        positions = torch.arange(length, device=hidden_states.device)[None]  # [1, seq]: broadcasts over samples
        cos, sin = self.rotary(hidden_states, positions)
        future = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
        mask = torch.zeros(length, length, dtype=hidden_states.dtype, device=hidden_states.device)
        mask = mask.masked_fill(future, torch.finfo(hidden_states.dtype).min)
        out = self.layer(hidden_states, attention_mask=mask[None, None], position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out  # a tuple in older transformers versions


class Head(torch.nn.Module):
    def __init__(self, norm, head):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, hidden_states):
        return self.head(self.norm(hidden_states))


def build():
    torch.manual_seed(0)
    # The head tied to the token embedding, as Llama 3.2 1B and 3B tie them: pipetune trains the
    # one tensor across the stages holding it.
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True, attn_implementation="eager")
    llama = LlamaForCausalLM(config)
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    decoder = llama.model
    model = ([Embeddings(decoder.embed_tokens)] + [Block(layer, config) for layer in decoder.layers]
             + [Head(decoder.norm, llama.lm_head)])
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1))
    return model, (tokens[:, :-1], tokens[:, 1:])  # next-token prediction
