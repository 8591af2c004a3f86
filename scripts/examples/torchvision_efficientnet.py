"""A torchvision EfficientNet-B0, built without pretrained weights, as pipetune takes it: its
stem, its seven stages of inverted-residual blocks, the last convolution, then pooling,
flattening and the classifier (dropout in place, then a linear layer).

    pip install torchvision
    python scripts/export_model.py scripts/examples/torchvision_efficientnet.py:build --out efficientnet

Every block drops its residual branch per sample (stochastic depth, `bernoulli_`): pipetune draws
those masks from each device's own generator, seeded per layer and micro-batch, so a recompute
draws its forward's masks and any split draws what one device draws. The classifier's
Dropout(inplace=True) changes its input in training mode; a stage that starts with it (or with
the Flatten before it, a view) runs on a copy of its input.
"""
import torch
import torchvision

IMAGE, CLASSES, SAMPLES = 64, 10, 8


def build():
    torch.manual_seed(0)
    net = torchvision.models.efficientnet_b0(weights=None, num_classes=CLASSES, stochastic_depth_prob=0.2)
    model = list(net.features) + [net.avgpool, torch.nn.Flatten(1)] + list(net.classifier)
    return model, (torch.randn(SAMPLES, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (SAMPLES,)))
