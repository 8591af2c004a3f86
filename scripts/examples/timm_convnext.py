"""A timm ConvNeXt-atto, built without pretrained weights, as pipetune takes it: the stem, its
four stages, then the head (norm, pooling and the classifier).

    pip install timm
    python scripts/export_model.py scripts/examples/timm_convnext.py:build --out convnext

Each stage is one child (2, 2, 6 and 2 blocks), whose blocks drop their branch per sample (drop
path, `bernoulli_`), drawn from each device's own generator as dropout is.
"""
import timm
import torch

IMAGE, CLASSES, SAMPLES = 64, 10, 8


def build():
    torch.manual_seed(0)
    net = timm.create_model("convnext_atto", pretrained=False, num_classes=CLASSES, drop_path_rate=0.1)
    model = [net.stem] + list(net.stages) + [net.norm_pre, net.head]
    return model, (torch.randn(SAMPLES, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (SAMPLES,)))
