"""Small real architectures for the end-to-end tests (seeded random weights)."""
from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.act1 = nn.Linear(16, 32), nn.GELU()
        self.fc2, self.norm = nn.Linear(32, 32), nn.LayerNorm(32)
        self.act2, self.head = nn.GELU(), nn.Linear(32, 8)

    def forward(self, x):
        return self.head(self.act2(self.norm(self.fc2(self.act1(self.fc1(x))))))


class ConvBN(nn.Module):
    """Conv-BN-ReLU blocks with non-trivial running statistics (the BN fold matters)."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU()
        self.conv2, self.bn2, self.relu2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 10)
        for bn in (self.bn1, self.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x):
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.relu2(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class Shared(nn.Module):
    """The same Linear and activation applied twice: alignment must follow each call."""

    def __init__(self):
        super().__init__()
        self.fc, self.act, self.out = nn.Linear(12, 12), nn.Tanh(), nn.Linear(12, 3)

    def forward(self, x):
        return self.out(self.act(self.fc(self.act(self.fc(x)))))


class Bert(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel

        self.bert = BertModel(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=64))

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).last_hidden_state


class ViT(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import ViTConfig, ViTModel

        self.vit = ViTModel(ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, intermediate_size=64), add_pooling_layer=False)

    def forward(self, pixel_values):
        return self.vit(pixel_values=pixel_values).last_hidden_state


def build(name: str):
    """``(model, inputs)`` for an architecture name, deterministic."""
    torch.manual_seed(0)
    model = {"mlp": MLP, "cnn": ConvBN, "shared": Shared, "bert": Bert, "vit": ViT}[name]().eval()
    g = torch.Generator().manual_seed(1)
    inputs = {
        "mlp": lambda: (torch.randn(4, 16, generator=g),),
        "cnn": lambda: (torch.randn(2, 3, 16, 16, generator=g),),
        "shared": lambda: (torch.randn(3, 12, generator=g),),
        "bert": lambda: (torch.randint(0, 128, (1, 16), generator=g),),
        "vit": lambda: (torch.randn(1, 3, 16, 16, generator=g),),
    }[name]()
    return model, inputs
