"""A torchvision ResNet-18, built without pretrained weights, as pipetune takes it: its stem,
its four stages of residual blocks, then pooling, flattening and the classifier.

    pip install torchvision
    python scripts/export_model.py scripts/examples/torchvision_resnet.py:build --out resnet

ResNet's forward flattens the pooled features with torch.flatten; as a Sequential that is an
nn.Flatten child of its own.
"""
import torch
import torchvision

IMAGE, CLASSES, SAMPLES = 64, 10, 8


def build():
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None, num_classes=CLASSES)
    model = [net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4,
             net.avgpool, torch.nn.Flatten(1), net.fc]
    return model, (torch.randn(SAMPLES, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (SAMPLES,)))
