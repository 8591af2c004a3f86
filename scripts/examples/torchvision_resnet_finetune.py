"""Fine-tuning a torchvision ResNet-18 as transfer learning does it: the stem and the first stage
of residual blocks frozen (their parameters do not train), the rest trained.

    pip install torchvision
    python scripts/export_model.py scripts/examples/torchvision_resnet_finetune.py:build --out resnet_ft

A frozen parameter keeps `requires_grad` off in the exported children, and `pipetune profile`
records it (`trainable_param_bytes`): no gradient and no optimizer state for it, and no backward
at all for the layers before the first that trains, whose input is data. The executor runs
them that way on any split, as one device would. Batch norm in a frozen layer still updates its
running statistics in training mode, as in PyTorch; put it in eval mode in `build` to stop that.
"""
import torch
import torchvision

IMAGE, CLASSES, SAMPLES = 64, 10, 8


def build():
    torch.manual_seed(0)
    net = torchvision.models.resnet18(weights=None, num_classes=CLASSES)
    for frozen in (net.conv1, net.bn1, net.layer1):
        frozen.requires_grad_(False)
    model = [net.conv1, net.bn1, net.relu, net.maxpool, net.layer1, net.layer2, net.layer3, net.layer4,
             net.avgpool, torch.nn.Flatten(1), net.fc]
    return model, (torch.randn(SAMPLES, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (SAMPLES,)))
