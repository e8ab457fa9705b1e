"""Tiny architectures of the alignment corpus (scripts/alignment_corpus.py).

Eight ``transformers`` architectures built from configs with random weights
(BERT, GPT-2, ViT, ResNet, ConvNeXt, Swin, T5 encoder, Whisper encoder) and two
hand-written ones (a Conv-BN CNN, an LSTM/GRU model).  Hidden sizes 32–64,
1–2 layers, small images and sequences, so the whole corpus runs in minutes
on two cores.

``build(name)`` returns ``(model, inputs)``: an eval-mode module taking
positional tensors and returning one tensor, and a tuple of those tensors.
``calibration(name, n)`` gives ``n`` further random inputs of the same kind
(for static quantization).  Everything is seeded.
"""
from __future__ import annotations

import torch
from torch import nn

TRANSFORMERS = ("bert", "gpt2", "vit", "resnet", "convnext", "swin", "t5enc", "whisper")
HANDWRITTEN = ("cnn", "rnn")
#: the same model with transformers' eager attention instead of the default SDPA: with torch 2.13 the
#: dynamo exporter fails on Swin's and T5's SDPA with a float mask/bias (an invalid ``view`` after
#: decomposition), but exports the eager attention
VARIANTS = ("swin-eager", "t5enc-eager")
ARCHS = TRANSFORMERS + HANDWRITTEN + VARIANTS
SEED = 0


class LastHidden(nn.Module):
    """Calls a transformers model with one named input and returns ``last_hidden_state``."""

    def __init__(self, model: nn.Module, input_name: str):
        super().__init__()
        self.model = model
        self.input_name = input_name

    def forward(self, x):
        return self.model(**{self.input_name: x}).last_hidden_state


class ConvBNNet(nn.Module):
    """Conv-BN-ReLU blocks, a residual add, max/avg pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()
        self.pool1 = nn.MaxPool2d(2)
        self.conv2, self.bn2, self.relu2 = nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        self.conv3, self.bn3, self.act3 = nn.Conv2d(32, 32, 3, padding=1, groups=4), nn.BatchNorm2d(32), nn.SiLU()
        self.pool2, self.drop, self.fc = nn.AdaptiveAvgPool2d(1), nn.Dropout(0.1), nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool1(self.relu1(self.bn1(self.conv1(x))))
        x = self.relu2(self.bn2(self.conv2(x)))
        x = x + self.act3(self.bn3(self.conv3(x)))
        return self.fc(self.drop(torch.flatten(self.pool2(x), 1)))


class RecurrentNet(nn.Module):
    """Embedding → 2-layer LSTM → LayerNorm → GRU → Linear over the last step."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.norm = nn.LayerNorm(32)
        self.gru = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, 8)

    def forward(self, tokens):
        h, _ = self.lstm(self.embed(tokens))
        h, _ = self.gru(self.norm(h))
        return self.head(h[:, -1])


def _bert():
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)
    return LastHidden(BertModel(cfg, add_pooling_layer=False), "input_ids")


def _gpt2():
    from transformers import GPT2Config, GPT2Model

    cfg = GPT2Config(vocab_size=128, n_embd=32, n_layer=2, n_head=2, n_positions=64, n_inner=64,
                     bos_token_id=0, eos_token_id=1)
    return LastHidden(GPT2Model(cfg), "input_ids")


def _vit():
    from transformers import ViTConfig, ViTModel

    cfg = ViTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64)
    return LastHidden(ViTModel(cfg, add_pooling_layer=False), "pixel_values")


def _resnet():
    from transformers import ResNetConfig, ResNetModel

    cfg = ResNetConfig(num_channels=3, embedding_size=32, hidden_sizes=[32, 64], depths=[1, 1],
                       layer_type="bottleneck", hidden_act="relu")
    return LastHidden(ResNetModel(cfg), "pixel_values")


def _convnext():
    from transformers import ConvNextConfig, ConvNextModel

    cfg = ConvNextConfig(num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[32, 64], depths=[1, 1])
    return LastHidden(ConvNextModel(cfg), "pixel_values")


def _swin():
    from transformers import SwinConfig, SwinModel

    cfg = SwinConfig(image_size=32, patch_size=4, num_channels=3, embed_dim=32, depths=[1, 1], num_heads=[2, 4],
                     window_size=4, mlp_ratio=2.0)
    return LastHidden(SwinModel(cfg, add_pooling_layer=False), "pixel_values")


def _t5enc():
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16)
    return LastHidden(T5EncoderModel(cfg), "input_ids")


def _whisper():
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    cfg = WhisperConfig(num_mel_bins=16, d_model=32, encoder_layers=2, encoder_attention_heads=2,
                        encoder_ffn_dim=64, max_source_positions=16, decoder_layers=1, decoder_attention_heads=2,
                        decoder_ffn_dim=64, vocab_size=128, max_target_positions=16, pad_token_id=0,
                        bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    return LastHidden(WhisperEncoder(cfg), "input_features")


BUILDERS = {
    "bert": _bert, "gpt2": _gpt2, "vit": _vit, "resnet": _resnet, "convnext": _convnext, "swin": _swin,
    "t5enc": _t5enc, "whisper": _whisper, "cnn": ConvBNNet, "rnn": RecurrentNet,
}


def _input(name: str, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    name = name.split("-")[0]
    if name in ("bert", "gpt2", "t5enc"):
        return (torch.randint(0, 128, (1, 16), generator=g),)
    if name == "rnn":
        return (torch.randint(0, 50, (2, 12), generator=g),)
    if name == "vit":
        return (torch.randn(1, 3, 16, 16, generator=g),)
    if name in ("resnet", "convnext", "swin"):
        return (torch.randn(1, 3, 32, 32, generator=g),)
    if name == "cnn":
        return (torch.randn(2, 3, 16, 16, generator=g),)
    if name == "whisper":  # (batch, mel bins, 2 * max_source_positions)
        return (torch.randn(1, 16, 32, generator=g),)
    raise KeyError(name)


def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``(model, inputs)`` for an architecture name, deterministic."""
    torch.manual_seed(SEED)
    base, _, variant = name.partition("-")
    model = BUILDERS[base]()
    if variant == "eager":
        model.model.set_attn_implementation("eager")
    randomize(model)
    model.eval()
    return model, _input(name, torch.Generator().manual_seed(SEED + 1))


def calibration(name: str, n: int = 4) -> list[tuple[torch.Tensor, ...]]:
    """``n`` random inputs for static quantization, different from ``build``'s."""
    g = torch.Generator().manual_seed(SEED + 100)
    return [_input(name, g) for _ in range(n)]


_NORMS = (nn.LayerNorm, nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@torch.no_grad()
def randomize(model: nn.Module) -> None:
    """Distinct, non-trivial weights (as scripts/make_fixtures.py does, extended to more layer kinds).

    Exporters and optimizers merge equal initializers (unit norm weights, zero
    biases), and default inits like ConvNeXt's layer scale (1e-6) or BERT's
    0.02 weights leave a tiny model nearly linear.  Linear weights get std
    1/sqrt(fan_in); zero biases become small noise; norms (including T5's and
    other custom ``*Norm`` modules with a weight) get random affine parameters,
    BatchNorms random running statistics; any other parameter that is constant
    gets noise around its value's scale.
    """
    handled: set[int] = set()
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.weight.normal_(0.0, m.in_features ** -0.5)
            if m.bias is not None and not m.bias.any():
                m.bias.normal_(0.0, 0.02)
        elif isinstance(m, _NORMS) or (type(m).__name__.endswith("Norm") and isinstance(getattr(m, "weight", None), nn.Parameter)):
            if getattr(m, "weight", None) is not None:
                m.weight.uniform_(0.5, 1.5)
            if getattr(m, "bias", None) is not None:
                m.bias.normal_(0.0, 0.1)
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.normal_(0.0, 0.5)
                m.running_var.uniform_(0.25, 2.0)
        elif isinstance(m, nn.Embedding):
            m.weight.normal_(0.0, 1.0)
        elif isinstance(m, (nn.Conv1d, nn.Conv2d)) and m.bias is not None and not m.bias.any():
            m.bias.normal_(0.0, 0.02)
        else:
            continue
        handled.update(id(p) for p in m.parameters(recurse=False))
    for name, p in model.named_parameters():
        if id(p) in handled or p.numel() < 2 or not p.is_floating_point():
            continue
        if bool((p == p.reshape(-1)[0]).all()):  # constant: layer scales, zero position tables, ...
            scale = float(p.reshape(-1)[0].abs())
            if "scale" in name or "gamma" in name or scale >= 0.5:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.1)
