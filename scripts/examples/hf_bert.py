"""A Hugging Face transformers BERT for sequence classification, built from a tiny config (no
weights downloaded), as pipetune takes it: the embeddings, the encoder layers, then the pooler,
dropout and the classifier.

    pip install transformers
    python scripts/export_model.py scripts/examples/hf_bert.py:build --out bert

The embeddings and the layers do not script, so export_model.py traces them and proves each
trace. The embeddings keep int64 buffers (position and token-type ids), which stay int64 in
pipetune whatever `--dtype` the model runs in. No attention mask: every sequence is full length.
"""
import torch
from transformers import BertConfig, BertForSequenceClassification

SEQ, VOCAB, LABELS, SAMPLES = 32, 300, 5, 8


class Layer(torch.nn.Module):
    """An encoder layer taking and returning one tensor."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden_states):
        out = self.layer(hidden_states)
        return out[0] if isinstance(out, tuple) else out


class Head(torch.nn.Module):
    def __init__(self, pooler, dropout, classifier):
        super().__init__()
        self.pooler, self.dropout, self.classifier = pooler, dropout, classifier

    def forward(self, hidden_states):
        return self.classifier(self.dropout(self.pooler(hidden_states)))


def build():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, num_labels=LABELS,
                        attn_implementation="eager")
    bert = BertForSequenceClassification(config)
    model = ([bert.bert.embeddings] + [Layer(layer) for layer in bert.bert.encoder.layer]
             + [Head(bert.bert.pooler, bert.dropout, bert.classifier)])
    return model, (torch.randint(0, VOCAB, (SAMPLES, SEQ)), torch.randint(0, LABELS, (SAMPLES,)))
