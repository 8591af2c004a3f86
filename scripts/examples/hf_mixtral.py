"""A Hugging Face transformers Mixtral (a mixture of experts), built from a tiny config (no
weights downloaded), as pipetune takes it: the token embedding, the decoder layers, then the
final RMS norm and the head.

    pip install transformers
    python scripts/export_model.py scripts/examples/hf_mixtral.py:build --out mixtral

Each layer routes every token to 2 of its 4 experts. The decoder layers are traced (and each
trace proved at every micro-batch size); each is wrapped to compute the rotary embeddings and the
causal mask itself, as in hf_llama.py. The router's auxiliary load-balancing loss is not part of
the loss pipetune trains (the layers return the hidden states only).
"""
import torch
from transformers import MixtralConfig, MixtralForCausalLM
from transformers.models.mixtral.modeling_mixtral import MixtralRotaryEmbedding

SEQ, VOCAB, SAMPLES = 32, 256, 8


class Block(torch.nn.Module):
    def __init__(self, layer, config):
        super().__init__()
        self.layer = layer
        self.rotary = MixtralRotaryEmbedding(config)

    def forward(self, hidden_states):
        length = hidden_states.shape[1]
        positions = torch.arange(length, device=hidden_states.device)[None]
        cos, sin = self.rotary(hidden_states, positions)
        future = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
        mask = torch.zeros(length, length, dtype=hidden_states.dtype, device=hidden_states.device)
        mask = mask.masked_fill(future, torch.finfo(hidden_states.dtype).min)
        out = self.layer(hidden_states, attention_mask=mask[None, None], position_embeddings=(cos, sin))
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, norm, head):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, hidden_states):
        return self.head(self.norm(hidden_states))


def build():
    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                           num_experts_per_tok=2, max_position_embeddings=64, attn_implementation="eager")
    mixtral = MixtralForCausalLM(config)
    decoder = mixtral.model
    model = ([decoder.embed_tokens] + [Block(layer, config) for layer in decoder.layers]
             + [Head(decoder.norm, mixtral.lm_head)])
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1))
    return model, (tokens[:, :-1], tokens[:, 1:])
