"""A Hugging Face transformers OPT, built from a tiny config (no weights downloaded), as pipetune
takes it: the token and learned position embeddings, the decoder layers, then the final norm,
the projection back to the embedding width and the head, tied to the token embedding.

    pip install transformers
    python scripts/export_model.py scripts/examples/hf_opt.py:build --out opt

OPT's embedding width may differ from its hidden width (`word_embed_proj_dim`): `project_in`
and `project_out` go between them, here 32 and 64. Its position module takes an attention mask
and does not script, so the embedding wrapper reads the position table itself (OPT offsets
positions by 2) and is traced; the tracer's warning on `nn.Embedding`'s padding-index check, a
check that only raises, does not refuse it. The layers are traced, each wrapped to build its
causal mask. Each layer's attention dropout is 0 before its residual dropout of 0.1: the exporter
proves the traces as their graphs are written, since torch's optimised graph executor would
draw a mask for the dropout of 0 (pipetune's executor draws none).
"""
import torch
from transformers import OPTConfig, OPTForCausalLM

SEQ, VOCAB, SAMPLES = 32, 512, 8
POSITION_OFFSET = 2  # OPT's learned positions start at index 2 of their table


def causal_mask(hidden_states):
    length = hidden_states.shape[1]
    future = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
    mask = torch.zeros(length, length, dtype=hidden_states.dtype, device=hidden_states.device)
    return mask.masked_fill(future, torch.finfo(hidden_states.dtype).min)[None, None]


class Embeddings(torch.nn.Module):
    def __init__(self, decoder):
        super().__init__()
        self.tokens, self.positions, self.project_in = (decoder.embed_tokens, decoder.embed_positions,
                                                        decoder.project_in)

    def forward(self, ids):
        places = torch.arange(ids.shape[1], device=ids.device)[None] + POSITION_OFFSET
        return self.project_in(self.tokens(ids)) + torch.nn.functional.embedding(places, self.positions.weight)


class Layer(torch.nn.Module):
    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        out = self.layer(hidden_states, attention_mask=causal_mask(hidden_states))
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, decoder, head):
        super().__init__()
        self.norm, self.project_out, self.head = decoder.final_layer_norm, decoder.project_out, head

    def forward(self, hidden_states):
        return self.head(self.project_out(self.norm(hidden_states)))


def build():
    torch.manual_seed(0)
    config = OPTConfig(vocab_size=VOCAB, hidden_size=64, word_embed_proj_dim=32, num_hidden_layers=4,
                       ffn_dim=128, num_attention_heads=4, max_position_embeddings=64, dropout=0.1,
                       attn_implementation="eager")
    opt = OPTForCausalLM(config)
    decoder = opt.model.decoder
    assert opt.lm_head.weight is decoder.embed_tokens.weight  # tied, as OPT is
    model = [Embeddings(decoder)] + [Layer(layer) for layer in decoder.layers] + [Head(decoder, opt.lm_head)]
    tokens = torch.randint(0, VOCAB, (SAMPLES, SEQ + 1))
    return model, (tokens[:, :-1], tokens[:, 1:])  # next-token prediction
