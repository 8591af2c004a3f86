"""A Hugging Face transformers ALBERT for sequence classification, built from a tiny config (no
weights downloaded), as pipetune takes it: the embeddings with their projection to the hidden
width, the one shared layer at every depth, then the pooler and the classifier.

    pip install transformers
    python scripts/export_model.py scripts/examples/hf_albert.py:build --out albert

ALBERT repeats one set of weights at every depth: its encoder calls the same layer group
num_hidden_layers times. Here that is the same wrapper module at each of those places in the
list, so export_model.py traces it once per place and prints a `tied:` line per parameter, each
held by every depth. A plan may put the depths on different stages, even on different devices:
every stage holding one keeps a copy, their gradients are summed before each step, and every copy
takes the one-device update (`docs/cli.md`, "Tied parameters"). The layers do not script
(keyword arguments), so they are traced and each trace proved.
"""
import torch
from transformers import AlbertConfig, AlbertModel

SEQ, VOCAB, LABELS, SAMPLES = 32, 256, 4, 8


class Embeddings(torch.nn.Module):
    """Token, position and type embeddings (ALBERT's narrow ones), then the projection to the
    hidden width that ALBERT's encoder applies before its first layer."""

    def __init__(self, albert):
        super().__init__()
        self.embeddings = albert.embeddings
        self.projection = albert.encoder.embedding_hidden_mapping_in

    def forward(self, ids):
        return self.projection(self.embeddings(input_ids=ids))


class Layer(torch.nn.Module):
    """The shared layer group, taking and returning one tensor."""

    def __init__(self, group):
        super().__init__()
        self.group = group

    def forward(self, hidden_states):
        out = self.group(hidden_states)
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, albert, classifier):
        super().__init__()
        self.pooler, self.activation, self.classifier = albert.pooler, albert.pooler_activation, classifier

    def forward(self, hidden_states):
        return self.classifier(self.activation(self.pooler(hidden_states[:, 0])))  # the first token


def build():
    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=VOCAB, embedding_size=32, hidden_size=128, num_hidden_layers=4,
                          num_attention_heads=4, intermediate_size=256, max_position_embeddings=64,
                          attn_implementation="eager", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    albert = AlbertModel(config)
    shared = Layer(albert.encoder.albert_layer_groups[0])  # one module, at every depth
    model = ([Embeddings(albert)] + [shared] * config.num_hidden_layers
             + [Head(albert, torch.nn.Linear(config.hidden_size, LABELS))])
    return model, (torch.randint(0, VOCAB, (SAMPLES, SEQ)), torch.randint(0, LABELS, (SAMPLES,)))
