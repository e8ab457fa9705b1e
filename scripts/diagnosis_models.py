"""The three architectures of the diagnosis suite: an MLP, a CNN and a small vision transformer.

Each one carries every layer a planted cause needs (GELU, a normalization with
an ``eps``, a BatchNorm that exporters fold or keep, Softmax, Dropout, an
upsampling Resize), with seeded non-trivial weights and BatchNorm statistics,
so that a fault planted in any of them reaches the outputs.
"""
from __future__ import annotations

import torch
from torch import nn

ARCHS = ("mlp", "cnn", "transformer")


class MLP(nn.Module):
    """fc1 → bn1 (BatchNorm1d) → act1 (GELU) → drop → fc2 → norm (LayerNorm) → act2 → up (1-d linear Resize) → head;
    returns the logits and their softmax."""

    def __init__(self):
        super().__init__()
        self.fc1, self.bn1, self.act1 = nn.Linear(16, 32), nn.BatchNorm1d(32, eps=1e-3), nn.GELU()
        self.drop = nn.Dropout(0.2)
        self.fc2, self.norm, self.act2 = nn.Linear(32, 32), nn.LayerNorm(32, eps=1e-5), nn.GELU()
        self.up = nn.Upsample(scale_factor=2, mode="linear", align_corners=False)
        self.head, self.softmax = nn.Linear(64, 10), nn.Softmax(dim=-1)

    def forward(self, x):
        h = self.drop(self.act1(self.bn1(self.fc1(x))))
        h = self.act2(self.norm(self.fc2(h)))
        logits = self.head(self.up(h.unsqueeze(1)).flatten(1))
        return logits, self.softmax(logits)


class CNN(nn.Module):
    """conv1+bn1 → act1 (GELU) → conv2 (stride 2) → gn (GroupNorm) → relu → up (bilinear) → pad (reflect) → conv3
    → drop → pool → fc; returns the logits and their softmax."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8, eps=1e-3), nn.GELU()
        self.conv2, self.gn, self.relu = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.GroupNorm(4, 16), nn.ReLU()
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.pad, self.conv3 = nn.ReflectionPad2d(1), nn.Conv2d(16, 16, 3)
        self.drop, self.pool = nn.Dropout(0.2), nn.AdaptiveAvgPool2d(1)
        self.fc, self.softmax = nn.Linear(16, 10), nn.Softmax(dim=1)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.relu(self.gn(self.conv2(x)))
        x = self.drop(self.conv3(self.pad(self.up(x))))
        logits = self.fc(torch.flatten(self.pool(x), 1))
        return logits, self.softmax(logits)


class Attention(nn.Module):
    """Multi-head self-attention with its Softmax as a module (so it aligns)."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.softmax, self.drop = nn.Softmax(dim=-1), nn.Dropout(0.1)

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = self.drop(self.softmax((q @ k.transpose(-2, -1)) * self.scale))
        return self.proj((attn @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(dim, eps=1e-6), Attention(dim, heads)
        self.ln2, self.fc1, self.act, self.fc2 = nn.LayerNorm(dim, eps=1e-6), nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.fc2(self.act(self.fc1(self.ln2(x)))))


class Transformer(nn.Module):
    """Conv patch stem + BatchNorm, two pre-norm blocks, final LayerNorm, bilinear upsampling head (segmentation-style)."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.patch, self.bn = nn.Conv2d(3, dim, 4, stride=4), nn.BatchNorm2d(dim, eps=1e-3)
        self.pos = nn.Parameter(torch.randn(1, 16, dim) * 0.1)
        self.blocks = nn.ModuleList([Block(dim, 2) for _ in range(2)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
        self.head = nn.Conv2d(dim, 4, 1)

    def forward(self, x):
        x = self.bn(self.patch(x))
        b, c, h, w = x.shape
        t = x.flatten(2).transpose(1, 2) + self.pos
        for block in self.blocks:
            t = block(t)
        t = self.norm(t).transpose(1, 2).reshape(b, c, h, w)
        return self.head(self.up(t))


@torch.no_grad()
def randomize(model: nn.Module) -> None:
    """Distinct, non-trivial weights: norms get random affine parameters, BatchNorms random statistics."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            fan_in = m.weight[0].numel()
            m.weight.normal_(0.0, fan_in ** -0.5)
            if m.bias is not None:
                m.bias.normal_(0.0, 0.1)
        elif isinstance(m, (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d)):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_(0.0, 0.1)
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.running_mean.normal_(0.0, 0.5)
                m.running_var.uniform_(0.05, 2.0)


def build(arch: str, seed: int = 0):
    """``(model, inputs)`` for ``arch``, deterministic, in eval mode."""
    torch.manual_seed(seed)
    model = {"mlp": MLP, "cnn": CNN, "transformer": Transformer}[arch]()
    randomize(model)
    if arch in ("mlp", "cnn"):
        with torch.no_grad():  # most of act1's inputs on GELU's negative tail, where its two forms differ most
            model.bn1.weight.uniform_(0.5, 1.0)
            model.bn1.bias.normal_(-3.0, 0.3)
    g = torch.Generator().manual_seed(seed + 1)
    shape = {"mlp": (8, 16), "cnn": (2, 3, 16, 16), "transformer": (2, 3, 16, 16)}[arch]
    return model.eval(), (torch.randn(*shape, generator=g),)


class Center(nn.Module):
    """Subtracts a float64 offset: inputs such as timestamps or coordinates that only float64 resolves."""

    def __init__(self, offset: float):
        super().__init__()
        self.register_buffer("offset", torch.tensor(offset, dtype=torch.float64))

    def forward(self, x):
        return x - self.offset


class Centered(nn.Module):
    """``model`` applied to inputs centred on a large offset."""

    def __init__(self, model: nn.Module, offset: float = 1234567.891):
        super().__init__()
        self.center, self.model = Center(offset), model

    def forward(self, x):
        return self.model(self.center(x))


def build_centered(arch: str, seed: int = 0):
    """``(float32 model to export, float64 model PyTorch runs, float64 inputs)``: the dtype cases."""
    import copy

    model, (x,) = build(arch, seed)
    exported = Centered(model).eval()
    exported.center.offset = exported.center.offset.float()
    reference = Centered(copy.deepcopy(model)).double().eval()
    return exported, reference, (x.double() + reference.center.offset,)
