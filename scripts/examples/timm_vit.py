"""A timm Vision Transformer, built without pretrained weights, as pipetune takes it: the patch
embedding with the class token and position embeddings, the blocks, then the norm, the class
token's pooling and the head.

    pip install timm
    python scripts/export_model.py scripts/examples/timm_vit.py:build --out vit

Each child holds only the modules and parameters it uses: a wrapper that kept the whole model
would share its parameters with every block, which export_model.py refuses.
"""
import timm
import torch

IMAGE, CLASSES, SAMPLES = 32, 10, 8


class Embed(torch.nn.Module):
    """Patches, then the class token and the position embeddings (timm's _pos_embed, plain ViT)."""

    def __init__(self, vit):
        super().__init__()
        self.patch_embed, self.pos_drop, self.norm_pre = vit.patch_embed, vit.pos_drop, vit.norm_pre
        self.cls_token, self.pos_embed = vit.cls_token, vit.pos_embed

    def forward(self, images):
        x = self.patch_embed(images)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.norm_pre(self.pos_drop(x))


class Head(torch.nn.Module):
    def __init__(self, vit):
        super().__init__()
        self.norm, self.fc_norm, self.head_drop, self.head = vit.norm, vit.fc_norm, vit.head_drop, vit.head

    def forward(self, x):
        return self.head(self.head_drop(self.fc_norm(self.norm(x)[:, 0])))  # the class token


def build():
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=IMAGE, patch_size=8,
                            num_classes=CLASSES, drop_rate=0.1)
    model = [Embed(vit)] + list(vit.blocks) + [Head(vit)]
    return model, (torch.randn(SAMPLES, 3, IMAGE, IMAGE), torch.randint(0, CLASSES, (SAMPLES,)))
