"""Tiny architectures of the fault sweep (scripts/fault_sweep.py), seeded random weights.

``build(name)`` returns ``(model, inputs)``: an eval-mode module taking
positional tensors and returning one tensor, and a tuple of those tensors.
``calibration(name, n)`` gives ``n`` further random inputs of the same kind (for
static quantization).  Everything is deterministic, so a model file that calls
``build`` in another process gets the very same weights.

Most architectures come from the existing corpora (read-only imports):
``scripts/corpus_models.py`` (BERT, GPT-2, ViT, Swin and T5 with eager
attention, Whisper encoder, ConvNeXt, the LSTM/GRU model) and
``scripts/holdout_faults.py`` (LLaMA with grouped-query attention, DistilBERT: their configs are
repeated here, since importing that script puts the working tree's ``src`` first on ``sys.path``).
Two are new here: a MobileNet-like CNN whose ReLU6 exports as ``Clip`` and a
small UNet whose bilinear / nearest upsampling exports as ``Resize`` with skip
``Concat``s.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

import corpus_models

SEED = 0


class ReLU6Net(nn.Module):
    """Conv-BN-ReLU6 stem, a depthwise-separable block with a residual, pooling and a classifier."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1, self.act1 = nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU6()
        self.dw, self.bn2, self.act2 = nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU6()
        self.pw, self.bn3 = nn.Conv2d(16, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.conv4, self.bn4, self.act4 = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32), nn.ReLU6()
        self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(32, 10)

    def forward(self, x):
        x = self.act1(self.bn1(self.conv1(x)))
        x = x + self.bn3(self.pw(self.act2(self.bn2(self.dw(x)))))
        x = self.act4(self.bn4(self.conv4(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class ConvBlock(nn.Module):
    """Two Conv-BN-ReLU layers."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout)
        self.conv2, self.bn2 = nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x))))))


class Up(nn.Module):
    """Upsample ×2 (``F.interpolate``), concatenate the skip, a ConvBlock."""

    def __init__(self, cin: int, cskip: int, cout: int, mode: str):
        super().__init__()
        self.mode = mode
        self.block = ConvBlock(cin + cskip, cout)

    def forward(self, x, skip):
        kwargs = {"align_corners": False} if self.mode == "bilinear" else {}
        x = F.interpolate(x, scale_factor=2.0, mode=self.mode, **kwargs)
        return self.block(torch.cat([x, skip], dim=1))


class UNet(nn.Module):
    """A two-level UNet: bilinear upsampling at the top level, nearest at the lower one, 1×1 head."""

    def __init__(self):
        super().__init__()
        self.enc1, self.enc2, self.mid = ConvBlock(3, 8), ConvBlock(8, 16), ConvBlock(16, 16)
        self.up2, self.up1 = Up(16, 16, 16, "nearest"), Up(16, 8, 8, "bilinear")
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        m = self.mid(F.max_pool2d(e2, 2))
        return self.head(self.up1(self.up2(m, e2), e1))


class LastHidden(corpus_models.LastHidden):
    """``last_hidden_state`` of a transformers model called with one named input."""


def _llama():
    from transformers import LlamaConfig, LlamaModel

    cfg = LlamaConfig(vocab_size=200, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
    return LastHidden(LlamaModel(cfg), "input_ids")


def _distilbert():
    from transformers import DistilBertConfig, DistilBertModel

    cfg = DistilBertConfig(vocab_size=200, dim=64, n_layers=2, n_heads=4, hidden_dim=128, max_position_embeddings=64)
    return LastHidden(DistilBertModel(cfg), "input_ids")


# --------------------------------------------------------------------------- held-out architectures
# Added after the tool's alignment and diagnosis were tuned on the twelve above; a sweep over these
# (``fault_sweep.py --archs heldout``) measures what was not tuned to: shared layers (ALBERT), partial
# rotary and parallel attention/MLP (Phi), efficient attention with a spatial-reduction Conv and a decode
# head that upsamples (SegFormer), a convolutional feature encoder with GroupNorm and a grouped positional
# Conv (wav2vec 2.0), relative position bias and layer scale (BEiT), bottlenecks and NoNorm (MobileBERT),
# and two hand-written models (squeeze-excitation with hard activations, GroupNorm, RMSNorm, PixelShuffle;
# a dilated causal TCN with weight-normed Conv1d, PReLU and a GRU).

def _albert():
    from transformers import AlbertConfig, AlbertModel

    cfg = AlbertConfig(vocab_size=128, embedding_size=16, hidden_size=32, num_hidden_layers=3, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=64, hidden_act="gelu_new")
    return LastHidden(AlbertModel(cfg, add_pooling_layer=False), "input_ids")


def _phi():
    from transformers import PhiConfig, PhiModel

    cfg = PhiConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                    max_position_embeddings=64, partial_rotary_factor=0.5)
    return LastHidden(PhiModel(cfg), "input_ids")


class Logits(nn.Module):
    """``logits`` of a transformers model called with one named input."""

    def __init__(self, model: nn.Module, key: str):
        super().__init__()
        self.model, self.key = model, key

    def forward(self, x):
        return self.model(**{self.key: x}).logits


def _segformer():
    from transformers import SegformerConfig, SegformerForSemanticSegmentation

    cfg = SegformerConfig(num_channels=3, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                          patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2],
                          decoder_hidden_size=32, num_labels=3)
    return Logits(SegformerForSemanticSegmentation(cfg), "pixel_values")


def _wav2vec2():
    from transformers import Wav2Vec2Config, Wav2Vec2Model

    cfg = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4, feat_extract_norm="group", do_stable_layer_norm=False)
    return LastHidden(Wav2Vec2Model(cfg), "input_values")


def _beit():
    from transformers import BeitConfig, BeitModel

    cfg = BeitConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2,
                     num_attention_heads=2, intermediate_size=64, use_relative_position_bias=True,
                     layer_scale_init_value=0.1)
    return LastHidden(BeitModel(cfg, add_pooling_layer=False), "pixel_values")


def _mobilebert():
    from transformers import MobileBertConfig, MobileBertModel

    cfg = MobileBertConfig(vocab_size=128, embedding_size=16, hidden_size=32, num_hidden_layers=2,
                           num_attention_heads=2, intermediate_size=32, intra_bottleneck_size=16, true_hidden_size=16,
                           num_feedforward_networks=2, max_position_embeddings=64)
    return LastHidden(MobileBertModel(cfg, add_pooling_layer=False), "input_ids")


class SqueezeExcite(nn.Module):
    """Global pooling, a 1×1 bottleneck and a hard-sigmoid gate."""

    def __init__(self, c: int, r: int = 4):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, c // r, 1), nn.Conv2d(c // r, c, 1)

    def forward(self, x):
        return x * F.hardsigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(x, 1)))))


class MobileSE(nn.Module):
    """Hard-swish stem, an inverted residual with GroupNorm and squeeze-excitation, an RMSNorm + Linear
    over channels-last tokens, a tanh GELU, and a PixelShuffle head."""

    def __init__(self):
        super().__init__()
        self.stem, self.bn0 = nn.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(16)
        self.expand, self.bn1 = nn.Conv2d(16, 32, 1, bias=False), nn.BatchNorm2d(32)
        self.dw, self.gn, self.se = nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.GroupNorm(4, 32), SqueezeExcite(32)
        self.project, self.bn2 = nn.Conv2d(32, 16, 1, bias=False), nn.BatchNorm2d(16)
        self.norm, self.mix = nn.RMSNorm(16, eps=1e-6), nn.Linear(16, 16)
        self.head, self.shuffle = nn.Conv2d(16, 12, 3, padding=1), nn.PixelShuffle(2)

    def forward(self, x):
        x = F.hardswish(self.bn0(self.stem(x)))
        y = F.hardswish(self.bn1(self.expand(x)))
        x = x + self.bn2(self.project(self.se(F.silu(self.gn(self.dw(y))))))
        t = self.mix(self.norm(x.permute(0, 2, 3, 1))).permute(0, 3, 1, 2)
        return self.shuffle(self.head(F.gelu(t, approximate="tanh") + x))


class TCN(nn.Module):
    """Dilated causal Conv1d residual stack (weight-normed), PReLU, LayerNorm over channels, a GRU head."""

    DILATIONS = (1, 2, 4)

    def __init__(self):
        super().__init__()
        self.emb = nn.Conv1d(8, 24, 1)
        self.convs = nn.ModuleList(nn.utils.parametrizations.weight_norm(nn.Conv1d(24, 24, 3, dilation=d))
                                   for d in self.DILATIONS)
        self.acts = nn.ModuleList(nn.PReLU(24) for _ in self.DILATIONS)
        self.norm, self.gru, self.out = nn.LayerNorm(24), nn.GRU(24, 16, batch_first=True), nn.Linear(16, 5)

    def forward(self, x):
        h = self.emb(x)
        for conv, act, d in zip(self.convs, self.acts, self.DILATIONS):
            h = h + act(conv(F.pad(h, (2 * d, 0))))
        y, _ = self.gru(self.norm(h.transpose(1, 2)))
        return self.out(y)


# --------------------------------------------------------------------------- second held-out set
# Added in a later stop, after the first held-out set had been debugged (its figures tuned): measured on the
# code as it stood, before any of their misses was looked at (``fault_sweep.py --archs heldout2``). ALiBi
# attention (BLOOM), disentangled relative attention (DeBERTa-v2), span-based dynamic convolution (ConvBERT),
# unfolded-patch transformers inside a CNN (MobileViT), attention with BatchNorm'd projections and learned
# biases (LeViT), global response normalization (ConvNeXt V2), quick GELU (CLIP's vision tower), multi-query
# attention (GPT-BigCode), and two hand-written models (a Conformer block: macaron FFN,
# nn.MultiheadAttention, GLU, depthwise Conv1d, BatchNorm1d; a video CNN: Conv3d, BatchNorm3d, InstanceNorm3d).

def _bloom():
    from transformers import BloomConfig, BloomModel
    cfg = BloomConfig(vocab_size=128, hidden_size=32, n_layer=2, n_head=4)
    return LastHidden(BloomModel(cfg), "input_ids")


def _deberta():
    from transformers import DebertaV2Config, DebertaV2Model
    cfg = DebertaV2Config(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, max_position_embeddings=64, relative_attention=True,
                          position_buckets=16, max_relative_positions=32, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=True)
    return LastHidden(DebertaV2Model(cfg), "input_ids")


def _convbert():
    from transformers import ConvBertConfig, ConvBertModel
    cfg = ConvBertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                         embedding_size=32, head_ratio=2, conv_kernel_size=5, num_groups=1, max_position_embeddings=64)
    return LastHidden(ConvBertModel(cfg), "input_ids")


def _mobilevit():
    from transformers import MobileViTConfig, MobileViTModel
    cfg = MobileViTConfig(image_size=32, num_channels=3, patch_size=2, hidden_sizes=[16, 24, 32], neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 48],
                          num_attention_heads=2, mlp_ratio=2.0, expand_ratio=2.0)
    return LastHidden(MobileViTModel(cfg, expand_output=False), "pixel_values")


def _levit():
    from transformers import LevitConfig, LevitModel
    cfg = LevitConfig(image_size=32, num_channels=3, patch_size=16, hidden_sizes=[32, 48, 64], num_attention_heads=[2, 2, 2],
                      depths=[1, 1, 1], key_dim=[8, 8, 8], drop_path_rate=0, mlp_ratio=[2, 2, 2], attention_ratio=[2, 2, 2])
    return LastHidden(LevitModel(cfg), "pixel_values")


def _convnextv2():
    from transformers import ConvNextV2Config, ConvNextV2Model
    cfg = ConvNextV2Config(num_channels=3, hidden_sizes=[16, 32], depths=[1, 1], patch_size=4, num_stages=2)
    return LastHidden(ConvNextV2Model(cfg), "pixel_values")


def _clipvision():
    from transformers import CLIPVisionConfig, CLIPVisionModel
    cfg = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, image_size=16,
                           patch_size=4, hidden_act="quick_gelu")
    return LastHidden(CLIPVisionModel(cfg), "pixel_values")


def _bigcode():
    from transformers import GPTBigCodeConfig, GPTBigCodeModel
    cfg = GPTBigCodeConfig(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64, multi_query=True)
    return LastHidden(GPTBigCodeModel(cfg), "input_ids")


class ConformerConv(nn.Module):
    """Conformer convolution module: pointwise Conv1d + GLU, depthwise Conv1d, BatchNorm1d, SiLU, pointwise."""
    def __init__(self, d=24):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.pw1, self.dw, self.bn, self.pw2 = nn.Conv1d(d, 2 * d, 1), nn.Conv1d(d, d, 7, padding=3, groups=d), nn.BatchNorm1d(d), nn.Conv1d(d, d, 1)
    def forward(self, x):  # N, T, D
        y = self.norm(x).transpose(1, 2)
        y = self.pw2(F.silu(self.bn(self.dw(F.glu(self.pw1(y), dim=1)))))
        return x + y.transpose(1, 2)


class Conformer(nn.Module):
    """A macaron feed-forward (half-step residuals), multi-head attention (nn.MultiheadAttention), the conv module."""
    def __init__(self, d=24):
        super().__init__()
        self.inp = nn.Linear(10, d)
        self.ff1 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 48), nn.SiLU(), nn.Linear(48, d))
        self.attn_norm, self.attn = nn.LayerNorm(d), nn.MultiheadAttention(d, 3, batch_first=True)
        self.conv = ConformerConv(d)
        self.ff2 = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 48), nn.SiLU(), nn.Linear(48, d))
        self.out_norm, self.head = nn.LayerNorm(d), nn.Linear(d, 6)
    def forward(self, x):
        x = self.inp(x)
        x = x + 0.5 * self.ff1(x)
        h = self.attn_norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        x = self.conv(x)
        x = x + 0.5 * self.ff2(x)
        return self.head(self.out_norm(x))


class Video3D(nn.Module):
    """Conv3d + BatchNorm3d + ELU stem, a (2+1)D block with a residual, MaxPool3d, InstanceNorm3d, softplus head."""
    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv3d(3, 8, (3, 3, 3), padding=1), nn.BatchNorm3d(8)
        self.spatial, self.temporal = nn.Conv3d(8, 8, (1, 3, 3), padding=(0, 1, 1)), nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0))
        self.inorm = nn.InstanceNorm3d(8, affine=True)
        self.head = nn.Linear(8, 4)
    def forward(self, x):
        x = F.elu(self.bn(self.stem(x)))
        x = x + self.temporal(F.leaky_relu(self.spatial(x), 0.1))
        x = F.max_pool3d(self.inorm(x), 2)
        return F.softplus(self.head(x.mean(dim=(2, 3, 4))))


# --------------------------------------------------------------------------- third held-out set
# Added in a later stop still, after the second held-out set had been debugged: measured on the code as it
# stood before any of their misses was looked at (``fault_sweep.py --archs heldout3``). RMSNorm with a
# (1 + weight) scale, tanh GELU and a scaled embedding (Gemma), parallel attention with multi-query rotary
# heads (Falcon), grouped pointwise Conv1d in place of Linear layers (SqueezeBERT), cosine attention with a
# clamped logit scale and a continuous position bias MLP (Swin V2), layer scale and a SwiGLU FFN (DINOv2),
# pooling token mixers (PoolFormer), "same"-padded depthwise convolutions with squeeze-excitation
# (EfficientNet), relative position buckets with a log (MPNet), and two hand-written models (an MLP-Mixer
# with a ConvTranspose2d / bicubic decoder; a set encoder with einsum attention, L2 normalisation, cumsum
# and logsumexp pooling).

def _gemma():
    from transformers import GemmaConfig, GemmaModel
    cfg = GemmaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=8, max_position_embeddings=64, hidden_activation="gelu_pytorch_tanh")
    return LastHidden(GemmaModel(cfg), "input_ids")


def _falcon():
    from transformers import FalconConfig, FalconModel
    cfg = FalconConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, multi_query=True,
                       parallel_attn=True, new_decoder_architecture=False, alibi=False, bias=False)
    return LastHidden(FalconModel(cfg), "input_ids")


def _squeezebert():
    from transformers import SqueezeBertConfig, SqueezeBertModel
    cfg = SqueezeBertConfig(vocab_size=128, hidden_size=32, embedding_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=64, q_groups=2, k_groups=2, v_groups=2,
                            post_attention_groups=2, intermediate_groups=4, output_groups=4)
    return LastHidden(SqueezeBertModel(cfg), "input_ids")


def _swinv2():
    from transformers import Swinv2Config, Swinv2Model
    cfg = Swinv2Config(image_size=32, patch_size=4, num_channels=3, embed_dim=16, depths=[2, 1], num_heads=[2, 4],
                       window_size=4, mlp_ratio=2.0)
    return LastHidden(Swinv2Model(cfg, add_pooling_layer=False), "pixel_values")


def _dinov2():
    from transformers import Dinov2Config, Dinov2Model
    cfg = Dinov2Config(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       mlp_ratio=2, layerscale_value=0.5, use_swiglu_ffn=True)
    return LastHidden(Dinov2Model(cfg), "pixel_values")


def _poolformer():
    from transformers import PoolFormerConfig, PoolFormerModel
    cfg = PoolFormerConfig(num_channels=3, patch_size=7, stride=4, pool_size=3, hidden_sizes=[16, 32], depths=[1, 1],
                           num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1], mlp_ratio=2.0)
    return LastHidden(PoolFormerModel(cfg), "pixel_values")


def _efficientnet():
    from transformers import EfficientNetConfig, EfficientNetModel
    cfg = EfficientNetConfig(image_size=32, num_channels=3, width_coefficient=0.25, depth_coefficient=0.3,
                             in_channels=[32, 16, 24], out_channels=[16, 24, 40], kernel_sizes=[3, 3, 5], strides=[1, 2, 2],
                             num_block_repeats=[1, 1, 1], expand_ratios=[1, 6, 6], depthwise_padding=[], hidden_dim=320)
    return LastHidden(EfficientNetModel(cfg), "pixel_values")


def _mpnet():
    from transformers import MPNetConfig, MPNetModel
    cfg = MPNetConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                      max_position_embeddings=64)
    return LastHidden(MPNetModel(cfg, add_pooling_layer=False), "input_ids")


class MixerDecoder(nn.Module):
    """MLP-Mixer blocks (token mixing over a transposed axis), a ConvTranspose2d and a bicubic upsampling."""
    def __init__(self, c=16, tokens=16):
        super().__init__()
        self.patch = nn.Conv2d(3, c, 4, stride=4)
        self.norm1, self.norm2 = nn.LayerNorm(c), nn.LayerNorm(c)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 32), nn.GELU(), nn.Linear(32, tokens))
        self.chan_mlp = nn.Sequential(nn.Linear(c, 32), nn.Hardswish(), nn.Linear(32, c))
        self.up = nn.ConvTranspose2d(c, 8, 2, stride=2)
        self.gn = nn.GroupNorm(2, 8)
        self.out = nn.Conv2d(8, 2, 3, padding=1)
    def forward(self, x):
        p = self.patch(x)                                      # N, C, 4, 4
        n, c, h, w = p.shape
        t = p.flatten(2).transpose(1, 2)                       # N, T, C
        t = t + self.token_mlp(self.norm1(t).transpose(1, 2)).transpose(1, 2)
        t = t + self.chan_mlp(self.norm2(t))
        y = t.transpose(1, 2).reshape(n, c, h, w)
        y = F.hardtanh(self.gn(self.up(y)), -2.0, 2.0)
        y = F.interpolate(y, scale_factor=2, mode="bicubic", align_corners=True)
        return self.out(y)


class SetEncoder(nn.Module):
    """Permutation-invariant set encoder: einsum attention, L2-normalised keys, cumsum and logsumexp pooling."""
    def __init__(self, d=16):
        super().__init__()
        self.embed, self.q, self.k, self.v = nn.Linear(6, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.temp = nn.Parameter(torch.tensor(4.0))
        self.ln = nn.LayerNorm(d, elementwise_affine=False)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.Mish(), nn.Linear(2 * d, d))
        self.head = nn.Linear(2 * d, 5)
    def forward(self, x):  # N, S, 6
        h = self.embed(x)
        q, k = F.normalize(self.q(h), dim=-1), F.normalize(self.k(h), dim=-1)
        a = torch.einsum("nsd,ntd->nst", q, k) * self.temp
        h = self.ln(h + torch.einsum("nst,ntd->nsd", a.softmax(-1), self.v(h)))
        h = h + self.ff(h)
        run = torch.cumsum(h, dim=1) / torch.arange(1, h.shape[1] + 1, dtype=h.dtype).view(1, -1, 1)
        pooled = torch.cat([torch.logsumexp(h, dim=1), run[:, -1]], dim=-1)
        return self.head(pooled)


# --------------------------------------------------------------------------- fourth held-out set
# Added in a later stop again, after the third held-out set had been debugged, and measured before any of
# their misses was looked at (``fault_sweep.py --archs heldout4``), with new provenances as well (dynamic
# shapes, ONNX Runtime's transformer fusions, float16 with float16 inputs and outputs). OPT (ReLU FFN, learned
# positions with an offset, a projected embedding), GPT-NeoX (partial rotary, parallel residual), Funnel
# (sequence pooling between blocks, relative attention), BiT (weight-standardised convolutions, GroupNorm,
# "same" padding), PVT v2 (spatial-reduction attention, depthwise Conv in the FFN), FocalNet (focal
# modulation, layer scale), HuBERT (conv feature encoder, stable layer norm), MobileNet v2 (TF padding,
# ReLU6), RoFormer (rotary attention in an encoder), and three hand-written models (a graph network with
# gathers, index_add and a GRU cell; a spatial transformer with affine_grid / grid_sample, pixel_unshuffle
# and instance norm; a point network with cdist, top-k neighbour gathers and max pooling).

def _opt():
    from transformers import OPTConfig, OPTModel
    return LastHidden(OPTModel(OPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=16)), "input_ids")
def _roformer():
    from transformers import RoFormerConfig, RoFormerModel
    return LastHidden(RoFormerModel(RoFormerConfig(vocab_size=128, embedding_size=32, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)), "input_ids")
def _gptneox():
    from transformers import GPTNeoXConfig, GPTNeoXModel
    return LastHidden(GPTNeoXModel(GPTNeoXConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, rotary_pct=0.5, use_parallel_residual=True)), "input_ids")
def _funnel():
    from transformers import FunnelConfig, FunnelBaseModel
    return LastHidden(FunnelBaseModel(FunnelConfig(vocab_size=128, block_sizes=[1, 1], num_decoder_layers=1, d_model=32, n_head=4, d_head=8, d_inner=64)), "input_ids")
def _bit():
    from transformers import BitConfig, BitModel
    return LastHidden(BitModel(BitConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="preactivation", global_padding="SAME", num_groups=4)), "pixel_values")
def _pvtv2():
    from transformers import PvtV2Config, PvtV2Model
    return LastHidden(PvtV2Model(PvtV2Config(image_size=32, num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2])), "pixel_values")
def _focalnet():
    from transformers import FocalNetConfig, FocalNetModel
    return LastHidden(FocalNetModel(FocalNetConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3], use_layerscale=True), add_pooling_layer=False), "pixel_values")
def _hubert():
    from transformers import HubertConfig, HubertModel
    return LastHidden(HubertModel(HubertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, feat_extract_norm="layer", do_stable_layer_norm=True)), "input_values")
def _mobilenetv2():
    from transformers import MobileNetV2Config, MobileNetV2Model
    return LastHidden(MobileNetV2Model(MobileNetV2Config(image_size=32, depth_multiplier=0.25, tf_padding=True), add_pooling_layer=False), "pixel_values")

class GraphNet(nn.Module):
    """Message passing over a fixed edge list: gather, index_add (ScatterElements), degree normalisation, max readout."""
    def __init__(self, d=16):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.register_buffer("src", torch.randint(0, 12, (30,), generator=g)); self.register_buffer("dst", torch.randint(0, 12, (30,), generator=g))
        self.inp = nn.Linear(5, d); self.msg = nn.Linear(2 * d, d); self.upd = nn.GRUCell(d, d); self.out = nn.Linear(d, 3)
        self.norm = nn.LayerNorm(d)
    def forward(self, x):  # N=12 nodes, 5 feats
        h = F.silu(self.inp(x))
        for _ in range(2):
            m = F.leaky_relu(self.msg(torch.cat([h[self.src], h[self.dst]], -1)), 0.2)
            agg = torch.zeros_like(h).index_add(0, self.dst, m)
            deg = torch.zeros(h.shape[0], 1).index_add(0, self.dst, torch.ones(self.dst.shape[0], 1)).clamp(min=1)
            h = self.norm(self.upd(agg / deg, h))
        return self.out(torch.amax(h, 0, keepdim=True))

class STN(nn.Module):
    """Spatial transformer: a localisation net predicting an affine grid, grid_sample, instance norm, pixel unshuffle."""
    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ELU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 6))
        self.body = nn.Sequential(nn.Conv2d(12, 16, 3, padding=1), nn.InstanceNorm2d(16, affine=True), nn.SiLU(), nn.Conv2d(16, 16, 3, padding=2, dilation=2), nn.Softplus())
        self.head = nn.Linear(16, 4)
    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3) * 0.1 + torch.tensor([[1.0, 0, 0], [0, 1.0, 0]])
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        y = F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
        y = self.body(F.pixel_unshuffle(y, 2))
        return self.head(F.adaptive_max_pool2d(y, 1).flatten(1))

class PointNet(nn.Module):
    """Points: shared MLP (Conv1d), top-k neighbour features, max and mean pooling, a log-softmax head."""
    def __init__(self):
        super().__init__()
        self.mlp1 = nn.Sequential(nn.Conv1d(3, 16, 1), nn.BatchNorm1d(16), nn.ReLU())
        self.mlp2 = nn.Sequential(nn.Conv1d(32, 32, 1), nn.BatchNorm1d(32), nn.GELU(approximate="tanh"))
        self.head = nn.Linear(64, 6)
    def forward(self, x):  # N, 3, P
        f = self.mlp1(x)
        d = torch.cdist(x.transpose(1, 2), x.transpose(1, 2))
        idx = d.topk(4, dim=-1, largest=False).indices  # N, P, 4
        nb = torch.gather(f.unsqueeze(2).expand(-1, -1, f.shape[2], -1), 3, idx.unsqueeze(1).expand(-1, f.shape[1], -1, -1))
        f = self.mlp2(torch.cat([f, (nb - f.unsqueeze(-1)).amax(-1)], 1))
        return F.log_softmax(self.head(torch.cat([f.amax(-1), f.mean(-1)], 1)), -1)


# --------------------------------------------------------------------------- fifth held-out set
# Added after the fourth held-out set had been debugged, and measured before any of their misses was looked at
# (``fault_sweep.py --archs heldout5``). Sliding-window causal attention with grouped-query heads (Mistral),
# mixture of experts with top-k routing over 3-D expert weights and a sigmoid-gated shared expert, qkv biases
# (Qwen2-MoE), an encoder-decoder with a causal decoder, cross-attention and right-shifted decoder inputs
# (BART), detection tokens with interpolated mid position embeddings (YOLOS), a dense-prediction neck that
# reassembles ViT tokens at four scales with ConvTranspose2d / strided Conv and fuses them with bilinear
# upsampling (DPT), overlapping spectrogram patches with two extra tokens (AST), and four hand-written
# models (a diffusion UNet with a sinusoidal timestep embedding of a second input, GroupNorm / SiLU
# ResBlocks, a spatial self-attention and a nearest-upsampled skip Concat; nn.TransformerDecoder with a
# causal mask, cross-attention over a strided Conv1d memory and output weights tied to the embedding; a
# PixelCNN with masked convolutions (weight × mask buffer) and gated tanh · sigmoid units; an LSTM
# seq2seq with a bidirectional encoder and an unrolled LSTMCell decoder with additive attention).

def _mistral():
    from transformers import MistralConfig, MistralModel
    return LastHidden(MistralModel(MistralConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=6)), "input_ids")
def _qwen2moe():
    from transformers import Qwen2MoeConfig, Qwen2MoeModel
    model = Qwen2MoeModel(Qwen2MoeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, moe_intermediate_size=16, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True))
    model.set_experts_implementation("batched_mm")  # gathered per-token expert weights and bmm: no grouped_mm, no data-dependent loop
    return LastHidden(model, "input_ids")
def _bart():
    from transformers import BartConfig, BartModel  # no decoder_input_ids: BartModel shifts input_ids right itself
    return LastHidden(BartModel(BartConfig(vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)), "input_ids")
def _yolos():
    from transformers import YolosConfig, YolosModel
    return LastHidden(YolosModel(YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, num_detection_tokens=4), add_pooling_layer=False), "pixel_values")
def _dpt():
    from transformers import DPTConfig, DPTForSemanticSegmentation
    model = DPTForSemanticSegmentation(DPTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 16, 32], fusion_hidden_size=16, use_auxiliary_head=False, num_labels=3))
    with torch.no_grad():  # its convolutions start at std 0.02, the logits then at std 0.006: fan-in scaled
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                m.weight.normal_(0.0, m.weight[0].numel() ** -0.5)
    return Logits(model, "pixel_values")
def _ast():
    from transformers import ASTConfig, ASTModel
    return LastHidden(ASTModel(ASTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, patch_size=8, frequency_stride=4, time_stride=4, max_length=32, num_mel_bins=16)), "input_values")

class ResBlockT(nn.Module):
    """GroupNorm-SiLU-Conv twice, the timestep embedding added per channel in between, a 1×1 skip when channels change."""
    def __init__(self, cin, cout, temb=32):
        super().__init__()
        self.n1, self.c1, self.t = nn.GroupNorm(4, cin), nn.Conv2d(cin, cout, 3, padding=1), nn.Linear(temb, cout)
        self.n2, self.c2 = nn.GroupNorm(4, cout), nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()
    def forward(self, x, emb):
        h = self.c1(F.silu(self.n1(x))) + self.t(F.silu(emb))[:, :, None, None]
        return self.skip(x) + self.c2(F.silu(self.n2(h)))

class DiffusionUNet(nn.Module):
    """Diffusion UNet: sinusoidal embedding of a timestep input (sin / cos of t × frequency buffer) and an MLP,
    ResBlocks, a two-head spatial self-attention (scaled_dot_product_attention), nearest upsampling and a skip Concat."""
    def __init__(self, c=16):
        super().__init__()
        self.register_buffer("freqs", torch.exp(torch.arange(8) * (-math.log(10000.0) / 8)))
        self.temb = nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 32))
        self.inp, self.res1 = nn.Conv2d(3, c, 3, padding=1), ResBlockT(c, c)
        self.down, self.res2 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), ResBlockT(2 * c, 2 * c)
        self.anorm, self.qkv, self.proj = nn.GroupNorm(4, 2 * c), nn.Conv2d(2 * c, 6 * c, 1), nn.Conv2d(2 * c, 2 * c, 1)
        self.upconv, self.res3 = nn.Conv2d(2 * c, 2 * c, 3, padding=1), ResBlockT(3 * c, c)
        self.out = nn.Sequential(nn.GroupNorm(4, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))
    def forward(self, x, t):  # x: N, 3, H, W; t: N timesteps
        a = t[:, None] * self.freqs[None]
        emb = self.temb(torch.cat([torch.sin(a), torch.cos(a)], -1))
        h1 = self.res1(self.inp(x), emb)
        h = self.res2(self.down(h1), emb)
        n, c, hh, ww = h.shape
        q, k, v = self.qkv(self.anorm(h)).reshape(n, 3, 2, c // 2, hh * ww).transpose(-1, -2).unbind(1)
        h = h + self.proj(F.scaled_dot_product_attention(q, k, v).transpose(-1, -2).reshape(n, c, hh, ww))
        h = self.upconv(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        return self.out(self.res3(torch.cat([h, h1], 1), emb))

class CausalDecoder(nn.Module):
    """nn.TransformerDecoder (pre-norm, GELU) with a causal mask, cross-attention over a memory from a strided Conv1d of the
    embedded tokens, learned positions, and output logits tied to the token embedding."""
    def __init__(self, vocab=128, d=32, t=16):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(t, d) * 0.5)
        self.mem = nn.Sequential(nn.Conv1d(d, d, 3, stride=2, padding=1), nn.GELU())
        layer = nn.TransformerDecoderLayer(d, 4, 64, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
        self.dec, self.norm = nn.TransformerDecoder(layer, 2), nn.LayerNorm(d)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(t))
    def forward(self, ids):  # N, T
        e = self.emb(ids)
        memory = self.mem(e.transpose(1, 2)).transpose(1, 2)
        t = ids.shape[1]
        h = self.dec(e + self.pos[:t], memory, tgt_mask=self.mask[:t, :t], tgt_is_causal=True)
        return F.linear(self.norm(h), self.emb.weight)

class MaskedConv2d(nn.Conv2d):
    """PixelCNN masked convolution: the weight times a fixed mask buffer (type A hides the centre pixel, type B keeps it)."""
    def __init__(self, kind, cin, cout, k):
        super().__init__(cin, cout, k, padding=k // 2)
        mask = torch.ones(k, k)
        mask[k // 2, k // 2 + (kind == "B"):] = 0
        mask[k // 2 + 1:] = 0
        self.register_buffer("mask", mask)
    def forward(self, x):
        return F.conv2d(x, self.weight * self.mask, self.bias, padding=self.padding)

class PixelCNN(nn.Module):
    """A type-A masked 7×7 convolution, gated residual blocks (type-B masked Conv, tanh · sigmoid of the halves), per-pixel
    log-softmax over 4 intensity levels per channel."""
    def __init__(self, c=16):
        super().__init__()
        self.first = MaskedConv2d("A", 3, c, 7)
        self.gated = nn.ModuleList(MaskedConv2d("B", c, 2 * c, 3) for _ in range(2))
        self.mix = nn.ModuleList(nn.Conv2d(c, c, 1) for _ in range(2))
        self.out = nn.Sequential(nn.ReLU(), nn.Conv2d(c, 12, 1))
    def forward(self, x):
        h = self.first(x)
        for gated, mix in zip(self.gated, self.mix):
            a, b = gated(h).chunk(2, dim=1)
            h = h + mix(torch.tanh(a) * torch.sigmoid(b))
        n, _, hh, ww = h.shape
        return F.log_softmax(self.out(h).view(n, 3, 4, hh, ww), dim=2)

class Seq2Seq(nn.Module):
    """Bidirectional LSTM encoder, a decoder state from its final states, an LSTMCell decoder unrolled for 5 steps with
    additive (Bahdanau) attention, each step fed its previous output."""
    STEPS = 5
    def __init__(self, d=16):
        super().__init__()
        self.enc = nn.LSTM(10, d, batch_first=True, bidirectional=True)
        self.init_h, self.init_c = nn.Linear(2 * d, 2 * d), nn.Linear(2 * d, 2 * d)
        self.wq, self.wk, self.v = nn.Linear(2 * d, d, bias=False), nn.Linear(2 * d, d), nn.Linear(d, 1, bias=False)
        self.cell, self.out = nn.LSTMCell(2 * d + 4, 2 * d), nn.Linear(4 * d, 4)
    def forward(self, x):  # N, T, 10
        enc, (hn, cn) = self.enc(x)
        h = torch.tanh(self.init_h(torch.cat([hn[0], hn[1]], -1)))
        c = self.init_c(torch.cat([cn[0], cn[1]], -1))
        keys, y, outs = self.wk(enc), x.new_zeros(x.shape[0], 4), []
        for _ in range(self.STEPS):
            w = self.v(torch.tanh(keys + self.wq(h)[:, None])).softmax(1)  # N, T, 1
            ctx = (w * enc).sum(1)
            h, c = self.cell(torch.cat([ctx, y], -1), (h, c))
            y = self.out(torch.cat([h, ctx], -1))
            outs.append(y)
        return torch.stack(outs, 1)


# --------------------------------------------------------------------------- sixth held-out set
# Added with the sixth set of fault kinds (scripts/sweep_faults_ops.py) and measured before any of their misses was
# looked at (``fault_sweep.py --archs heldout6``): attention logit soft-capping (tanh) with alternating sliding-window
# layers and four norms per layer (Gemma 2), bias-free LayerNorm with parallel attention and a logit scale (Cohere),
# alternating global / local attention with GeGLU and no biases (ModernBERT), a selective state-space scan
# unrolled over time with a depthwise causal Conv1d (Mamba, its slow path), separable linear self-attention over
# unfolded patches (MobileViT-V2), convolutional token embeddings and depthwise-Conv projections with BatchNorm
# inside attention (CvT), grouped convolutions with squeeze-excitation (RegNet), squeezed wav2vec2 (pooling down and
# upsampling back, SEW), and two hand-written models: a WaveNet (dilated causal Conv1d, gated tanh · sigmoid units,
# residual and skip sums, a max-pooled head) and a style-transfer network (AdaIN: instance statistics of one input
# rescaled by those of a second, reflection padding, an average pool that pads, nearest upsampling).

def _gemma2():
    from transformers import Gemma2Config, Gemma2Model
    return LastHidden(Gemma2Model(Gemma2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=6, attn_logit_softcapping=5.0, final_logit_softcapping=None, query_pre_attn_scalar=8)), "input_ids")
def _cohere():
    from transformers import CohereConfig, CohereModel
    return LastHidden(CohereModel(CohereConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_qk_norm=False)), "input_ids")
def _modernbert():
    from transformers import ModernBertConfig, ModernBertModel
    return LastHidden(ModernBertModel(ModernBertConfig(vocab_size=128, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=64, local_attention=4, global_attn_every_n_layers=2, pad_token_id=0)), "input_ids")
def _mamba():
    from transformers import MambaConfig, MambaModel
    return LastHidden(MambaModel(MambaConfig(vocab_size=128, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4, use_mambapy=False)), "input_ids")
def _mobilevitv2():
    from transformers import MobileViTV2Config, MobileViTV2Model
    return LastHidden(MobileViTV2Model(MobileViTV2Config(image_size=64, width_multiplier=0.25, patch_size=2)), "pixel_values")
def _cvt():
    from transformers import CvtConfig, CvtModel
    return LastHidden(CvtModel(CvtConfig(embed_dim=[16, 24, 32], num_heads=[1, 2, 2], depth=[1, 2, 3], patch_sizes=[7, 3, 3], patch_stride=[4, 2, 1], patch_padding=[2, 1, 1], mlp_ratio=[2.0] * 3, attention_drop_rate=[0.0] * 3, drop_rate=[0.0] * 3, drop_path_rate=[0.0] * 3, qkv_bias=[True] * 3, cls_token=[False, False, True], qkv_projection_method=["dw_bn"] * 3, kernel_qkv=[3] * 3, padding_kv=[1] * 3, stride_kv=[2, 2, 1], padding_q=[1] * 3, stride_q=[1] * 3)), "pixel_values")
def _regnet():
    from transformers import RegNetConfig, RegNetModel
    return LastHidden(RegNetModel(RegNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], groups_width=8, layer_type="y")), "pixel_values")
def _sew():
    from transformers import SEWConfig, SEWModel
    return LastHidden(SEWModel(SEWConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16, 16), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, squeeze_factor=2)), "input_values")

class WaveNet(nn.Module):
    """Dilated causal Conv1d stack (left padding), gated tanh · sigmoid units, residual and skip 1×1 convolutions,
    ReLU and a max-pooled classification head."""
    def __init__(self, c=16, layers=4):
        super().__init__()
        self.inp = nn.Conv1d(1, c, 1)
        self.filt = nn.ModuleList(nn.Conv1d(c, c, 2, dilation=2 ** i) for i in range(layers))
        self.gate = nn.ModuleList(nn.Conv1d(c, c, 2, dilation=2 ** i) for i in range(layers))
        self.res = nn.ModuleList(nn.Conv1d(c, c, 1) for _ in range(layers))
        self.skip = nn.ModuleList(nn.Conv1d(c, 2 * c, 1) for _ in range(layers))
        self.head = nn.Sequential(nn.ReLU(), nn.Conv1d(2 * c, 2 * c, 1), nn.ReLU(), nn.MaxPool1d(4), nn.Conv1d(2 * c, 5, 1))
    def forward(self, x):  # N, T
        h, skips = self.inp(x[:, None]), 0
        for f, g, r, s in zip(self.filt, self.gate, self.res, self.skip):
            p = F.pad(h, (f.dilation[0], 0))
            z = torch.tanh(f(p)) * torch.sigmoid(g(p))
            h, skips = h + r(z), skips + s(z)
        return self.head(skips).mean(-1)

class StyleNet(nn.Module):
    """AdaIN style transfer: a reflection-padded encoder for content and style images, the content features
    normalised by their instance statistics and given the style's (std with an epsilon), an average pool that
    counts padding, a max pool, nearest upsampling and a decoder."""
    def __init__(self, c=16):
        super().__init__()
        self.enc = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(3, c, 3), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.ReflectionPad2d(1), nn.Conv2d(c, c, 3), nn.ReLU())
        self.pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.dec = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(c, c, 3), nn.ReLU(), nn.Upsample(scale_factor=2.0),
                                 nn.ReflectionPad2d(1), nn.Conv2d(c, 3, 3))
    @staticmethod
    def stats(f):
        return f.mean((2, 3), keepdim=True), (f.var((2, 3), keepdim=True, unbiased=True) + 1e-5).sqrt()
    def forward(self, content, style):
        fc, fs = self.enc(content), self.enc(style)
        (mc, sc), (ms, ss) = self.stats(fc), self.stats(fs)
        return self.dec(self.pool((fc - mc) / sc * ss + ms))



# --------------------------------------------------------------------------- seventh held-out set
# Added with the seventh set of fault kinds (scripts/sweep_faults_seven.py) and measured before any of their misses
# was looked at (``fault_sweep.py --archs heldout7``): interleaved rotary with a parallel block (GPT-J), a
# non-parametric LayerNorm and clipped q/k/v (OLMo), a LayerNorm whose scale is ``1 + weight`` and squared-ReLU MLPs
# (Nemotron), gated short convolutions between attention layers (LFM2), a gated relative position bias (WavLM),
# efficient additive attention with BatchNorm'd conv encoders (SwiftFormer), mask-unit attention with unrolled
# tokens and a pooled query (Hiera), and three hand-written models: a sub-pixel super-resolution net (PixelShuffle,
# PReLU, a bicubic residual), a bidirectional GRU + reversed LSTM tagger, and a tabular FT-Transformer (per-feature
# embeddings, a class token, ReGLU).

def _gptj():
    from transformers import GPTJConfig, GPTJModel
    return LastHidden(GPTJModel(GPTJConfig(vocab_size=128, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, n_inner=64)), "input_ids")
def _olmo():
    from transformers import OlmoConfig, OlmoModel
    return LastHidden(OlmoModel(OlmoConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, clip_qkv=2.0, pad_token_id=0)), "input_ids")
def _nemotron():
    from transformers import NemotronConfig, NemotronModel
    return LastHidden(NemotronModel(NemotronConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, partial_rotary_factor=0.5)), "input_ids")
def _lfm2():
    from transformers import Lfm2Config, Lfm2Model
    return LastHidden(Lfm2Model(Lfm2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, layer_types=["conv", "full_attention", "conv"], conv_L_cache=3, block_auto_adjust_ff_dim=False)), "input_ids")
def _wavlm():
    from transformers import WavLMConfig, WavLMModel
    return LastHidden(WavLMModel(WavLMConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 4), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, num_buckets=16, max_bucket_distance=32)), "input_values")
def _swiftformer():
    from transformers import SwiftFormerConfig, SwiftFormerModel
    return LastHidden(SwiftFormerModel(SwiftFormerConfig(image_size=32, depths=[1, 1, 1, 1], embed_dims=[8, 16, 24, 32], mlp_ratio=2)), "pixel_values")
def _hiera():
    from transformers import HieraConfig, HieraModel
    return LastHidden(HieraModel(HieraConfig(image_size=[32, 32], patch_size=[3, 3], patch_stride=[2, 2], patch_padding=[1, 1], embed_dim=16, num_heads=[1, 2], depths=[1, 2], query_stride=[2, 2], masked_unit_size=[4, 4], masked_unit_attention=[True, False], mlp_ratio=2.0, num_query_pool=1)), "pixel_values")

class SuperRes(nn.Module):
    """Sub-pixel super-resolution (ESPCN-like): PReLU convolutions, a PixelShuffle ×2, tanh, plus a bicubic
    upsampling of the input as a residual."""
    def __init__(self, c=16):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, c, 5, padding=2), nn.PReLU(c), nn.Conv2d(c, c, 3, padding=1),
                                  nn.PReLU(), nn.Conv2d(c, 3 * 4, 3, padding=1))
        self.shuffle = nn.PixelShuffle(2)
    def forward(self, x):
        up = F.interpolate(x, scale_factor=2.0, mode="bicubic", align_corners=False)
        return up + 0.5 * torch.tanh(self.shuffle(self.body(x)))

class RNNTagger(nn.Module):
    """Embedded tokens through a bidirectional GRU, then an LSTM over the reversed sequence (flipped back),
    layer norm and per-token tag scores with a sigmoid gate."""
    def __init__(self, vocab=50, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.gru = nn.GRU(d, d, batch_first=True, bidirectional=True)
        self.lstm = nn.LSTM(2 * d, d, batch_first=True)
        self.norm, self.gate, self.out = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, 6)
    def forward(self, ids):  # N, T
        h, _ = self.gru(self.emb(ids))
        r, _ = self.lstm(torch.flip(h, [1]))
        r = self.norm(torch.flip(r, [1]))
        return self.out(r * torch.sigmoid(self.gate(r)))

class FTTransformer(nn.Module):
    """Tabular FT-Transformer: each numeric feature embedded as x·w + b (its own weight and bias), a class token,
    two pre-norm transformer blocks (nn.MultiheadAttention, ReGLU feed-forward), a head on the class token."""
    def __init__(self, features=12, d=16):
        super().__init__()
        self.w, self.b = nn.Parameter(torch.randn(features, d)), nn.Parameter(torch.randn(features, d))
        self.cls = nn.Parameter(torch.randn(1, 1, d))
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, 2, batch_first=True) for _ in range(2))
        self.n1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.n2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ff1 = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(2))
        self.ff2 = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(2))
        self.head = nn.Sequential(nn.LayerNorm(d), nn.ReLU(), nn.Linear(d, 3))
    def forward(self, x):  # N, features
        t = torch.cat([self.cls.expand(x.shape[0], -1, -1), x[:, :, None] * self.w + self.b], 1)
        for attn, n1, n2, ff1, ff2 in zip(self.attn, self.n1, self.n2, self.ff1, self.ff2):
            h = n1(t)
            t = t + attn(h, h, h, need_weights=False)[0]
            a, g = ff1(n2(t)).chunk(2, -1)
            t = t + ff2(a * F.relu(g))
        return self.head(t[:, 0])


# --------------------------------------------------------------------------- eighth held-out set
# Added with the eighth set of fault kinds (scripts/sweep_faults_eight.py) and measured before any of their misses
# was looked at (``fault_sweep.py --archs heldout8``): rotary attention with a scaled token embedding and pre-norm
# (ESM), per-head q/k LayerNorms with partial rotary (StableLM), µP-style multipliers on the embedding, the
# attention scores and the residual branches (Granite), a SEANet convolutional codec with weight-normed Conv1d,
# reflect padding and an LSTM (EnCodec), patched time-series attention with BatchNorm'd tokens (PatchTST),
# divided space-time video attention (TimeSformer), snake activations and
# residual dilated units (DAC), and three hand-written models: an atrous spatial pyramid pooling head (DeepLab),
# a GRU speech-enhancement mask net and a DCGAN generator (ConvTranspose2d, BatchNorm, tanh).

def _esm():
    from transformers import EsmConfig, EsmModel
    return LastHidden(EsmModel(EsmConfig(vocab_size=33, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, position_embedding_type="rotary", pad_token_id=1, mask_token_id=32, token_dropout=True, emb_layer_norm_before=False), add_pooling_layer=False), "input_ids")
def _stablelm():
    from transformers import StableLmConfig, StableLmModel
    return LastHidden(StableLmModel(StableLmConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, partial_rotary_factor=0.5, qk_layernorm=True, use_qkv_bias=True)), "input_ids")
def _granite():
    from transformers import GraniteConfig, GraniteModel
    return LastHidden(GraniteModel(GraniteConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0625)), "input_ids")

class EncodecCodes(nn.Module):
    """EnCodec's encoder (SEANet: weight-normed Conv1d, reflect padding, ELU residual units, strided
    downsampling, a 2-layer LSTM with a skip) on a mono waveform."""
    def __init__(self):
        super().__init__()
        from transformers import EncodecConfig, EncodecModel
        cfg = EncodecConfig(audio_channels=1, num_filters=4, upsampling_ratios=[4, 2], hidden_size=16, num_lstm_layers=2, codebook_size=32, codebook_dim=16, target_bandwidths=[1.5], sampling_rate=8000, kernel_size=5, last_kernel_size=5, residual_kernel_size=3, compress=2, use_causal_conv=False, pad_mode="reflect", norm_type="weight_norm")
        self.encoder = EncodecModel(cfg).encoder
    def forward(self, x):  # N, T
        return self.encoder(x[:, None])

def _encodec():
    return EncodecCodes()

def _patchtst():
    from transformers import PatchTSTConfig, PatchTSTModel
    class PatchTST(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = PatchTSTModel(PatchTSTConfig(num_input_channels=3, context_length=32, patch_length=8, patch_stride=4, d_model=16, num_attention_heads=2, num_hidden_layers=2, ffn_dim=32, norm_type="batchnorm", scaling="std", do_mask_input=False))
        def forward(self, x):  # N, T, C
            return self.model(past_values=x).last_hidden_state
    return PatchTST()
def _timesformer():
    from transformers import TimesformerConfig, TimesformerModel
    return LastHidden(TimesformerModel(TimesformerConfig(image_size=16, patch_size=4, num_channels=3, num_frames=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, attention_type="divided_space_time")), "pixel_values")

class DacEncoder(nn.Module):
    """DAC's encoder: weight-normed Conv1d, residual units of snake activations (x + sin²(αx)/α) and dilated
    convolutions, strided downsampling."""
    def __init__(self):
        super().__init__()
        from transformers import DacConfig, DacModel
        self.encoder = DacModel(DacConfig(encoder_hidden_size=4, downsampling_ratios=[2, 4], decoder_hidden_size=16, n_codebooks=2, codebook_size=32, codebook_dim=4, hidden_size=32, sampling_rate=8000)).encoder
    def forward(self, x):  # N, T
        return self.encoder(x[:, None])

def _dac():
    return DacEncoder()

class ASPPNet(nn.Module):
    """A DeepLab-style segmentation head: a strided Conv/BN/ReLU stem, atrous spatial pyramid pooling (1×1 and
    dilated 3×3 branches, an image-pooling branch broadcast back by bilinear upsampling), a concatenating
    projection and a bilinear (align_corners) upsampling to the input size."""
    def __init__(self, c=16, classes=5):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                  nn.Conv2d(c, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.branches = nn.ModuleList([nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())] + [
            nn.Sequential(nn.Conv2d(c, c, 3, padding=d, dilation=d, bias=False), nn.BatchNorm2d(c), nn.ReLU())
            for d in (2, 3)])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(c, c, 1), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(4 * c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                     nn.Conv2d(c, classes, 1))
    def forward(self, x):
        f = self.stem(x)
        pooled = F.interpolate(self.pool(f), size=f.shape[-2:], mode="bilinear", align_corners=False)
        y = self.project(torch.cat([b(f) for b in self.branches] + [pooled], 1))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=True)

class GRUEnhancer(nn.Module):
    """Speech enhancement on a magnitude spectrogram: log compression, a Conv1d front end, a two-layer GRU, a
    sigmoid mask applied to the input, and a per-frame energy."""
    def __init__(self, bins=12, h=16):
        super().__init__()
        self.front = nn.Conv1d(bins, h, 3, padding=1)
        self.gru = nn.GRU(h, h, num_layers=2, batch_first=True)
        self.mask = nn.Linear(h, bins)
    def forward(self, spec):  # N, T, bins (non-negative magnitudes are made by abs)
        mag = spec.abs()
        z = F.relu(self.front(torch.log1p(mag).transpose(1, 2))).transpose(1, 2)
        h, _ = self.gru(z)
        out = mag * torch.sigmoid(self.mask(h))
        return torch.cat([out, out.pow(2).sum(-1, keepdim=True).sqrt()], -1)

class DCGAN(nn.Module):
    """A DCGAN generator: a latent vector through ConvTranspose2d / BatchNorm / ReLU up to a 16×16 image, tanh."""
    def __init__(self, z=8, c=16):
        super().__init__()
        self.net = nn.Sequential(
            nn.ConvTranspose2d(z, 2 * c, 4, 1, 0, bias=False), nn.BatchNorm2d(2 * c), nn.ReLU(),
            nn.ConvTranspose2d(2 * c, c, 4, 2, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
            nn.ConvTranspose2d(c, c // 2, 4, 2, 1, bias=False), nn.BatchNorm2d(c // 2), nn.LeakyReLU(0.2),
            nn.ConvTranspose2d(c // 2, 3, 4, 2, 1, bias=False), nn.Tanh())
    def forward(self, z):  # N, z
        return self.net(z[:, :, None, None])


# --------------------------------------------------------------------------- ninth held-out set
# Added after the eighth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout9``): position ids made by a cumsum over the non-padding mask (XLM-RoBERTa), an encoder-decoder with
# sinusoidal position tables and right-shifted decoder inputs (Pegasus), partial rotary with per-head q/k LayerNorms
# and a squared-ReLU MLP (Persimmon), a projected smaller embedding (ELECTRA), class and distillation tokens (DeiT),
# and five hand-written models: a MobileNetV3 (hard-swish, squeeze-excitation with a hard-sigmoid gate, depthwise
# convolutions, BatchNorm), a CycleGAN ResNet generator (reflection padding, affine InstanceNorm, ConvTranspose2d),
# a HiFi-GAN vocoder generator (ConvTranspose1d upsamplers, dilated multi-receptive-field residual blocks, leaky
# ReLU, reflection padding), a nanoGPT (a causal mask made at run time with tril, learned positions, a tied head)
# and a VQ-VAE (nearest-codebook lookup: distances, argmin, an embedding gather; PixelShuffle decoder).

def _xlmroberta():
    from transformers import XLMRobertaConfig, XLMRobertaModel
    return LastHidden(XLMRobertaModel(XLMRobertaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, pad_token_id=1), add_pooling_layer=False), "input_ids")

class SinusoidalTable(nn.Module):
    """A fixed position table held as a buffer (not an nn.Embedding, whose weights the sweep's randomisation redraws),
    looked up as Pegasus's sinusoidal embedding is."""
    def __init__(self, emb: nn.Embedding):
        super().__init__()
        self.register_buffer("weight", emb.create_weight())
    def forward(self, input_ids_shape, past_key_values_length=0, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(past_key_values_length, past_key_values_length + input_ids_shape[1], device=self.weight.device)
        return F.embedding(position_ids, self.weight)

class PegasusSeq2Seq(nn.Module):
    """Pegasus's encoder-decoder on one token input: its decoder inputs the tokens shifted right (as BartModel does
    itself), sinusoidal positions on both sides, the decoder's last hidden state."""
    def __init__(self):
        super().__init__()
        from transformers import PegasusConfig, PegasusModel
        self.model = PegasusModel(PegasusConfig(vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, decoder_start_token_id=0))
        for part in (self.model.encoder, self.model.decoder):
            part.embed_positions = SinusoidalTable(part.embed_positions)
    def forward(self, ids):  # N, T
        from transformers.models.pegasus.modeling_pegasus import shift_tokens_right
        dec = shift_tokens_right(ids, self.model.config.pad_token_id, self.model.config.decoder_start_token_id)
        return self.model(input_ids=ids, decoder_input_ids=dec).last_hidden_state

def _pegasus():
    return PegasusSeq2Seq()
def _persimmon():
    from transformers import PersimmonConfig, PersimmonModel
    return LastHidden(PersimmonModel(PersimmonConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64, partial_rotary_factor=0.5, qk_layernorm=True, hidden_act="relu2")), "input_ids")
def _electra():
    from transformers import ElectraConfig, ElectraModel
    return LastHidden(ElectraModel(ElectraConfig(vocab_size=128, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)), "input_ids")
def _deit():
    from transformers import DeiTConfig, DeiTModel
    return LastHidden(DeiTModel(DeiTConfig(image_size=16, patch_size=4, num_channels=3, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64), add_pooling_layer=False), "pixel_values")

class Bneck(nn.Module):
    """MobileNetV3 bottleneck: 1×1 expansion, a k×k depthwise convolution, optional squeeze-excitation (ReLU, hard
    sigmoid), a 1×1 projection, each convolution BatchNorm'd, a residual when the shape stays."""
    def __init__(self, cin, exp, cout, k, stride, se, act):
        super().__init__()
        self.expand = nn.Sequential(nn.Conv2d(cin, exp, 1, bias=False), nn.BatchNorm2d(exp), act())
        self.dw = nn.Sequential(nn.Conv2d(exp, exp, k, stride, k // 2, groups=exp, bias=False), nn.BatchNorm2d(exp), act())
        self.se = SqueezeExcite(exp) if se else nn.Identity()
        self.project = nn.Sequential(nn.Conv2d(exp, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.residual = stride == 1 and cin == cout
    def forward(self, x):
        y = self.project(self.se(self.dw(self.expand(x))))
        return x + y if self.residual else y

class MobileNetV3(nn.Module):
    """A small MobileNetV3: hard-swish stem, bottlenecks (ReLU / hard-swish, 3×3 and 5×5 depthwise, squeeze-excitation),
    a 1×1 hard-swish head convolution, global pooling and a hard-swish classifier."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(Bneck(16, 16, 16, 3, 2, True, nn.ReLU), Bneck(16, 48, 24, 3, 2, False, nn.ReLU),
                                    Bneck(24, 64, 24, 3, 1, False, nn.ReLU), Bneck(24, 64, 32, 5, 2, True, nn.Hardswish),
                                    Bneck(32, 96, 32, 5, 1, True, nn.Hardswish))
        self.head = nn.Sequential(nn.Conv2d(32, 96, 1, bias=False), nn.BatchNorm2d(96), nn.Hardswish())
        self.classifier = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Linear(64, 10))
        with torch.no_grad():  # He-scaled convolutions: with the default inits the activations (std 0.1) drown in the
            for m in self.modules():  # BatchNorms' random running means and an early weight barely reaches the logits
                if isinstance(m, nn.Conv2d):
                    m.weight.normal_(0.0, (2.0 / m.weight[0].numel()) ** 0.5)
    def forward(self, x):
        return self.classifier(F.adaptive_avg_pool2d(self.head(self.blocks(self.stem(x))), 1).flatten(1))

class CycleResBlock(nn.Module):
    """Reflection pad, 3×3 Conv, InstanceNorm, ReLU, twice (no ReLU after the second), a residual."""
    def __init__(self, c):
        super().__init__()
        self.body = nn.Sequential(nn.ReflectionPad2d(1), nn.Conv2d(c, c, 3), nn.InstanceNorm2d(c, affine=True), nn.ReLU(),
                                  nn.ReflectionPad2d(1), nn.Conv2d(c, c, 3), nn.InstanceNorm2d(c, affine=True))
    def forward(self, x):
        return x + self.body(x)

class CycleGAN(nn.Module):
    """A CycleGAN ResNet generator: a reflection-padded 7×7 stem, two strided downsamplings, residual blocks, two
    ConvTranspose2d upsamplings, all with affine InstanceNorm and ReLU, a reflection-padded 7×7 output Conv and tanh."""
    def __init__(self, c=8, blocks=2):
        super().__init__()
        def norm_relu(ch):
            return [nn.InstanceNorm2d(ch, affine=True), nn.ReLU()]
        self.net = nn.Sequential(
            nn.ReflectionPad2d(3), nn.Conv2d(3, c, 7), *norm_relu(c),
            nn.Conv2d(c, 2 * c, 3, 2, 1), *norm_relu(2 * c), nn.Conv2d(2 * c, 4 * c, 3, 2, 1), *norm_relu(4 * c),
            *[CycleResBlock(4 * c) for _ in range(blocks)],
            nn.ConvTranspose2d(4 * c, 2 * c, 3, 2, 1, output_padding=1), *norm_relu(2 * c),
            nn.ConvTranspose2d(2 * c, c, 3, 2, 1, output_padding=1), *norm_relu(c),
            nn.ReflectionPad2d(3), nn.Conv2d(c, 3, 7), nn.Tanh())
    def forward(self, x):
        return self.net(x)

class MRFBlock(nn.Module):
    """HiFi-GAN residual block: for each dilation, leaky ReLU, a dilated Conv1d, leaky ReLU, a Conv1d, a residual."""
    def __init__(self, c, k, dilations):
        super().__init__()
        self.convs1 = nn.ModuleList(nn.Conv1d(c, c, k, dilation=d, padding=d * (k - 1) // 2) for d in dilations)
        self.convs2 = nn.ModuleList(nn.Conv1d(c, c, k, padding=(k - 1) // 2) for _ in dilations)
    def forward(self, x):
        for c1, c2 in zip(self.convs1, self.convs2):
            x = x + c2(F.leaky_relu(c1(F.leaky_relu(x, 0.1)), 0.1))
        return x

class HiFiGAN(nn.Module):
    """A HiFi-GAN generator on a mel spectrogram: a 7-tap Conv1d, ConvTranspose1d ×2 upsamplers each followed by the
    mean of multi-receptive-field residual blocks (kernels 3 and 5, dilations 1 and 3), leaky ReLU(0.1), a
    reflection-padded output Conv1d and tanh."""
    def __init__(self, mels=8, c=32):
        super().__init__()
        self.pre = nn.Conv1d(mels, c, 7, padding=3)
        self.ups = nn.ModuleList(nn.ConvTranspose1d(c // 2 ** i, c // 2 ** (i + 1), 4, 2, 1) for i in range(2))
        self.mrf = nn.ModuleList(nn.ModuleList(MRFBlock(c // 2 ** (i + 1), k, (1, 3)) for k in (3, 5)) for i in range(2))
        self.pad, self.post = nn.ReflectionPad1d(3), nn.Conv1d(c // 4, 1, 7)
        with torch.no_grad():  # default inits shrink the signal layer by layer (output std 0.04): He-scaled instead
            for m in self.modules():
                if isinstance(m, nn.Conv1d):
                    m.weight.normal_(0.0, (2.0 / m.weight[0].numel()) ** 0.5)
                elif isinstance(m, nn.ConvTranspose1d):
                    m.weight.normal_(0.0, (2.0 * m.stride[0] / (m.in_channels * m.kernel_size[0])) ** 0.5)
    def forward(self, mel):  # N, mels, T
        x = self.pre(mel)
        for up, blocks in zip(self.ups, self.mrf):
            x = up(F.leaky_relu(x, 0.1))
            x = sum(b(x) for b in blocks) / len(blocks)
        return torch.tanh(self.post(self.pad(F.leaky_relu(x))))

class NanoGPT(nn.Module):
    """nanoGPT: token and learned position embeddings, pre-LayerNorm blocks with hand-written causal attention (the mask
    made at run time by tril of the sequence length, masked_fill with -inf) and a GELU MLP, a head tied to the token
    embedding."""
    def __init__(self, vocab=128, d=32, heads=4, layers=2, block=64):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.qkv = nn.ModuleList(nn.Linear(d, 3 * d) for _ in range(layers))
        self.proj = nn.ModuleList(nn.Linear(d, d) for _ in range(layers))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.mlp = nn.ModuleList(nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):  # N, T
        n, t = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        causal = torch.tril(torch.ones(t, t, dtype=torch.bool, device=ids.device))
        for ln1, qkv, proj, ln2, mlp in zip(self.ln1, self.qkv, self.proj, self.ln2, self.mlp):
            q, k, v = qkv(ln1(x)).view(n, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            att = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
            att = att.masked_fill(~causal, float("-inf")).softmax(-1)
            x = x + proj((att @ v).transpose(1, 2).reshape(n, t, -1))
            x = x + mlp(ln2(x))
        return F.linear(self.ln_f(x), self.wte.weight)

class VQVAE(nn.Module):
    """A VQ-VAE: a strided Conv encoder, nearest-codebook quantisation (squared distances to every code, argmin, the
    codes gathered by embedding lookup), a decoder upsampling with PixelShuffle (DepthToSpace) ×2 twice."""
    def __init__(self, codes=16, dim=8, c=16):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, c, 4, 2, 1), nn.ReLU(), nn.Conv2d(c, 2 * c, 4, 2, 1), nn.ReLU(),
                                 nn.Conv2d(2 * c, dim, 1))
        # a plain Parameter (randomize redraws nn.Embedding weights), spread twice the encoder outputs' scale: on the
        # sweep's input 5 of the 16 codes are used and every nearest code wins by at least 0.5 in squared distance
        # (about 3 %), so ±1e-2 input noise, float16 or int8 weights change no index
        self.codebook = nn.Parameter(2.0 * torch.randn(codes, dim))
        self.dec = nn.Sequential(nn.Conv2d(dim, 2 * c, 3, padding=1), nn.ReLU(), nn.Conv2d(2 * c, 4 * c, 3, padding=1),
                                 nn.PixelShuffle(2), nn.ReLU(), nn.Conv2d(c, 12, 3, padding=1), nn.PixelShuffle(2))
        with torch.no_grad():  # He-scaled convolutions: with the default inits the codes see inputs of std 0.1
            for m in self.modules():
                if isinstance(m, nn.Conv2d):
                    m.weight.normal_(0.0, (2.0 / m.weight[0].numel()) ** 0.5)
    def indices(self, x):
        z = self.enc(x)
        flat = z.permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        dist = flat.pow(2).sum(1, keepdim=True) - 2 * flat @ self.codebook.t() + self.codebook.pow(2).sum(1)[None]
        return z, dist.argmin(1)
    def forward(self, x):
        z, idx = self.indices(x)
        q = F.embedding(idx, self.codebook).view(z.shape[0], z.shape[2], z.shape[3], -1).permute(0, 3, 1, 2)
        return self.dec(q)


# --------------------------------------------------------------------------- tenth held-out set
# Added after the ninth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout10``): per-head q/k RMSNorms before rotary (Qwen3), fused qkv and gate/up projections split by
# slicing (Phi-3), a fused qkv split across CodeGen's four "mp" shards with interleaved partial rotary (CodeGen),
# super-resolution by residual Swin V2 window attention and a PixelShuffle upsampler (Swin2SR), scaled token
# embeddings with learned offset positions (BioGPT), a time-series MLP mixer with gated attention over patches and
# channels (PatchTSMixer), and four hand-written models: a ShuffleNetV2 (channel split, channel shuffle by
# reshape/transpose, depthwise convolutions, BatchNorm), a SIREN (sine activations scaled by omega_0 = 30, its
# special first-layer and hidden initialisations), a neural ODE (fixed-step RK4: one small conv field evaluated
# 4 × 3 times with the same weights, the time as an extra channel) and a top-2 mixture-of-experts transformer
# (router softmax, TopK, renormalised gates, dense experts combined by a gather and by a one-hot scatter).

def _qwen3():
    from transformers import Qwen3Config, Qwen3Model
    return LastHidden(Qwen3Model(Qwen3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)), "input_ids")
def _phi3():
    from transformers import Phi3Config, Phi3Model
    return LastHidden(Phi3Model(Phi3Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, original_max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)), "input_ids")
def _codegen():
    from transformers import CodeGenConfig, CodeGenModel
    return LastHidden(CodeGenModel(CodeGenConfig(vocab_size=128, n_positions=64, n_ctx=64, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_inner=64, bos_token_id=0, eos_token_id=0)), "input_ids")

class Swin2SR(nn.Module):
    """Swin2SR ×2 super-resolution: a shallow Conv, residual Swin V2 groups (window attention with cosine logits and a
    continuous position bias MLP, a Conv after each group), a PixelShuffle upsampler; the reconstructed image."""
    def __init__(self):
        super().__init__()
        from transformers import Swin2SRConfig, Swin2SRForImageSuperResolution
        self.model = Swin2SRForImageSuperResolution(Swin2SRConfig(image_size=16, patch_size=1, num_channels=3, embed_dim=16, depths=[2], num_heads=[2], window_size=4, mlp_ratio=2.0, upscale=2, img_range=1.0, upsampler="pixelshuffle", drop_path_rate=0.0))
        with torch.no_grad():  # variance-keeping convolutions: with the default inits the upsampler's three Convs shrink
            for m in self.modules():  # the reconstruction to std 0.03
                if isinstance(m, nn.Conv2d):
                    m.weight.normal_(0.0, m.weight[0].numel() ** -0.5)
    def forward(self, x):  # N, 3, H, W
        return self.model(pixel_values=x).reconstruction

def _swin2sr():
    return Swin2SR()
def _biogpt():
    from transformers import BioGptConfig, BioGptModel
    return LastHidden(BioGptModel(BioGptConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, scale_embedding=True, pad_token_id=1)), "input_ids")

class TimePatchify(nn.Module):
    """PatchTSMixer's patchify with ``unfold`` on the time axis named positively (1, not -2): the TorchScript exporter's
    unfold puts a negative axis's patches in the wrong place (its file then fails ORT's shape inference)."""
    def __init__(self, patchify: nn.Module):
        super().__init__()
        self.start, self.length, self.stride = patchify.sequence_start, patchify.patch_length, patchify.patch_stride
    def forward(self, x):  # N, T, C -> N, C, patches, patch_length
        return x[:, self.start:].unfold(1, self.length, self.stride).transpose(1, 2).contiguous()

class PatchTSMixer(nn.Module):
    """PatchTSMixer's backbone on a multivariate series: std scaling, patches, MLP mixers over patches, features and
    channels with gated attention; the last hidden state (N, C, patches, d)."""
    def __init__(self):
        super().__init__()
        from transformers import PatchTSMixerConfig, PatchTSMixerModel
        self.model = PatchTSMixerModel(PatchTSMixerConfig(context_length=32, patch_length=8, patch_stride=4, num_input_channels=3, d_model=16, expansion_factor=2, num_layers=2, mode="mix_channel", gated_attn=True, norm_mlp="LayerNorm", scaling="std", dropout=0.0, head_dropout=0.0))
        self.model.patching = TimePatchify(self.model.patching)
    def forward(self, x):  # N, T, C
        return self.model(past_values=x).last_hidden_state

def _patchtsmixer():
    return PatchTSMixer()

def channel_shuffle(x, groups: int):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)

class ShuffleUnit(nn.Module):
    """ShuffleNetV2 unit: stride 1 splits the channels in two and transforms one half (1×1, 3×3 depthwise, 1×1, each
    BatchNorm'd); stride 2 transforms both copies (a depthwise-downsampling branch); concatenate, shuffle the channels."""
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride == 2:
            self.branch1 = nn.Sequential(nn.Conv2d(cin, cin, 3, 2, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                                         nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())
        bin_ = cin if stride == 2 else half
        self.branch2 = nn.Sequential(nn.Conv2d(bin_, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU(),
                                     nn.Conv2d(half, half, 3, stride, 1, groups=half, bias=False), nn.BatchNorm2d(half),
                                     nn.Conv2d(half, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU())
    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.branch2(b)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)

class ShuffleNetV2(nn.Module):
    """A small ShuffleNetV2: a strided Conv stem and max pooling, two stages (a downsampling unit, a split unit), a 1×1
    head Conv, global pooling, a classifier."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.stages = nn.Sequential(ShuffleUnit(16, 32, 2), ShuffleUnit(32, 32, 1), ShuffleUnit(32, 64, 2), ShuffleUnit(64, 64, 1))
        self.head = nn.Sequential(nn.Conv2d(64, 96, 1, bias=False), nn.BatchNorm2d(96), nn.ReLU())
        self.fc = nn.Linear(96, 10)
        with torch.no_grad():  # variance-keeping convolutions: the default inits shrink the activations, He's grow them
            for m in self.modules():  # (through BatchNorms with random running statistics) to logits of std 7
                if isinstance(m, nn.Conv2d):
                    m.weight.normal_(0.0, m.weight[0].numel() ** -0.5)
    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.head(self.stages(self.stem(x))), 1).flatten(1))

class SineLayer(nn.Module):
    """sin(omega_0 · (x W + b)) with SIREN's initialisation: U(-1/in, 1/in) for the first layer, U(±sqrt(6/in)/omega_0)
    after it, U(±sqrt(6/in)) for the linear output (unit-scale outputs, untrained).  Plain Parameters, not an nn.Linear, so that the sweep's randomisation keeps the initialisation (with
    std 1/sqrt(in) weights omega_0 = 30 would make the sines alias)."""
    def __init__(self, cin, cout, first, omega=30.0, last=False):
        super().__init__()
        self.omega, self.last = omega, last
        bound = 1.0 / cin if first else (6.0 / cin) ** 0.5 / (1.0 if last else omega)
        self.weight = nn.Parameter(torch.empty(cout, cin).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(cout).uniform_(-cin ** -0.5, cin ** -0.5))
    def forward(self, x):
        y = F.linear(x, self.weight, self.bias)
        return y if self.last else torch.sin(self.omega * y)

class Siren(nn.Module):
    """A SIREN on 2-D coordinates: three sine layers of width 32 and a linear output of 3 channels."""
    def __init__(self, width=32):
        super().__init__()
        self.net = nn.Sequential(SineLayer(2, width, True), SineLayer(width, width, False), SineLayer(width, width, False),
                                 SineLayer(width, 3, False, last=True))
    def forward(self, coords):  # N, P, 2 in [-1, 1]
        return self.net(coords)

class ODEFunc(nn.Module):
    """dh/dt = f(t, h): GroupNorm, tanh, a 3×3 Conv of [h, t], GroupNorm, tanh, a 3×3 Conv of [h, t] (torchdiffeq's
    ConcatConv2d: the time as a constant extra channel)."""
    def __init__(self, c):
        super().__init__()
        self.norm1, self.norm2 = nn.GroupNorm(2, c), nn.GroupNorm(2, c)
        self.conv1, self.conv2 = nn.Conv2d(c + 1, c, 3, padding=1), nn.Conv2d(c + 1, c, 3, padding=1)
    def forward(self, t, h):
        tt = torch.ones_like(h[:, :1]) * t
        h = self.conv1(torch.cat((tt, torch.tanh(self.norm1(h))), 1))
        return self.conv2(torch.cat((tt, torch.tanh(self.norm2(h))), 1))

class NeuralODE(nn.Module):
    """A neural ODE: a strided Conv stem, h(1) from h(0) by classic fixed-step RK4 (three steps of dt = 1/3, so the one
    field's weights are used twelve times), a 1×1 Conv head on the final state."""
    def __init__(self, c=8, steps=3):
        super().__init__()
        self.steps = steps
        self.stem = nn.Conv2d(3, c, 3, 2, 1)
        self.func = ODEFunc(c)
        self.head = nn.Conv2d(c, 4, 1)
    def forward(self, x):
        h = self.stem(x)
        dt = 1.0 / self.steps
        for i in range(self.steps):
            t = i * dt
            k1 = self.func(t, h)
            k2 = self.func(t + dt / 2, h + dt / 2 * k1)
            k3 = self.func(t + dt / 2, h + dt / 2 * k2)
            k4 = self.func(t + dt, h + dt * k3)
            h = h + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        return self.head(h)

class Top2MoE(nn.Module):
    """A mixture-of-experts feed-forward: router Linear and softmax, the top 2 of 4 gates (TopK) renormalised, every
    expert (Linear, GELU, Linear) run densely and stacked; combined either by gathering the two chosen experts' outputs
    (GatherElements) or by a one-hot gate matrix scattered from the top-2 (ScatterElements) times all of them."""
    def __init__(self, d, hidden, experts=4, combine="gather"):
        super().__init__()
        self.combine = combine
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d)) for _ in range(experts))
    def forward(self, x):  # N, T, d
        gates = self.router(x).softmax(-1)
        top, idx = torch.topk(gates, 2, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        outs = torch.stack([e(x) for e in self.experts], 2)  # N, T, E, d
        if self.combine == "gather":
            picked = torch.gather(outs, 2, idx[..., None].expand(-1, -1, -1, outs.shape[-1]))
            return (top[..., None] * picked).sum(2)
        dense = torch.zeros_like(gates).scatter(-1, idx, top)
        return (dense[..., None] * outs).sum(2)

class MoETransformer(nn.Module):
    """Token and learned position embeddings, two pre-LayerNorm blocks of nn.MultiheadAttention and a top-2 MoE
    feed-forward (the first combining by gather, the second by one-hot scatter), a final LayerNorm."""
    def __init__(self, vocab=128, d=32, heads=4, block=64):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(2))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.moe = nn.ModuleList(Top2MoE(d, 2 * d, combine=c) for c in ("gather", "scatter"))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):  # N, T
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for ln1, attn, ln2, moe in zip(self.ln1, self.attn, self.ln2, self.moe):
            h = ln1(x)
            x = x + attn(h, h, h, need_weights=False)[0]
            x = x + moe(ln2(x))
        return self.ln_f(x)


# --------------------------------------------------------------------------- eleventh held-out set
# Added after the tenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout11``): multi-head latent attention (DeepSeek-V3: low-rank q and compressed kv projections with their
# own RMSNorms, the rotary part of q/k split from the non-rotary part and the shared rope key broadcast over heads,
# v's head size different from q/k's), ALiBi attention with clipped q/k/v and bias-free LayerNorms (MPT), alternating
# global and local (windowed) causal attention without attention scaling (GPT-Neo), sliding-window grouped-query
# attention with biases and LayerNorm (StarCoder2), landmark attention with an iterative Moore-Penrose
# pseudo-inverse and a depthwise Conv2d residual on v (Nystromformer), the RWKV time-mix recurrence (token shift,
# exponential decays with a running maximum, unrolled over time) and channel mix (squared ReLU, sigmoid receptance),
# and four hand-written models: a capsule network (squash, three dynamic-routing iterations of softmax couplings and
# agreement updates), a RealNVP flow (affine couplings with tanh-bounded exp scales under checkerboard and
# channel masks, a squeeze, the log-determinant concatenated to the output), a RetNet (multi-scale retention: a
# per-head exponential decay mask built at run time, rotated q/k, the retention normalised by its row sums, per-head
# GroupNorm, a swish gate) and a KAN (B-spline bases by the Cox-de Boor recursion on a knot grid, comparisons cast to
# float, a SiLU base path).

def _deepseekv3():
    from transformers import DeepseekV3Config, DeepseekV3Model
    return LastHidden(DeepseekV3Model(DeepseekV3Config(vocab_size=128, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=6, first_k_dense_replace=2, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, n_shared_experts=1, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)), "input_ids")
def _mpt():
    from transformers import MptConfig, MptModel
    return LastHidden(MptModel(MptConfig(vocab_size=128, d_model=32, n_heads=4, n_layers=2, expansion_ratio=2, max_seq_len=64, attn_config={"alibi": True, "clip_qkv": 1.5, "alibi_bias_max": 8})), "input_ids")
def _gptneo():
    from transformers import GPTNeoConfig, GPTNeoModel
    return LastHidden(GPTNeoModel(GPTNeoConfig(vocab_size=128, max_position_embeddings=64, hidden_size=32, num_layers=2, attention_types=[[["global", "local"], 1]], num_heads=4, intermediate_size=64, window_size=4, bos_token_id=0, eos_token_id=0)), "input_ids")
def _starcoder2():
    from transformers import Starcoder2Config, Starcoder2Model
    return LastHidden(Starcoder2Model(Starcoder2Config(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, sliding_window=4, use_bias=True, max_position_embeddings=64, bos_token_id=0, eos_token_id=0)), "input_ids")
class Nystromformer(nn.Module):
    """Nystromformer's embeddings and encoder called without an attention mask: under tracing the model's own forward
    materialises an all-ones (N, 1, T, T) mask and adds it to the landmark scores (N, h, landmarks, T), which fails to
    broadcast in both exporters (eagerly the mask is dropped)."""
    def __init__(self):
        super().__init__()
        from transformers import NystromformerConfig, NystromformerModel
        self.model = NystromformerModel(NystromformerConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, segment_means_seq_len=16, num_landmarks=4, conv_kernel_size=3, inv_coeff_init_option=False, pad_token_id=1, bos_token_id=0, eos_token_id=2))
    def forward(self, ids):  # N, 16 (16 = segment_means_seq_len: four landmarks of four tokens)
        return self.model.encoder(self.model.embeddings(input_ids=ids), attention_mask=None).last_hidden_state

def _nystromformer():
    return Nystromformer()
def _rwkv():
    from transformers import RwkvConfig, RwkvModel
    return LastHidden(RwkvModel(RwkvConfig(vocab_size=128, context_length=64, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, bos_token_id=0, eos_token_id=0)), "input_ids")

def squash(s, dim: int = -1):
    n2 = (s * s).sum(dim, keepdim=True)
    return s * (n2 / (1.0 + n2)) / torch.sqrt(n2 + 1e-8)

class CapsNet(nn.Module):
    """A capsule network: a strided Conv stem, primary capsules (a strided Conv reshaped to 4 × 4 × 4 capsules of
    dimension 8, squashed), per-pair transformation matrices to 5 output capsules of dimension 8 (einsum), three
    dynamic-routing iterations (softmax couplings over the outputs, weighted sums, squash, agreement added to the
    logits); the output capsules (N, 5, 8)."""
    def __init__(self, types=4, dim=8, classes=5, out_dim=8, iters=3):
        super().__init__()
        self.types, self.dim, self.iters = types, dim, iters
        self.stem = nn.Conv2d(3, 16, 5, 2, 2)
        self.primary = nn.Conv2d(16, types * dim, 3, 2, 1)
        self.W = nn.Parameter(torch.randn(types * 16, classes, out_dim, dim) * 2 * dim ** -0.5)
    def forward(self, x):  # N, 3, 16, 16
        h = self.primary(F.relu(self.stem(x)))  # N, types*dim, 4, 4
        n = h.shape[0]
        u = squash(h.view(n, self.types, self.dim, -1).permute(0, 1, 3, 2).reshape(n, -1, self.dim))  # N, 64, dim
        u_hat = torch.einsum("icod,nid->nico", self.W, u)  # N, 64, classes, out_dim
        b = torch.zeros(u_hat.shape[:3], dtype=u_hat.dtype, device=u_hat.device)
        v = u_hat.mean(1)
        for i in range(self.iters):
            c = b.softmax(2)
            v = squash((c[..., None] * u_hat).sum(1))  # N, classes, out_dim
            if i < self.iters - 1:
                b = b + (u_hat * v[:, None]).sum(-1)
        return v

class Coupling(nn.Module):
    """RealNVP affine coupling: the masked part conditions a small Conv net giving s (tanh-bounded, scaled) and t;
    y = x·m + (1 − m)·(x·exp(s) + t), log|det| = Σ (1 − m)·s."""
    def __init__(self, c, mask, hidden=16):
        super().__init__()
        self.register_buffer("mask", mask)
        self.net = nn.Sequential(nn.Conv2d(c, hidden, 3, padding=1), nn.ReLU(), nn.Conv2d(hidden, hidden, 1), nn.ReLU(),
                                 nn.Conv2d(hidden, 2 * c, 3, padding=1))
        self.scale = nn.Parameter(torch.full((1, c, 1, 1), 0.8))
    def forward(self, x):
        xm = x * self.mask
        s, t = self.net(xm).chunk(2, dim=1)
        s = self.scale * torch.tanh(s) * (1 - self.mask)
        t = t * (1 - self.mask)
        return xm + (1 - self.mask) * (x * torch.exp(s) + t), s.flatten(1).sum(1)

class RealNVP(nn.Module):
    """A RealNVP flow: three checkerboard couplings (alternating masks), a 2 × 2 squeeze (pixel_unshuffle), two
    channel-wise couplings (alternating halves); z flattened with the summed log-determinant appended."""
    def __init__(self, c=3, size=16):
        super().__init__()
        board = ((torch.arange(size)[:, None] + torch.arange(size)[None]) % 2).float()[None, None]
        self.checker = nn.ModuleList(Coupling(c, board if i % 2 == 0 else 1 - board) for i in range(3))
        half = torch.zeros(1, 4 * c, 1, 1)
        half[:, : 2 * c] = 1
        self.channel = nn.ModuleList(Coupling(4 * c, half if i % 2 == 0 else 1 - half) for i in range(2))
    def forward(self, x):  # N, 3, 16, 16
        logdet = x.new_zeros(x.shape[0])
        for layer in self.checker:
            x, ld = layer(x)
            logdet = logdet + ld
        x = F.pixel_unshuffle(x, 2)
        for layer in self.channel:
            x, ld = layer(x)
            logdet = logdet + ld
        return torch.cat((x.flatten(1), logdet[:, None] / x[0].numel()), 1)

class MultiScaleRetention(nn.Module):
    """RetNet's retention, parallel form: q/k rotated by per-position angles, a per-head decay mask
    D[n, m] = γ_h^(n−m) (n ≥ m) built at run time and normalised by its row sums' square roots, scores normalised by
    max(|row sum|, 1), per-head GroupNorm, a swish gate, an output projection."""
    def __init__(self, d, heads):
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.q, self.k, self.v, self.g, self.o = (nn.Linear(d, d, bias=False) for _ in range(5))
        self.norm = nn.GroupNorm(heads, d)
        self.register_buffer("log_gamma", torch.log(1 - 2.0 ** (-5.0 - torch.arange(heads, dtype=torch.float))))
        self.register_buffer("theta", 10000 ** -torch.linspace(0, 1, self.dk // 2))
    def rotate(self, x, ang):  # N, h, T, dk
        x1, x2 = x[..., 0::2], x[..., 1::2]
        c, s = ang.cos(), ang.sin()
        return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)
    def forward(self, x):  # N, T, d
        n, t, d = x.shape
        split = lambda y: y.view(n, t, self.h, self.dk).transpose(1, 2)
        pos = torch.arange(t, dtype=x.dtype, device=x.device)
        ang = pos[:, None] * self.theta[None]
        q, k, v = self.rotate(split(self.q(x)), ang), self.rotate(split(self.k(x)), ang) * self.dk ** -0.5, split(self.v(x))
        diff = pos[:, None] - pos[None]
        decay = torch.exp(self.log_gamma[:, None, None] * diff) * (diff >= 0).to(x.dtype)  # h, T, T
        decay = decay / decay.sum(-1, keepdim=True).sqrt()
        scores = q @ k.transpose(-1, -2) * decay
        scores = scores / scores.sum(-1, keepdim=True).abs().clamp(min=1.0)
        r = (scores @ v).transpose(1, 2).reshape(n * t, d)
        r = self.norm(r).view(n, t, d)
        return self.o(F.silu(self.g(x)) * r)

class RetNet(nn.Module):
    """Token embeddings, two pre-LayerNorm blocks of multi-scale retention and a GELU feed-forward, a final LayerNorm."""
    def __init__(self, vocab=128, d=32, heads=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ret = nn.ModuleList(MultiScaleRetention(d, heads) for _ in range(2))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):
        x = self.emb(ids)
        for ln1, ret, ln2, ffn in zip(self.ln1, self.ret, self.ln2, self.ffn):
            x = x + ret(ln1(x))
            x = x + ffn(ln2(x))
        return self.ln_f(x)

class KANLinear(nn.Module):
    """A Kolmogorov-Arnold layer (efficient-KAN): SiLU(x) through a base Linear plus cubic B-spline bases of x (Cox-de
    Boor recursion on a uniform knot grid over [-2, 2], the order-0 bases from comparisons cast to float) through
    per-input-per-output spline coefficients."""
    def __init__(self, cin, cout, grid_size=5, order=3, lo=-2.0, hi=2.0):
        super().__init__()
        self.order = order
        h = (hi - lo) / grid_size
        grid = torch.arange(-order, grid_size + order + 1, dtype=torch.float) * h + lo
        self.register_buffer("grid", grid.expand(cin, -1).contiguous())
        self.base = nn.Linear(cin, cout)
        self.spline = nn.Parameter(torch.randn(cout, cin, grid_size + order) * (cin * (grid_size + order)) ** -0.5 * 2)
    def bases(self, x):  # N, in -> N, in, grid_size + order
        g, x = self.grid, x[..., None]
        b = ((x >= g[:, :-1]) & (x < g[:, 1:])).to(x.dtype)
        for k in range(1, self.order + 1):
            b = ((x - g[:, : -(k + 1)]) / (g[:, k:-1] - g[:, : -(k + 1)]) * b[..., :-1]
                 + (g[:, k + 1:] - x) / (g[:, k + 1:] - g[:, 1:-k]) * b[..., 1:])
        return b
    def forward(self, x):
        return self.base(F.silu(x)) + torch.einsum("nik,oik->no", self.bases(x), self.spline)

class KAN(nn.Module):
    """A KAN on tabular rows: KAN layers 12 → 16 → 16 → 4, a LayerNorm between (keeping the inputs on the grid)."""
    def __init__(self):
        super().__init__()
        self.l1, self.n1, self.l2, self.n2, self.l3 = KANLinear(12, 16), nn.LayerNorm(16), KANLinear(16, 16), nn.LayerNorm(16), KANLinear(16, 4)
    def forward(self, x):  # N, 12
        return self.l3(self.n2(self.l2(self.n1(self.l1(x)))))


# --------------------------------------------------------------------------- twelfth held-out set
# Added after the eleventh held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout12``): BigBird's block-sparse attention (the keys gathered block by block into sliding-window, global
# and random blocks, the first and last query blocks attending globally), XLNet's relative attention (sinusoidal
# relative encodings projected separately, content and position biases r_w / r_r, the position scores realigned by
# the reshape-and-slice rel_shift, segment biases from a same-segment one-hot), DiffLlama's differential attention
# (two softmax maps subtracted with a λ re-parameterised from exponentials of dot products, a per-head RMSNorm, a
# (1 − λ_init) scale), xLSTM's matrix LSTM (exponential input gates, log-sigmoid forget gates accumulated by cumsum,
# max-stabilised, evaluated chunkwise with soft-capped gates), Doge's dynamic mask attention (a per-head mask made from
# the values by exp(A·softplus(dt)), the keys outside its top-k set to the dtype minimum by a scatter), the Perceiver
# (a learned latent array broadcast over the batch cross-attending to the inputs, then latent self-attention: the
# output length is the latents', not the input's), and four hand-written models: an involution network (per-pixel
# kernels generated from the input and applied to an unfolded (im2col) neighbourhood), a hypernetwork (per-sample Conv
# and Linear weights generated at run time and applied as a batch-grouped Conv and a bmm: weights that are not
# initializers), a SuperGlue-style optimal-transport matcher (a learned dustbin row and column, log-space Sinkhorn
# iterations alternating logsumexp over rows and columns) and an attention-free transformer (AFT-full: learned pairwise
# position biases, exp of max-shifted keys, a causal mask by multiplication, a sigmoid query gate).

def _bigbird():
    from transformers import BigBirdConfig, BigBirdModel
    return LastHidden(BigBirdModel(BigBirdConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128, attention_type="block_sparse", block_size=2, num_random_blocks=1)), "input_ids")
def _xlnet():
    from transformers import XLNetConfig, XLNetModel
    return LastHidden(XLNetModel(XLNetConfig(vocab_size=128, d_model=32, n_layer=2, n_head=4, d_inner=64, bi_data=False, attn_type="bi")), "input_ids")
class RMSNormPlain(nn.Module):
    """x / rms(x), no weight: DiffLlama's ``nn.RMSNorm(elementwise_affine=False)`` written out, since the TorchScript
    exporter has no ``aten::rms_norm`` at opset 17."""
    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps
    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

def _diffllama():
    from transformers import DiffLlamaConfig, DiffLlamaModel
    model = DiffLlamaModel(DiffLlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    for layer in model.layers:
        layer.self_attn.groupnorm = RMSNormPlain(layer.self_attn.groupnorm.eps)
    return LastHidden(model, "input_ids")
def _xlstm():
    from transformers import xLSTMConfig, xLSTMModel
    return LastHidden(xLSTMModel(xLSTMConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_heads=2, chunk_size=4, ffn_round_up_to_multiple_of=16, autocast_kernel_dtype="float32", mode="inference", use_cache=False)), "input_ids")
def _doge():
    from transformers import DogeConfig, DogeModel
    return LastHidden(DogeModel(DogeConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, keep_window_size=8, max_position_embeddings=64)), "input_ids")
class Perceiver(nn.Module):
    """A token embedding fed as ``inputs`` to a PerceiverModel (no preprocessor): 8 latents of size 32 cross-attend to
    the 16 tokens, then two latent self-attention layers; the latents (N, 8, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import PerceiverConfig, PerceiverModel
        self.emb = nn.Embedding(128, 32)
        self.model = PerceiverModel(PerceiverConfig(num_latents=8, d_latents=32, d_model=32, num_blocks=1, num_self_attends_per_block=2, num_self_attention_heads=4, num_cross_attention_heads=2))
    def forward(self, ids):
        return self.model(inputs=self.emb(ids)).last_hidden_state

class Involution(nn.Module):
    """Involution (Li et al. 2021): a K × K kernel per pixel and channel group, generated from the pixel's own features
    (1×1 reduce, BatchNorm, ReLU, 1×1 span), multiplied into the unfolded (im2col) neighbourhood and summed."""
    def __init__(self, c, k=3, groups=4, stride=1, reduction=2):
        super().__init__()
        self.k, self.g, self.stride = k, groups, stride
        self.reduce = nn.Sequential(nn.Conv2d(c, c // reduction, 1), nn.BatchNorm2d(c // reduction), nn.ReLU())
        self.span = nn.Conv2d(c // reduction, k * k * groups, 1)
    def forward(self, x):
        n, c, h, w = x.shape
        ho, wo = h // self.stride, w // self.stride
        kernel = self.span(self.reduce(F.avg_pool2d(x, self.stride) if self.stride > 1 else x))
        kernel = kernel.view(n, self.g, 1, self.k * self.k, ho, wo)
        patches = F.unfold(x, self.k, padding=self.k // 2, stride=self.stride)
        patches = patches.view(n, self.g, c // self.g, self.k * self.k, ho, wo)
        return (kernel * patches).sum(3).view(n, c, ho, wo)

class InvNet(nn.Module):
    """A Conv stem, two residual involution blocks (the second strided, its shortcut average-pooled), BatchNorm and
    ReLU, global pooling, a classifier."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.inv1, self.bn1 = Involution(16), nn.BatchNorm2d(16)
        self.inv2, self.bn2 = Involution(16, k=5, stride=2), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 10)
    def forward(self, x):  # N, 3, 16, 16
        x = self.stem(x)
        x = F.relu(x + self.bn1(self.inv1(x)))
        x = F.relu(F.avg_pool2d(x, 2) + self.bn2(self.inv2(x)))
        return self.fc(x.mean((2, 3)))

class HyperNet(nn.Module):
    """A hypernetwork: a context vector (global statistics of the input through an MLP) generates per-sample 3×3 Conv
    weights and biases, applied to the whole batch at once as a Conv grouped by sample; a second generated matrix is
    applied by bmm after pooling.  The generated weights are run-time tensors, not initializers."""
    def __init__(self, cin=3, cout=8, hidden=32, classes=6):
        super().__init__()
        self.cin, self.cout, self.classes = cin, cout, classes
        self.ctx = nn.Sequential(nn.Linear(2 * cin, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.gen_w = nn.Linear(hidden, cout * cin * 9)
        self.gen_b = nn.Linear(hidden, cout)
        self.gen_fc = nn.Linear(hidden, classes * cout)
        self.stem = nn.Conv2d(cin, cin, 3, padding=1)
    def forward(self, x):  # N, 3, 16, 16
        n, c, h, w = x.shape
        z = self.ctx(torch.cat((x.mean((2, 3)), x.std((2, 3))), 1))
        weight = self.gen_w(z).view(n * self.cout, c, 3, 3) * (c * 9) ** -0.5
        y = F.conv2d(self.stem(x).reshape(1, n * c, h, w), weight, self.gen_b(z).flatten(), padding=1, groups=n)
        y = F.gelu(y.view(n, self.cout, h, w))
        pooled = F.adaptive_max_pool2d(y, 1).flatten(1)  # N, cout
        fc = self.gen_fc(z).view(n, self.classes, self.cout) * self.cout ** -0.5
        return torch.bmm(fc, pooled[:, :, None]).squeeze(-1)

class SinkhornMatcher(nn.Module):
    """SuperGlue-style matching of two point sets: MLP descriptors, a cross-attention round, scaled similarity
    scores, a learned dustbin score appended as a row and a column, log-space Sinkhorn (the marginals 1 per point and
    the other set's size for the dustbin; u and v updated by logsumexp over columns and rows, 10 iterations); the
    log assignment (N, m + 1, n + 1)."""
    def __init__(self, cin=6, d=16, iters=10):
        super().__init__()
        self.iters = iters
        self.enc = nn.Sequential(nn.Linear(cin, d), nn.ReLU(), nn.Linear(d, d))
        self.cross = nn.MultiheadAttention(d, 2, batch_first=True)
        self.proj = nn.Linear(d, d)
        self.bin_score = nn.Parameter(torch.tensor(1.0))
    def forward(self, a, b):  # N, m, 6 and N, n, 6
        da, db = self.enc(a), self.enc(b)
        da = da + self.cross(da, db, db, need_weights=False)[0]
        db = db + self.cross(db, da, da, need_weights=False)[0]
        scores = torch.einsum("nmd,nkd->nmk", self.proj(da), self.proj(db)) / da.shape[-1] ** 0.5
        bsz, m, k = scores.shape
        col = self.bin_score.expand(bsz, m, 1)
        row = self.bin_score.expand(bsz, 1, k + 1)
        z = torch.cat((torch.cat((scores, col), 2), row), 1)  # N, m+1, k+1
        norm = -math.log(m + k)
        log_mu = torch.cat((torch.full((m,), norm), torch.full((1,), math.log(k) + norm))).to(z)
        log_nu = torch.cat((torch.full((k,), norm), torch.full((1,), math.log(m) + norm))).to(z)
        u, v = torch.zeros_like(z[:, :, 0]), torch.zeros_like(z[:, 0, :])
        for _ in range(self.iters):
            u = log_mu - torch.logsumexp(z + v[:, None, :], dim=2)
            v = log_nu - torch.logsumexp(z + u[:, :, None], dim=1)
        return z + u[:, :, None] + v[:, None, :] - norm

class AFTFull(nn.Module):
    """Attention-free transformer layer (AFT-full, causal): Y_t = σ(Q_t) ⊙ Σ_{t'≤t} exp(K_t' + w_{t,t'}) ⊙ V_t' /
    Σ_{t'≤t} exp(K_t' + w_{t,t'}), with learned pairwise position biases w (sliced to the length), the keys and
    biases shifted by their maxima before exp, the causal mask applied by multiplication."""
    def __init__(self, d, max_len=64):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.w = nn.Parameter(torch.randn(max_len, max_len) * 0.5)
    def forward(self, x):  # N, T, d
        t = x.shape[1]
        k = self.k(x)
        ek = torch.exp(k - k.amax(1, keepdim=True))  # N, T, d
        w = self.w[:t, :t]
        ew = torch.exp(w - w.max()) * torch.ones(t, t, device=x.device).tril()  # T, T
        num = torch.einsum("ts,nsd->ntd", ew, ek * self.v(x))
        den = torch.einsum("ts,nsd->ntd", ew, ek)
        return self.o(torch.sigmoid(self.q(x)) * num / den)

class AFTNet(nn.Module):
    """Token embeddings, two pre-LayerNorm AFT-full blocks with GELU FFNs, a final LayerNorm."""
    def __init__(self, vocab=128, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.aft = nn.ModuleList(AFTFull(d) for _ in range(2))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):
        x = self.emb(ids)
        for ln1, aft, ln2, ffn in zip(self.ln1, self.aft, self.ln2, self.ffn):
            x = x + aft(ln1(x))
            x = x + ffn(ln2(x))
        return self.ln_f(x)


# --------------------------------------------------------------------------- thirteenth held-out set
# Added after the twelfth held-out set and measured before any of their misses was looked at (``fault_sweep.py --archs
# heldout13``): the Switch Transformer's encoder (top-1 routing with an expert capacity: the argmax expert one-hot, a
# cumsum over the tokens giving each token's place in its expert's queue, the tokens past the capacity dropped, the
# chosen probability scaling the expert output; T5 relative position buckets, RMS norms), RecurrentGemma's Griffin
# blocks (the real-gated linear recurrence RG-LRU unrolled over time, its input scaled by √(1 − a²), a short causal
# Conv1d, a gated GELU MLP, local sliding-window attention, embeddings scaled by √d), GPT-OSS (attention sinks: a
# learned per-head logit concatenated to the scores before the softmax and dropped after it, a clamped SwiGLU with a
# sigmoid(α·x) gate, top-k routing with a softmax over the chosen experts, alternating sliding-window layers), ViTDet
# (window attention on a padded patch grid partitioned into windows and merged back, decomposed relative position
# biases from height and width tables by einsum, a residual bottleneck Conv block), ViT-MAE (the patches shuffled by
# an argsort of a noise input, the kept half gathered, so the output has fewer tokens than the image has patches),
# CANINE (character ids hashed by several multiply-and-modulo functions into bucket embeddings, local attention over
# character blocks, a strided Conv1d down to molecules, the molecules repeated back to characters and concatenated, a
# same-padded Conv1d projection), and four hand-written models: a graph attention network (edge scores by LeakyReLU,
# non-edges of an adjacency input filled with −inf before the softmax, heads concatenated or averaged), a TabNet
# (sparsemax feature masks: sort, cumsum, support count and a gathered threshold; prior scales, GLU blocks with
# BatchNorm), a deformable convolution written with gathers (offsets from a Conv, floored corners, clamped linear
# indices, bilinear weights zeroed outside the image, an im2col matmul) and an S4D model (a Vandermonde convolution
# kernel computed at run time with exp, cos and sin from a per-sample step size, spread into a causal Toeplitz matrix
# by a gather of lags and applied by a matmul).

class SwitchDenseExperts(nn.Module):
    """SwitchTransformersExperts evaluated densely: every expert on every token, each output times the token's
    (capacity-masked) one-hot dispatch entry, the sum times the router probability.  The same values as the sparse
    original, whose loop over the experts hit (``nonzero``) and ``index_add_`` the dynamo exporter cannot trace."""
    def __init__(self, experts):
        super().__init__()
        self.experts = experts
    def forward(self, hidden_states, selected_experts, routing_weights):  # T, d; T, 1, experts; T, 1
        out = 0
        for e in range(len(self.experts)):
            out = out + selected_experts[:, 0, e, None].to(hidden_states.dtype) * self.experts[f"expert_{e}"](hidden_states)
        return out * routing_weights

class SwitchEncoder(nn.Module):
    """A SwitchTransformersEncoderModel (the second layer's feed-forward a 4-expert top-1 MoE, a capacity of 4 of the
    16 tokens per expert) with its experts evaluated densely (SwitchDenseExperts) and an explicit all-ones attention
    mask: without one, under torch.export the model makes no mask and then subscripts None."""
    def __init__(self):
        super().__init__()
        from transformers import SwitchTransformersConfig, SwitchTransformersEncoderModel
        self.model = SwitchTransformersEncoderModel(SwitchTransformersConfig(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_sparse_encoder_layers=1, num_heads=4, num_experts=4, expert_capacity=4, router_jitter_noise=0.0, relative_attention_num_buckets=8, relative_attention_max_distance=16))
        for module in list(self.model.modules()):
            if type(module).__name__ == "SwitchTransformersSparseMLP":
                module.experts = SwitchDenseExperts(module.experts)
    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state

def _recurrentgemma():
    from transformers import RecurrentGemmaConfig, RecurrentGemmaModel
    return LastHidden(RecurrentGemmaModel(RecurrentGemmaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, lru_width=32, attention_window_size=8, conv1d_width=4, block_types=["recurrent", "attention"])), "input_ids")
def _gptoss():
    from transformers import GptOssConfig, GptOssModel
    model = GptOssModel(GptOssConfig(vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=2, sliding_window=4))
    model.set_experts_implementation("batched_mm")  # as Qwen2-MoE: no grouped_mm (histc), no data-dependent loop
    return LastHidden(model, "input_ids")
def _vitdet():
    from transformers import VitDetConfig, VitDetModel
    return LastHidden(VitDetModel(VitDetConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, image_size=32, pretrain_image_size=32, patch_size=4, window_block_indices=[0], residual_block_indices=[1], use_relative_position_embeddings=True, window_size=3)), "pixel_values")
class ViTMAE(nn.Module):
    """ViTMAEModel called with its masking noise as a second input (otherwise drawn by torch.rand at run time): the
    16 patches argsorted by the noise, the first half kept; the encoder output of the class token and 8 patches."""
    def __init__(self):
        super().__init__()
        from transformers import ViTMAEConfig, ViTMAEModel
        self.model = ViTMAEModel(ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=4, mask_ratio=0.5))
    def forward(self, x, noise):  # N, 3, 16, 16 and N, 16
        return self.model(pixel_values=x, noise=noise).last_hidden_state

def _repeat_molecules(molecules, char_seq_length: int, rate: int):
    """CanineModel._repeat_molecules with expand + flatten for repeat_interleave: the TorchScript exporter's
    repeat_interleave with a repeat count traced from the input length gives a graph whose shapes ONNX Runtime
    rejects."""
    body = molecules[:, 1:, None, :].expand(-1, -1, rate, -1).flatten(1, 2)
    return torch.cat((body, molecules[:, -1:, :].expand(-1, char_seq_length % rate + rate, -1)), dim=-2)

def _canine():
    import functools

    from transformers import CanineConfig, CanineModel
    model = CanineModel(CanineConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, num_hash_functions=4, num_hash_buckets=64, local_transformer_stride=8, downsampling_rate=4, upsampling_kernel_size=4))
    model._repeat_molecules = functools.partial(_repeat_molecules, rate=model.config.downsampling_rate)
    return LastHidden(model, "input_ids")

class GATLayer(nn.Module):
    """A graph attention layer (GAT, Veličković et al. 2018) on a dense adjacency: per-head scores
    LeakyReLU(a_dst·Wh_i + a_src·Wh_j), the non-edges filled with −inf before a softmax over the neighbours j (self
    loops keep every row finite), the neighbours' features summed with those weights; heads concatenated or averaged."""
    def __init__(self, cin, d, heads, concat=True):
        super().__init__()
        self.h, self.d, self.concat = heads, d, concat
        self.lin = nn.Linear(cin, heads * d, bias=False)
        self.a_src = nn.Parameter(torch.randn(heads, d) * d ** -0.5)
        self.a_dst = nn.Parameter(torch.randn(heads, d) * d ** -0.5)
        self.bias = nn.Parameter(torch.randn(heads * d if concat else d) * 0.1)
    def forward(self, x, adj):  # N, n, cin and N, n, n (adj[b, i, j] = 1: an edge j → i)
        b, n, _ = x.shape
        h = self.lin(x).view(b, n, self.h, self.d)
        e = F.leaky_relu((h * self.a_dst).sum(-1)[:, :, None] + (h * self.a_src).sum(-1)[:, None], 0.2)  # N, i, j, heads
        alpha = e.masked_fill(adj[..., None] == 0, float("-inf")).softmax(2)
        out = torch.einsum("bijh,bjhd->bihd", alpha, h)
        return (out.flatten(2) if self.concat else out.mean(2)) + self.bias

class GAT(nn.Module):
    """Two multi-head GAT layers (4 heads concatenated, ELU, the second residual under a LayerNorm) and an output GAT
    layer (2 heads averaged) over node features and a dense 0/1 adjacency given as the second input; per-node outputs
    (N, nodes, 5)."""
    def __init__(self, cin=6, d=8, heads=4, out=5):
        super().__init__()
        self.l1, self.l2 = GATLayer(cin, d, heads), GATLayer(d * heads, d, heads)
        self.norm = nn.LayerNorm(d * heads)
        self.l3 = GATLayer(d * heads, out, 2, concat=False)
    def forward(self, x, adj):  # N, 10, 6 and N, 10, 10
        x = F.elu(self.l1(x, adj))
        x = self.norm(x + F.elu(self.l2(x, adj)))
        return self.l3(x, adj)

def sparsemax(z):
    """Sparsemax over the last axis (Martins & Astudillo 2016): sorted descending, the support size k(z) where
    1 + k·z_(k) > Σ_{j≤k} z_(j), the threshold τ gathered from the cumulative sums, max(z − τ, 0)."""
    zs = torch.sort(z, dim=-1, descending=True).values
    k = torch.arange(1, z.shape[-1] + 1, dtype=z.dtype, device=z.device)
    cs = zs.cumsum(-1) - 1
    kz = (k * zs > cs).sum(-1, keepdim=True)
    tau = cs.gather(-1, kz - 1) / kz.to(z.dtype)
    return torch.clamp(z - tau, min=0)

class GLUBlock(nn.Module):
    """Linear, BatchNorm, GLU; with ``residual`` the input added back and the sum scaled by √0.5."""
    def __init__(self, cin, cout, residual):
        super().__init__()
        self.fc, self.bn, self.residual = nn.Linear(cin, 2 * cout, bias=False), nn.BatchNorm1d(2 * cout), residual
    def forward(self, x):
        y = F.glu(self.bn(self.fc(x)), -1)
        return (x + y) * math.sqrt(0.5) if self.residual else y

class TabNet(nn.Module):
    """TabNet (Arik & Pfister 2021) on tabular rows: an input BatchNorm, three decision steps, each an attentive
    transformer (Linear, BatchNorm, times the prior scales, sparsemax: a feature mask with exact zeros; the prior
    updated by γ − mask), the masked features through a feature transformer (two GLU blocks shared across the steps,
    two step-specific, √0.5-scaled residuals), its split into a ReLU'd decision part summed over the steps and the
    next step's attention part; a final Linear."""
    def __init__(self, cin=12, nd=8, na=8, steps=3, gamma=1.3, out=4):
        super().__init__()
        self.nd, self.gamma = nd, gamma
        self.bn = nn.BatchNorm1d(cin)
        shared = nn.ModuleList([GLUBlock(cin, nd + na, False), GLUBlock(nd + na, nd + na, True)])
        self.steps = nn.ModuleList(nn.ModuleList([*shared, GLUBlock(nd + na, nd + na, True), GLUBlock(nd + na, nd + na, True)])
                                   for _ in range(steps + 1))
        self.att = nn.ModuleList(nn.Sequential(nn.Linear(na, cin, bias=False), nn.BatchNorm1d(cin)) for _ in range(steps))
        self.fc = nn.Linear(nd, out)
    def transform(self, i, x):
        for block in self.steps[i]:
            x = block(x)
        return x
    def forward(self, x):  # N, 12
        x = self.bn(x)
        prior = torch.ones_like(x)
        a = self.transform(0, x)[:, self.nd:]
        out = 0
        for i, att in enumerate(self.att):
            mask = sparsemax(att(a) * prior)
            prior = prior * (self.gamma - mask)
            h = self.transform(i + 1, mask * x)
            out = out + F.relu(h[:, : self.nd])
            a = h[:, self.nd:]
        return self.fc(out)

class DeformConv2d(nn.Module):
    """A deformable 3×3 convolution (DCNv1) written with gathers: per-tap (dy, dx) offsets from a Conv, the sampling
    positions floored into four integer corners, each corner read from the flattened image by a gather of clamped linear
    indices and weighted bilinearly (zero outside the image), the sampled columns (im2col-like) through a matmul."""
    def __init__(self, cin, cout, k=3):
        super().__init__()
        self.k = k
        self.offset = nn.Conv2d(cin, 2 * k * k, 3, padding=1)
        self.weight = nn.Parameter(torch.randn(cout, cin * k * k) * (cin * k * k) ** -0.5)
        self.bias = nn.Parameter(torch.randn(cout) * 0.1)
        tap = torch.arange(k, dtype=torch.float) - k // 2
        self.register_buffer("tap_y", tap.repeat_interleave(k)[:, None, None])
        self.register_buffer("tap_x", tap.repeat(k)[:, None, None])
    def forward(self, x):
        n, c, h, w = x.shape
        kk = self.k * self.k
        off = self.offset(x).view(n, kk, 2, h, w)
        ys = torch.arange(h, dtype=x.dtype, device=x.device)[:, None] + self.tap_y + off[:, :, 0]  # N, kk, h, w
        xs = torch.arange(w, dtype=x.dtype, device=x.device) + self.tap_x + off[:, :, 1]
        y0, x0 = ys.floor(), xs.floor()
        flat = x.flatten(2)  # N, c, h·w
        cols = 0
        for dy in (0, 1):
            for dx in (0, 1):
                yy, xx = y0 + dy, x0 + dx
                wgt = (1 - (ys - yy).abs()) * (1 - (xs - xx).abs())
                inside = ((yy >= 0) & (yy <= h - 1) & (xx >= 0) & (xx <= w - 1)).to(x.dtype)
                idx = (yy.clamp(0, h - 1) * w + xx.clamp(0, w - 1)).long().view(n, 1, -1).expand(n, c, -1)
                cols = cols + flat.gather(2, idx).view(n, c, kk, h, w) * (wgt * inside)[:, None]
        out = self.weight @ cols.reshape(n, c * kk, h * w)
        return (out + self.bias[:, None]).view(n, -1, h, w)

class DeformNet(nn.Module):
    """A Conv-BatchNorm-ReLU stem, two deformable convolutions with BatchNorm and ReLU (the second residual), a 1×1
    Conv head: a dense (N, 4, 16, 16) map."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.d1, self.bn1 = DeformConv2d(8, 16), nn.BatchNorm2d(16)
        self.d2, self.bn2 = DeformConv2d(16, 16), nn.BatchNorm2d(16)
        self.head = nn.Conv2d(16, 4, 1)
    def forward(self, x):  # N, 3, 16, 16
        x = F.relu(self.bn1(self.d1(self.stem(x))))
        x = F.relu(x + self.bn2(self.d2(x)))
        return self.head(x)

class S4DConv(nn.Module):
    """An S4D layer (Gu et al. 2022) in real arithmetic, its step size modulated per sample: a diagonal state matrix
    A = −exp(log_a) + i·a_im per channel, dt = exp(log_dt + 0.5·tanh(Linear(mean over time of u))); the long kernel
    K[l] = 2·Re(C·(exp(dt·A) − 1)/A·exp(dt·A·l)) evaluated at run time (a Vandermonde product written with exp, cos and
    sin, summed over the states), spread into a causal Toeplitz matrix by a gather of lags t − s (masked where s > t)
    and applied by a matmul; a D skip.  (With a fixed step size the kernel depends on the weights only and the dynamo
    exporter folds it into a constant.)"""
    def __init__(self, h, n=8, dt_min=0.01, dt_max=0.3):
        super().__init__()
        self.log_dt = nn.Parameter(torch.rand(h) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
        self.dt_mod = nn.Linear(h, h)
        self.log_a = nn.Parameter(math.log(0.5) + 0.2 * torch.randn(h, n // 2))
        self.a_im = nn.Parameter(math.pi * torch.arange(n // 2, dtype=torch.float).expand(h, -1) + 0.1 * torch.randn(h, n // 2))
        self.c_re, self.c_im = nn.Parameter(torch.randn(h, n // 2) * 0.5), nn.Parameter(torch.randn(h, n // 2) * 0.5)
        self.D = nn.Parameter(torch.randn(h))
    def kernel(self, dt, length):  # dt: N, h, 1 -> N, h, L
        a_re, a_im = -self.log_a.exp(), self.a_im  # h, n/2
        e = torch.exp(a_re * dt)
        p, q = e * torch.cos(a_im * dt) - 1, e * torch.sin(a_im * dt)  # exp(dt·A) − 1
        den = a_re * a_re + a_im * a_im
        b_re, b_im = (p * a_re + q * a_im) / den, (q * a_re - p * a_im) / den  # (exp(dt·A) − 1) / A
        w_re, w_im = self.c_re * b_re - self.c_im * b_im, self.c_re * b_im + self.c_im * b_re  # N, h, n/2
        lag = torch.arange(length, dtype=dt.dtype, device=dt.device)
        mag = torch.exp((a_re * dt)[..., None] * lag)  # N, h, n/2, L
        ang = (a_im * dt)[..., None] * lag
        return 2 * (mag * (w_re[..., None] * torch.cos(ang) - w_im[..., None] * torch.sin(ang))).sum(2)
    def forward(self, u):  # N, h, L
        length = u.shape[-1]
        dt = torch.exp(self.log_dt + 0.5 * torch.tanh(self.dt_mod(u.mean(-1))))[..., None]
        k = self.kernel(dt, length)
        pos = torch.arange(length, device=u.device)
        lags = pos[:, None] - pos[None]  # t − s
        toeplitz = k[..., lags.clamp(min=0)] * (lags >= 0).to(u.dtype)  # N, h, L, L
        return (toeplitz @ u[..., None]).squeeze(-1) + u * self.D[:, None]

class S4DNet(nn.Module):
    """A series model: a Linear encoder, two pre-LayerNorm S4D blocks (S4D, GELU, a 1×1 Conv1d to 2h and GLU, residual),
    a final LayerNorm and a Linear decoder per time step."""
    def __init__(self, cin=3, h=16, out=3):
        super().__init__()
        self.enc = nn.Linear(cin, h)
        self.norms = nn.ModuleList(nn.LayerNorm(h) for _ in range(2))
        self.s4 = nn.ModuleList(S4DConv(h) for _ in range(2))
        self.mix = nn.ModuleList(nn.Conv1d(h, 2 * h, 1) for _ in range(2))
        self.ln_f, self.dec = nn.LayerNorm(h), nn.Linear(h, out)
    def forward(self, x):  # N, L, 3
        x = self.enc(x)
        for norm, s4, mix in zip(self.norms, self.s4, self.mix):
            y = s4(norm(x).transpose(1, 2))
            x = x + F.glu(mix(F.gelu(y)), 1).transpose(1, 2)
        return self.dec(self.ln_f(x))


# --------------------------------------------------------------------------- fourteenth held-out set
# Added after the thirteenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout14``): LayoutLMv3's text stream (2-D layout embeddings gathered from x / y / width / height tables by
# the four bounding-box coordinates of a second, integer input, and two kinds of attention bias: 1-D relative position
# buckets and 2-D ones from the boxes' x and y differences, each bucketed with a log, one-hot encoded and projected
# to the heads), FNet (attention replaced by the real part of a 2-D Fourier transform over the tokens and the hidden
# axis, written as run-time cosine and sine DFT matrices, C_T·X·C_D − S_T·X·S_D, since the TorchScript exporter has no
# ``aten::fft_fftn``), Bamba (a hybrid of Mamba-2 and attention layers: the Mamba-2 SSD chunked scan with a
# segment-sum of the decays made into a causal exp mask, 5-D einsums within and across chunks, an inter-chunk state
# recurrence by an einsum against a decay matrix, a gated RMSNorm; a causal depthwise Conv1d; grouped-query rotary
# attention in the other layer), Conditional DETR (a small ResNet backbone with frozen BatchNorms, sine position
# embeddings from cumsums of the pixel mask, learned object queries, reference points from an MLP and a sigmoid, the
# conditional spatial query: sine embeddings of the reference points scaled by an MLP of the decoder state and
# concatenated per head with the content query in cross-attention; the output has 8 query tokens, not image tokens),
# MiniMax (lightning attention: SiLU'd q / k / v, linear attention with per-head decay slopes — ALiBi's geometric
# series, scaled down with depth — evaluated block by block: an intra-block causal decay mask and an inter-block
# key-value state carried with exp decays; an RMSNorm and a sigmoid output gate; alternating with softmax attention;
# a top-1 of 2 expert MoE whose renormalised routing weight is always 1), the SigLIP vision tower (its multihead
# attention pooling head: a learned probe token repeated over the batch cross-attends to the patches through
# nn.MultiheadAttention, a residual MLP; the output is one pooled vector per image), and four hand-written models: a
# Performer (FAVOR+ positive random features: exp of projections onto orthogonal random directions minus half the
# squared norm and a max stabiliser, linear attention as a key-value outer-product sum, and a causal layer whose
# sums are cumsums over time of 5-D outer products), a Hyena operator (an implicit long filter as long as the input,
# generated from sin / cos positional features of the lags by a sine-activated MLP and an exponential decay window,
# applied as a depthwise Conv1d with that generated kernel over a left pad of L − 1; short causal Conv1d, data-
# controlled multiplicative gates), a NeRF-style radiance field with volume rendering (points along rays at fixed
# depths, sinusoidal positional encodings of 2^k·π frequencies, a skip concatenation in the MLP, α = 1 − exp(−σδ),
# transmittance by exp of an exclusive cumsum, weighted sums over the samples into RGB, depth and opacity) and slot
# attention (a softmax over the slots rather than the keys, renormalised over the inputs, three iterations with
# shared weights and a GRUCell update, slots initialised from a fixed noise buffer, a soft position embedding from a
# coordinate grid).

class LayoutLMv3Text(nn.Module):
    """LayoutLMv3Model without the visual stream, called with token ids and their bounding boxes (N, T, 4 integer
    x0, y0, x1, y1 in [0, 128)); 1-D and 2-D relative attention biases on."""
    def __init__(self):
        super().__init__()
        from transformers import LayoutLMv3Config, LayoutLMv3Model
        self.model = LayoutLMv3Model(LayoutLMv3Config(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, max_2d_position_embeddings=128, coordinate_size=6, shape_size=4, rel_pos_bins=16, max_rel_pos=32, rel_2d_pos_bins=32, max_rel_2d_pos=128, has_relative_attention_bias=True, has_spatial_attention_bias=True, visual_embed=False))
    def forward(self, ids, bbox):  # N, T and N, T, 4
        return self.model(input_ids=ids, bbox=bbox).last_hidden_state

class _RealPart:
    def __init__(self, real):
        self.real = real

def real_fft2(x):
    """``torch.fft.fftn(x, dim=(1, 2))`` as FNet uses it (only ``.real`` is read), by DFT matrices made at run time:
    Re(F_T X F_D) = C_T X C_D − S_T X S_D with C, S the cosines and sines of 2π·j·k / n.  The same values; the
    TorchScript exporter has no ``aten::fft_fftn`` (the dynamo exporter would write a DFT op).  The dynamo exporter
    folds the cosine and sine matrices into initializers; the TorchScript export computes them (Cos, Sin)."""
    def cos_sin(n):
        k = torch.arange(n, dtype=x.dtype, device=x.device)
        angle = (2 * math.pi / n) * k[:, None] * k
        return torch.cos(angle), torch.sin(angle)
    (ct, st), (cd, sd) = cos_sin(x.shape[1]), cos_sin(x.shape[2])
    return _RealPart(ct @ x @ cd - st @ x @ sd)

def _fnet():
    from transformers import FNetConfig, FNetModel
    model = FNetModel(FNetConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, intermediate_size=64, max_position_embeddings=64, use_tpu_fourier_optimizations=False))
    for module in model.modules():
        if type(module).__name__ == "FNetBasicFourierTransform":
            module.fourier_transform = real_fft2
    return LastHidden(model, "input_ids")

class _NonNegativePermute:
    """``Tensor.permute`` with negative dims made non-negative while active: the Mamba-2 scan's
    ``permute(0, -2, -1, 1)`` becomes, from the TorchScript exporter, a Transpose with perm {0, -2, -1, 1} that ONNX
    Runtime rejects.  The same values."""
    def __enter__(self):
        self.orig = orig = torch.Tensor.permute
        def permute(t, *dims):
            dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
            return orig(t, *[d % t.dim() for d in dims])
        torch.Tensor.permute = permute
    def __exit__(self, *exc):
        torch.Tensor.permute = self.orig

class Bamba(nn.Module):
    """A BambaModel: a Mamba-2 layer (4 heads of 16, state 8, chunks of 8: two chunks of the 16 tokens) then a
    grouped-query attention layer; run with non-negative permute dims (_NonNegativePermute)."""
    def __init__(self):
        super().__init__()
        from transformers import BambaConfig, BambaModel
        self.model = BambaModel(BambaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_expand=2, mamba_chunk_size=8, mamba_n_groups=1, mamba_d_conv=4))
    def forward(self, ids):
        with _NonNegativePermute():
            return self.model(input_ids=ids).last_hidden_state

class ConditionalDETR(nn.Module):
    """A ConditionalDetrModel on a transformers ResNet backbone (no timm, no pretrained weights: basic blocks, 16 and 32
    channels, the stride-16 stage), one encoder and two decoder layers, 8 object queries; the decoder output (N, 8, 32).
    The frozen BatchNorms' buffers get random statistics here (corpus_models.randomize leaves buffers alone).  With
    no pixel mask input the position embeddings depend on the image size only: the dynamo exporter folds them into
    initializers, the TorchScript export computes them (CumSum, Sin, Cos; the mask resized by a Resize)."""
    def __init__(self):
        super().__init__()
        from transformers import ConditionalDetrConfig, ConditionalDetrModel, ResNetConfig
        backbone = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", out_features=["stage2"])
        self.model = ConditionalDetrModel(ConditionalDetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone, d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8))
        for module in self.model.modules():
            if type(module).__name__.endswith("FrozenBatchNorm2d"):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.5)
                module.running_var.uniform_(0.25, 2.0)
    def forward(self, x):  # N, 3, 64, 64
        return self.model(pixel_values=x).last_hidden_state

def _minimax():
    from transformers import MiniMaxConfig, MiniMaxModel
    model = MiniMaxModel(MiniMaxConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"], block_size=4, num_local_experts=2, num_experts_per_tok=1))
    model.set_experts_implementation("batched_mm")  # as GPT-OSS
    return LastHidden(model, "input_ids")

class SiglipPooled(nn.Module):
    """A SiglipVisionModel's ``pooler_output``: the multihead attention pooling head's one vector per image (N, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import SiglipVisionConfig, SiglipVisionModel
        self.model = SiglipVisionModel(SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=4))
    def forward(self, x):  # N, 3, 32, 32
        return self.model(pixel_values=x).pooler_output

class FavorAttention(nn.Module):
    """Performer self-attention (FAVOR+, Choromanski et al. 2021): q and k mapped to positive random features
    φ(x) = exp(ωᵀx − ‖x‖²/2 − stabiliser) / √m with m = 16 orthogonal random directions ω (a QR of a seeded Gaussian,
    rows rescaled to chi-distributed norms, a buffer); the keys' stabiliser the max over time and features, the
    queries' the max over features; attention in linear time: Σ_s φ(k_s) v_sᵀ, normalised by φ(q)·Σ_s φ(k_s).
    With ``causal``, the sums are prefix sums (cumsum over time of the 5-D outer products φ(k_s) v_sᵀ)."""
    def __init__(self, d, heads, m=16, causal=False):
        super().__init__()
        self.h, self.dh, self.m, self.causal = heads, d // heads, m, causal
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        q, _ = torch.linalg.qr(torch.randn(self.dh, self.dh))
        blocks = [q.T]
        while sum(b.shape[0] for b in blocks) < m:
            blocks.append(torch.linalg.qr(torch.randn(self.dh, self.dh))[0].T)
        omega = torch.cat(blocks)[:m] * torch.randn(m, self.dh).norm(dim=1, keepdim=True)
        self.register_buffer("omega", omega)
    def features(self, x, query):  # N, h, T, dh
        x = x * self.dh ** -0.25
        wx = x @ self.omega.T  # N, h, T, m
        stab = wx.amax(-1, keepdim=True) if query else wx.amax((-2, -1), keepdim=True)
        return (torch.exp(wx - x.pow(2).sum(-1, keepdim=True) / 2 - stab) + 1e-4) / math.sqrt(self.m)
    def forward(self, x):  # N, T, d
        n, t, _ = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.h, self.dh).permute(2, 0, 3, 1, 4)
        q, k = self.features(q, True), self.features(k, False)
        if self.causal:
            kv = torch.einsum("nhtm,nhtd->nhtmd", k, v).cumsum(2)
            out = torch.einsum("nhtm,nhtmd->nhtd", q, kv) / (q * k.cumsum(2)).sum(-1, keepdim=True)
        else:
            kv = torch.einsum("nhtm,nhtd->nhmd", k, v)
            out = torch.einsum("nhtm,nhmd->nhtd", q, kv) / (q * k.sum(2, keepdim=True)).sum(-1, keepdim=True)
        return self.o(out.transpose(1, 2).reshape(n, t, -1))

class Performer(nn.Module):
    """Token and learned position embeddings, a bidirectional then a causal pre-LayerNorm FAVOR+ block with GELU
    FFNs, a final LayerNorm."""
    def __init__(self, vocab=128, d=32, heads=4):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(64, d) * 0.5)
        self.attn = nn.ModuleList((FavorAttention(d, heads), FavorAttention(d, heads, causal=True)))
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):
        x = self.emb(ids) + self.pos[: ids.shape[1]]
        for ln1, attn, ln2, ffn in zip(self.ln1, self.attn, self.ln2, self.ffn):
            x = x + attn(ln1(x))
            x = x + ffn(ln2(x))
        return self.ln_f(x)


class HyenaFilter(nn.Module):
    """Hyena's implicit long filter: positional features of each lag t (t / L, cos and sin of 2π k t / L for k = 1..4,
    computed at run time from arange of the length) through a sine-activated MLP (learned frequency), times an
    exponential decay window exp(−|α_c| t / L) per channel: a (filters, channels, L) kernel computed in the graph by
    the TorchScript export; the dynamo exporter folds it (it depends on weights and the length only) into Conv weight
    initializers."""
    def __init__(self, d, order, width=16, bands=4):
        super().__init__()
        self.bands, self.d, self.order = bands, d, order
        self.l1, self.l2 = nn.Linear(1 + 2 * bands, width), nn.Linear(width, width)
        self.l3 = nn.Linear(width, order * d)
        self.freq = nn.Parameter(torch.ones(width) + 0.2 * torch.randn(width))
        self.decay = nn.Parameter(torch.linspace(0.5, 4.0, order * d))
    def forward(self, length: int, ref):
        # the lags in reverse order (L − 1 … 0), so the kernel comes out flipped for F.conv1d's cross-correlation
        t = torch.arange(length - 1, -1, -1, device=ref.device, dtype=ref.dtype)[:, None] / length  # L, 1 (lag / L)
        k = torch.arange(1, self.bands + 1, device=ref.device, dtype=ref.dtype)
        z = torch.cat((t, torch.cos(2 * math.pi * k * t), torch.sin(2 * math.pi * k * t)), -1)
        h = torch.sin(self.freq * self.l1(z))
        h = self.l3(torch.sin(self.freq * self.l2(h)))  # L, order·d
        h = h * torch.exp(-self.decay.abs() * t)
        return h.T.reshape(self.order, self.d, length)

class HyenaOperator(nn.Module):
    """Hyena operator of order 3 (Poli et al. 2023, as the safari code): an input projection to four streams x0, x1,
    x2, v, a short causal depthwise Conv1d (left pad 2); v gated by x2, long-convolved with the first implicit filter,
    gated by x1, long-convolved with the second, gated by x0.  Each long convolution is a depthwise F.conv1d with the
    run-time kernel over a left pad of L − 1 (a causal convolution as long as the input) plus a skip D·v; an output
    projection."""
    def __init__(self, d, order=3):
        super().__init__()
        self.d = d
        self.in_proj, self.out_proj = nn.Linear(d, (order + 1) * d), nn.Linear(d, d)
        self.short = nn.Conv1d((order + 1) * d, (order + 1) * d, 3, groups=(order + 1) * d)
        self.filter = HyenaFilter(d, order - 1)
        self.skip = nn.Parameter(torch.randn(order - 1, d) * 0.5)
    def forward(self, x):  # N, T, d
        t = int(x.shape[1])  # a Python int: the generated filter's length is the kernel size of a Conv
        u = self.short(F.pad(self.in_proj(x).transpose(1, 2), (2, 0)))  # N, 4d, T
        *gates, v = u.split(self.d, dim=1)
        h = self.filter(t, x)  # order − 1, d, T
        for i, gate in enumerate(reversed(gates[1:])):
            v = v * gate
            v = F.conv1d(F.pad(v, (t - 1, 0)), h[i][:, None, :], groups=self.d) + self.skip[i, :, None] * v
        return self.out_proj((v * gates[0]).transpose(1, 2))

class HyenaNet(nn.Module):
    """Token embeddings, two pre-LayerNorm Hyena blocks with GELU FFNs, a final LayerNorm."""
    def __init__(self, vocab=128, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.ModuleList(HyenaOperator(d) for _ in range(2))
        self.ln1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ln2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.ffn = nn.ModuleList(nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):
        x = self.emb(ids)
        for ln1, mix, ln2, ffn in zip(self.ln1, self.mix, self.ln2, self.ffn):
            x = x + mix(ln1(x))
            x = x + ffn(ln2(x))
        return self.ln_f(x)


def positional_encoding(x, bands: int):
    """NeRF's γ(x): x, then sin and cos of 2^k·π·x for k < bands, concatenated on the last axis."""
    freqs = (2.0 ** torch.arange(bands, dtype=x.dtype, device=x.device)) * math.pi
    xf = (x[..., None, :] * freqs[:, None]).flatten(-2)
    return torch.cat((x, torch.sin(xf), torch.cos(xf)), -1)

class NeRF(nn.Module):
    """A NeRF-style radiance field rendered along rays: 12 fixed depths between near and far per ray, the sample points
    o + t·d encoded by γ (6 bands), a 4-layer ReLU MLP of width 64 with the encoding concatenated
    back in the middle (skip), a ReLU density, view directions normalised and encoded (2 bands) for a sigmoid colour
    branch; volume rendering: α = 1 − exp(−σ·δ) (δ the spacing times |d|), transmittance exp(−exclusive cumsum of
    σ·δ), weights α·T summed against colour and depth; per ray RGB, depth and accumulated opacity (N, rays, 5)."""
    def __init__(self, width=64, bands=6, dir_bands=2, samples=12, near=1.0, far=3.0):
        super().__init__()
        self.bands, self.dir_bands = bands, dir_bands
        self.register_buffer("t", torch.linspace(near, far, samples))
        cin, cdir = 3 + 6 * bands, 3 + 6 * dir_bands
        self.l1, self.l2 = nn.Linear(cin, width), nn.Linear(width, width)
        self.l3, self.l4 = nn.Linear(width + cin, width), nn.Linear(width, width)
        self.sigma, self.feat = nn.Linear(width, 1), nn.Linear(width, width)
        self.rgb1, self.rgb2 = nn.Linear(width + cdir, width // 2), nn.Linear(width // 2, 3)
    def forward(self, origins, dirs):  # N, R, 3 each
        t = self.t
        pts = origins[:, :, None, :] + dirs[:, :, None, :] * t[:, None]  # N, R, S, 3
        enc = positional_encoding(pts, self.bands)
        h = F.relu(self.l2(F.relu(self.l1(enc))))
        h = F.relu(self.l4(F.relu(self.l3(torch.cat((h, enc), -1)))))
        sigma = F.relu(self.sigma(h)).squeeze(-1)  # N, R, S
        view = positional_encoding(F.normalize(dirs, dim=-1), self.dir_bands)
        view = view[:, :, None, :].expand(-1, -1, t.shape[0], -1)
        rgb = torch.sigmoid(self.rgb2(F.relu(self.rgb1(torch.cat((self.feat(h), view), -1)))))
        delta = torch.cat((t[1:] - t[:-1], t[-1:] - t[-2:-1]))  # S
        sd = sigma * delta * dirs.norm(dim=-1, keepdim=True)
        alpha = 1 - torch.exp(-sd)
        weights = alpha * torch.exp(-(sd.cumsum(-1) - sd))
        rgb_map = (weights[..., None] * rgb).sum(-2)
        depth = (weights * t).sum(-1, keepdim=True)
        return torch.cat((rgb_map, depth, weights.sum(-1, keepdim=True)), -1)


class SlotAttention(nn.Module):
    """Slot attention (Locatello et al. 2020): slots initialised as μ + σ·noise (a fixed seeded noise buffer, so the
    model is deterministic), three iterations with shared weights of dot-product attention whose softmax runs over
    the slots (they compete for each input), ε added and renormalised over the inputs (a weighted mean), a GRUCell
    update and a residual MLP."""
    def __init__(self, d=32, slots=4, iters=3):
        super().__init__()
        self.iters, self.scale = iters, d ** -0.5
        self.mu, self.log_sigma = nn.Parameter(torch.randn(d) * 0.5), nn.Parameter(torch.randn(d) * 0.1 - 1.0)
        self.register_buffer("noise", torch.randn(slots, d))
        self.q, self.k, self.v = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.ln_in, self.ln_slots, self.ln_mlp = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.gru = nn.GRUCell(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 2 * d), nn.ReLU(), nn.Linear(2 * d, d))
    def forward(self, inputs):  # N, n, d
        n, _, d = inputs.shape
        x = self.ln_in(inputs)
        k, v = self.k(x), self.v(x)
        slots = (self.mu + self.log_sigma.exp() * self.noise).expand(n, -1, -1)
        for _ in range(self.iters):
            prev = slots
            logits = torch.einsum("nid,nsd->nis", k, self.q(self.ln_slots(slots))) * self.scale
            attn = logits.softmax(-1) + 1e-8  # over the slots
            attn = attn / attn.sum(1, keepdim=True)  # over the inputs
            updates = torch.einsum("nis,nid->nsd", attn, v)
            slots = self.gru(updates.reshape(-1, d), prev.reshape(-1, d)).view(n, -1, d)
            slots = slots + self.mlp(self.ln_mlp(slots))
        return slots

class SlotNet(nn.Module):
    """A Conv encoder (two 3×3 Conv + ReLU, the second strided), a soft position embedding (a Linear of a 4-channel
    coordinate grid buffer added), a per-pixel MLP, slot attention with 4 slots; the slots (N, 4, 32)."""
    def __init__(self, d=32):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, d, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(d, d, 3, stride=2, padding=1), nn.ReLU())
        ys, xs = torch.meshgrid(torch.linspace(0, 1, 8), torch.linspace(0, 1, 8), indexing="ij")
        self.register_buffer("grid", torch.stack((ys, xs, 1 - ys, 1 - xs), -1).view(64, 4))
        self.pos = nn.Linear(4, d)
        self.norm = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, d))
        self.slots = SlotAttention(d)
    def forward(self, x):  # N, 3, 16, 16
        f = self.enc(x).flatten(2).transpose(1, 2) + self.pos(self.grid)
        return self.slots(self.mlp(self.norm(f)))


# --------------------------------------------------------------------------- fifteenth held-out set
# Added after the fourteenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout15``): Deformable DETR (multi-scale deformable attention: a ResNet backbone's two stages and a strided
# Conv's third level flattened and concatenated, reference points from linspace grids over each level divided by the
# valid ratios of the pixel mask, per head / level / point sampling offsets and softmaxed weights from Linears of the
# queries, the value split per level and bilinearly sampled at the offset locations by GridSample, a weighted sum over
# levels and points; in the encoder over every pixel of every level, in the decoder from 8 object queries), the
# Pix2Struct vision encoder (variable-resolution patches: the input's first two columns are the patches' row and
# column numbers, cast to integers and gathered from embedding tables; the attention mask from the padding patches'
# zero sums; T5-style RMSNorms and gated GELU), the Qwen2-VL text model (multimodal rotary positions: a second input
# of three position rows, temporal / height / width, for 4 text tokens, a 2×3 grid of vision tokens and 6 more text
# tokens; cos and sin computed per row and the head dimension's rotary sections taken from different rows, 2 / 1 / 1
# frequencies), Reformer (local attention in chunks of 4 tokens attending to their own, the previous and the next
# chunk, axial position embeddings — two factor tables broadcast over a 4×4 grid and concatenated —, reversible
# residual streams y1 = x1 + Attn(x2), y2 = x2 + FFN(y1) concatenated, a feed-forward run chunk by chunk), ProphetNet
# (an encoder-decoder whose decoder predicts 2 future tokens at once: a main stream and 2 n-gram streams built from
# n-gram embeddings plus positions, the n-gram streams attending to the main stream's keys and to themselves,
# bucketed relative position biases for the main and the predicting streams; the output concatenates the main and
# n-gram streams), and five hand-written models: Glow (squeeze by reshape and permute, ActNorm, an invertible 1×1
# Conv whose weight P·L·U is composed at run time from masked LU factors and exp of a log-diagonal, affine couplings
# with sigmoid scales, a split with a learned conditional Gaussian prior, log-likelihoods in bits per dimension),
# gMLP (spatial gating units: half of the channels LayerNorm'd and mixed across the tokens by a learned T×T matrix,
# causally masked in the second block, plus a tiny single-head attention in the first (aMLP), multiplied into the
# other half), a closed-form continuous-time (CfC) recurrent network (a second input of elapsed times per step
# scaling a learned time gate σ(t_a·Δt + t_b) that interpolates between two tanh heads, LeCun tanh backbone, 16
# unrolled steps), a spiking CNN of leaky integrate-and-fire neurons (4 time steps, Heaviside spikes as a ≥ comparison
# cast to float, reset by subtraction and hard reset, a non-spiking leaky integrator readout) and DGCNN (dynamic
# k-NN graphs: pairwise squared distances by a matmul, TopK neighbours, a gather by flat indices, edge features
# (x_j − x_i, x_i) through a 1×1 Conv2d, max over the neighbours; the second graph is rebuilt from the features).

class _ArangeLinspace:
    """``torch.linspace`` as ``arange · step + start`` while active: the TorchScript exporter writes linspace with a
    cast to double (so Deformable DETR's reference points and then GridSample's grid are doubles, for which ONNX
    Runtime has no GridSample kernel).  The same values for the half-integer grids used here."""
    def __enter__(self):
        self.orig = orig = torch.linspace
        def linspace(start, end, steps, dtype=None, device=None, **kwargs):
            if steps == 1:
                return orig(start, end, steps, dtype=dtype, device=device, **kwargs)
            step = (end - start) / (steps - 1)
            return torch.arange(steps, dtype=dtype or torch.get_default_dtype(), device=device) * step + start
        torch.linspace = linspace
    def __exit__(self, *exc):
        torch.linspace = self.orig

class DeformableDETR(nn.Module):
    """A DeformableDetrModel on a transformers ResNet backbone (no timm, no pretrained weights: basic blocks, 16 and 32
    channels, stages 1 and 2 plus a strided Conv: 3 feature levels of 16×16, 8×8 and 4×4), one encoder and one decoder
    layer, 4 heads, 2 sampling points per head and level, 8 object queries; the decoder output (N, 8, 32).  The frozen
    BatchNorms' buffers get random statistics here; run with linspace as arange (_ArangeLinspace)."""
    def __init__(self):
        super().__init__()
        from transformers import DeformableDetrConfig, DeformableDetrModel, ResNetConfig
        backbone = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", out_features=["stage1", "stage2"])
        self.model = DeformableDetrModel(DeformableDetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8, num_feature_levels=3, encoder_n_points=2, decoder_n_points=2))
        for module in self.model.modules():
            if type(module).__name__.endswith("FrozenBatchNorm2d"):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.5)
                module.running_var.uniform_(0.25, 2.0)
    def forward(self, x):  # N, 3, 64, 64
        with _ArangeLinspace():
            return self.model(pixel_values=x).last_hidden_state

class Pix2StructVision(nn.Module):
    """A Pix2StructVisionModel called with flattened patches (N, 32, 2 + 48): row and column numbers then 4×4×3 pixel
    values, the last 8 patches padding (all zero, masked out); its last hidden state (N, 32, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import Pix2StructVisionConfig, Pix2StructVisionModel
        self.model = Pix2StructVisionModel(Pix2StructVisionConfig(hidden_size=32, patch_embed_hidden_size=48, d_ff=64, d_kv=8, num_hidden_layers=2, num_attention_heads=4, seq_len=64))
    def forward(self, patches):
        return self.model(flattened_patches=patches).last_hidden_state

class Qwen2VLText(nn.Module):
    """A Qwen2VLTextModel (grouped-query attention, 4 query and 2 key/value heads of 8) called with token ids and
    multimodal rotary position ids (3, N, T); rope θ = 100, so that the height and width sections turn visibly."""
    def __init__(self):
        super().__init__()
        from transformers import Qwen2VLTextConfig, Qwen2VLTextModel
        self.model = Qwen2VLTextModel(Qwen2VLTextConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, bos_token_id=1, eos_token_id=2, rope_parameters={"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 1, 1]}))
    def forward(self, ids, pos):  # N, T and 3, N, T
        return self.model(input_ids=ids, position_ids=pos).last_hidden_state

class _InlineReversible:
    """Reformer's reversible layers called through their ``autograd.Function``'s forward (with a stand-in context)
    while active: the TorchScript exporter fails on the ``_ReversibleFunction.apply`` call (``unordered_map::at``).
    The same computation."""
    def __enter__(self):
        from transformers.models.reformer import modeling_reformer
        self.fn = fn = modeling_reformer._ReversibleFunction
        self.orig = fn.__dict__.get("apply")
        class _Ctx:
            def save_for_backward(self, *tensors):
                pass
        fn.apply = staticmethod(lambda *args: fn.forward(_Ctx(), *args))
    def __exit__(self, *exc):
        if self.orig is None:
            del self.fn.apply
        else:
            self.fn.apply = self.orig

class Reformer(nn.Module):
    """A ReformerModel with two local-attention layers (chunks of 4, one chunk before and after), axial position
    embeddings over a 4×4 grid (16 + 16 dims), a feed-forward chunked by 4 tokens; the two reversible streams
    concatenated (N, 16, 64).  No LSH layer: its hashing rotations are drawn with torch.randn at every call."""
    def __init__(self):
        super().__init__()
        from transformers import ReformerConfig, ReformerModel
        self.model = ReformerModel(ReformerConfig(vocab_size=128, hidden_size=32, num_attention_heads=4, attention_head_size=8, attn_layers=["local", "local"], feed_forward_size=64, chunk_size_feed_forward=4, local_attn_chunk_length=4, local_num_chunks_before=1, local_num_chunks_after=1, axial_pos_embds=True, axial_pos_shape=[4, 4], axial_pos_embds_dim=[16, 16], max_position_embeddings=16, is_decoder=False, hidden_dropout_prob=0.0, local_attention_probs_dropout_prob=0.0, pad_token_id=0, eos_token_id=2))
    def forward(self, ids):
        with _InlineReversible():
            return self.model(input_ids=ids).last_hidden_state

class ProphetNet(nn.Module):
    """A ProphetNetModel (one encoder and one decoder layer, 2-gram prediction) on token ids, the decoder input the ids
    shifted right after a start token 1; the main stream's and the two n-gram streams' last hidden states
    concatenated over the tokens (N, 48, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import ProphetNetConfig, ProphetNetModel
        self.model = ProphetNetModel(ProphetNetConfig(vocab_size=128, hidden_size=32, encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=1, num_decoder_layers=1, num_encoder_attention_heads=4, num_decoder_attention_heads=4, ngram=2, num_buckets=8, relative_max_distance=16, max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, decoder_start_token_id=1))
    def forward(self, ids):
        dec = torch.cat((torch.ones_like(ids[:, :1]), ids[:, :-1]), 1)
        out = self.model(input_ids=ids, decoder_input_ids=dec, use_cache=False)
        return torch.cat((out.last_hidden_state, out.last_hidden_state_ngram), 1)


def squeeze2d(x):
    """Glow's squeeze: each 2×2 spatial block moved into the channels (N, C, H, W → N, 4C, H/2, W/2) by reshape and
    permute."""
    n, c, h, w = x.shape
    x = x.view(n, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4)
    return x.reshape(n, c * 4, h // 2, w // 2)

class ActNorm(nn.Module):
    """Glow's ActNorm: a per-channel affine (x + b)·exp(log s); log-det H·W·Σ log s."""
    def __init__(self, c):
        super().__init__()
        self.bias, self.logs = nn.Parameter(torch.randn(1, c, 1, 1) * 0.3), nn.Parameter(torch.randn(1, c, 1, 1) * 0.2)
    def forward(self, x):
        return (x + self.bias) * torch.exp(self.logs), self.logs.sum() * x.shape[2] * x.shape[3]

class InvConv1x1LU(nn.Module):
    """Glow's invertible 1×1 convolution in LU form: W = P·(L ⊙ strict-lower mask + I)·(U ⊙ strict-upper mask +
    I·sign(s)·exp(log |s|)) composed at run time (P, sign(s), the mask and I are buffers; L, U, log |s| parameters,
    from the LU factors of a random rotation), applied as a 1×1 Conv; log-det H·W·Σ log |s|."""
    def __init__(self, c):
        super().__init__()
        p, lower, upper = torch.linalg.lu(torch.linalg.qr(torch.randn(c, c))[0])
        s = torch.diagonal(upper)
        self.register_buffer("p", p)
        self.register_buffer("sign_s", torch.sign(s))
        self.register_buffer("lower_mask", torch.tril(torch.ones(c, c), -1))
        self.register_buffer("eye", torch.eye(c))
        self.lower, self.upper = nn.Parameter(lower), nn.Parameter(torch.triu(upper, 1))
        self.log_s = nn.Parameter(torch.log(s.abs()))
    def forward(self, x):
        lower = self.lower * self.lower_mask + self.eye
        upper = self.upper * self.lower_mask.T + self.eye * (self.sign_s * torch.exp(self.log_s))
        w = self.p @ lower @ upper
        return F.conv2d(x, w[:, :, None, None]), self.log_s.sum() * x.shape[2] * x.shape[3]

class AffineCoupling(nn.Module):
    """Glow's affine coupling: the first half of the channels through Conv 3×3 – ReLU – Conv 1×1 – ReLU – Conv 3×3
    scaled by exp(3·logscale); shift and scale interleaved in its channels (h[:, 0::2], h[:, 1::2]), the scale
    sigmoid(raw + 2); the second half becomes (x_b + shift)·scale; log-det Σ log scale."""
    def __init__(self, c, hidden=16):
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(c // 2, hidden, 3, padding=1), nn.Conv2d(hidden, hidden, 1)
        self.c3 = nn.Conv2d(hidden, c, 3, padding=1)
        self.logscale = nn.Parameter(torch.randn(1, c, 1, 1) * 0.1)
    def forward(self, x):
        xa, xb = x.chunk(2, 1)
        h = self.c3(F.relu(self.c2(F.relu(self.c1(xa))))) * torch.exp(self.logscale * 3)
        shift, scale = h[:, 0::2], torch.sigmoid(h[:, 1::2] + 2.0)
        return torch.cat((xa, (xb + shift) * scale), 1), torch.log(scale).flatten(1).sum(1)

class FlowStep(nn.Module):
    """ActNorm, invertible 1×1 Conv, affine coupling; the log-dets summed."""
    def __init__(self, c):
        super().__init__()
        self.actnorm, self.invconv, self.coupling = ActNorm(c), InvConv1x1LU(c), AffineCoupling(c)
    def forward(self, x, logdet):
        x, ld = self.actnorm(x)
        logdet = logdet + ld
        x, ld = self.invconv(x)
        logdet = logdet + ld
        x, ld = self.coupling(x)
        return x, logdet + ld

def gaussian_logp(x, mean, logs):
    """Per-sample log-density of x under N(mean, exp(logs)²), summed over every other axis."""
    return (-0.5 * (math.log(2 * math.pi) + 2.0 * logs + (x - mean) ** 2 * torch.exp(-2.0 * logs))).flatten(1).sum(1)

class Glow(nn.Module):
    """A two-level Glow (Kingma & Dhariwal 2018): squeeze (3×16×16 → 12×8×8), two flow steps, a split whose second half
    is scored under a Gaussian with mean and log-std from a Conv of the first half, squeeze again (6×8×8 → 24×4×4), two
    flow steps, a learned-prior Gaussian on the rest; per image the latents (flattened, concatenated), then the
    negative log-likelihood in bits per dimension and the log-det per dimension (N, 770)."""
    def __init__(self):
        super().__init__()
        self.level1 = nn.ModuleList(FlowStep(12) for _ in range(2))
        self.split_prior = nn.Conv2d(6, 12, 3, padding=1)
        self.level2 = nn.ModuleList(FlowStep(24) for _ in range(2))
        self.prior = nn.Parameter(torch.randn(1, 48, 1, 1) * 0.2)
    def forward(self, x):  # N, 3, 16, 16
        dims = x[0].numel()
        logdet = torch.zeros(x.shape[0], dtype=x.dtype, device=x.device)
        z = squeeze2d(x)
        for step in self.level1:
            z, logdet = step(z, logdet)
        z1, z2 = z.chunk(2, 1)
        mean, logs = self.split_prior(z1).chunk(2, 1)
        logp = gaussian_logp(z2, mean, logs)
        z = squeeze2d(z1)
        for step in self.level2:
            z, logdet = step(z, logdet)
        mean, logs = self.prior.chunk(2, 1)
        logp = logp + gaussian_logp(z, mean, logs)
        bpd = -(logp + logdet) / (dims * math.log(2.0))
        return torch.cat((z2.flatten(1), z.flatten(1), bpd[:, None], (logdet / dims)[:, None]), 1)


class SpatialGatingUnit(nn.Module):
    """gMLP's spatial gating unit (Liu et al. 2021): the channels split in two, the gate half LayerNorm'd and mixed
    across the tokens by a learned T×T matrix (an einsum over the token axis; bias near 1; causal: the matrix masked
    by a lower-triangular buffer), with ``d_attn`` plus a tiny single-head attention over the block input (aMLP),
    times the other half."""
    def __init__(self, d_ffn, seq, causal=False, d_in=None, d_attn=0):
        super().__init__()
        self.norm = nn.LayerNorm(d_ffn // 2)
        self.weight = nn.Parameter(torch.randn(seq, seq) * seq ** -0.5)
        self.bias = nn.Parameter(1.0 + 0.1 * torch.randn(seq, 1))
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)) if causal else torch.ones(seq, seq))
        self.attn = None
        if d_attn:
            self.attn, self.attn_out, self.d_attn = nn.Linear(d_in, 3 * d_attn), nn.Linear(d_attn, d_ffn // 2), d_attn
    def forward(self, x, block_in):  # N, T, d_ffn and N, T, d
        u, v = x.chunk(2, -1)
        v = self.norm(v)
        t = x.shape[1]
        v = torch.einsum("st,ntd->nsd", (self.weight * self.mask)[:t, :t], v) + self.bias[:t]
        if self.attn is not None:
            q, k, a = self.attn(block_in).chunk(3, -1)
            scores = (q @ k.transpose(1, 2)) * self.d_attn ** -0.5
            v = v + self.attn_out(scores.softmax(-1) @ a)
        return u * v

class GMLP(nn.Module):
    """Token embeddings, two gMLP blocks (LayerNorm, channel expansion ×4 with GELU, a spatial gating unit, channel
    projection, residual): the first bidirectional with a tiny attention (aMLP), the second causal; a final
    LayerNorm."""
    def __init__(self, vocab=128, d=32, seq=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(2))
        self.proj_in = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(2))
        self.sgu = nn.ModuleList((SpatialGatingUnit(4 * d, seq, d_in=d, d_attn=16), SpatialGatingUnit(4 * d, seq, causal=True)))
        self.proj_out = nn.ModuleList(nn.Linear(2 * d, d) for _ in range(2))
        self.ln_f = nn.LayerNorm(d)
    def forward(self, ids):
        x = self.emb(ids)
        for norm, proj_in, sgu, proj_out in zip(self.norms, self.proj_in, self.sgu, self.proj_out):
            h = norm(x)
            x = x + proj_out(sgu(F.gelu(proj_in(h)), h))
        return self.ln_f(x)


class CfCCell(nn.Module):
    """A closed-form continuous-time cell (Hasani et al. 2022, the default mode): a backbone Linear on [input, state]
    with LeCun's tanh 1.7159·tanh(0.666·x), two tanh heads ff1 and ff2, two time heads t_a and t_b, the interpolation
    σ(t_a·Δt + t_b) by the step's elapsed time Δt: h = ff1·(1 − σ) + σ·ff2."""
    def __init__(self, cin, units, backbone=32):
        super().__init__()
        self.backbone = nn.Linear(cin + units, backbone)
        self.ff1, self.ff2 = nn.Linear(backbone, units), nn.Linear(backbone, units)
        self.time_a, self.time_b = nn.Linear(backbone, units), nn.Linear(backbone, units)
    def forward(self, x, h, ts):  # N, cin; N, units; N, 1
        z = 1.7159 * torch.tanh(0.666 * self.backbone(torch.cat((x, h), 1)))
        ff1, ff2 = torch.tanh(self.ff1(z)), torch.tanh(self.ff2(z))
        t_interp = torch.sigmoid(self.time_a(z) * ts + self.time_b(z))
        return ff1 * (1.0 - t_interp) + t_interp * ff2

class CfCNet(nn.Module):
    """An irregularly sampled series (N, T, 3) with each step's elapsed time (N, T): a CfC cell of 16 units unrolled
    over the 16 steps from a zero state, a Linear readout of every step's state (N, T, 4)."""
    def __init__(self, cin=3, units=16, out=4):
        super().__init__()
        self.units = units
        self.cell, self.head = CfCCell(cin, units), nn.Linear(units, out)
    def forward(self, x, ts):
        h = x.new_zeros(x.shape[0], self.units)
        states = []
        for t in range(x.shape[1]):
            h = self.cell(x[:, t], h, ts[:, t, None])
            states.append(h)
        return self.head(torch.stack(states, 1))


def heaviside(x):
    """The spike function's forward (a surrogate gradient would change only the backward): 1 where x ≥ 0, else 0."""
    return (x >= 0).to(x.dtype)

class SpikingNet(nn.Module):
    """A spiking CNN of leaky integrate-and-fire neurons over 4 time steps with direct encoding (the image's Conv–BN
    current at every step): LIF neurons (v ← β·v + I, spike = H(v − θ), reset by subtraction), the spikes average-pooled
    into a strided Conv–BN whose current drives LIF neurons with a hard reset (v·(1 − spike)), their spikes flattened
    into a Linear that drives a non-spiking leaky integrator; its membrane averaged over the steps (N, 10).  The
    membranes stay at least 2e-4 from the threshold on the bundled input."""
    def __init__(self, steps=4, beta=0.8, theta=1.0):
        super().__init__()
        self.steps, self.beta, self.theta = steps, beta, theta
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16 * 4 * 4, 10)
        self.pool = nn.AvgPool2d(2)
    def forward(self, x):  # N, 3, 16, 16
        cur1 = self.bn1(self.conv1(x))
        v1 = torch.zeros_like(cur1)
        v2 = v3 = None
        acc = 0
        for _ in range(self.steps):
            v1 = self.beta * v1 + cur1
            s1 = heaviside(v1 - self.theta)
            v1 = v1 - s1 * self.theta
            cur2 = self.bn2(self.conv2(self.pool(s1)))
            v2 = cur2 if v2 is None else self.beta * v2 + cur2
            s2 = heaviside(v2 - self.theta)
            v2 = v2 * (1.0 - s2)
            cur3 = self.fc(s2.flatten(1))
            v3 = cur3 if v3 is None else self.beta * v3 + cur3
            acc = acc + v3
        return acc / self.steps


def knn(x, k):
    """Indices (N, P, k) of each point's k nearest points (features N, C, P) by TopK of −‖x_i − x_j‖² =
    2·x_iᵀx_j − ‖x_i‖² − ‖x_j‖²."""
    inner = 2 * torch.matmul(x.transpose(2, 1), x)
    xx = (x ** 2).sum(1, keepdim=True)
    return (inner - xx - xx.transpose(2, 1)).topk(k, dim=-1)[1]

def edge_features(x, k):
    """DGCNN's graph features (N, 2C, P, k): each point's k neighbours gathered by flat indices (idx + n·P) from the
    points of the whole batch, (x_j − x_i, x_i)."""
    n, c, p = x.shape
    idx = (knn(x, k) + torch.arange(n, device=x.device).view(-1, 1, 1) * p).view(-1)
    nbr = x.transpose(2, 1).reshape(n * p, c)[idx].view(n, p, k, c)
    center = x.transpose(2, 1)[:, :, None, :].expand(-1, -1, k, -1)
    return torch.cat((nbr - center, center), 3).permute(0, 3, 1, 2)

class DGCNN(nn.Module):
    """Dynamic graph CNN (Wang et al. 2019): two EdgeConvs, each on a k-NN graph (k = 4) rebuilt from its input
    features, the gathered edge features through a 1×1 Conv2d, BatchNorm and LeakyReLU, max over the neighbours;
    both outputs concatenated, a Conv1d, global max and mean pooling, a Linear classifier (N, 8).  The 4th and 5th
    nearest neighbours' distances differ by at least 2e-3 on the bundled input."""
    def __init__(self, k=4):
        super().__init__()
        self.k = k
        self.ec1 = nn.Sequential(nn.Conv2d(6, 16, 1, bias=False), nn.BatchNorm2d(16), nn.LeakyReLU(0.2))
        self.ec2 = nn.Sequential(nn.Conv2d(32, 16, 1, bias=False), nn.BatchNorm2d(16), nn.LeakyReLU(0.2))
        self.conv = nn.Sequential(nn.Conv1d(32, 32, 1, bias=False), nn.BatchNorm1d(32), nn.LeakyReLU(0.2))
        self.fc = nn.Linear(64, 8)
    def forward(self, x):  # N, 3, P
        x1 = self.ec1(edge_features(x, self.k)).amax(-1)
        x2 = self.ec2(edge_features(x1, self.k)).amax(-1)
        h = self.conv(torch.cat((x1, x2), 1))
        return self.fc(torch.cat((h.amax(-1), h.mean(-1)), 1))


# --------------------------------------------------------------------------- sixteenth held-out set
# Added after the fifteenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout16``): JetMoE (a mixture of attention heads: per token a top-2 of 4 query / output projection
# experts routed by a softmaxed TopK, the tokens sorted by expert, projected by per-expert slices and scattered back,
# the key / value projections shared; a top-2 of 4 SwiGLU expert MLP routed the same way; rotary grouped keys), the
# GroupViT vision encoder (learned group tokens appended to the patch tokens, a grouping block after each stage:
# the group tokens cross-attend to the image tokens, then each image token is hard-assigned to its best group by an
# ArgMax written back as a one-hot by ScatterElements (straight-through: one-hot − softmax + softmax), the groups'
# assigned tokens averaged and MLP-projected into fewer output tokens: 8 groups, then 4), LUKE (RoBERTa-style word
# tokens plus 3 entities whose embeddings average the word position embeddings of their spans (padded with −1,
# masked by a clamp and a sum), entity-aware self-attention: separate query projections for word→word, word→entity,
# entity→word and entity→entity pairs whose score blocks are concatenated), UnivNet (a GAN vocoder driven by a
# noise sequence: a kernel predictor of residual Conv1d blocks turns the mel frames into per-frame convolution
# kernels and biases, location-variable convolutions apply each frame's own kernel to its hop of upsampled samples
# (unfolded windows, an einsum), gated tanh · sigmoid units between ConvTranspose1d upsamplers), TimesFM (a decoder-
# only time-series foundation model: the series cut into patches of 8, each normalised by the first patch's mean and
# standard deviation, a residual MLP patch embedding, sinusoidal positions, causal attention whose queries are scaled
# per dimension by a learned softplus), and five hand-written models: a quantization-aware-training CNN (fake
# quantization exported as QuantizeLinear / DequantizeLinear: per-tensor int8 input, per-channel int8 Conv weights
# with run-time absmax scales, per-tensor uint8 activations that clip at 6.375, a float Linear classifier), DLRM
# (three EmbeddingBags over one flat index input and its bag offsets, in sum, mean and max modes, exported as Loops;
# a bottom MLP, the pairwise dot products of the four feature vectors taken from the lower triangle by index
# buffers, a top MLP), N-BEATS (doubly residual stacks: a trend block projecting onto a fixed polynomial basis, a
# seasonality block onto a fixed Fourier basis, a generic block; every block's backcast subtracted from its input,
# the forecasts summed), a pointer network (an LSTM encoder over 10 points, a decoder LSTMCell unrolled 10 steps with
# a glimpse attention, tanh-clipped pointer logits over the unvisited points, the greedy pick's one-hot (ArgMax,
# one_hot) accumulated into the visited mask and used to select the next input; the tour's length) and a binary
# XNOR-style CNN (Sign activations, weights sign(W) scaled per output channel by mean |W| at run time, Bi-Real
# residual shortcuts, BatchNorm, hardtanh).

class _ScatterAddIndexAdd:
    """``Tensor.index_add`` as ``scatter_add`` with the index broadcast over the rows while active: the TorchScript
    exporter refuses index_add (JetMoE's un-sorting of expert outputs) because its index may repeat.  The same
    values: each row sums the same one or two contributions onto zeros."""
    def __enter__(self):
        self.orig = orig = torch.Tensor.index_add
        def index_add(self, dim, index, source, **kwargs):
            if dim != 0 or source.dim() != 2 or kwargs:
                return orig(self, dim, index, source, **kwargs)
            return self.scatter_add(0, index[:, None].expand(-1, source.shape[1]), source)
        torch.Tensor.index_add = index_add
    def __exit__(self, *exc):
        torch.Tensor.index_add = self.orig

class JetMoe(nn.Module):
    """A JetMoeModel: two layers of 32, a mixture of 4 attention experts (2 key / value heads of 8, 2 experts per
    token) and of 4 SwiGLU MLP experts (intermediate 32, 2 per token); run with index_add as scatter_add
    (_ScatterAddIndexAdd).  The second and third router logits of every token differ by at least 1e-2 on the bundled
    input."""
    def __init__(self):
        super().__init__()
        from transformers import JetMoeConfig, JetMoeModel
        self.model = JetMoeModel(JetMoeConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_key_value_heads=2, kv_channels=8, intermediate_size=32, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2))
    def forward(self, ids):
        with _ScatterAddIndexAdd():
            return self.model(input_ids=ids).last_hidden_state

class GroupViT(nn.Module):
    """A GroupViTVisionModel on 32×32 images (4×4 patches: 64 tokens): two stages of one layer, 8 then 4 group
    tokens, grouped into 8 then 4 output tokens; the last hidden state (N, 4, 32).  Every image token's two best
    group probabilities differ by at least 4e-3 on the bundled input."""
    def __init__(self):
        super().__init__()
        from transformers import GroupViTVisionConfig, GroupViTVisionModel
        self.model = GroupViTVisionModel(GroupViTVisionConfig(hidden_size=32, intermediate_size=64, depths=[1, 1], num_hidden_layers=2, num_group_tokens=[8, 4], num_output_groups=[8, 4], num_attention_heads=4, image_size=32, patch_size=4))
    def forward(self, x):
        return self.model(pixel_values=x).last_hidden_state

class Luke(nn.Module):
    """A LukeModel with entity-aware attention (two layers of 32, entity embeddings of 16 projected to 32) on token
    ids and three entities: their ids taken from the tokens 2, 5 and 9 (modulo the entity vocabulary of 32), their
    spans tokens 1–2, 5 and 9–11 (a buffer padded with −1); the word and entity hidden states concatenated over the
    tokens (N, 19, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import LukeConfig, LukeModel
        self.model = LukeModel(LukeConfig(vocab_size=128, entity_vocab_size=32, hidden_size=32, entity_emb_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, use_entity_aware_attention=True))
        self.register_buffer("entity_tokens", torch.tensor([2, 5, 9]))
        self.register_buffer("entity_spans", torch.tensor([[1, 2, -1], [5, -1, -1], [9, 10, 11]]))
    def forward(self, ids):
        entities = ids[:, self.entity_tokens] % 32
        spans = self.entity_spans.expand(ids.shape[0], -1, -1)
        out = self.model(input_ids=ids, entity_ids=entities, entity_position_ids=spans)
        return torch.cat((out.last_hidden_state, out.entity_last_hidden_state), 1)

class _GatherLVC:
    """UnivNet's location-variable convolution with the windows gathered by an index tensor instead of
    ``Tensor.unfold`` while active (dilation 1, the only one it is called with): the TorchScript exporter cannot
    export the unfold of the padded input (``input size not accessible``).  The same windows, the same einsum."""
    def __enter__(self):
        from transformers.models.univnet import modeling_univnet
        self.cls = cls = modeling_univnet.UnivNetLvcResidualBlock
        self.orig = orig = cls.__dict__["location_variable_convolution"]
        def lvc(self, hidden_states, kernel, bias, dilation=1, hop_size=256):
            if dilation != 1:
                return orig(self, hidden_states, kernel, bias, dilation, hop_size)
            batch, _, out_channels, kernel_size, kernel_length = kernel.shape
            padding = (kernel_size - 1) // 2
            hidden_states = F.pad(hidden_states, (padding, padding), "constant", 0)
            idx = (torch.arange(kernel_length)[:, None, None] * hop_size + torch.arange(hop_size)[None, :, None]
                   + torch.arange(kernel_size)[None, None, :])
            windows = hidden_states[:, :, idx].unsqueeze(3)  # batch, in, frames, 1, hop, kernel
            out = torch.einsum("bildsk,biokl->bolsd", windows, kernel) + bias.unsqueeze(-1).unsqueeze(-1)
            return out.view(batch, out_channels, -1)
        cls.location_variable_convolution = lvc
    def __exit__(self, *exc):
        self.cls.location_variable_convolution = self.orig

class UnivNet(nn.Module):
    """A UnivNetModel (16 noise channels, 8 hidden, 10 mel bins, two LVC blocks upsampling ×2 each, a kernel predictor
    of one residual block of 16 channels) called with mel frames (N, 8, 10) and a noise sequence (N, 8, 16); the
    waveform (N, 32).  Its Conv weights are redrawn with std 1/√fan-in (the pretrained-model init, std 0.01, leaves the
    waveform near zero); run with gathered LVC windows (_GatherLVC)."""
    def __init__(self):
        super().__init__()
        from transformers import UnivNetConfig, UnivNetModel
        self.model = UnivNetModel(UnivNetConfig(model_in_channels=16, model_hidden_channels=8, num_mel_bins=10, resblock_kernel_sizes=[3, 3], resblock_stride_sizes=[2, 2], resblock_dilation_sizes=[[1, 3], [1, 3]], kernel_predictor_num_blocks=1, kernel_predictor_hidden_channels=16, kernel_predictor_conv_size=3))
        with torch.no_grad():
            for module in self.model.modules():
                if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                    module.weight.normal_(0.0, module.weight[0].numel() ** -0.5)
    def forward(self, mel, noise):
        with _GatherLVC():
            return self.model(input_features=mel, noise_sequence=noise).waveforms

class TimesFm(nn.Module):
    """A TimesFmModel (patches of 8, context 32, two layers of 32, 4 heads of 8) on each of the input's 3 channels as
    its own series (N·3, 32), nothing padded, frequency class 0; the last hidden state (N·3, 4, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import TimesFmConfig, TimesFmModel
        self.model = TimesFmModel(TimesFmConfig(patch_length=8, context_length=32, horizon_length=8, hidden_size=32, intermediate_size=32, head_dim=8, num_attention_heads=4, num_hidden_layers=2))
    def forward(self, x):  # N, 32, 3
        series = x.transpose(1, 2).reshape(-1, x.shape[1])
        freq = torch.zeros(series.shape[0], 1, dtype=torch.long, device=x.device)
        return self.model(past_values=series, past_values_padding=torch.zeros_like(series), freq=freq).last_hidden_state


class QATCNN(nn.Module):
    """A quantization-aware-trained CNN in eval mode (fake quantization: round(x / s) + z clamped, minus z, times s):
    the input per-tensor int8 (scale 4/127), two Conv–BN–ReLU layers (the second strided) with per-channel
    symmetric int8 weights whose scales are the output channels' absmax / 127 at run time, their activations
    per-tensor uint8 (scale 0.025, zero point 0: they clip at 6.375), global average pooling, a float Linear classifier
    (left unquantized, as QAT recipes often leave the last layer; it also gives the weight faults a float weight)
    (N, 10).  On the bundled input the value nearest a rounding boundary has x / s 7e-5 from a half-integer (ONNX
    Runtime's activations differ by about 1e-7)."""
    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.BatchNorm2d(32)
        self.fc = nn.Linear(32, 10)
        self.register_buffer("zero_points16", torch.zeros(16, dtype=torch.int32))
        self.register_buffer("zero_points32", torch.zeros(32, dtype=torch.int32))
    @staticmethod
    def weight_fq(w, zero_points):
        scale = w.detach().abs().amax((1, 2, 3)) / 127  # an observer's statistic: no gradient
        return torch.fake_quantize_per_channel_affine(w, scale, zero_points, 0, -128, 127)
    def forward(self, x):  # N, 3, 16, 16
        x = torch.fake_quantize_per_tensor_affine(x, 4 / 127, 0, -128, 127)
        x = F.relu(self.bn1(F.conv2d(x, self.weight_fq(self.conv1.weight, self.zero_points16), self.conv1.bias, padding=1)))
        x = torch.fake_quantize_per_tensor_affine(x, 0.025, 0, 0, 255)
        x = F.relu(self.bn2(F.conv2d(x, self.weight_fq(self.conv2.weight, self.zero_points32), self.conv2.bias, stride=2, padding=1)))
        x = torch.fake_quantize_per_tensor_affine(x, 0.025, 0, 0, 255)
        return self.fc(x.mean((2, 3)))


class DLRM(nn.Module):
    """A deep learning recommendation model (Naumov et al. 2019): 8 dense features through a bottom MLP (8 → 16 → 8,
    ReLU); three categorical features, each a bag of indices into its own EmbeddingBag of 8-vectors (24 rows, sum;
    16 rows, mean; 12 rows, max) — one flat index row and one offsets row (0, split) per table, two bags a table;
    the pairwise dot products of the four 8-vectors (a bmm, its strict lower triangle gathered by index buffers)
    concatenated to the dense vector, a top MLP (14 → 16 → 4, ReLU) (N, 4)."""
    def __init__(self, d=8):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, d), nn.ReLU())
        self.tables = nn.ModuleList(nn.EmbeddingBag(rows, d, mode=mode) for rows, mode in ((24, "sum"), (16, "mean"), (12, "max")))
        li, lj = torch.tril_indices(4, 4, -1)
        self.register_buffer("li", li)
        self.register_buffer("lj", lj)
        self.top = nn.Sequential(nn.Linear(d + 6, 16), nn.ReLU(), nn.Linear(16, 4))
    def forward(self, dense, indices, offsets):  # N, 8; 3, L; 3, N
        feats = [self.bottom(dense)] + [table(indices[t], offsets[t]) for t, table in enumerate(self.tables)]
        t = torch.stack(feats, 1)
        z = torch.bmm(t, t.transpose(1, 2))[:, self.li, self.lj]
        return self.top(torch.cat((feats[0], z), 1))


class NBeatsBlock(nn.Module):
    """An N-BEATS block: four Linear–ReLU layers, Linears to the backcast and forecast expansion coefficients θ; with
    fixed bases (buffers, interpretable blocks: θ without bias) the backcast / forecast are θ · basis, else Linears
    of θ (generic)."""
    def __init__(self, lookback, horizon, hidden=32, basis_b=None, basis_f=None, theta=8):
        super().__init__()
        self.fc = nn.Sequential(nn.Linear(lookback, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                                nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
        if basis_b is None:
            self.theta_b, self.theta_f = nn.Linear(hidden, theta), nn.Linear(hidden, theta)
            self.out_b, self.out_f = nn.Linear(theta, lookback), nn.Linear(theta, horizon)
        else:
            self.theta_b = nn.Linear(hidden, basis_b.shape[0], bias=False)
            self.theta_f = nn.Linear(hidden, basis_f.shape[0], bias=False)
            self.register_buffer("basis_b", basis_b)
            self.register_buffer("basis_f", basis_f)
            self.out_b = self.out_f = None
    def forward(self, x):
        h = self.fc(x)
        if self.out_b is not None:
            return self.out_b(self.theta_b(h)), self.out_f(self.theta_f(h))
        return self.theta_b(h) @ self.basis_b, self.theta_f(h) @ self.basis_f

class NBeats(nn.Module):
    """N-BEATS (Oreshkin et al. 2020) forecasting 8 steps from 32 for each of the input's 3 channels as its own
    series: a trend block (polynomial basis t^0…t^3 over t = i / length), a seasonality block (Fourier basis: 1 and
    cos / sin 2πkt for k = 1…3 over the backcast and the forecast windows), a generic block; doubly residual (each
    block's backcast subtracted from its input, the forecasts summed) (N, 8, 3)."""
    def __init__(self, lookback=32, horizon=8):
        super().__init__()
        tb, tf = torch.arange(lookback) / lookback, torch.arange(horizon) / horizon
        poly = lambda t: torch.stack([t ** p for p in range(4)])
        fourier = lambda t: torch.cat([torch.ones(1, len(t))] + [f(2 * math.pi * k * t)[None] for k in range(1, 4) for f in (torch.cos, torch.sin)])
        self.blocks = nn.ModuleList((NBeatsBlock(lookback, horizon, basis_b=poly(tb), basis_f=poly(tf)),
                                     NBeatsBlock(lookback, horizon, basis_b=fourier(tb), basis_f=fourier(tf)),
                                     NBeatsBlock(lookback, horizon)))
    def forward(self, x):  # N, 32, 3
        n, length, c = x.shape
        residual = x.transpose(1, 2).reshape(n * c, length)
        forecast = 0
        for block in self.blocks:
            b, f = block(residual)
            residual = residual - b
            forecast = forecast + f
        return forecast.view(n, c, -1).transpose(1, 2)


class PointerNet(nn.Module):
    """A pointer network (Vinyals et al. 2015; Bello et al. 2016) greedily touring 10 points: a Linear embedding, an
    LSTM encoder; a decoder LSTMCell unrolled 10 steps from a learned start input, a glimpse (additive attention over
    the encoder outputs), pointer logits 10·tanh(vᵀ tanh(W₁e + W₂g)) with the visited points lowered by 1e4; the
    greedy pick as an ArgMax whose one-hot is added to the visited mask and selects the next input by a bmm.  Per
    step the softmax over the points, then the closed tour's length (N, 101).  The two best logits of every step differ
    by at least 2e-3 on the bundled input."""
    def __init__(self, d=32, n=10):
        super().__init__()
        self.n = n
        self.embed = nn.Linear(2, d)
        self.encoder = nn.LSTM(d, d, batch_first=True)
        self.cell = nn.LSTMCell(d, d)
        self.start = nn.Parameter(torch.randn(d))
        self.g_ref, self.g_q, self.g_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1, bias=False)
        self.p_ref, self.p_q, self.p_v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1, bias=False)
    def forward(self, points):  # N, 10, 2
        emb = self.embed(points)
        enc, (h, c) = self.encoder(emb)
        h, c = h[0], c[0]
        g_ref, p_ref = self.g_ref(enc), self.p_ref(enc)
        inp = self.start.expand(points.shape[0], -1)
        visited = torch.zeros_like(points[..., 0])
        probs, tour = [], []
        for _ in range(self.n):
            h, c = self.cell(inp, (h, c))
            scores = self.g_v(torch.tanh(g_ref + self.g_q(h)[:, None])).squeeze(-1) - 1e4 * visited
            glimpse = (scores.softmax(-1)[:, None] @ enc).squeeze(1)
            logits = 10 * torch.tanh(self.p_v(torch.tanh(p_ref + self.p_q(glimpse)[:, None])).squeeze(-1))
            logits = logits - 1e4 * visited
            probs.append(logits.softmax(-1))
            pick = F.one_hot(logits.argmax(-1), self.n).to(points.dtype)
            visited = visited + pick
            inp = (pick[:, None] @ emb).squeeze(1)
            tour.append((pick[:, None] @ points).squeeze(1))
        tour = torch.stack(tour, 1)
        length = (tour - tour.roll(1, 1)).norm(dim=-1).sum(1, keepdim=True)
        return torch.cat((torch.stack(probs, 1).flatten(1), length), 1)


class BinaryConv(nn.Module):
    """An XNOR-Net / Bi-Real binary convolution: BatchNorm, the activations binarised by Sign, the weights sign(W)
    times each output channel's mean |W| (computed at run time), a Conv; plus the real-valued input (a Bi-Real
    shortcut, average-pooled when strided)."""
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.bn = nn.BatchNorm2d(cin)
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.stride = stride
    def forward(self, x):
        w = self.conv.weight
        w = torch.sign(w) * w.abs().mean((1, 2, 3), keepdim=True)
        out = F.conv2d(torch.sign(self.bn(x)), w, stride=self.stride, padding=1)
        shortcut = F.avg_pool2d(x, self.stride) if self.stride > 1 else x
        return out + shortcut

class BinaryNet(nn.Module):
    """A binary CNN: a real-valued Conv–BN–hardtanh stem (16 channels), three binary convolutions (the second
    strided) with hardtanh between them, a BatchNorm, global average pooling and a real Linear (N, 10).  Every input
    of Sign lies at least 3e-5 from zero on the bundled input."""
    def __init__(self):
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.blocks = nn.ModuleList((BinaryConv(16, 16), BinaryConv(16, 16, 2), BinaryConv(16, 16)))
        self.bn_out, self.fc = nn.BatchNorm2d(16), nn.Linear(16, 10)
    def forward(self, x):  # N, 3, 16, 16
        x = F.hardtanh(self.bn(self.stem(x)))
        for block in self.blocks:
            x = F.hardtanh(block(x))
        return self.fc(self.bn_out(x).mean((2, 3)))


# --------------------------------------------------------------------------- seventeenth held-out set
# Added after the sixteenth held-out set and measured before any of their misses was looked at (``fault_sweep.py --archs
# heldout17``): YOSO (attention without a softmax: L2-normalised queries and keys, the expected LSH collision
# probability (1 − acos(q·k)/π)^9 as the weights, the context L2-normalised again), LongT5's encoder with transient-
# global attention (the tokens cut into blocks of 4, each attending to its own and both neighbouring blocks (padded,
# concatenated) and to 4 side tokens, the RMS-normed sums of the global blocks built by a one-hot einsum of the block
# ids, side relative-position buckets), PhiMoE (sparsemixer routing: the top expert's logit threshold masks by (max −
# logit) / max(|logit|, max) > 2ε, softmax of the masked logits gathered at the argmax, then the first expert scattered
# to −inf and the same repeated for the second; LayerNorms, grouped-query rotary attention; the three best router logits
# of every token differ by at least 1.2e-2 on the bundled input), Qwen3-Next (a gated DeltaNet layer: the chunkwise
# delta rule whose intra-chunk UT transform is solved by forward substitution, exp decays by cumsum in log space, a scan
# over the chunks' recurrent state; then gated attention with a sigmoid output gate and (1 + w) RMSNorms; top-2 MoE with
# a sigmoid-gated shared expert: second and third router logits at least 2.6e-2 apart), SAM (Segment Anything with two
# point prompts: windowed / global ViT encoder, random-Fourier point encodings, a two-way transformer, ConvTranspose2d
# upscaling, hypernetwork MLPs producing per-mask dot-product heads), and five hand-written models: HRNet (parallel
# 16×16 / 8×8 / 4×4 branches repeatedly exchanged by strided Convs and nearest upsampling, a bilinear concat head),
# ResNeSt (split attention: a radix-axis softmax over the splits of a grouped Conv, average-pool downsampling in the
# block and the shortcut), an octave-convolution CNN (high- and low-frequency maps at two resolutions exchanged by
# average pooling and nearest upsampling), PointNet++ (farthest point sampling unrolled as running minima and ArgMaxes,
# a ball query by a radius comparison and TopK over indices, grouped relative coordinates through a shared MLP, max
# pooling) and a CBAM CNN (channel attention from the average- and max-pooled maps through one shared MLP, spatial
# attention from a 7×7 Conv of the channel mean and max).

def _yoso():
    from transformers import YosoConfig, YosoModel
    return LastHidden(YosoModel(YosoConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, use_expectation=True, hash_code_len=9, conv_window=None)), "input_ids")

class LongT5(nn.Module):
    """A LongT5EncoderModel with transient-global attention (two layers of 32, 4 heads of 8, local radius 3: blocks of 4
    tokens attending to their own and both neighbouring blocks; global blocks of 4 tokens: 4 side tokens); called with
    an all-ones attention mask (without one the dynamo exporter's trace concatenates an unbroadcast local position bias
    to the per-block side bias and fails)."""
    def __init__(self):
        super().__init__()
        from transformers import LongT5Config, LongT5EncoderModel
        self.model = LongT5EncoderModel(LongT5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, local_radius=3, global_block_size=4, encoder_attention_type="transient-global", relative_attention_num_buckets=16, relative_attention_max_distance=32))
    def forward(self, ids):
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state

def _phimoe():  # intermediate 16: the three best router logits of every token at least 1.2e-2 apart
    from transformers import PhimoeConfig, PhimoeModel
    model = PhimoeModel(PhimoeConfig(vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=2))
    model.set_experts_implementation("batched_mm")  # as Qwen2-MoE: no grouped_mm (histc), no data-dependent loop
    return LastHidden(model, "input_ids")

class _ChunkedDeltaRule:
    """Qwen3-Next's chunked gated delta rule with chunks of 8 (the default 64 would pad the 16 tokens to one chunk)
    and its triangular system solved by forward substitution (the code path it takes under the dynamo exporter) while
    active: the TorchScript exporter cannot export ``torch.linalg.solve_triangular``.  The same values up to
    rounding."""
    def __enter__(self):
        import functools

        from transformers.models.qwen3_next import modeling_qwen3_next
        self.module = module = modeling_qwen3_next
        self.orig = (module.torch_chunk_gated_delta_rule, module.is_torchdynamo_exporting)
        module.torch_chunk_gated_delta_rule = functools.partial(self.orig[0], chunk_size=8)
        module.is_torchdynamo_exporting = lambda: True
    def __exit__(self, *exc):
        self.module.torch_chunk_gated_delta_rule, self.module.is_torchdynamo_exporting = self.orig

class Qwen3Next(nn.Module):
    """A Qwen3NextModel of two layers of 32: a gated DeltaNet layer (2 key heads of 8 shared by 4 value heads of 8,
    a causal depthwise Conv1d of 4 over the fused q / k / v, L2-normalised q / k, decays −exp(A)·softplus(a + dt), the
    chunked delta rule over 2 chunks of 8, a gated RMSNorm of the output by SiLU(z)) then a gated full-attention layer
    (4 query heads of 8, 2 key / value heads, q / k RMSNorms, partial rotary, a sigmoid output gate); each layer's MLP
    a top-2 of 4 expert mixture (intermediate 24, batched_mm) plus a sigmoid-gated shared expert; run with
    _ChunkedDeltaRule.  The second and third router logits of every token differ by at least 2.6e-2 on the bundled
    input."""
    def __init__(self):
        super().__init__()
        from transformers import Qwen3NextConfig, Qwen3NextModel
        self.model = Qwen3NextModel(Qwen3NextConfig(vocab_size=128, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, shared_expert_intermediate_size=16, layer_types=["linear_attention", "full_attention"], decoder_sparse_step=1))
        self.model.set_experts_implementation("batched_mm")  # as Qwen2-MoE
    def forward(self, ids):
        with _ChunkedDeltaRule():
            return self.model(input_ids=ids).last_hidden_state

class Sam(nn.Module):
    """A SamModel (Segment Anything) on a 64×64 image with two fixed point prompts (a buffer: one foreground, one
    background point): a ViT image encoder of two layers of 32 on 8×8 patches (the first in 4×4 windows, the
    second global; decomposed relative position biases) and a Conv / LayerNorm2d neck to 16 channels; the prompt
    encoder's random-Fourier point embeddings (a fixed Gaussian matrix, sin / cos) plus label embeddings picked by
    torch.where, a learned no-mask embedding; the mask decoder's two-way transformer (tokens ↔ image cross-attention
    both ways, downsampled attention), two ConvTranspose2d upscalings with LayerNorm2d, per-mask hypernetwork MLPs
    whose outputs are matrix-multiplied with the upscaled embedding: the three multimask logit maps (N, 1, 3, 32, 32).
    Built with eager attention (the vision attention class is chosen at construction, so EAGER would not reach it;
    under SDPA the dynamo exporter cannot view its permuted output)."""
    def __init__(self):
        super().__init__()
        from transformers import SamConfig, SamMaskDecoderConfig, SamModel, SamPromptEncoderConfig, SamVisionConfig
        cfg = SamConfig(vision_config=SamVisionConfig(hidden_size=32, output_channels=16, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=8, window_size=4, global_attn_indexes=[1], num_pos_feats=8, mlp_dim=64).to_dict(),
                        prompt_encoder_config=SamPromptEncoderConfig(hidden_size=16, image_size=64, patch_size=8, mask_input_channels=4).to_dict(),
                        mask_decoder_config=SamMaskDecoderConfig(hidden_size=16, mlp_dim=32, num_hidden_layers=2, num_attention_heads=2, iou_head_hidden_dim=16).to_dict())
        cfg._attn_implementation = cfg.vision_config._attn_implementation = "eager"
        self.model = SamModel(cfg)
        self.register_buffer("points", torch.tensor([[[[20.0, 12.0], [44.0, 50.0]]]]))
        self.register_buffer("labels", torch.tensor([[[1, 0]]]))
    def forward(self, x):  # N = 1, 3, 64, 64
        out = self.model(pixel_values=x, input_points=self.points, input_labels=self.labels, multimask_output=True)
        return out.pred_masks


def _conv_bn(cin, cout, k=3, stride=1, groups=1):
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout))

class HRBasicBlock(nn.Module):
    """A ResNet basic block: two 3×3 Conv–BNs, the identity added, ReLU."""
    def __init__(self, c):
        super().__init__()
        self.a, self.b = _conv_bn(c, c), _conv_bn(c, c)
    def forward(self, x):
        return F.relu(x + self.b(F.relu(self.a(x))))

class HRFusion(nn.Module):
    """HRNet's exchange unit: every output branch i sums all input branches j — itself as is, a lower-resolution one
    (j > i) by a 1×1 Conv–BN and nearest upsampling ×2^(j−i), a higher-resolution one (j < i) by i − j strided 3×3
    Conv–BNs (ReLU between them) — then a ReLU."""
    def __init__(self, widths):
        super().__init__()
        self.n = len(widths)
        self.paths = nn.ModuleDict()
        for i, ci in enumerate(widths):
            for j, cj in enumerate(widths):
                if j > i:
                    self.paths[f"{j}to{i}"] = _conv_bn(cj, ci, 1)
                elif j < i:
                    steps = [nn.Sequential(_conv_bn(cj, cj, 3, 2), nn.ReLU()) for _ in range(i - j - 1)]
                    self.paths[f"{j}to{i}"] = nn.Sequential(*steps, _conv_bn(cj, ci, 3, 2))
    def forward(self, xs):
        out = []
        for i in range(self.n):
            y = xs[i]
            for j in range(self.n):
                if j > i:
                    y = y + F.interpolate(self.paths[f"{j}to{i}"](xs[j]), scale_factor=2.0 ** (j - i), mode="nearest")
                elif j < i:
                    y = y + self.paths[f"{j}to{i}"](xs[j])
            out.append(F.relu(y))
        return out

class HRNetLite(nn.Module):
    """A small HRNet (Sun et al. 2019) keeping a high-resolution branch throughout: a strided Conv–BN–ReLU stem (16
    channels at 16×16); stage 2 adds a 32-channel 8×8 branch by a strided Conv, stage 3 a 48-channel 4×4 one, each
    stage a basic block per branch then an exchange unit (HRFusion); the head upsamples the lower branches bilinearly
    to 16×16, concatenates the three (96 channels), a 1×1 Conv–BN–ReLU and a 1×1 Conv to 4 class maps (N, 4, 16, 16)."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 16, 3, 2), nn.ReLU())
        self.down2 = nn.Sequential(_conv_bn(16, 32, 3, 2), nn.ReLU())
        self.blocks2 = nn.ModuleList((HRBasicBlock(16), HRBasicBlock(32)))
        self.fuse2 = HRFusion((16, 32))
        self.down3 = nn.Sequential(_conv_bn(32, 48, 3, 2), nn.ReLU())
        self.blocks3 = nn.ModuleList((HRBasicBlock(16), HRBasicBlock(32), HRBasicBlock(48)))
        self.fuse3 = HRFusion((16, 32, 48))
        self.head = nn.Sequential(_conv_bn(96, 32, 1), nn.ReLU(), nn.Conv2d(32, 4, 1))
    def forward(self, x):  # N, 3, 32, 32
        x = self.stem(x)
        xs = self.fuse2([block(t) for block, t in zip(self.blocks2, (x, self.down2(x)))])
        xs = self.fuse3([block(t) for block, t in zip(self.blocks3, xs + [self.down3(xs[1])])])
        size = xs[0].shape[-2:]
        up = [xs[0]] + [F.interpolate(t, size=size, mode="bilinear", align_corners=False) for t in xs[1:]]
        return self.head(torch.cat(up, 1))


class SplitAttention(nn.Module):
    """ResNeSt's split-attention convolution (radix 2, cardinality 2): a grouped 3×3 Conv (groups radix·cardinality)
    to radix·C channels, BN, ReLU; the radix splits summed, globally average-pooled, a grouped 1×1 Conv–BN–ReLU and a
    grouped 1×1 Conv to radix·C attention logits; the r-softmax (reshaped to N, cardinality, radix, −1, transposed,
    softmax over the radix axis) weights the splits, which are summed."""
    def __init__(self, c, radix=2, card=2, inter=16):
        super().__init__()
        self.radix, self.card = radix, card
        self.conv = _conv_bn(c, c * radix, 3, 1, radix * card)
        self.fc1 = nn.Sequential(nn.Conv2d(c, inter, 1, groups=card), nn.BatchNorm2d(inter), nn.ReLU())
        self.fc2 = nn.Conv2d(inter, c * radix, 1, groups=card)
    def forward(self, x):
        n = x.shape[0]
        x = F.relu(self.conv(x))
        splits = x.reshape(n, self.radix, -1, x.shape[2], x.shape[3])
        gap = splits.sum(1).mean((2, 3), keepdim=True)
        att = self.fc2(self.fc1(gap)).reshape(n, self.card, self.radix, -1).transpose(1, 2).softmax(1)
        return (att.reshape(n, self.radix, -1, 1, 1) * splits).sum(1)

class ResNeStBlock(nn.Module):
    """A ResNeSt bottleneck: 1×1 Conv–BN–ReLU, split attention, a 3×3 average pool of stride 2 when downsampling
    ("avd"), 1×1 Conv–BN; the shortcut average-pooled (ceil mode, padding excluded) then a 1×1 Conv–BN when the shape
    changes ("avg down"); added, ReLU."""
    def __init__(self, cin, c, cout, stride=1):
        super().__init__()
        self.reduce, self.split, self.expand = _conv_bn(cin, c, 1), SplitAttention(c), _conv_bn(c, cout, 1)
        self.stride = stride
        self.down = _conv_bn(cin, cout, 1) if stride > 1 or cin != cout else None
    def forward(self, x):
        y = self.split(F.relu(self.reduce(x)))
        if self.stride > 1:
            y = F.avg_pool2d(y, 3, self.stride, 1)
        shortcut = x
        if self.down is not None:
            if self.stride > 1:
                shortcut = F.avg_pool2d(shortcut, self.stride, ceil_mode=True, count_include_pad=False)
            shortcut = self.down(shortcut)
        return F.relu(self.expand(y) + shortcut)

class ResNeSt(nn.Module):
    """A small ResNeSt (Zhang et al. 2020): a deep stem of three 3×3 Conv–BN–ReLUs (16 channels), two split-attention
    bottlenecks (16 → 32 channels, the second strided), global average pooling and a Linear (N, 10)."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 8), nn.ReLU(), _conv_bn(8, 8), nn.ReLU(), _conv_bn(8, 16), nn.ReLU())
        self.blocks = nn.Sequential(ResNeStBlock(16, 16, 32), ResNeStBlock(32, 16, 32, stride=2))
        self.fc = nn.Linear(32, 10)
    def forward(self, x):  # N, 3, 16, 16
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


class OctaveConv(nn.Module):
    """An octave convolution (Chen et al. 2019) on a high-frequency map and a half-resolution low-frequency one:
    high' = Conv_hh(high) + nearest-upsampled Conv_lh(low), low' = Conv_ll(low) + Conv_hl(2×2-average-pooled high);
    without a low input (the first layer) only the high → high and high → low paths, without a low output (the last)
    only the paths into high; stride 2 average-pools both inputs first.  Each output BN'd and ReLU'd."""
    def __init__(self, cin_h, cin_l, cout_h, cout_l, stride=1):
        super().__init__()
        self.stride = stride
        self.hh, self.bn_h = nn.Conv2d(cin_h, cout_h, 3, padding=1, bias=False), nn.BatchNorm2d(cout_h)
        self.lh = nn.Conv2d(cin_l, cout_h, 3, padding=1, bias=False) if cin_l else None
        self.hl = nn.Conv2d(cin_h, cout_l, 3, padding=1, bias=False) if cout_l else None
        self.ll = nn.Conv2d(cin_l, cout_l, 3, padding=1, bias=False) if cin_l and cout_l else None
        self.bn_l = nn.BatchNorm2d(cout_l) if cout_l else None
    def forward(self, high, low=None):
        if self.stride > 1:
            high = F.avg_pool2d(high, self.stride)
            low = F.avg_pool2d(low, self.stride) if low is not None else None
        out_h = self.hh(high)
        if self.lh is not None:
            out_h = out_h + F.interpolate(self.lh(low), scale_factor=2.0, mode="nearest")
        out_h = F.relu(self.bn_h(out_h))
        if self.hl is None:
            return out_h, None
        out_l = self.hl(F.avg_pool2d(high, 2))
        if self.ll is not None:
            out_l = out_l + self.ll(low)
        return out_h, F.relu(self.bn_l(out_l))

class OctaveNet(nn.Module):
    """A CNN of octave convolutions (α = 0.5): 3 → 8 + 8, 8 + 8 → 16 + 16 (strided), 16 + 16 → 16 + 16, the last
    merging into one 32-channel high map; global average pooling and a Linear (N, 10)."""
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList((OctaveConv(3, 0, 8, 8), OctaveConv(8, 8, 16, 16, stride=2),
                                     OctaveConv(16, 16, 16, 16), OctaveConv(16, 16, 32, 0)))
        self.fc = nn.Linear(32, 10)
    def forward(self, x):  # N, 3, 16, 16
        high, low = x, None
        for layer in self.layers:
            high, low = layer(high, low)
        return self.fc(high.mean((2, 3)))


def farthest_point_sample(xyz, n: int):
    """Farthest point sampling unrolled ``n`` steps from point 0: the running minimum squared distance to the chosen
    points, the next choice its ArgMax; the chosen indices (B, n)."""
    idx = [torch.zeros_like(xyz[:, 0, 0], dtype=torch.long)]
    dist = ((xyz - xyz[:, :1]) ** 2).sum(-1)
    for _ in range(n - 1):
        idx.append(dist.argmax(-1))
        centroid = xyz.gather(1, idx[-1][:, None, None].expand(-1, 1, xyz.shape[-1]))
        dist = torch.minimum(dist, ((xyz - centroid) ** 2).sum(-1))
    return torch.stack(idx, 1)

def ball_query(xyz, centroids, radius: float, k: int):
    """The first ``k`` point indices within ``radius`` of each centroid (B, S, k), in index order: indices beyond the
    radius replaced by N, the k smallest by TopK, an N-filled slot given the first index found (each centroid is
    a point, so it finds itself)."""
    n = xyz.shape[1]
    sq = ((centroids[:, :, None] - xyz[:, None]) ** 2).sum(-1)
    idx = torch.arange(n, device=xyz.device).expand_as(sq)
    idx = torch.where(sq > radius * radius, torch.full_like(idx, n), idx)
    idx = idx.topk(k, -1, largest=False, sorted=True).values
    return torch.where(idx == n, idx[..., :1], idx)

def gather_points(x, idx):
    """``x`` (B, N, C) at the indices ``idx`` (B, ...) by GatherElements: (B, ..., C)."""
    flat = idx.reshape(idx.shape[0], -1)
    out = x.gather(1, flat[..., None].expand(-1, -1, x.shape[-1]))
    return out.reshape(*idx.shape, x.shape[-1])

class PointNetPP(nn.Module):
    """A PointNet++ classifier (Qi et al. 2017), single scale: set abstraction 1 picks 8 of the 20 points by farthest
    point sampling, groups 6 neighbours within radius 1.8 of each by a ball query (1 to 10 lie within it), their
    coordinates relative to the centroid through a shared MLP (1×1 Conv2d–BN–ReLU, 3 → 16 → 32), a max over the
    neighbours; set abstraction 2 groups all 8 centroids (their coordinates concatenated to the features, 35 → 64), a
    max over them; an MLP head (64 → 32 → 10) (N, 10).  On the bundled input every ArgMax of the sampling wins by at
    least 0.1 and every squared centroid–point distance lies at least 5e-2 from the radius²."""
    def __init__(self, npoint=8, radius=1.8, k=6):
        super().__init__()
        self.npoint, self.radius, self.k = npoint, radius, k
        self.mlp1 = nn.Sequential(nn.Conv2d(3, 16, 1), nn.BatchNorm2d(16), nn.ReLU(),
                                  nn.Conv2d(16, 32, 1), nn.BatchNorm2d(32), nn.ReLU())
        self.mlp2 = nn.Sequential(nn.Conv1d(35, 64, 1), nn.BatchNorm1d(64), nn.ReLU())
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    def forward(self, points):  # N, 3, 20
        xyz = points.transpose(1, 2)
        centroids = gather_points(xyz, farthest_point_sample(xyz, self.npoint))  # B, S, 3
        grouped = gather_points(xyz, ball_query(xyz, centroids, self.radius, self.k)) - centroids[:, :, None]
        feats = self.mlp1(grouped.permute(0, 3, 1, 2)).amax(-1)  # B, 32, S
        feats = self.mlp2(torch.cat((centroids.transpose(1, 2), feats), 1)).amax(-1)
        return self.head(feats)


class CBAM(nn.Module):
    """A convolutional block attention module (Woo et al. 2018): channel attention — a shared MLP (1×1 Convs,
    reduction 4) of the average- and max-pooled maps, summed, sigmoid — then spatial attention — the channel mean and
    channel max stacked, a 7×7 Conv–BN, sigmoid — each multiplied in."""
    def __init__(self, c, reduction=4):
        super().__init__()
        self.mlp = nn.Sequential(nn.Conv2d(c, c // reduction, 1), nn.ReLU(), nn.Conv2d(c // reduction, c, 1))
        self.spatial = _conv_bn(2, 1, 7)
    def forward(self, x):
        x = x * torch.sigmoid(self.mlp(x.mean((2, 3), keepdim=True)) + self.mlp(x.amax((2, 3), keepdim=True)))
        pooled = torch.cat((x.mean(1, keepdim=True), x.amax(1, keepdim=True)), 1)
        return x * torch.sigmoid(self.spatial(pooled))

class CBAMBlock(nn.Module):
    """A ResNet basic block with CBAM on its residual branch; a 1×1 Conv–BN shortcut when strided."""
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.a, self.b, self.att = _conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout), CBAM(cout)
        self.down = _conv_bn(cin, cout, 1, stride) if stride > 1 or cin != cout else None
    def forward(self, x):
        y = self.att(self.b(F.relu(self.a(x))))
        return F.relu(y + (x if self.down is None else self.down(x)))

class CBAMNet(nn.Module):
    """A CNN of CBAM blocks: a Conv–BN–ReLU stem (16 channels), a CBAM basic block, a strided one to 32 channels,
    global average pooling and a Linear (N, 10)."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 16), nn.ReLU())
        self.blocks = nn.Sequential(CBAMBlock(16, 16), CBAMBlock(16, 32, 2))
        self.fc = nn.Linear(32, 10)
    def forward(self, x):  # N, 3, 16, 16
        return self.fc(self.blocks(self.stem(x)).mean((2, 3)))


# --------------------------------------------------------------------------- eighteenth held-out set
# Added after the seventeenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout18``): Gemma 3n's text model (alternating updates: the embedding and three projected copies rescaled to
# its RMS magnitude form four streams; every layer predicts all four from per-token 4×4 coefficient matrices computed by
# a tanh router, runs only the active stream, then corrects all four by the layer's innovation (output − active
# prediction) times routed coefficients; LAuReL low-rank residuals; per-layer token embeddings gated into the inactive
# streams; a Gaussian top-k MLP (ReLU of the excess over mean + 1.645·std); the last two layers reuse the first two
# layers' keys and values; local / global layers with their own rotary bases), Zamba2 (Mamba-2 layers interleaved with
# one shared attention + MLP block, applied at two depths to the hidden states concatenated with the original
# embeddings, with per-depth LoRA adapters on its q / k / v and gate / up projections), RT-DETR (a hybrid encoder:
# attention within the top level only, top-down and bottom-up CSP-RepVGG fusion; encoder-side query selection: TopK of
# the tokens' best class logits gathers the decoder's queries and logit-space anchor boxes; deformable decoder layers
# refining the boxes through inverse sigmoids), ZoeDepth (DPT on a BEiT backbone, then the metric-bins head: normalised
# seed bin widths turned into centres by a cumsum, four attractor layers shifting them by the attractors' mean dx / (1 +
# 1000 dx²) and re-sorting them, a conditional log-binomial distribution over the bins: Stirling log C(15, k) + k log p
# + (15 − k) log(1 − p) over a predicted temperature, a softmax, the depth its expectation over the bin centres), Llama
# 4's text model (a rotary chunked-attention layer — 8-token chunks — with weightless L2 q / k norms, then a NoPE global
# layer whose queries are scaled by 1 + 0.1·log1p(floor((pos + 1) / 4)); a top-1 of 4 mixture whose sigmoid router score
# scales the expert's input, plus a shared expert; the complex rotary written in reals), and five hand-written models:
# DenseNet-BC (pre-activation bottleneck layers concatenating their 8 new channels onto all earlier ones, a compressing
# transition), an Inception-v3 CNN (parallel 1×1 / 5×5 / double 3×3 / pool-projection branches concatenated, a strided
# reduction with a max-pool branch, 1×3 / 3×1 factorised and split branches), SchNet (continuous-filter convolutions:
# Gaussian radial bases of the pairwise distances through a filter network, a cosine cutoff, neighbour sums; shifted
# softplus), a Temporal Fusion Transformer (gated residual networks with ELU and GLU, softmax variable selection over
# per-variable embeddings, an LSTM with gated skip connections, interpretable multi-head attention sharing one value
# projection across heads and averaging them) and a neural Turing machine (an LSTM controller with content addressing by
# cosine similarity, interpolation with the previous weights, a circular shift convolution by rolls, sharpening by a
# run-time power, erase / add writes to an 8×8 memory, unrolled over 8 steps).

def _gaussian_topk(inputs, z: float):
    """Gemma 3n's Gaussian top-k: ReLU of the excess over mean + z·std (population std) of the last axis."""
    cutoff = inputs.mean(-1, keepdim=True) + inputs.std(-1, keepdim=True, unbiased=False) * z
    return F.relu(inputs - cutoff)

class Gemma3n(nn.Module):
    """A Gemma3nTextModel of four layers of 32 (4 query heads of 8, 2 key / value heads; q, k and scale-free v
    RMSNorms, attention scaling 1; sliding window 8 on layers 0 and 2 with rotary base 10⁴, global layers 1 and 3 with
    base 10⁶): AltUp over 4 streams, LAuReL of rank 8, per-layer inputs of 8 (a 128-row per-layer embedding table plus a
    projection of the main embedding), layers 2 and 3 reusing the keys and values stored by layers 0 and 1, the Gaussian
    top-k MLP (sparsity 0.95) on layer 0.  That MLP's cutoff multiplier, the standard normal quantile of 0.95, is
    computed here once and given as a number (transformers computes it with Normal.icdf at run time: an ErfInv that
    the dynamo exporter cannot convert); the same value."""
    def __init__(self):
        super().__init__()
        import functools

        from transformers import Gemma3nTextConfig, Gemma3nTextModel
        cfg = Gemma3nTextConfig(vocab_size=128, vocab_size_per_layer_input=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, sliding_window=8, hidden_size_per_layer_input=8, laurel_rank=8, altup_num_inputs=4, num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2, activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0])
        self.model = Gemma3nTextModel(cfg)
        for layer in self.model.layers:
            if layer.mlp.activation_sparsity > 0:
                z = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(layer.mlp.activation_sparsity))
                layer.mlp._gaussian_topk = functools.partial(_gaussian_topk, z=float(z))
    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state

class Zamba2(nn.Module):
    """A Zamba2Model of four layers of 32: Mamba-2 layers (4 heads of 16, state 8, chunks of 8) at every depth; at depths
    1 and 3 a shared transformer block first — the hidden states concatenated with the original token embeddings (64
    wide), RMSNorm, rotary attention (4 heads of 16, scaling (16 / 2)^−½) whose q / k / v projections add a per-depth
    rank-4 LoRA adapter, RMSNorm, a GELU-gated MLP whose gate / up projection adds a per-depth adapter — whose output,
    through a per-depth Linear, is added to the Mamba layer's input.  The block's weights are tied between the two
    depths, the adapters are not.  Run with non-negative permute dims (_NonNegativePermute)."""
    def __init__(self):
        super().__init__()
        from transformers import Zamba2Config, Zamba2Model
        self.model = Zamba2Model(Zamba2Config(vocab_size=128, hidden_size=32, num_hidden_layers=4, max_position_embeddings=64, layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"], mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, n_mamba_heads=4, chunk_size=8, num_attention_heads=4, intermediate_size=64, num_mem_blocks=1, use_shared_attention_adapter=True, adapter_rank=4, use_mem_rope=True))
    def forward(self, ids):
        with _NonNegativePermute():
            return self.model(input_ids=ids).last_hidden_state

class RTDETR(nn.Module):
    """An RTDetrModel on its ResNet-vd backbone (a three-Conv stem, basic blocks of 16 / 32 / 32 / 32 channels, stages
    2–4: 8×8, 4×4 and 2×2 maps of a 64×64 image): the hybrid encoder (one attention layer with 2-D sine positions on the
    2×2 level only, then top-down and bottom-up fusion by nearest upsampling, strided Convs and CSP blocks of RepVGG
    units), 84 tokens scored by an encoder head; TopK picks the 10 with the best class logit (the best ten differ by at
    least 8e-3 on the bundled input) and gathers their features as the queries and their anchor-offset box logits as
    the reference points; two decoder layers of deformable attention (4 heads, 2 points per level) with box refinement
    through inverse sigmoids.  The decoder output (N, 10, 32).  Convolutions fan-in scaled (from std 0.02 every token of
    a level had the same features and the TopK picked among ties), the frozen BatchNorms given random statistics; run
    with linspace as arange (_ArangeLinspace)."""
    def __init__(self):
        super().__init__()
        from transformers import RTDetrConfig, RTDetrModel, RTDetrResNetConfig
        backbone = RTDetrResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 32, 32], depths=[1, 1, 1, 1], layer_type="basic", out_features=["stage2", "stage3", "stage4"])
        self.model = RTDetrModel(RTDetrConfig(backbone_config=backbone, encoder_in_channels=[32, 32, 32], encoder_hidden_dim=32, encoder_ffn_dim=64, encoder_attention_heads=4, d_model=32, decoder_in_channels=[32, 32, 32], decoder_ffn_dim=64, decoder_layers=2, decoder_attention_heads=4, decoder_n_points=2, num_queries=10, num_labels=8, num_denoising=0))
        with torch.no_grad():
            for module in self.model.modules():
                if type(module).__name__.endswith("FrozenBatchNorm2d"):
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(0.0, 0.1)
                    module.running_mean.normal_(0.0, 0.5)
                    module.running_var.uniform_(0.25, 2.0)
                elif isinstance(module, nn.Conv2d):
                    module.weight.normal_(0.0, module.weight[0].numel() ** -0.5)
    def forward(self, x):  # N, 3, 64, 64
        with _ArangeLinspace():
            return self.model(pixel_values=x).last_hidden_state

class ZoeDepth(nn.Module):
    """A ZoeDepthForDepthEstimation on a BEiT backbone (four layers of 32, 4×4 patches of a 16×16 image, absolute
    positions, all four layers read out): DPT's reassembly (readout projection, resampling ×4 / ×2 / ×1 / ×½) and
    fusion, the relative-depth head, and the metric head with "normed" bins: a seed regressor's 16 bin widths
    normalised, padded with the minimum depth and cumsummed to edges then centres; four attractor layers (4, 4, 2, 1
    attractors; the previous bins and embeddings upsampled bilinearly with aligned corners) shifting the centres by the
    mean of dx / (1 + 1000 dx²) and sorting them; the conditional log-binomial softmax over the 16 bins; the metric depth
    their expectation (N, 64, 64).  Convolutions fan-in scaled (from std 0.02 the depth map was flat)."""
    def __init__(self):
        super().__init__()
        from transformers import BeitConfig, ZoeDepthConfig, ZoeDepthForDepthEstimation
        backbone = BeitConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=64, image_size=16, patch_size=4, use_absolute_position_embeddings=True, out_indices=[1, 2, 3, 4], reshape_hidden_states=False)
        self.model = ZoeDepthForDepthEstimation(ZoeDepthConfig(backbone_config=backbone, neck_hidden_sizes=[8, 16, 32, 32], fusion_hidden_size=16, bottleneck_features=16, num_relative_features=8, bin_embedding_dim=16, num_attractors=[4, 4, 2, 1], bin_centers_type="normed", bin_configurations=[{"n_bins": 16, "min_depth": 0.001, "max_depth": 10.0}]))
        with torch.no_grad():
            for m in self.model.modules():
                if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                    m.weight.normal_(0.0, m.weight[0].numel() ** -0.5)
    def forward(self, x):  # N, 3, 16, 16
        return self.model(pixel_values=x).predicted_depth

def _llama4_rotary_cos_sin(self, x, position_ids):
    """Llama 4's rotary table as real (…, dim / 2, 2) cos / sin pairs instead of complex numbers."""
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    return torch.stack((freqs.cos(), freqs.sin()), -1) * self.attention_scaling

def _llama4_apply_rotary(xq, xk, cos_sin):
    """Llama 4's interleaved rotary (each (even, odd) pair a complex number times e^{iθ}) in real arithmetic."""
    cos, sin = cos_sin[:, :, None, :, 0], cos_sin[:, :, None, :, 1]
    def rotate(x):
        pairs = x.float().reshape(*x.shape[:-1], -1, 2)
        re, im = pairs[..., 0], pairs[..., 1]
        return torch.stack((re * cos - im * sin, re * sin + im * cos), -1).flatten(3).type_as(x)
    return rotate(xq), rotate(xk)

class _RealRotary:
    """Llama 4's rotary embedding computed in reals while active: transformers builds it with torch.polar and
    view_as_complex, complex tensors that neither exporter can write to ONNX.  The same values up to rounding."""
    def __enter__(self):
        from transformers.models.llama4 import modeling_llama4
        self.module = module = modeling_llama4
        self.orig = (module.Llama4TextRotaryEmbedding.forward, module.apply_rotary_emb)
        module.Llama4TextRotaryEmbedding.forward = _llama4_rotary_cos_sin
        module.apply_rotary_emb = _llama4_apply_rotary
    def __exit__(self, *exc):
        self.module.Llama4TextRotaryEmbedding.forward, self.module.apply_rotary_emb = self.orig

class Llama4Text(nn.Module):
    """A Llama4TextModel of two layers of 32 (4 query heads of 8, 2 key / value heads): layer 0 rotary (θ = 5·10⁵,
    interleaved pairs) with weightless L2 (RMS) q / k norms and chunked causal attention in chunks of 8, a dense SwiGLU
    MLP (64); layer 1 without rotary (NoPE), full causal attention with temperature tuning (queries times
    1 + 0.1·log1p(floor((pos + 1) / 4))), and a mixture of 4 SwiGLU experts (32): TopK-1 of the router logits scattered
    into −inf, a sigmoid, each expert's input scaled by its score (all experts run, batched bmm), plus a shared expert.
    The best and second router logits of every token differ by at least 4e-2 on the bundled input.  Run with the
    rotary in reals (_RealRotary)."""
    def __init__(self):
        super().__init__()
        from transformers import Llama4TextConfig, Llama4TextModel
        self.model = Llama4TextModel(Llama4TextConfig(vocab_size=128, hidden_size=32, intermediate_size=32, intermediate_size_mlp=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layer_interval=2, attention_chunk_size=8, floor_scale=4, attn_scale=0.1, pad_token_id=0))
    def forward(self, ids):
        with _RealRotary():
            return self.model(input_ids=ids).last_hidden_state


def _bn_relu_conv(cin, cout, k):
    return nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, k, 1, k // 2, bias=False))

class DenseLayer(nn.Module):
    """A DenseNet-BC layer: BN–ReLU–1×1 Conv to 4·growth channels, BN–ReLU–3×3 Conv to ``growth``, concatenated
    after its input (every earlier layer's output)."""
    def __init__(self, cin, growth, bottleneck=4):
        super().__init__()
        self.reduce = _bn_relu_conv(cin, bottleneck * growth, 1)
        self.conv = _bn_relu_conv(bottleneck * growth, growth, 3)
    def forward(self, x):
        return torch.cat((x, self.conv(self.reduce(x))), 1)

class DenseNet(nn.Module):
    """A small DenseNet-BC (Huang et al. 2017): a 3×3 Conv stem (16 channels), a dense block of three layers (growth 8:
    16 → 40 channels), a transition (BN–ReLU–1×1 Conv compressing by half, 2×2 average pooling), a second dense block
    (20 → 44), a final BN–ReLU, global average pooling and a Linear (N, 10)."""
    def __init__(self, growth=8, layers=(3, 3), stem=16):
        super().__init__()
        self.stem = nn.Conv2d(3, stem, 3, padding=1, bias=False)
        blocks, c = [], stem
        for i, n in enumerate(layers):
            for _ in range(n):
                blocks.append(DenseLayer(c, growth))
                c += growth
            if i < len(layers) - 1:
                blocks += [_bn_relu_conv(c, c // 2, 1), nn.AvgPool2d(2)]
                c //= 2
        self.features = nn.Sequential(*blocks)
        self.norm, self.fc = nn.BatchNorm2d(c), nn.Linear(c, 10)
    def forward(self, x):  # N, 3, 16, 16
        return self.fc(F.relu(self.norm(self.features(self.stem(x)))).mean((2, 3)))


def _cbr(cin, cout, k, stride=1, padding=None):
    """Conv (square or (kh, kw) kernel, "same" padding unless given)–BN (ε 1e-3)–ReLU, as Inception-v3's BasicConv2d."""
    if padding is None:
        padding = (k[0] // 2, k[1] // 2) if isinstance(k, tuple) else k // 2
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, padding, bias=False), nn.BatchNorm2d(cout, eps=1e-3), nn.ReLU())

class InceptionA(nn.Module):
    """Inception-v3's block A: 1×1; 1×1 → 5×5; 1×1 → 3×3 → 3×3; 3×3 average pool (padding not counted) → 1×1;
    concatenated."""
    def __init__(self, cin, pool_c):
        super().__init__()
        self.b1 = _cbr(cin, 8, 1)
        self.b5 = nn.Sequential(_cbr(cin, 6, 1), _cbr(6, 8, 5))
        self.b3 = nn.Sequential(_cbr(cin, 8, 1), _cbr(8, 12, 3), _cbr(12, 12, 3))
        self.bp = _cbr(cin, pool_c, 1)
    def forward(self, x):
        pool = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        return torch.cat((self.b1(x), self.b5(x), self.b3(x), self.bp(pool)), 1)

class ReductionA(nn.Module):
    """Inception-v3's grid reduction: an unpadded strided 3×3; 1×1 → 3×3 → unpadded strided 3×3; a 3×3 stride-2 max
    pool; concatenated."""
    def __init__(self, cin):
        super().__init__()
        self.b3 = _cbr(cin, 16, 3, 2, 0)
        self.b33 = nn.Sequential(_cbr(cin, 8, 1), _cbr(8, 12, 3), _cbr(12, 12, 3, 2, 0))
    def forward(self, x):
        return torch.cat((self.b3(x), self.b33(x), F.max_pool2d(x, 3, 2)), 1)

class InceptionC(nn.Module):
    """Inception-v3's block C with factorised n×n convolutions (n = 3 here): 1×1; 1×1 → 1×n → n×1; 1×1 → n×1 → 1×n →
    n×1 → 1×n; average pool → 1×1; concatenated."""
    def __init__(self, cin, mid=8, n=3):
        super().__init__()
        self.b1 = _cbr(cin, 12, 1)
        self.b7 = nn.Sequential(_cbr(cin, mid, 1), _cbr(mid, mid, (1, n)), _cbr(mid, 12, (n, 1)))
        self.b77 = nn.Sequential(_cbr(cin, mid, 1), _cbr(mid, mid, (n, 1)), _cbr(mid, mid, (1, n)),
                                 _cbr(mid, mid, (n, 1)), _cbr(mid, 12, (1, n)))
        self.bp = _cbr(cin, 12, 1)
    def forward(self, x):
        pool = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        return torch.cat((self.b1(x), self.b7(x), self.b77(x), self.bp(pool)), 1)

class InceptionE(nn.Module):
    """Inception-v3's block E with split branches: 1×1; 1×1 then 1×3 and 3×1 side by side; 1×1 → 3×3 then 1×3 and 3×1
    side by side; average pool → 1×1; concatenated."""
    def __init__(self, cin):
        super().__init__()
        self.b1 = _cbr(cin, 8, 1)
        self.b3, self.b3a, self.b3b = _cbr(cin, 12, 1), _cbr(12, 8, (1, 3)), _cbr(12, 8, (3, 1))
        self.bd = nn.Sequential(_cbr(cin, 12, 1), _cbr(12, 12, 3))
        self.bda, self.bdb = _cbr(12, 8, (1, 3)), _cbr(12, 8, (3, 1))
        self.bp = _cbr(cin, 8, 1)
    def forward(self, x):
        b3, bd = self.b3(x), self.bd(x)
        pool = F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)
        return torch.cat((self.b1(x), self.b3a(b3), self.b3b(b3), self.bda(bd), self.bdb(bd), self.bp(pool)), 1)

class InceptionNet(nn.Module):
    """A small Inception-v3 (Szegedy et al. 2016): two Conv–BN–ReLU stem layers (16 channels at 16×16), block A (32
    channels), a grid reduction (60 channels at 7×7), block C, block E (48 channels), global average pooling and a
    Linear (N, 10)."""
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(_cbr(3, 16, 3), _cbr(16, 16, 3))
        self.a, self.red, self.c, self.e = InceptionA(16, 4), ReductionA(32), InceptionC(60), InceptionE(48)
        self.fc = nn.Linear(48, 10)
    def forward(self, x):  # N, 3, 16, 16
        return self.fc(self.e(self.c(self.red(self.a(self.stem(x))))).mean((2, 3)))


def shifted_softplus(x):
    """SchNet's activation: softplus(x) − log 2 (zero at zero)."""
    return F.softplus(x) - math.log(2.0)

class CFConv(nn.Module):
    """A SchNet interaction: a filter network (Linear – shifted softplus – Linear) of the radial bases, times the cosine
    cutoff (zero for an atom and itself), multiplies the atom-wise projected features of every neighbour j, summed over
    j; then Linear – shifted softplus – Linear."""
    def __init__(self, c=32, n_rbf=16, filters=32):
        super().__init__()
        self.in2f = nn.Linear(c, filters, bias=False)
        self.filter1, self.filter2 = nn.Linear(n_rbf, filters), nn.Linear(filters, filters)
        self.f2out, self.dense = nn.Linear(filters, c), nn.Linear(c, c)
    def forward(self, x, rbf, cutoff):  # N, A, C; N, A, A, K; N, A, A
        w = self.filter2(shifted_softplus(self.filter1(rbf))) * cutoff[..., None]
        y = (self.in2f(x)[:, None, :, :] * w).sum(2)
        return self.dense(shifted_softplus(self.f2out(y)))

class SchNet(nn.Module):
    """SchNet (Schütt et al. 2017) on 12-atom molecules: atom-type embeddings (32); the pairwise distances (the square
    root of the clamped squared differences) expanded in 16 Gaussians exp(−γ (d − μ_k)²), μ_k from 0 to the 4.0 cutoff;
    the cosine cutoff ½ (cos(π d / 4) + 1) · (d < 4), the diagonal zeroed; three residual interactions (CFConv); an
    atom-wise head (32 → 16, shifted softplus, → 1): the atoms' energy contributions (N, 12), whose sum is the
    molecule's energy.  Every pairwise distance on the bundled input lies at least 4e-3 from the cutoff (where the
    cutoff function is zero anyway)."""
    def __init__(self, c=32, n_rbf=16, cutoff=4.0, interactions=3, types=10):
        super().__init__()
        self.cutoff = cutoff
        self.embed = nn.Embedding(types, c)
        self.register_buffer("centers", torch.linspace(0.0, cutoff, n_rbf))
        self.gamma = 0.5 / float(cutoff / (n_rbf - 1)) ** 2
        self.interactions = nn.ModuleList(CFConv(c, n_rbf) for _ in range(interactions))
        self.out1, self.out2 = nn.Linear(c, c // 2), nn.Linear(c // 2, 1)
    def forward(self, z, pos):  # N, A atom types and N, A, 3 positions
        d = ((pos[:, :, None] - pos[:, None]) ** 2).sum(-1).clamp_min(1e-12).sqrt()
        rbf = torch.exp(-self.gamma * (d[..., None] - self.centers) ** 2)
        cut = 0.5 * (torch.cos(d * math.pi / self.cutoff) + 1.0) * (d < self.cutoff).float()
        cut = cut * (1.0 - torch.eye(pos.shape[1], device=pos.device))
        x = self.embed(z)
        for block in self.interactions:
            x = x + block(x, rbf, cut)
        return self.out2(shifted_softplus(self.out1(x))).squeeze(-1)


class GatedLinear(nn.Module):
    """A gated linear unit: sigmoid(W₄x + b₄) ⊙ (W₅x + b₅)."""
    def __init__(self, cin, cout):
        super().__init__()
        self.gate, self.value = nn.Linear(cin, cout), nn.Linear(cin, cout)
    def forward(self, x):
        return torch.sigmoid(self.gate(x)) * self.value(x)

class GatedResidualNetwork(nn.Module):
    """The TFT's gated residual network: LayerNorm(skip(a) + GLU(W₁ ELU(W₂ a + b₂) + b₁)), skip a Linear when the
    width changes."""
    def __init__(self, cin, hidden, cout=None):
        super().__init__()
        cout = cout or cin
        self.skip = nn.Linear(cin, cout) if cin != cout else None
        self.fc2, self.fc1 = nn.Linear(cin, hidden), nn.Linear(hidden, hidden)
        self.glu, self.norm = GatedLinear(hidden, cout), nn.LayerNorm(cout)
    def forward(self, a):
        eta = self.fc1(F.elu(self.fc2(a)))
        return self.norm((a if self.skip is None else self.skip(a)) + self.glu(eta))

class VariableSelection(nn.Module):
    """The TFT's variable selection network: each scalar variable embedded (x·w_v + b_v), a GRN of all embeddings
    flattened gives softmax weights over the variables, each embedding through its own GRN, the weighted sum."""
    def __init__(self, n_vars, d):
        super().__init__()
        self.embed_w, self.embed_b = nn.Parameter(torch.randn(n_vars, d)), nn.Parameter(torch.randn(n_vars, d) * 0.1)
        self.flat = GatedResidualNetwork(n_vars * d, d, n_vars)
        self.per_var = nn.ModuleList(GatedResidualNetwork(d, d) for _ in range(n_vars))
    def forward(self, x):  # N, T, V
        emb = x[..., None] * self.embed_w + self.embed_b  # N, T, V, d
        weights = self.flat(emb.flatten(2)).softmax(-1)
        processed = torch.stack([grn(emb[:, :, i]) for i, grn in enumerate(self.per_var)], 2)
        return (weights[..., None] * processed).sum(2)

class InterpretableAttention(nn.Module):
    """The TFT's interpretable multi-head attention: per-head queries and keys, one value projection shared by all
    heads, causal softmax attention, the heads' outputs averaged, then a Linear."""
    def __init__(self, d, heads):
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)
        self.v, self.out = nn.Linear(d, self.dk), nn.Linear(self.dk, d)
    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, self.heads, self.dk).transpose(1, 2)
        k = self.k(x).reshape(b, t, self.heads, self.dk).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.dk)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        attn = scores.masked_fill(causal, float("-inf")).softmax(-1)
        return self.out((attn @ self.v(x)[:, None]).mean(1))

class TFT(nn.Module):
    """A Temporal Fusion Transformer (Lim et al. 2021) on 3 observed variables, no static covariates: variable
    selection (d = 16), an LSTM with a gated skip connection (GLU, add, LayerNorm), a GRN, interpretable attention (4
    heads) with a gated skip, a position-wise GRN, a gated skip from the LSTM output, three quantile outputs per step
    (N, 32, 3)."""
    def __init__(self, n_vars=3, d=16, heads=4, quantiles=3):
        super().__init__()
        self.select = VariableSelection(n_vars, d)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.gate_lstm, self.norm_lstm = GatedLinear(d, d), nn.LayerNorm(d)
        self.enrich = GatedResidualNetwork(d, d)
        self.attn = InterpretableAttention(d, heads)
        self.gate_attn, self.norm_attn = GatedLinear(d, d), nn.LayerNorm(d)
        self.ff = GatedResidualNetwork(d, d)
        self.gate_out, self.norm_out = GatedLinear(d, d), nn.LayerNorm(d)
        self.head = nn.Linear(d, quantiles)
    def forward(self, x):  # N, T, V
        xi = self.select(x)
        lstm_out = self.norm_lstm(xi + self.gate_lstm(self.lstm(xi)[0]))
        enriched = self.enrich(lstm_out)
        attended = self.norm_attn(enriched + self.gate_attn(self.attn(enriched)))
        return self.head(self.norm_out(lstm_out + self.gate_out(self.ff(attended))))


class NTMHead(nn.Module):
    """A neural Turing machine head's addressing (Graves et al. 2014): from the controller state a key, a strength β
    (softplus), a gate g (sigmoid), a shift distribution over −1 / 0 / +1 (softmax) and a sharpening γ (1 + softplus);
    content weights softmax(β · cos(key, memory rows)), interpolated g·w + (1 − g)·w_prev, circularly convolved with
    the shift (rolls), raised to the power γ and renormalised."""
    def __init__(self, hidden, m):
        super().__init__()
        self.m = m
        self.params = nn.Linear(hidden, m + 1 + 1 + 3 + 1)
    def address(self, h, memory, w_prev):
        k, beta, g, s, gamma = self.params(h).split((self.m, 1, 1, 3, 1), -1)
        beta, g, s, gamma = F.softplus(beta), torch.sigmoid(g), s.softmax(-1), 1.0 + F.softplus(gamma)
        sim = (memory @ k[:, :, None]).squeeze(-1) / (memory.norm(dim=-1) * k.norm(dim=-1, keepdim=True) + 1e-8)
        w = g * (beta * sim).softmax(-1) + (1.0 - g) * w_prev
        w = s[:, :1] * torch.roll(w, -1, 1) + s[:, 1:2] * w + s[:, 2:] * torch.roll(w, 1, 1)
        w = w ** gamma
        return w / (w.sum(-1, keepdim=True) + 1e-16)

class NTM(nn.Module):
    """A neural Turing machine unrolled over 8 steps of 20 features: the inputs projected once (Linear, 20 → 16); an
    LSTMCell controller (32) fed the projected input and the last read vector; a write head (erase sigmoid(e), add
    tanh(a): M ← M ⊙ (1 − w eᵀ) + w aᵀ) then a read head (r = wᵀ M) on an 8×8 memory starting from a learned matrix,
    uniform initial weights; the steps' controller states and read vectors stacked and put through one Linear
    (N, 8, 10).  (The per-step weights are shared by 8 nodes each; the input and output projections are not.)"""
    def __init__(self, cin=20, emb=16, hidden=32, n=8, m=8, cout=10):
        super().__init__()
        self.n, self.m, self.hidden = n, m, hidden
        self.encode = nn.Linear(cin, emb)
        self.controller = nn.LSTMCell(emb + m, hidden)
        self.read, self.write = NTMHead(hidden, m), NTMHead(hidden, m)
        self.erase_add = nn.Linear(hidden, 2 * m)
        self.memory0 = nn.Parameter(torch.randn(n, m) * 0.5)
        self.out = nn.Linear(hidden + m, cout)
    def forward(self, x):  # N, T, C
        b, xe = x.shape[0], self.encode(x)
        memory = self.memory0.expand(b, -1, -1)
        h = c = x.new_zeros(b, self.hidden)
        r = x.new_zeros(b, self.m)
        w_read = w_write = x.new_zeros(b, self.n) + 1.0 / self.n
        states = []
        for t in range(x.shape[1]):
            h, c = self.controller(torch.cat((xe[:, t], r), -1), (h, c))
            w_write = self.write.address(h, memory, w_write)
            erase, add = self.erase_add(h).chunk(2, -1)
            memory = (memory * (1.0 - w_write[:, :, None] * torch.sigmoid(erase)[:, None])
                      + w_write[:, :, None] * torch.tanh(add)[:, None])
            w_read = self.read.address(h, memory, w_read)
            r = (w_read[:, :, None] * memory).sum(1)
            states.append(torch.cat((h, r), -1))
        return self.out(torch.stack(states, 1))


# --------------------------------------------------------------------------- nineteenth held-out set
# Added after the eighteenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout19``): Florence-2's DaViT vision backbone (overlapping Conv patch embeddings with a LayerNorm before
# the later ones; every block a depthwise-Conv positional encoding, window attention over 4×4 windows, another
# depthwise Conv and channel group attention — attention over the channels, the tokens the feature axis, scaled by the
# token count), UperNet (a ConvNeXt backbone read at three levels; a pyramid pooling module: adaptive average pooling to
# 1×1, 2×2 and 4×4, 1×1 Conv–BN–ReLU each, bilinear upsampling, concatenated; a top-down FPN of lateral 1×1 Convs and
# upsampled sums; the levels upsampled, concatenated and fused, the logits upsampled to the image), BLIP-2's Q-Former (8
# learned query tokens through BERT-like layers that self-attend, cross-attend to a ViT's patch tokens in every layer
# and use the query-only FFN), EoMT (an encoder-only mask transformer: a ViT with register tokens; 8 learned queries
# prepended before its last two layers, each of which first predicts masks from the queries (an MLP dot the patch
# tokens upscaled by ConvTranspose blocks), interpolates them back to the patch grid and lets each query attend only to
# the patches its mask logit is positive on — an attention mask thresholded from an intermediate prediction), Mllama's
# vision encoder (an image as 4 tiles of 16×16, the aspect ratio id gathering pre- and post-tile embeddings scaled by
# tanh gates, a gated positional embedding, the tile mask turned into a block attention mask, patches padded to a
# multiple of 8 and cut off again; a local transformer then a global one with tanh-gated attention and MLP; two
# intermediate layers' states concatenated onto the output), and five hand-written models: a Fourier neural operator
# (the real DFT and its truncated inverse as matmuls with cos / sin tables, complex mode mixing as four einsums, plus a
# pointwise Conv1d), Transformer-XL (segment-level recurrence: the second 8-token segment attends to the first one's
# layer inputs; relative partial attention with the u / v biases and the pad-reshape-slice relative shift), an
# E(n)-equivariant graph network (messages of the squared distances, coordinates moved along the normalised pairwise
# differences, feature updates), a ConvLSTM next-frame predictor (gates by 3×3 Convs of [x; h] with Hadamard peepholes,
# two stacked cells unrolled over 4 frames, a ConvTranspose2d head) and a Tacotron 2 (a BiLSTM encoder, an
# autoregressive decoder unrolled for 6 steps: prenet of its own last frame, attention LSTMCell, location-sensitive
# attention over Conv1d features of the previous and cumulative weights, decoder LSTMCell, frames and stop logits;
# a postnet).

class Florence2Vision(nn.Module):
    """Florence-2's DaViT vision backbone: two stages of 16 and 32 channels (a 7×7 stride-4 Conv embedding, then a
    LayerNorm and a 3×3 stride-2 Conv), one spatial block (a depthwise 3×3 Conv positional encoding added, window
    attention over 4×4 windows, 2 / 4 heads, an MLP) and one channel block (the same encoding, channel group attention
    over 2 / 4 groups, an MLP) per stage; the 32×32 image's final map (N, 32, 4, 4)."""
    def __init__(self):
        super().__init__()
        from transformers import Florence2VisionConfig
        from transformers.models.florence2.modeling_florence2 import Florence2VisionBackbone
        self.model = Florence2VisionBackbone(Florence2VisionConfig(depths=[1, 1], patch_size=[7, 3], patch_stride=[4, 2], patch_padding=[3, 1], patch_prenorm=[False, True], embed_dim=[16, 32], num_heads=[2, 4], num_groups=[2, 4], window_size=4, drop_path_rate=0.0, projection_dim=32))
    def forward(self, x):  # N, 3, 32, 32
        return self.model(x).last_hidden_state

class UperNet(nn.Module):
    """An UperNetForSemanticSegmentation on a three-stage ConvNeXt (8 / 16 / 32 channels: 16×16, 8×8 and 4×4 maps of a
    64×64 image): the pyramid pooling module on the 4×4 level (adaptive average pools to 1, 2 and 4, Conv–BN–ReLU,
    bilinear upsampling, concatenated with the level and fused by a 3×3 Conv), a top-down FPN (lateral 1×1 Convs,
    bilinear upsampled sums, 3×3 Convs), the three levels upsampled to 16×16, concatenated and fused, a 1×1 classifier
    of 3 labels upsampled to the image (N, 3, 64, 64).  Convolutions fan-in scaled (from their default init the logits
    had std 9e-3); pool sizes dividing the map (TorchScript exports no other adaptive pooling)."""
    def __init__(self):
        super().__init__()
        from transformers import ConvNextConfig, UperNetConfig, UperNetForSemanticSegmentation
        backbone = ConvNextConfig(num_channels=3, num_stages=3, hidden_sizes=[8, 16, 32], depths=[1, 1, 1], out_features=["stage1", "stage2", "stage3"])
        self.model = UperNetForSemanticSegmentation(UperNetConfig(backbone_config=backbone, hidden_size=16, pool_scales=[1, 2, 4], use_auxiliary_head=False, num_labels=3))
        with torch.no_grad():
            for m in self.model.modules():
                if isinstance(m, nn.Conv2d):
                    m.weight.normal_(0.0, m.weight[0].numel() ** -0.5)
    def forward(self, x):  # N, 3, 64, 64
        return self.model(pixel_values=x).logits

class QFormer(nn.Module):
    """BLIP-2's querying transformer on a small BLIP-2 ViT (two layers of 32, 4×4 patches of a 16×16 image, class
    token): 8 learned query tokens (expanded over the batch) through two Q-Former layers of 32 (4 heads), each
    self-attention, cross-attention to the 17 image tokens (post-LayerNorm, BERT style) and the query FFN; the queries'
    output (N, 8, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import Blip2QFormerConfig, Blip2QFormerModel, Blip2VisionConfig, Blip2VisionModel
        self.vision = Blip2VisionModel(Blip2VisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4))
        self.query_tokens = nn.Parameter(torch.randn(1, 8, 32))
        self.qformer = Blip2QFormerModel(Blip2QFormerConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, cross_attention_frequency=1, encoder_hidden_size=32, max_position_embeddings=64, vocab_size=128))
    def forward(self, x):  # N, 3, 16, 16
        image = self.vision(pixel_values=x).last_hidden_state
        return self.qformer(query_embeds=self.query_tokens.expand(x.shape[0], -1, -1),
                            encoder_hidden_states=image).last_hidden_state

class _NoSegmentationLoss(nn.Module):
    """Stands in for a segmentation model's Hungarian-matching loss while the model is built: the loss needs scipy,
    which this environment lacks, and inference never calls it.  The attributes its weight init touches."""
    def __init__(self, **kwargs):
        super().__init__()
        self.num_labels, self.eos_coef = 1, 0.1
        self.register_buffer("empty_weight", torch.ones(2))

class Eomt(nn.Module):
    """An EomtForUniversalSegmentation: a ViT of four layers of 32 (4 heads, layer scale, 4×4 patches of a 32×32 image,
    a class and 2 register tokens); 8 learned queries prepended before layer 2; before layers 2 and 3 the queries'
    mask logits (an MLP of the LayerNormed queries dotted with the patch tokens upscaled ×4 by two ConvTranspose–
    depthwise Conv–LayerNorm blocks) are interpolated bilinearly back to the 8×8 grid and each query attends only to the
    patches whose logit is positive; the final mask logits (N, 8, 32, 32).  On the bundled input the thresholded logits
    lie at least 7e-3 (before layer 2) and 4e-4 (before layer 3) from zero.  The per-layer mask probabilities (a buffer
    of ones, compared with 0 in Python control flow, which the dynamo exporter cannot trace) given as Python floats;
    built with the loss replaced (_NoSegmentationLoss)."""
    def __init__(self):
        super().__init__()
        from transformers import EomtConfig, EomtForUniversalSegmentation
        from transformers.models.eomt import modeling_eomt
        loss, modeling_eomt.EomtLoss = modeling_eomt.EomtLoss, _NoSegmentationLoss
        try:
            self.model = EomtForUniversalSegmentation(EomtConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, image_size=32, patch_size=4, num_upscale_blocks=2, num_blocks=2, num_queries=8, num_register_tokens=2, num_labels=4))
        finally:
            modeling_eomt.EomtLoss = loss
        del self.model.attn_mask_probs
        self.model.attn_mask_probs = [1.0, 1.0]
    def forward(self, x):  # N, 3, 32, 32
        return self.model(pixel_values=x).masks_queries_logits

class MllamaVision(nn.Module):
    """A MllamaVisionModel: an image of 4 tiles of 16×16 (4×4 patches of 32), aspect ratio id 3 ([2, 1]: 2 tiles
    used) with the tile mask [1, 1, 0, 0]; tanh-gated pre- and post-tile embeddings gathered by the id, a class token,
    the gated positional embedding (a tanh gate between the shared and the per-aspect-ratio tables), patches padded
    from 17 to 24 and the padding and masked tiles excluded by a block attention mask; two local layers, then two global
    layers with tanh-gated attention and MLP; the output with both local layers' states concatenated
    (N, 1, 4, 17, 96)."""
    def __init__(self):
        super().__init__()
        from transformers import MllamaVisionConfig, MllamaVisionModel
        self.model = MllamaVisionModel(MllamaVisionConfig(hidden_size=32, num_hidden_layers=2, num_global_layers=2, attention_heads=4, intermediate_size=64, vision_output_dim=96, image_size=16, patch_size=4, max_num_tiles=4, intermediate_layers_indices=[0, 1], supported_aspect_ratios=[[1, 1], [1, 2], [2, 1], [2, 2]]))
        self.register_buffer("aspect_ratio_ids", torch.tensor([[3]]))
        self.register_buffer("aspect_ratio_mask", torch.tensor([[[1, 1, 0, 0]]]))
    def forward(self, tiles):  # N, 4, 3, 16, 16
        return self.model(pixel_values=tiles[:, None], aspect_ratio_ids=self.aspect_ratio_ids,
                          aspect_ratio_mask=self.aspect_ratio_mask).last_hidden_state

class SpectralConv1d(nn.Module):
    """An FNO spectral convolution with the real DFT written as matmuls: the signal's first ``modes`` Fourier
    coefficients (x·cos, −x·sin over the grid), a complex per-mode channel mixing (einsum of real and imaginary
    weights), the inverse real DFT of the truncated spectrum (the DC term once, the others twice, over the length)."""
    def __init__(self, c, modes, length):
        super().__init__()
        self.w_re = nn.Parameter(torch.randn(c, c, modes) / c)
        self.w_im = nn.Parameter(torch.randn(c, c, modes) / c)
        t = torch.arange(length, dtype=torch.float32)[:, None]
        k = torch.arange(modes, dtype=torch.float32)[None]
        angle = 2 * math.pi * t * k / length  # T, K
        scale = torch.full((modes,), 2.0 / length)
        scale[0] = 1.0 / length
        self.register_buffer("cos", torch.cos(angle))
        self.register_buffer("sin", torch.sin(angle))
        self.register_buffer("icos", (torch.cos(angle) * scale).t().contiguous())  # K, T
        self.register_buffer("isin", (torch.sin(angle) * scale).t().contiguous())
    def forward(self, x):  # N, C, T
        re, im = x @ self.cos, -(x @ self.sin)  # N, C, K
        out_re = torch.einsum("nik,iok->nok", re, self.w_re) - torch.einsum("nik,iok->nok", im, self.w_im)
        out_im = torch.einsum("nik,iok->nok", re, self.w_im) + torch.einsum("nik,iok->nok", im, self.w_re)
        return out_re @ self.icos - out_im @ self.isin

class FNO(nn.Module):
    """A 1-D Fourier neural operator (Li et al. 2021) on 3-channel series of 32 points: the input and its grid
    coordinate lifted to 24 channels, four Fourier layers (spectral convolution over 8 modes plus a pointwise 1×1
    Conv1d, GELU but after the last), a two-Linear projection to 2 output channels per point (N, 32, 2)."""
    def __init__(self, cin=3, c=24, modes=8, length=32, layers=4, cout=2):
        super().__init__()
        self.register_buffer("grid", torch.linspace(0.0, 1.0, length)[None, :, None])
        self.lift = nn.Linear(cin + 1, c)
        self.spectral = nn.ModuleList(SpectralConv1d(c, modes, length) for _ in range(layers))
        self.pointwise = nn.ModuleList(nn.Conv1d(c, c, 1) for _ in range(layers))
        self.proj1, self.proj2 = nn.Linear(c, 64), nn.Linear(64, cout)
    def forward(self, x):  # N, T, C
        h = self.lift(torch.cat((x, self.grid.expand(x.shape[0], -1, -1)), -1)).transpose(1, 2)
        for i, (spec, pw) in enumerate(zip(self.spectral, self.pointwise)):
            h = spec(h) + pw(h)
            if i < len(self.spectral) - 1:
                h = F.gelu(h)
        return self.proj2(F.gelu(self.proj1(h.transpose(1, 2))))

def _rel_shift(x):
    """Transformer-XL's relative shift: a zero column padded on the left, the (q, k + 1) scores reshaped to
    (k + 1, q), the first row dropped, reshaped back: row i's scores shifted so column j holds distance i − j."""
    b, h, q, k = x.shape
    x = F.pad(x, (1, 0))
    return x.reshape(b, h, k + 1, q)[:, :, 1:].reshape(b, h, q, k)

class RelPartialAttention(nn.Module):
    """Transformer-XL relative multi-head attention over [memory; segment]: content scores (q + u)·k, position scores
    (q + v)·W_r R of the sinusoids of the distances klen − 1 … 0, relatively shifted; a causal mask offset by the
    memory length; post-LayerNorm residual and a ReLU FFN."""
    def __init__(self, d, heads, ffn):
        super().__init__()
        self.h, self.dh = heads, d // heads
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.r = nn.Linear(d, d, bias=False)
        self.u, self.v = nn.Parameter(torch.randn(heads, self.dh) * 0.1), nn.Parameter(torch.randn(heads, self.dh) * 0.1)
        self.o = nn.Linear(d, d, bias=False)
        self.norm1, self.ff, self.norm2 = nn.LayerNorm(d), nn.Sequential(nn.Linear(d, ffn), nn.ReLU(), nn.Linear(ffn, d)), nn.LayerNorm(d)
    def forward(self, x, mem, pos):  # N, Q, D; N, M, D; K, D
        b, q, d = x.shape
        cat = torch.cat((mem, x), 1)
        k_len = cat.shape[1]
        heads = self.qkv(cat).reshape(b, k_len, 3, self.h, self.dh)
        wq, wk, wv = heads[:, -q:, 0], heads[:, :, 1], heads[:, :, 2]
        rk = self.r(pos).reshape(k_len, self.h, self.dh)
        ac = torch.einsum("bqhd,bkhd->bhqk", wq + self.u, wk)
        bd = _rel_shift(torch.einsum("bqhd,khd->bhqk", wq + self.v, rk))
        future = torch.ones(q, k_len, dtype=torch.bool, device=x.device).triu(1 + k_len - q)
        attn = ((ac + bd) / math.sqrt(self.dh)).masked_fill(future, float("-inf")).softmax(-1)
        out = self.o(torch.einsum("bhqk,bkhd->bqhd", attn, wv).reshape(b, q, d))
        x = self.norm1(x + out)
        return self.norm2(x + self.ff(x))

class TransformerXL(nn.Module):
    """Transformer-XL (Dai et al. 2019) run over a 16-token text as two 8-token segments: two layers of relative
    partial attention (32 wide, 4 heads); the first segment attends to a learned 4-token memory per layer, the second
    to the first segment's inputs of that layer (the segment-level recurrence; 8 memory tokens); sinusoidal relative
    positions; a Linear head over both segments' outputs (N, 16, 32)."""
    def __init__(self, vocab=128, d=32, heads=4, ffn=64, layers=2, seg=8, mem0=4):
        super().__init__()
        self.d, self.seg = d, seg
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(RelPartialAttention(d, heads, ffn) for _ in range(layers))
        self.mem0 = nn.Parameter(torch.randn(layers, mem0, d) * 0.5)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d))
        self.head = nn.Linear(d, d)
    def positions(self, k_len, device):
        dist = torch.arange(k_len - 1, -1, -1.0, device=device)[:, None] * self.inv_freq
        return torch.cat((dist.sin(), dist.cos()), -1)
    def forward(self, ids):  # N, T
        x = self.embed(ids) * math.sqrt(self.d)
        mems = [m.expand(ids.shape[0], -1, -1) for m in self.mem0]
        outs = []
        for s in range(0, ids.shape[1], self.seg):
            h, new_mems = x[:, s:s + self.seg], []
            for layer, mem in zip(self.layers, mems):
                new_mems.append(h)
                h = layer(h, mem, self.positions(mem.shape[1] + h.shape[1], ids.device))
            mems = new_mems
            outs.append(h)
        return self.head(torch.cat(outs, 1))

class EGNNLayer(nn.Module):
    """An E(n)-equivariant graph layer: messages φ_e(h_i, h_j, ‖x_i − x_j‖²) (SiLU MLP), coordinates moved by the
    mean over the other atoms of (x_i − x_j) / (‖x_i − x_j‖ + 1) · tanh(φ_x(m_ij)) (the normalised, bounded update), features updated residually by φ_h(h_i, Σ_j m_ij), then a LayerNorm."""
    def __init__(self, c, hidden):
        super().__init__()
        self.edge = nn.Sequential(nn.Linear(2 * c + 1, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.coord = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1, bias=False))
        self.node = nn.Sequential(nn.Linear(c + hidden, hidden), nn.SiLU(), nn.Linear(hidden, c))
        self.norm = nn.LayerNorm(c)
    def forward(self, h, x, off_diag):  # N, A, C; N, A, 3; A, A
        a = h.shape[1]
        diff = x[:, :, None] - x[:, None]  # N, A, A, 3
        d2 = (diff ** 2).sum(-1, keepdim=True)
        pair = torch.cat((h[:, :, None].expand(-1, -1, a, -1), h[:, None].expand(-1, a, -1, -1), d2), -1)
        m = self.edge(pair) * off_diag[..., None]
        x = x + (diff / (d2.sqrt() + 1.0) * torch.tanh(self.coord(m))).sum(2) / (a - 1)
        return self.norm(h + self.node(torch.cat((h, m.sum(2)), -1))), x

class EGNN(nn.Module):
    """An EGNN (Satorras et al. 2021) on 12-atom molecules: atom-type embeddings (16), four equivariant layers
    (hidden 32) updating features and coordinates, an atom-wise head (16 → 1); the output (N, 12, 4) the atoms'
    energy contributions and their coordinates' displacement from the input (rotation-equivariant)."""
    def __init__(self, c=16, hidden=32, layers=4, types=10):
        super().__init__()
        self.embed = nn.Embedding(types, c)
        self.layers = nn.ModuleList(EGNNLayer(c, hidden) for _ in range(layers))
        self.head = nn.Sequential(nn.Linear(c, c), nn.SiLU(), nn.Linear(c, 1))
    def forward(self, z, pos):  # N, A atom types and N, A, 3 positions
        a = pos.shape[1]
        off_diag = 1.0 - torch.eye(a, device=pos.device)
        h, x = self.embed(z), pos
        for layer in self.layers:
            h, x = layer(h, x, off_diag)
        return torch.cat((self.head(h), x - pos), -1)

class ConvLSTMCell(nn.Module):
    """A ConvLSTM cell (Shi et al. 2015): the input, forget, cell and output gates one 3×3 Conv of [x; h], with
    Hadamard peephole weights on the cell state for the input, forget (previous c) and output (new c) gates."""
    def __init__(self, cin, hidden, size):
        super().__init__()
        self.gates = nn.Conv2d(cin + hidden, 4 * hidden, 3, padding=1)
        self.w_ci, self.w_cf, self.w_co = (nn.Parameter(torch.randn(1, hidden, size, size) * 0.1) for _ in range(3))
    def forward(self, x, h, c):
        i, f, g, o = self.gates(torch.cat((x, h), 1)).chunk(4, 1)
        i, f = torch.sigmoid(i + self.w_ci * c), torch.sigmoid(f + self.w_cf * c)
        c = f * c + i * torch.tanh(g)
        return torch.sigmoid(o + self.w_co * c) * torch.tanh(c), c

class ConvLSTMNet(nn.Module):
    """A next-frame predictor on 4 frames of 16×16: a strided Conv–GroupNorm–SiLU encoder per frame (8 × 8×8), two
    stacked peephole ConvLSTM layers (16 and 16 channels) unrolled over the frames, the top state upsampled by a
    ConvTranspose2d (×2) and a 3×3 Conv to the predicted frame (N, 3, 16, 16).  Convolutions drawn with std 2 / √fan-in (from the default init the
    frame was nearly flat)."""
    def __init__(self, hidden=16):
        super().__init__()
        self.hidden = hidden
        self.encode = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.GroupNorm(2, 8), nn.SiLU())
        self.cell1, self.cell2 = ConvLSTMCell(8, hidden, 8), ConvLSTMCell(hidden, hidden, 8)
        self.up = nn.ConvTranspose2d(hidden, 8, 4, stride=2, padding=1)
        self.out = nn.Conv2d(8, 3, 3, padding=1)
        with torch.no_grad():
            for m in self.modules():
                if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d)):
                    m.weight.normal_(0.0, 2.0 * m.weight[0].numel() ** -0.5)
    def forward(self, video):  # N, T, 3, 16, 16
        n, t = video.shape[:2]
        feats = self.encode(video.flatten(0, 1)).unflatten(0, (n, t))
        h1 = c1 = h2 = c2 = feats.new_zeros(n, self.hidden, 8, 8)
        for k in range(t):
            h1, c1 = self.cell1(feats[:, k], h1, c1)
            h2, c2 = self.cell2(h1, h2, c2)
        return self.out(F.silu(self.up(h2)))

class LocationSensitiveAttention(nn.Module):
    """Tacotron 2's attention: energies vᵀ tanh(W s + V f + U m) with location features f a Conv1d (kernel 7, 8
    filters) of the previous and the cumulative attention weights then a Linear; softmax over the encoder steps."""
    def __init__(self, query, memory, attn=32, filters=8, kernel=7):
        super().__init__()
        self.q, self.m = nn.Linear(query, attn, bias=False), nn.Linear(memory, attn, bias=False)
        self.loc_conv = nn.Conv1d(2, filters, kernel, padding=kernel // 2, bias=False)
        self.loc = nn.Linear(filters, attn, bias=False)
        self.v = nn.Linear(attn, 1)
    def forward(self, query, keys, weights):  # N, Q; N, T, A (processed memory); N, 2, T
        loc = self.loc(self.loc_conv(weights).transpose(1, 2))
        return self.v(torch.tanh(self.q(query)[:, None] + loc + keys)).squeeze(-1).softmax(-1)

class Tacotron2(nn.Module):
    """A small Tacotron 2 (Shen et al. 2018) on 16 tokens: character embeddings (32), three Conv1d–BatchNorm–ReLU
    layers, a bidirectional LSTM encoder (2 × 16); an autoregressive decoder unrolled for 6 steps (two frames of 8 mel
    bins per step): a ReLU prenet of the last frame, an attention LSTMCell (48), location-sensitive attention, a decoder
    LSTMCell (48) of its state and the context, a frame projection and a stop-token logit; a postnet of three
    Conv1d–BatchNorm layers (tanh between) added to the frames.  Output (N, 12, 9): mel frames and stop logits."""
    def __init__(self, vocab=128, d=32, mel=8, r=2, rnn=48, steps=6):
        super().__init__()
        self.mel, self.r, self.rnn, self.steps = mel, r, rnn, steps
        self.embed = nn.Embedding(vocab, d)
        self.convs = nn.ModuleList(nn.Sequential(nn.Conv1d(d, d, 5, padding=2), nn.BatchNorm1d(d), nn.ReLU()) for _ in range(3))
        self.encoder = nn.LSTM(d, d // 2, batch_first=True, bidirectional=True)
        self.prenet = nn.Sequential(nn.Linear(mel, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.attn_rnn = nn.LSTMCell(32 + d, rnn)
        self.attention = LocationSensitiveAttention(rnn, d)
        self.dec_rnn = nn.LSTMCell(rnn + d, rnn)
        self.frame = nn.Linear(rnn + d, mel * r)
        self.stop = nn.Linear(rnn + d, r)
        self.postnet = nn.ModuleList(nn.Sequential(nn.Conv1d(c_in, c_out, 5, padding=2), nn.BatchNorm1d(c_out))
                                     for c_in, c_out in ((mel, 16), (16, 16), (16, mel)))
    def forward(self, ids):  # N, T
        x = self.embed(ids).transpose(1, 2)
        for conv in self.convs:
            x = conv(x)
        memory = self.encoder(x.transpose(1, 2))[0]  # N, T, d
        keys = self.attention.m(memory)
        n, t = ids.shape
        ah = ac = dh = dc = memory.new_zeros(n, self.rnn)
        context = memory.new_zeros(n, memory.shape[2])
        weights = cumulative = memory.new_zeros(n, t)
        last = memory.new_zeros(n, self.mel)
        frames, stops = [], []
        for _ in range(self.steps):
            ah, ac = self.attn_rnn(torch.cat((self.prenet(last), context), -1), (ah, ac))
            weights = self.attention(ah, keys, torch.stack((weights, cumulative), 1))
            cumulative = cumulative + weights
            context = (weights[:, :, None] * memory).sum(1)
            dh, dc = self.dec_rnn(torch.cat((ah, context), -1), (dh, dc))
            out = torch.cat((dh, context), -1)
            frame = self.frame(out).reshape(n, self.r, self.mel)
            frames.append(frame)
            stops.append(self.stop(out))
            last = frame[:, -1]
        mel = torch.cat(frames, 1)  # N, steps·r, mel
        y = mel.transpose(1, 2)
        for k, layer in enumerate(self.postnet):
            y = layer(y)
            if k < len(self.postnet) - 1:
                y = torch.tanh(y)
        return torch.cat((mel + y.transpose(1, 2), torch.cat(stops, 1)[..., None]), -1)


# --------------------------------------------------------------------------- twentieth held-out set
# Added after the nineteenth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout20``): Pixtral's vision encoder (a Conv patch embedding cut to the image's own size, a non-square 8×6
# patch grid, RMSNorm before the layers, 2-D rotary embeddings — half the frequencies by patch row, half by column —
# and a block-diagonal attention mask), DAB-DETR (learned 4-d anchor boxes as the queries: their sine embedding through
# an MLP is the positional query, the cross-attention's positional part modulated by the anchor's width / height, the
# anchors refined after every decoder layer through inverse sigmoid), Apertus (the xIELU activation — a learned
# quadratic for positive inputs, an exponential for negative ones, both scaled by softplus'd parameters — with QK-norm
# and llama-3 rotary scaling), LiLT (a text stream and a layout stream of the token boxes, each with its own
# attention; each stream's attention scores the sum of both streams' scaled scores), ViTPose+ (a ViT whose MLPs end in
# a shared part and a dataset-selected expert part: every expert run and masked by a dataset index; a classic decoder
# of two ConvTranspose–BN–ReLU layers to keypoint heatmaps), and five hand-written models: a DiT (adaLN-Zero: the
# timestep embedding regresses shift, scale and gate per block for an affine-free LayerNorm, gated residuals, a
# modulated final layer, unpatchify), a YOLOv8-style anchor-free head (distribution focal loss decoding: softmax over
# 8 bins per box side then the integral, distances to boxes around fixed anchor points times the stride; C2f blocks
# of split, chained and concatenated Convs), a Linformer (keys and values projected along the sequence axis to 4
# rows), a graph U-Net (GCN layers with symmetric normalisation, gPool keeping the TopK nodes of a learned projection
# scaled by its sigmoid, adjacency gathered on both axes; gUnpool scattering back into zeros; skip additions) and an
# expert-choice MoE (every expert picks its top-capacity tokens by router probability, gathered, a batched expert
# FFN, weighted and scatter-added back).

class PixtralVision(nn.Module):
    """A PixtralVisionModel of two layers of 32 (4 heads of 8) on a 32×32 image with 4×4 patches, the image's size
    given as 32×24 so the patch grid is cut to 8×6 (48 patches); RMSNorm before the layers, 2-D rotary embeddings by
    patch row and column, the block attention mask of one image; the last hidden state (N, 48, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import PixtralVisionConfig, PixtralVisionModel
        self.model = PixtralVisionModel(PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, head_dim=8, image_size=32, patch_size=4))
    def forward(self, x):  # N, 3, 32, 32
        return self.model(pixel_values=x, image_sizes=[(32, 24)]).last_hidden_state

class DabDETR(nn.Module):
    """A DabDetrModel on a transformers ResNet backbone (no timm, no pretrained weights: basic blocks, 16 and 32
    channels, the stride-16 stage), one encoder and two decoder layers of 32 (4 heads), 8 learned anchor boxes: the
    positional queries a sine embedding of the anchors through an MLP, width / height-modulated positional
    cross-attention, anchors refined layer by layer; the decoder output (N, 8, 32).  The frozen BatchNorms' buffers get
    random statistics here."""
    def __init__(self):
        super().__init__()
        from transformers import DabDetrConfig, DabDetrModel, ResNetConfig
        backbone = ResNetConfig(num_channels=3, embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", out_features=["stage2"])
        self.model = DabDetrModel(DabDetrConfig(use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=backbone, hidden_size=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, num_queries=8))
        for module in self.model.modules():
            if type(module).__name__.endswith("FrozenBatchNorm2d"):
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0.0, 0.1)
                module.running_mean.normal_(0.0, 0.5)
                module.running_var.uniform_(0.25, 2.0)
    def forward(self, x):  # N, 3, 64, 64
        return self.model(pixel_values=x).last_hidden_state

class _XIELU(nn.Module):
    """transformers' xIELU (Python path) with float32 parameters and exp(x) − 1 for expm1, which the TorchScript
    exporter lacks: alpha_p x² + beta x for x > 0, else (exp(min(x, eps)) − 1 − x) alpha_n + beta x, alpha_p =
    softplus(a_p), alpha_n = beta + softplus(a_n)."""
    def __init__(self, act):
        super().__init__()
        self.alpha_p = nn.Parameter(act.alpha_p.detach().float())
        self.alpha_n = nn.Parameter(act.alpha_n.detach().float())
        self.beta, self.eps = float(act.beta), float(act.eps)
    def forward(self, x):
        alpha_p, alpha_n = F.softplus(self.alpha_p), self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0, alpha_p * x * x + self.beta * x,
                           (torch.exp(torch.clamp(x, max=self.eps)) - 1 - x) * alpha_n + self.beta * x)

def _apertus():
    """An ApertusModel of two layers of 32 (4 query heads, 2 key/value heads, QK RMSNorm, llama-3 rotary scaling), its
    up / down MLP activated by xIELU (_XIELU: the bfloat16 parameters as float32, expm1 written out)."""
    from transformers import ApertusConfig, ApertusModel
    model = ApertusModel(ApertusConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))
    for layer in model.layers:
        layer.mlp.act_fn = _XIELU(layer.mlp.act_fn)
    return LastHidden(model, "input_ids")

class Lilt(nn.Module):
    """A LiltModel of two layers of 48 (4 heads) on token ids and their boxes: a text stream of 48 and a layout stream
    of 12 (channel shrink 4; box embeddings of x, y, width and height projected), each with its own query / key /
    value; each stream's attention the softmax of both streams' scaled scores summed; the text stream (N, 16, 48)."""
    def __init__(self):
        super().__init__()
        from transformers import LiltConfig, LiltModel
        self.model = LiltModel(LiltConfig(vocab_size=128, hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, channel_shrink_ratio=4), add_pooling_layer=False)
    def forward(self, ids, bbox):  # N, T; N, T, 4
        return self.model(input_ids=ids, bbox=bbox).last_hidden_state

class VitPose(nn.Module):
    """A VitPoseForPoseEstimation (ViTPose+) on the middle 64×48 of a 64×64 image: a ViT of two layers of 32 (4 heads,
    8×8 patches with padding 2: an 8×6 grid), each MLP's output 24 shared channels and 8 from one of 3 experts (all
    run, masked by the dataset index 1); the classic decoder (two ConvTranspose–BN–ReLU layers of 256, a 1×1 Conv) to
    5 keypoint heatmaps (N, 5, 32, 24)."""
    def __init__(self):
        super().__init__()
        from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation
        backbone = VitPoseBackboneConfig(image_size=[64, 48], patch_size=[8, 8], hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2, out_indices=[2], num_experts=3, part_features=8)
        self.model = VitPoseForPoseEstimation(VitPoseConfig(backbone_config=backbone, use_simple_decoder=False, num_labels=5))
        self.register_buffer("dataset_index", torch.tensor([1]))
    def forward(self, x):  # N, 3, 64, 64
        return self.model(pixel_values=x[:, :, :, 8:56], dataset_index=self.dataset_index).heatmaps

def _modulate(x, shift, scale):
    """adaLN modulation: x (N, T, D) scaled by 1 + scale and shifted, both (N, D) per sample."""
    return x * (1 + scale[:, None]) + shift[:, None]

class DiTBlock(nn.Module):
    """A DiT block with adaLN-Zero: SiLU–Linear of the conditioning gives shift, scale and gate for the attention and
    the MLP; affine-free LayerNorms modulated, gated residual branches."""
    def __init__(self, d, heads):
        super().__init__()
        self.h = heads
        self.norm1 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 6 * d))
    def forward(self, x, c):  # N, T, D; N, D
        b, t, d = x.shape
        shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(c).chunk(6, -1)
        q, k, v = self.qkv(_modulate(self.norm1(x), shift1, scale1)).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        a = ((q @ k.transpose(-1, -2)) / math.sqrt(d // self.h)).softmax(-1) @ v
        x = x + gate1[:, None] * self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + gate2[:, None] * self.mlp(_modulate(self.norm2(x), shift2, scale2))

class DiT(nn.Module):
    """A diffusion transformer (Peebles & Xie 2023) on 16×16 images and timesteps: 4×4 patches embedded by a Conv to 32,
    fixed 2-D sin-cos positions, a sinusoidal timestep embedding through a SiLU MLP as the conditioning, two adaLN-Zero
    blocks (4 heads), a modulated final LayerNorm and Linear to the patches' noise and variance, unpatchified
    (N, 6, 16, 16)."""
    def __init__(self, d=32, heads=4, depth=2, patch=4, size=16, cin=3):
        super().__init__()
        self.p, self.g, self.cin = patch, size // patch, cin
        self.embed = nn.Conv2d(cin, d, patch, stride=patch)
        g = torch.arange(self.g, dtype=torch.float32)
        yy, xx = torch.meshgrid(g, g, indexing="ij")
        omega = 1.0 / 10000 ** (torch.arange(d // 4, dtype=torch.float32) / (d // 4))
        pos = [f(c.reshape(-1)[:, None] * omega) for c in (yy, xx) for f in (torch.sin, torch.cos)]
        self.register_buffer("pos", torch.cat(pos, 1)[None])
        self.register_buffer("freqs", torch.exp(-math.log(10000) * torch.arange(16, dtype=torch.float32) / 16))
        self.t_mlp = nn.Sequential(nn.Linear(32, d), nn.SiLU(), nn.Linear(d, d))
        self.blocks = nn.ModuleList(DiTBlock(d, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Sequential(nn.SiLU(), nn.Linear(d, 2 * d))
        self.out = nn.Linear(d, patch * patch * 2 * cin)
    def forward(self, x, t):  # N, 3, 16, 16; N
        n = x.shape[0]
        h = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        args = t[:, None] * self.freqs
        c = self.t_mlp(torch.cat((torch.cos(args), torch.sin(args)), -1))
        for blk in self.blocks:
            h = blk(h, c)
        shift, scale = self.ada(c).chunk(2, -1)
        h = self.out(_modulate(self.norm(h), shift, scale))
        h = h.reshape(n, self.g, self.g, self.p, self.p, 2 * self.cin).permute(0, 5, 1, 3, 2, 4)
        return h.reshape(n, 2 * self.cin, self.g * self.p, self.g * self.p)

class ConvBNSiLU(nn.Sequential):
    """Conv (no bias, same padding) – BatchNorm – SiLU."""
    def __init__(self, cin, cout, k=3, s=1):
        super().__init__(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())

class C2f(nn.Module):
    """YOLOv8's C2f: a 1×1 Conv split in two halves, bottlenecks chained on the second (residual), every piece
    concatenated and fused by a 1×1 Conv."""
    def __init__(self, cin, cout, n=1):
        super().__init__()
        self.c = cout // 2
        self.cv1 = ConvBNSiLU(cin, 2 * self.c, 1)
        self.m = nn.ModuleList(nn.Sequential(ConvBNSiLU(self.c, self.c), ConvBNSiLU(self.c, self.c)) for _ in range(n))
        self.cv2 = ConvBNSiLU((2 + n) * self.c, cout, 1)
    def forward(self, x):
        y = list(self.cv1(x).split((self.c, self.c), 1))
        for m in self.m:
            y.append(y[-1] + m(y[-1]))
        return self.cv2(torch.cat(y, 1))

class YoloDFL(nn.Module):
    """A YOLOv8-style anchor-free detector on 32×32 images: a strided Conv / C2f backbone read at strides 4 and 8
    (8×8 and 4×4 maps), decoupled box and class heads; distribution focal loss decoding (4 × 8 bin logits per anchor,
    softmax over the bins, the expectation over 0…7), left-top / right-bottom distances around the fixed anchor
    points to centre-size boxes times the stride; sigmoid class scores: (N, 4 + 4, 80)."""
    def __init__(self, nc=4, reg_max=8):
        super().__init__()
        self.nc, self.r = nc, reg_max
        self.stem = nn.Sequential(ConvBNSiLU(3, 8, 3, 2), ConvBNSiLU(8, 16, 3, 2), C2f(16, 16))
        self.down = nn.Sequential(ConvBNSiLU(16, 32, 3, 2), C2f(32, 32))
        self.box = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, 16), nn.Conv2d(16, 4 * reg_max, 1)) for c in (16, 32))
        self.cls = nn.ModuleList(nn.Sequential(ConvBNSiLU(c, 16), nn.Conv2d(16, nc, 1)) for c in (16, 32))
        self.register_buffer("bins", torch.arange(reg_max, dtype=torch.float32))
        anchors, strides = [], []
        for size, stride in ((8, 4), (4, 8)):
            s = torch.arange(size, dtype=torch.float32) + 0.5
            yy, xx = torch.meshgrid(s, s, indexing="ij")
            anchors.append(torch.stack((xx, yy), -1).reshape(-1, 2))
            strides.append(torch.full((size * size, 1), float(stride)))
        self.register_buffer("anchors", torch.cat(anchors).t()[None])  # 1, 2, A
        self.register_buffer("strides", torch.cat(strides).t()[None])  # 1, 1, A
    def forward(self, x):  # N, 3, 32, 32
        p3 = self.stem(x)
        p4 = self.down(p3)
        n = x.shape[0]
        box = torch.cat([b(f).flatten(2) for b, f in zip(self.box, (p3, p4))], 2)  # N, 4R, A
        cls = torch.cat([c(f).flatten(2) for c, f in zip(self.cls, (p3, p4))], 2)
        a = box.shape[2]
        dist = (box.reshape(n, 4, self.r, a).softmax(2) * self.bins[:, None]).sum(2)  # N, 4, A
        lt, rb = dist.chunk(2, 1)
        x1y1, x2y2 = self.anchors - lt, self.anchors + rb
        xywh = torch.cat(((x1y1 + x2y2) / 2, x2y2 - x1y1), 1) * self.strides
        return torch.cat((xywh, cls.sigmoid()), 1)

class LinformerLayer(nn.Module):
    """Linformer self-attention (pre-LayerNorm): keys and values projected along the sequence axis by learned (k, n)
    matrices E and F shared by the heads, so each query attends to k mixed rows; a GELU FFN."""
    def __init__(self, d, heads, n, k):
        super().__init__()
        self.h = heads
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.E, self.Fp = nn.Parameter(torch.randn(k, n) / math.sqrt(n)), nn.Parameter(torch.randn(k, n) / math.sqrt(n))
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
    def forward(self, x):  # N, T, D
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, -1)
        k, v = self.E @ k, self.Fp @ v  # N, k, D
        q = q.reshape(b, t, self.h, -1).transpose(1, 2)
        k = k.reshape(b, -1, self.h, d // self.h).transpose(1, 2)
        v = v.reshape(b, -1, self.h, d // self.h).transpose(1, 2)
        a = ((q @ k.transpose(-1, -2)) * (d // self.h) ** -0.5).softmax(-1) @ v
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff(self.norm2(x))

class Linformer(nn.Module):
    """A Linformer (Wang et al. 2020) encoder on 16 tokens: embeddings and learned positions (32), two layers of 4
    heads with the sequence projected to 4 rows, a final LayerNorm (N, 16, 32)."""
    def __init__(self, vocab=128, d=32, heads=4, n=16, k=4, layers=2):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(1, n, d) * 0.5)
        self.layers = nn.ModuleList(LinformerLayer(d, heads, n, k) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
    def forward(self, ids):  # N, T
        x = self.embed(ids) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)

class GCNLayer(nn.Module):
    """A graph convolution: ELU(D^-1/2 (A + I) D^-1/2 X W), the degrees of the self-looped adjacency."""
    def __init__(self, cin, cout):
        super().__init__()
        self.lin = nn.Linear(cin, cout)
    def forward(self, x, adj):  # N, V, C; N, V, V
        a = adj + torch.eye(adj.shape[-1], device=adj.device)
        d = a.sum(-1).rsqrt()
        return F.elu((d[..., :, None] * a * d[..., None, :]) @ self.lin(x))

class GPool(nn.Module):
    """gPool (Gao & Ji 2019): node scores the features' projection on a learned vector over its norm, the top k nodes
    kept (TopK), their features gathered and gated by the scores' sigmoid, the adjacency gathered on both axes."""
    def __init__(self, c, k):
        super().__init__()
        self.k, self.p = k, nn.Parameter(torch.randn(c))
    def forward(self, x, adj):
        y = x @ self.p / self.p.norm()
        score, idx = y.topk(self.k, dim=1)
        x = torch.gather(x, 1, idx[..., None].expand(-1, -1, x.shape[-1])) * torch.sigmoid(score)[..., None]
        adj = torch.gather(adj, 1, idx[..., None].expand(-1, -1, adj.shape[-1]))
        adj = torch.gather(adj, 2, idx[:, None].expand(-1, self.k, -1))
        return x, adj, idx

class GraphUNet(nn.Module):
    """A graph U-Net on 10-node graphs (features and adjacency inputs): a GCN to 16, two gPool levels (6 then 3 nodes)
    each followed by a GCN, two gUnpool levels (the pooled features scattered back into zeros at the kept nodes,
    added to the skip, a GCN on that level's adjacency), a last GCN of [features; first GCN's] (N, 10, 4)."""
    def __init__(self, cin=6, c=16, ks=(6, 3), cout=4):
        super().__init__()
        self.inp = GCNLayer(cin, c)
        self.pools = nn.ModuleList(GPool(c, k) for k in ks)
        self.down = nn.ModuleList(GCNLayer(c, c) for _ in ks)
        self.up = nn.ModuleList(GCNLayer(c, c) for _ in ks)
        self.out = GCNLayer(2 * c, cout)
    def forward(self, x, adj):  # N, V, C; N, V, V
        h = first = self.inp(x, adj)
        stack = []
        for pool, gcn in zip(self.pools, self.down):
            skip, skip_adj = h, adj
            h, adj, idx = pool(h, adj)
            h = gcn(h, adj)
            stack.append((skip, skip_adj, idx))
        for gcn in self.up:
            skip, adj, idx = stack.pop()
            h = skip + torch.zeros_like(skip).scatter(1, idx[..., None].expand(-1, -1, h.shape[-1]), h)
            h = gcn(h, adj)
        return self.out(torch.cat((h, first), -1), adj)

class ExpertChoiceMoE(nn.Module):
    """Expert-choice routing (Zhou et al. 2022): router probabilities (softmax over experts), every expert takes its
    top-capacity tokens (TopK over the token axis), gathered; a batched GELU FFN per expert (einsums of stacked
    weights), outputs weighted by the router probability and scatter-added back to their tokens."""
    def __init__(self, d, experts, hidden, capacity):
        super().__init__()
        self.k = capacity
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, hidden) / math.sqrt(d))
        self.w2 = nn.Parameter(torch.randn(experts, hidden, d) / math.sqrt(hidden))
    def forward(self, x):  # N, T, D
        n, t, d = x.shape
        s = self.gate(x).softmax(-1)  # N, T, E
        g, idx = s.transpose(1, 2).topk(self.k, dim=-1)  # N, E, k
        e = idx.shape[1]
        xin = torch.gather(x, 1, idx.reshape(n, -1, 1).expand(-1, -1, d)).reshape(n, e, self.k, d)
        y = torch.einsum("nekh,ehd->nekd", F.gelu(torch.einsum("nekd,edh->nekh", xin, self.w1)), self.w2)
        y = (y * g[..., None]).reshape(n, e * self.k, d)
        return torch.zeros_like(x).scatter_add(1, idx.reshape(n, -1, 1).expand(-1, -1, d), y)

class ExpertChoiceNet(nn.Module):
    """A transformer of two layers (32 wide) on 16 tokens: pre-LayerNorm multi-head attention (4 heads) and an
    expert-choice MoE of 4 experts (hidden 48) with capacity 8 tokens each (capacity factor 2); (N, 16, 32)."""
    def __init__(self, vocab=128, d=32, heads=4, layers=2, experts=4, n=16):
        super().__init__()
        self.embed, self.pos = nn.Embedding(vocab, d), nn.Parameter(torch.randn(1, n, d) * 0.5)
        self.attn = nn.ModuleList(nn.MultiheadAttention(d, heads, batch_first=True) for _ in range(layers))
        self.moe = nn.ModuleList(ExpertChoiceMoE(d, experts, 48, n * 2 // experts) for _ in range(layers))
        self.n1 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.n2 = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
    def forward(self, ids):  # N, T
        x = self.embed(ids) + self.pos
        for attn, moe, n1, n2 in zip(self.attn, self.moe, self.n1, self.n2):
            h = n1(x)
            x = x + attn(h, h, h, need_weights=False)[0]
            x = x + moe(n2(x))
        return x


# --------------------------------------------------------------------------- twenty-first held-out set
# Added after the twentieth held-out set and measured before any of their misses was looked at (``fault_sweep.py
# --archs heldout21``): X-CLIP's vision encoder (cross-frame communication: every frame's class token projected to a
# message token, the messages of a clip attending to each other across frames, each frame's tokens attending with
# its message appended, the message sliced off again), the Decision Transformer (return-to-go, state and action
# embeddings plus a shared timestep embedding, stacked and interleaved into one 3T-token sequence for a GPT-2 with
# zero position ids, its outputs de-interleaved into state, action (tanh) and return predictions), MarkupLM (XPath
# embeddings: one tag and one subscript embedding table per DOM depth, gathered from (N, T, depth) index inputs,
# concatenated over the depths and summed, a ReLU FFN to the hidden size added to the token embeddings), MGP-STR (a
# ViT on a wide text-line image and three A³ token learners: grouped 1×1 Convs to per-character attention maps,
# softmax over the patches, an einsum pooling grouped-Conv features; character, BPE and WordPiece logits), Parakeet's
# FastConformer encoder (a strided depthwise-separable Conv2d subsampler, Transformer-XL-style relative positional
# attention with u / v biases and a rel-shift by pad-and-reshape, a GLU / depthwise Conv1d / BatchNorm convolution
# module, macaron half-step FFNs), and five hand-written models: a CenterNet head (peaks kept where a 3×3 max-pool
# equals the heatmap, TopK over the flattened class × position map, class / row / column by floor division, size
# and offset gathered at the peaks), a KPConv point network (k-NN by TopK, neighbours gathered, kernel-point
# correlations 1 − |d|/σ clipped by ReLU, an einsum of correlations, features and per-kernel-point weights), a QRNN
# (a causal Conv1d to candidate / forget / output gates, fo-pooling made parallel in log space: exp of a cumsum of
# log-sigmoid forget gates times a cumsum of the rescaled inputs), a LambdaNetwork (keys softmaxed over the
# positions, a content lambda and relative position lambdas from a learned table gathered by relative offsets,
# applied to the queries by einsums) and a neural CDE (a natural cubic spline of the time-augmented series, its
# second derivatives by a fixed linear solve, RK4 over every knot interval of a vector field whose (hidden × input)
# matrix is contracted with the spline's derivative).

class XClipVision(nn.Module):
    """An XCLIPVisionModel of two layers of 32 (4 heads) on a clip of 4 frames of 16×16 (4×4 patches): per layer every
    frame's class token through a Linear to a message token, LayerNorm and self-attention of the messages across the 4
    frames, the message appended to its frame's 17 tokens for the attention and sliced off before the MLP; quick GELU;
    the last hidden state (4, 17, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import XCLIPVisionConfig, XCLIPVisionModel
        self.model = XCLIPVisionModel(XCLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=16, patch_size=4, num_frames=4))
    def forward(self, x):  # N, 4, 3, 16, 16
        return self.model(pixel_values=x.flatten(0, 1)).last_hidden_state

class DecisionTransformer(nn.Module):
    """A DecisionTransformerModel (a GPT-2 of two layers of 32, 4 heads, ReLU FFN of 64) on a 10-step trajectory of
    6-d states, 3-d actions, returns-to-go and timesteps 5…14: linear return / state / action embeddings plus the
    timestep embedding, stacked and permuted into 30 interleaved tokens, an embedding LayerNorm, zero position ids;
    the outputs de-interleaved: next-state, tanh'd action and return predictions concatenated (N, 10, 10)."""
    def __init__(self):
        super().__init__()
        from transformers import DecisionTransformerConfig, DecisionTransformerModel
        self.model = DecisionTransformerModel(DecisionTransformerConfig(state_dim=6, act_dim=3, hidden_size=32, max_ep_len=64, n_positions=64, n_layer=2, n_head=4, n_inner=64))
    def forward(self, states, actions, returns, timesteps):  # N, T, 6; N, T, 3; N, T, 1; N, T
        o = self.model(states=states, actions=actions, rewards=returns, returns_to_go=returns, timesteps=timesteps)
        return torch.cat((o.state_preds, o.action_preds, o.return_preds), -1)

class MarkupLM(nn.Module):
    """A MarkupLMModel of two layers of 32 (4 heads) on token ids and their XPaths (tag and subscript ids per DOM
    depth, (N, 16, 6), padded past each token's depth with the pad ids): 6 tag and 6 subscript embedding tables of 8,
    gathered per depth, concatenated, the two sums through a ReLU FFN (48 → 128 → 32) added to the token, position
    and type embeddings; the last hidden state (N, 16, 32)."""
    def __init__(self):
        super().__init__()
        from transformers import MarkupLMConfig, MarkupLMModel
        self.model = MarkupLMModel(MarkupLMConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=64, max_xpath_tag_unit_embeddings=32, max_xpath_subs_unit_embeddings=64, tag_pad_id=31, subs_pad_id=63, xpath_unit_hidden_size=8, max_depth=6), add_pooling_layer=False)
    def forward(self, ids, tags, subs):  # N, T; N, T, 6; N, T, 6
        return self.model(input_ids=ids, xpath_tags_seq=tags, xpath_subs_seq=subs).last_hidden_state

class MgpStr(nn.Module):
    """An MgpstrForSceneTextRecognition on a 16×32 text-line image: a ViT of two layers of 32 (4 heads, 4×4 patches,
    a class token) and three A³ modules (LayerNorm, a grouped (8) then a plain 1×1 Conv to 6 attention maps, softmax
    over the 33 tokens, an einsum pooling grouped-1×1-Conv features, LayerNorm) with character (10), BPE (20) and
    WordPiece (20) heads: the three logits concatenated (N, 6, 50)."""
    def __init__(self):
        super().__init__()
        from transformers import MgpstrConfig, MgpstrForSceneTextRecognition
        self.model = MgpstrForSceneTextRecognition(MgpstrConfig(image_size=[16, 32], patch_size=4, max_token_length=6, num_character_labels=10, num_bpe_labels=20, num_wordpiece_labels=20, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, mlp_ratio=2))
    def forward(self, x):  # N, 3, 16, 32
        return torch.cat(self.model(pixel_values=x).logits, -1)

class Parakeet(nn.Module):
    """A ParakeetEncoder (FastConformer) of two layers of 32 (4 heads) on 64 frames of 16 mel bins: a ×4 subsampler
    (a strided Conv2d, a strided depthwise Conv2d and a 1×1 Conv of 8 channels, ReLU, a Linear), the input scaled by
    √32; per layer macaron half-step SiLU FFNs, relative positional attention (sinusoidal relative positions through
    a Linear, u / v biases, the position scores rel-shifted by pad and reshape) and a convolution module (pointwise
    Conv1d, GLU, depthwise Conv1d of 5, BatchNorm, SiLU, pointwise); the last hidden state (N, 16, 32).  Eager
    attention: the dynamo exporter fails on SDPA's output view here."""
    def __init__(self):
        super().__init__()
        from transformers import ParakeetEncoder, ParakeetEncoderConfig
        self.model = ParakeetEncoder(ParakeetEncoderConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_kernel_size=5, subsampling_factor=4, subsampling_conv_channels=8, num_mel_bins=16, max_position_embeddings=64))
    def forward(self, x):  # N, 64, 16
        return self.model(input_features=x).last_hidden_state

def _conv_bn_relu(cin, cout, stride):
    """Conv 3×3 (no bias) – BatchNorm – ReLU."""
    return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

class CenterNet(nn.Module):
    """A CenterNet-style detector (Zhou et al. 2019, objects as points) on 64×64 images: three stride-2 Conv–BN–ReLU
    layers, a ConvTranspose ×2 to a 16×16 map of stride 4, heatmap (3 classes, sigmoid), size (log w, h) and offset
    heads; decoding without NMS: peaks kept where a 3×3 stride-1 max-pool equals the heatmap, the top 10 of the
    flattened class × position scores, class, row and column by floor division, size and offset gathered at the
    peaks, boxes times the stride: x1, y1, x2, y2, score, class (N, 10, 6)."""
    def __init__(self, nc=3, k=10, stride=4):
        super().__init__()
        self.k, self.stride = k, stride
        self.backbone = nn.Sequential(_conv_bn_relu(3, 16, 2), _conv_bn_relu(16, 32, 2), _conv_bn_relu(32, 32, 2))
        self.up = nn.Sequential(nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.heads = nn.ModuleList(nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, c, 1)) for c in (nc, 2, 2))
    def forward(self, x):  # N, 3, 64, 64
        f = self.up(self.backbone(x))
        heat, wh, off = (head(f) for head in self.heads)
        heat = heat.sigmoid()
        hh, ww = heat.shape[2:]
        heat = heat * (F.max_pool2d(heat, 3, 1, 1) == heat).float()
        score, idx = heat.flatten(1).topk(self.k)  # N, K
        cls = torch.div(idx, hh * ww, rounding_mode="floor")
        pix = idx - cls * (hh * ww)
        ys = torch.div(pix, ww, rounding_mode="floor")
        xs = pix - ys * ww
        wh = torch.gather(wh.flatten(2), 2, pix[:, None].expand(-1, 2, -1)).exp()  # N, 2, K
        off = torch.gather(off.flatten(2), 2, pix[:, None].expand(-1, 2, -1))
        cx, cy = xs.float() + off[:, 0], ys.float() + off[:, 1]
        boxes = torch.stack((cx - wh[:, 0] / 2, cy - wh[:, 1] / 2, cx + wh[:, 0] / 2, cy + wh[:, 1] / 2), -1)
        return torch.cat((boxes * self.stride, score[..., None], cls.float()[..., None]), -1)

class KPConv(nn.Module):
    """A rigid kernel-point convolution (Thomas et al. 2019): the k neighbours' positions and features gathered, each
    neighbour's correlation with 7 fixed kernel points (centre and ±r on every axis) ReLU(1 − |rel − kp| / σ), one
    einsum of correlations, features and per-kernel-point weights; BatchNorm1d, LeakyReLU."""
    def __init__(self, cin, cout, sigma=0.6, radius=0.5):
        super().__init__()
        self.sigma = sigma
        kp = torch.tensor([[0, 0, 0], [1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]], dtype=torch.float32)
        self.register_buffer("kernel_points", kp * radius)
        self.weight = nn.Parameter(torch.randn(kp.shape[0], cin, cout) / math.sqrt(cin * kp.shape[0]))
        self.bn = nn.BatchNorm1d(cout)
    def forward(self, pos, feat, idx):  # N, P, 3; N, P, C; N, P, K
        n, p, k = idx.shape
        flat = idx.reshape(n, p * k, 1)
        nb_pos = torch.gather(pos, 1, flat.expand(-1, -1, 3)).reshape(n, p, k, 3)
        nb_feat = torch.gather(feat, 1, flat.expand(-1, -1, feat.shape[-1])).reshape(n, p, k, -1)
        rel = nb_pos - pos[:, :, None]
        dist = (rel[:, :, :, None] - self.kernel_points).pow(2).sum(-1).sqrt()  # N, P, K, M
        out = torch.einsum("npkm,npkc,mcd->npd", F.relu(1 - dist / self.sigma), nb_feat, self.weight)
        return F.leaky_relu(self.bn(out.transpose(1, 2)).transpose(1, 2), 0.1)

class KPConvNet(nn.Module):
    """A KPConv segmentation network on 24 points in [−1, 1]³: 8 nearest neighbours (TopK of negated squared distances
    by a matmul), three KPConv layers (a constant 1 and the coordinates → 16 → 32 → 32), a global max concatenated
    to every point, a per-point MLP to 4 classes (N, 24, 4)."""
    def __init__(self, k=8, cout=4):
        super().__init__()
        self.k = k
        self.convs = nn.ModuleList(KPConv(cin, c) for cin, c in ((4, 16), (16, 32), (32, 32)))
        self.head = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, cout))
    def forward(self, pos):  # N, P, 3
        sq = (pos * pos).sum(-1)
        d = sq[:, :, None] + sq[:, None, :] - 2 * pos @ pos.transpose(1, 2)
        idx = (-d).topk(self.k, dim=-1)[1]
        h = torch.cat((torch.ones_like(pos[..., :1]), pos), -1)
        for conv in self.convs:
            h = conv(pos, h, idx)
        return self.head(torch.cat((h, h.max(1, keepdim=True)[0].expand_as(h)), -1))

class QRNNLayer(nn.Module):
    """A quasi-recurrent layer (Bradbury et al. 2017): a causal Conv1d of width 2 to candidate z (tanh), forget f and
    output o (sigmoid) gates; fo-pooling c_t = f_t c_{t−1} + (1 − f_t) z_t done in parallel: L = cumsum(log σ(f)),
    c = exp(L) · cumsum(exp(−L) (1 − f) z); h = o c."""
    def __init__(self, cin, c, window=2):
        super().__init__()
        self.window = window
        self.conv = nn.Conv1d(cin, 3 * c, window)
    def forward(self, x):  # N, T, C
        z, f, o = self.conv(F.pad(x.transpose(1, 2), (self.window - 1, 0))).transpose(1, 2).chunk(3, -1)
        logf = F.logsigmoid(f)
        cum = torch.cumsum(logf, 1)
        c = torch.exp(cum) * torch.cumsum(torch.exp(-cum) * (1 - logf.exp()) * torch.tanh(z), 1)
        return torch.sigmoid(o) * c

class QRNN(nn.Module):
    """A QRNN language-model body on 16 tokens: embeddings of 32, two residual QRNN layers, LayerNorm, a Linear
    (N, 16, 32)."""
    def __init__(self, vocab=128, d=32, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(QRNNLayer(d, d) for _ in range(layers))
        self.norm, self.out = nn.LayerNorm(d), nn.Linear(d, d)
    def forward(self, ids):  # N, T
        h = self.embed(ids)
        for layer in self.layers:
            h = h + layer(h)
        return self.out(self.norm(h))

class LambdaLayer(nn.Module):
    """A lambda layer (Bello 2021) over an S×S map: BatchNorm'd queries (4 heads × 8), keys (8, softmax over the
    positions), BatchNorm'd values (D / 4); the content lambda keysᵀ·values, position lambdas from a learned
    (2S−1)² × 8 relative table gathered by the positions' row / column offsets, both applied to the queries
    (einsums); the heads' outputs concatenated."""
    def __init__(self, d, size, heads=4, k=8):
        super().__init__()
        self.h, self.k, self.v = heads, k, d // heads
        self.q = nn.Sequential(nn.Conv2d(d, heads * k, 1, bias=False), nn.BatchNorm2d(heads * k))
        self.key = nn.Conv2d(d, k, 1, bias=False)
        self.val = nn.Sequential(nn.Conv2d(d, self.v, 1, bias=False), nn.BatchNorm2d(self.v))
        self.rel = nn.Parameter(torch.randn(2 * size - 1, 2 * size - 1, k) * 0.3)
        g = torch.arange(size)
        yy, xx = (c.reshape(-1) for c in torch.meshgrid(g, g, indexing="ij"))
        self.register_buffer("rel_y", yy[:, None] - yy[None] + size - 1)
        self.register_buffer("rel_x", xx[:, None] - xx[None] + size - 1)
    def forward(self, x):  # N, D, H, W
        b, d, hh, ww = x.shape
        q = self.q(x).reshape(b, self.h, self.k, hh * ww)
        keys = self.key(x).reshape(b, self.k, hh * ww).softmax(-1)
        v = self.val(x).reshape(b, self.v, hh * ww)
        content = torch.einsum("bkm,bvm->bkv", keys, v)
        position = torch.einsum("nmk,bvm->bnkv", self.rel[self.rel_y, self.rel_x], v)
        y = torch.einsum("bhkn,bkv->bhvn", q, content) + torch.einsum("bhkn,bnkv->bhvn", q, position)
        return y.reshape(b, d, hh, ww)

class LambdaNet(nn.Module):
    """A LambdaResNet-like classifier on 16×16 images: a stride-2 Conv–BN–ReLU stem to 32 channels at 8×8, two
    residual blocks of lambda layer, BatchNorm, ReLU and a 1×1 Conv, global average pooling, a Linear to 10 (N, 10)."""
    def __init__(self, d=32, size=8, classes=10):
        super().__init__()
        self.stem = _conv_bn_relu(3, d, 2)
        self.lambdas = nn.ModuleList(LambdaLayer(d, size) for _ in range(2))
        self.bns = nn.ModuleList(nn.BatchNorm2d(d) for _ in range(2))
        self.pws = nn.ModuleList(nn.Conv2d(d, d, 1) for _ in range(2))
        self.head = nn.Linear(d, classes)
    def forward(self, x):  # N, 3, 16, 16
        h = self.stem(x)
        for lam, bn, pw in zip(self.lambdas, self.bns, self.pws):
            h = h + pw(F.relu(bn(lam(h))))
        return self.head(h.mean((2, 3)))

class NeuralCDE(nn.Module):
    """A neural controlled differential equation (Kidger et al. 2020) on 8 observations of 3 channels at t = 0…7:
    the path [t; x] interpolated by a natural cubic spline (second derivatives by a fixed matrix, the solved
    tridiagonal system, times the knots), the hidden state (16) from the first observation, one RK4 step per knot
    interval of dz = f(z) dX/dt (f: a Softplus MLP to a tanh'd 16 × 4 matrix, contracted with the spline's derivative
    at the step's start, middle and end by an einsum), a Linear readout of every knot's state (N, 8, 2)."""
    def __init__(self, knots=8, cin=4, hid=16, width=32, cout=2):
        super().__init__()
        self.cin, self.hid = cin, hid
        a, b = torch.zeros(knots, knots), torch.zeros(knots, knots)
        a[0, 0] = a[-1, -1] = 1.0
        for i in range(1, knots - 1):
            a[i, i - 1:i + 2] = torch.tensor([1.0, 4.0, 1.0])
            b[i, i - 1:i + 2] = torch.tensor([6.0, -12.0, 6.0])
        self.register_buffer("second", torch.linalg.solve(a, b))
        self.init = nn.Linear(cin, hid)
        self.field = nn.Sequential(nn.Linear(hid, width), nn.Softplus(), nn.Linear(width, width), nn.Softplus(),
                                   nn.Linear(width, hid * cin), nn.Tanh())
        self.readout = nn.Linear(hid, cout)
    @staticmethod
    def dxdt(y, m, i, s):
        """The spline's derivative on [i, i + 1] at i + s (knot values y, second derivatives m)."""
        return y[:, i + 1] - y[:, i] - (2 * m[:, i] + m[:, i + 1]) / 6 + m[:, i] * s + (m[:, i + 1] - m[:, i]) * (s * s / 2)
    def f(self, z, dx):
        return torch.einsum("nhc,nc->nh", self.field(z).reshape(-1, self.hid, self.cin), dx)
    def forward(self, x):  # N, T, 3
        t = torch.arange(x.shape[1], dtype=x.dtype)[None, :, None].expand(x.shape[0], -1, 1)
        y = torch.cat((t, x), -1)
        m = self.second @ y
        z = self.init(y[:, 0])
        states = [z]
        for i in range(y.shape[1] - 1):
            d0, dh, d1 = (self.dxdt(y, m, i, s) for s in (0.0, 0.5, 1.0))
            k1 = self.f(z, d0)
            k2 = self.f(z + k1 / 2, dh)
            k3 = self.f(z + k2 / 2, dh)
            k4 = self.f(z + k3, d1)
            z = z + (k1 + 2 * k2 + 2 * k3 + k4) / 6
            states.append(z)
        return self.readout(torch.stack(states, 1))


#: arch -> (builder of the module, input maker(generator), source note)
ARCHS = {
    "bert": (corpus_models._bert, "text16", "corpus_models"),
    "gpt2": (corpus_models._gpt2, "text16", "corpus_models"),
    "llama": (_llama, "text12x2", "holdout_faults config (GQA: 4 query heads, 2 key/value heads)"),
    "distilbert": (_distilbert, "text12x2", "holdout_faults config"),
    "vit": (corpus_models._vit, "image16", "corpus_models"),
    "swin": (corpus_models._swin, "image32", "corpus_models, eager attention (window attention)"),
    "t5enc": (corpus_models._t5enc, "text16", "corpus_models, eager attention"),
    "whisper": (corpus_models._whisper, "mel", "corpus_models (encoder)"),
    "convnext": (corpus_models._convnext, "image32", "corpus_models"),
    "cnn": (ReLU6Net, "image16x2", "Conv+BN+ReLU6 (Clip), depthwise"),
    "rnn": (corpus_models.RecurrentNet, "tokens50", "corpus_models (LSTM ×2, LayerNorm, GRU)"),
    "unet": (UNet, "image32", "bilinear and nearest Resize, skip Concats"),
    # held-out (see above): not used while tuning; ``--archs heldout`` names them all
    "albert": (_albert, "text16", "shared layers, gelu_new"),
    "phi": (_phi, "text16", "partial rotary, parallel attention and MLP"),
    "segformer": (_segformer, "image32", "spatial-reduction attention, Mix-FFN, upsampling decode head"),
    "wav2vec2": (_wav2vec2, "wave400", "conv feature encoder, GroupNorm, grouped positional Conv"),
    "beit": (_beit, "image16", "relative position bias, layer scale"),
    "mobilebert": (_mobilebert, "text16", "bottlenecks, NoNorm"),
    "mobilese": (MobileSE, "image16x2", "squeeze-excitation, hard activations, GroupNorm, RMSNorm, PixelShuffle"),
    "tcn": (TCN, "seq8x20", "dilated causal Conv1d, weight norm, PReLU, GRU"),
    # second held-out set (see above): ``--archs heldout2``
    "bloom": (_bloom, "text16", "ALiBi attention, embedding LayerNorm"),
    "deberta": (_deberta, "text16", "disentangled relative attention (DeBERTa-v2)"),
    "convbert": (_convbert, "text16", "span-based dynamic convolution heads"),
    "mobilevit": (_mobilevit, "image64", "MobileNet blocks with unfolded-patch transformers"),
    "levit": (_levit, "image32", "attention with BatchNorm'd projections, hard-swish, attention biases"),
    "convnextv2": (_convnextv2, "image32", "global response normalization"),
    "clipvision": (_clipvision, "image16", "quick GELU, pre-LayerNorm, class token"),
    "bigcode": (_bigcode, "text16", "multi-query attention"),
    "conformer": (Conformer, "feat10x12", "macaron FFN, nn.MultiheadAttention, GLU, depthwise Conv1d, BatchNorm1d"),
    "video3d": (Video3D, "clip8", "Conv3d, BatchNorm3d, (2+1)D block, InstanceNorm3d, MaxPool3d"),
    # third held-out set (see above): ``--archs heldout3``
    "gemma": (_gemma, "text16", "RMSNorm (1 + weight), tanh GELU, scaled embedding, grouped-query rotary attention"),
    "falcon": (_falcon, "text16", "parallel attention, multi-query rotary attention"),
    "squeezebert": (_squeezebert, "text16", "grouped pointwise Conv1d layers"),
    "swinv2": (_swinv2, "image32", "cosine attention, clamped logit scale, continuous position bias MLP"),
    "dinov2": (_dinov2, "image16", "layer scale, SwiGLU FFN, interpolated position embedding"),
    "poolformer": (_poolformer, "image32", "pooling token mixer, GroupNorm, layer scale"),
    "efficientnet": (_efficientnet, "image32", "same-padded depthwise convolutions, squeeze-excitation, swish"),
    "mpnet": (_mpnet, "text16", "relative position buckets with a log"),
    "mixerdec": (MixerDecoder, "image16x2", "token-mixing MLP, ConvTranspose2d, bicubic upsampling, hardtanh"),
    "setenc": (SetEncoder, "set10x6", "einsum attention, L2 normalisation, cumsum, logsumexp"),
    # fourth held-out set (see above): ``--archs heldout4``
    "opt": (_opt, "text16", "ReLU FFN, learned positions with an offset, projected embedding"),
    "gptneox": (_gptneox, "text16", "partial rotary, parallel residual"),
    "funnel": (_funnel, "text16", "sequence pooling between blocks, relative attention"),
    "bit": (_bit, "image32", "weight-standardised convolutions, GroupNorm, same padding"),
    "pvtv2": (_pvtv2, "image32", "spatial-reduction attention, depthwise Conv FFN"),
    "focalnet": (_focalnet, "image32", "focal modulation, layer scale"),
    "hubert": (_hubert, "wave400", "conv feature encoder, stable layer norm"),
    "mobilenetv2": (_mobilenetv2, "image32", "TF padding, ReLU6, inverted residuals"),
    "roformer": (_roformer, "text16", "rotary attention in an encoder"),
    "graphnet": (GraphNet, "nodes12x5", "gathers, index_add, GRU cell, max readout"),
    "stn": (STN, "image16x2", "affine_grid, grid_sample, pixel_unshuffle, instance norm"),
    "pointnet": (PointNet, "points2x3x20", "cdist, top-k neighbour gather, max pooling"),
    # fifth held-out set (see above): ``--archs heldout5``
    "mistral": (_mistral, "text16", "sliding-window causal attention, grouped-query rotary heads"),
    "qwen2moe": (_qwen2moe, "text16", "mixture of experts (top-2 of 4, 3-D expert weights), gated shared expert, qkv bias"),
    "bart": (_bart, "text16", "encoder-decoder: right-shifted decoder inputs, causal decoder, cross-attention"),
    "yolos": (_yolos, "image32", "detection tokens, interpolated mid position embeddings"),
    "dpt": (_dpt, "image32", "ViT tokens reassembled at four scales, bilinear fusion, upsampling head"),
    "ast": (_ast, "spec32x16", "overlapping spectrogram patches, CLS and distillation tokens"),
    "diffunet": (DiffusionUNet, "image16t", "sinusoidal timestep embedding (2nd input), GroupNorm ResBlocks, SDPA, skip Concat"),
    "tfdecoder": (CausalDecoder, "text16", "nn.TransformerDecoder: causal mask, cross-attention, tied output weights"),
    "pixelcnn": (PixelCNN, "image16x2", "masked convolutions (weight × mask), gated tanh · sigmoid, log-softmax"),
    "seq2seq": (Seq2Seq, "feat10x12", "bidirectional LSTM, unrolled LSTMCell decoder, additive attention"),
    # sixth held-out set (see above): ``--archs heldout6``
    "gemma2": (_gemma2, "text16", "attention logit soft-capping (tanh), sliding-window layers, four norms a layer"),
    "cohere": (_cohere, "text16", "bias-free LayerNorm, parallel attention and MLP, interleaved rotary"),
    "modernbert": (_modernbert, "text16", "alternating global / local attention, GeGLU, no biases"),
    "mamba": (_mamba, "text16", "selective state-space scan unrolled over time, causal depthwise Conv1d"),
    "mobilevitv2": (_mobilevitv2, "image64", "separable linear self-attention over unfolded patches"),
    "cvt": (_cvt, "image32", "convolutional token embedding, depthwise-Conv + BatchNorm q/k/v projections"),
    "regnet": (_regnet, "image32", "grouped convolutions, squeeze-excitation"),
    "sew": (_sew, "wave400", "squeezed wav2vec2: pooled down, upsampled back"),
    "wavenet": (WaveNet, "wave400", "dilated causal Conv1d, gated units, residual and skip sums, MaxPool1d"),
    "stylenet": (StyleNet, "image16pair", "AdaIN instance statistics of two inputs, reflection pad, padded AvgPool"),
    # seventh held-out set (see above): ``--archs heldout7``
    "gptj": (_gptj, "text16", "interleaved rotary (every two), parallel attention and MLP, gelu_new"),
    "olmo": (_olmo, "text16", "non-parametric LayerNorm, q/k/v clipped"),
    "nemotron": (_nemotron, "text16", "LayerNorm with scale 1 + weight, squared-ReLU MLP, partial rotary"),
    "lfm2": (_lfm2, "text16", "gated short causal convolutions between attention layers, RMSNorm"),
    "wavlm": (_wavlm, "wave400", "gated relative position bias, conv feature encoder"),
    "swiftformer": (_swiftformer, "image32", "efficient additive attention, BatchNorm'd conv encoders"),
    "hiera": (_hiera, "image32", "mask-unit attention, unrolled tokens, pooled queries"),
    "superres": (SuperRes, "image16x2", "PixelShuffle, PReLU, bicubic residual"),
    "rnntagger": (RNNTagger, "tokens50", "bidirectional GRU, LSTM over the flipped sequence"),
    "fttransformer": (FTTransformer, "tab2x12", "per-feature embeddings, class token, ReGLU, nn.MultiheadAttention"),
    # eighth held-out set (see above): ``--archs heldout8``
    "esm": (_esm, "protein16", "rotary encoder, token-dropout embedding scaling, pre-LayerNorm"),
    "stablelm": (_stablelm, "text16", "per-head q/k LayerNorms, partial rotary, qkv bias"),
    "granite": (_granite, "text16", "embedding, attention and residual multipliers"),
    "encodec": (_encodec, "wave400", "SEANet: weight-normed Conv1d, reflect padding, ELU residual units, LSTM"),
    "patchtst": (_patchtst, "series2x32x3", "patched time series, std scaling, BatchNorm'd attention blocks"),
    "timesformer": (_timesformer, "video4x16", "divided space-time attention: temporal attention per patch, spatial per frame"),
    "dac": (_dac, "wave400", "snake activations, dilated residual Conv1d units"),
    "aspp": (ASPPNet, "image32", "atrous spatial pyramid pooling, image pooling branch, align_corners upsampling"),
    "gruenhancer": (GRUEnhancer, "spec2x10x12", "log1p, Conv1d front end, 2-layer GRU, sigmoid mask"),
    "dcgan": (DCGAN, "latent2x8", "ConvTranspose2d, BatchNorm, LeakyReLU, tanh"),
    # ninth held-out set (see above): ``--archs heldout9``
    "xlmroberta": (_xlmroberta, "text16", "position ids by a cumsum over the non-padding mask"),
    "pegasus": (_pegasus, "text16", "encoder-decoder: sinusoidal position tables, right-shifted decoder inputs"),
    "persimmon": (_persimmon, "text16", "partial rotary, per-head q/k LayerNorms, squared-ReLU MLP"),
    "electra": (_electra, "text16", "smaller embedding projected to the hidden size"),
    "deit": (_deit, "image16", "class and distillation tokens"),
    "mobilenetv3": (MobileNetV3, "image32", "hard-swish, squeeze-excitation with hard sigmoid, depthwise Conv, BatchNorm"),
    "cyclegan": (CycleGAN, "image32", "reflection padding, affine InstanceNorm, residual blocks, ConvTranspose2d, tanh"),
    "hifigan": (HiFiGAN, "mel8x16", "ConvTranspose1d upsamplers, dilated multi-receptive-field blocks, reflect pad"),
    "nanogpt": (NanoGPT, "text16", "causal mask by tril at run time, learned positions, tied LM head"),
    "vqvae": (VQVAE, "image32", "codebook distances, argmin, embedding gather, PixelShuffle decoder"),
    # tenth held-out set (see above): ``--archs heldout10``
    "qwen3": (_qwen3, "text16", "per-head q/k RMSNorms before rotary, grouped-query attention"),
    "phi3": (_phi3, "text16", "fused qkv and gate/up projections split by slicing, SwiGLU"),
    "codegen": (_codegen, "text16", "fused qkv split over four mp shards, interleaved partial rotary, parallel MLP"),
    "swin2sr": (_swin2sr, "image16", "×2 super-resolution: Swin V2 window attention groups, PixelShuffle upsampler"),
    "biogpt": (_biogpt, "text16", "scaled token embeddings, learned positions with an offset"),
    "patchtsmixer": (_patchtsmixer, "series2x32x3", "std scaling, patches, MLP mixing over patches/features/channels, gated attention"),
    "shufflenetv2": (ShuffleNetV2, "image32", "channel split, channel shuffle by reshape/transpose, depthwise Conv, BatchNorm"),
    "siren": (Siren, "coords2x64x2", "sine activations scaled by omega_0 = 30, SIREN initialisation"),
    "neuralode": (NeuralODE, "image16x2", "fixed-step RK4: one conv field's weights used 12 times, time channel"),
    "moe": (MoETransformer, "text16", "router softmax, TopK, GatherElements and one-hot ScatterElements expert combine"),
    # eleventh held-out set (see above): ``--archs heldout11``
    "deepseekv3": (_deepseekv3, "text16", "multi-head latent attention: low-rank q, compressed kv, split rope/nope heads"),
    "mpt": (_mpt, "text16", "ALiBi attention, q/k/v clipped, bias-free LayerNorms"),
    "gptneo": (_gptneo, "text16", "alternating global / local windowed causal attention, no attention scaling"),
    "starcoder2": (_starcoder2, "text16", "sliding-window grouped-query rotary attention, biases, LayerNorm"),
    "nystromformer": (_nystromformer, "text16", "landmark attention, iterative pseudo-inverse, depthwise Conv2d on v"),
    "rwkv": (_rwkv, "text16", "time-mix recurrence with exponential decays unrolled over time, token shift"),
    "capsnet": (CapsNet, "image16x2", "capsules: squash, three dynamic-routing iterations (softmax, agreement)"),
    "realnvp": (RealNVP, "image16x2", "affine couplings, exp of tanh scales, checkerboard / channel masks, log-det"),
    "retnet": (RetNet, "text16", "multi-scale retention: run-time decay mask, row-sum normalisation, GroupNorm, swish gate"),
    "kan": (KAN, "tab2x12", "B-spline bases by Cox-de Boor recursion, comparisons cast to float, SiLU base"),
    # twelfth held-out set (see above): ``--archs heldout12``
    "bigbird": (_bigbird, "text16", "block-sparse attention: gathered sliding-window, global and random key blocks"),
    "xlnet": (_xlnet, "text16", "relative attention with rel_shift, r_w / r_r biases, segment one-hot biases"),
    "diffllama": (_diffllama, "text16", "differential attention: two softmax maps subtracted by a learned lambda, head RMSNorm"),
    "xlstm": (_xlstm, "text16", "matrix LSTM: exponential input gates, log-sigmoid forget cumsum, chunkwise, soft caps"),
    "doge": (_doge, "text16", "dynamic mask attention: value-derived exp(A softplus(dt)) mask, top-k keys kept by scatter"),
    "perceiver": (Perceiver, "text16", "learned latent array cross-attending to the inputs, latent self-attention"),
    "involution": (InvNet, "image16x2", "per-pixel generated kernels over an unfolded (im2col) neighbourhood"),
    "hypernet": (HyperNet, "image16x2", "run-time generated weights: batch-grouped Conv, bmm, std/mean context"),
    "sinkhorn": (SinkhornMatcher, "setpair2x8x10", "dustbin row/column, log-space Sinkhorn: alternating logsumexp"),
    "aft": (AFTNet, "text16", "attention-free transformer: pairwise position biases, exp of max-shifted keys, sigmoid gate"),
    # thirteenth held-out set (see above): ``--archs heldout13``
    "switch": (SwitchEncoder, "text16", "top-1 routing with expert capacity: argmax one-hot, cumsum queue position, drops"),
    "recurrentgemma": (_recurrentgemma, "text16", "RG-LRU gated linear recurrence unrolled over time, causal Conv1d, local attention"),
    "gptoss": (_gptoss, "text16", "attention sinks concatenated to the scores, clamped SwiGLU, top-k expert routing"),
    "vitdet": (_vitdet, "image32", "window attention on a padded grid, decomposed relative position biases, Conv block"),
    "vitmae": (ViTMAE, "image16noise", "patches argsorted by a noise input, the kept half gathered (fewer output tokens)"),
    "canine": (_canine, "text16", "multiply-modulo hash embeddings, local attention, strided Conv1d to molecules and back"),
    "gat": (GAT, "graph2x10", "graph attention: LeakyReLU edge scores, non-edges of an adjacency input masked to -inf"),
    "tabnet": (TabNet, "tab2x12", "sparsemax masks (sort, cumsum, gathered threshold), prior scales, GLU blocks"),
    "deformconv": (DeformNet, "image16x2", "deformable conv by gathers: floored corners, clamped indices, bilinear weights"),
    "s4d": (S4DNet, "series2x32x3", "run-time Vandermonde kernel (exp, cos, sin), gathered causal Toeplitz matmul"),
    # fourteenth held-out set (see above): ``--archs heldout14``
    "layoutlmv3": (LayoutLMv3Text, "textbox16", "2-D layout embeddings gathered by box coordinates, 1-D and 2-D relative biases"),
    "fnet": (_fnet, "text16", "Fourier token mixing: real part of a 2-D DFT by run-time cos / sin matrices"),
    "bamba": (Bamba, "text16", "hybrid Mamba-2 SSD chunked scan (segment-sum exp mask, 5-D einsums) and GQA attention"),
    "conddetr": (ConditionalDETR, "image64", "ResNet backbone, sine position embeddings, object queries, conditional spatial queries"),
    "minimax": (_minimax, "text16", "lightning attention: block-wise linear attention with decay slopes, top-1 MoE"),
    "siglip": (SiglipPooled, "image32", "multihead attention pooling: a learned probe cross-attends to the patches"),
    "performer": (Performer, "text16", "FAVOR+ random features (exp, stabilisers), linear attention, causal cumsum of outer products"),
    "hyena": (HyenaNet, "text16", "implicit long filters from a sine MLP, run-time-kernel causal Conv1d, multiplicative gates"),
    "nerf": (NeRF, "rays2x16", "sinusoidal positional encoding, skip concat, volume rendering by exp and exclusive cumsum"),
    "slotattn": (SlotNet, "image16x2", "slot attention: softmax over slots, renormalised over inputs, GRUCell iterations"),
    # fifteenth held-out set (see above): ``--archs heldout15``
    "deformdetr": (DeformableDETR, "image64", "multi-scale deformable attention: offset sampling points, GridSample per level"),
    "pix2struct": (Pix2StructVision, "patches32", "row / column ids read from the float input as indices, padding-patch mask"),
    "qwen2vl": (Qwen2VLText, "textmrope16", "multimodal rotary: temporal / height / width position rows, per-section cos / sin"),
    "reformer": (Reformer, "text16", "chunked local attention, axial position embeddings, reversible streams, chunked FFN"),
    "prophetnet": (ProphetNet, "text16", "n-gram prediction streams, main / predict relative position buckets"),
    "glow": (Glow, "image16x2", "squeeze, ActNorm, LU-composed invertible 1x1 Conv, affine couplings, split prior, bits/dim"),
    "gmlp": (GMLP, "text16", "spatial gating: token-mixing matrix (causally masked), tiny attention, multiplicative gate"),
    "cfc": (CfCNet, "series2x16ts", "closed-form continuous-time cell: time gate by elapsed-time input, 16 unrolled steps"),
    "spiking": (SpikingNet, "image16x2", "leaky integrate-and-fire: Heaviside spikes by >= and cast, soft and hard resets"),
    "dgcnn": (DGCNN, "points2x3x20", "dynamic k-NN graphs: matmul distances, TopK, flat-index gather, max over neighbours"),
    # sixteenth held-out set (see above): ``--archs heldout16``
    "jetmoe": (JetMoe, "text16", "mixture of attention heads: top-2 routed q / o projection experts, scatter-add merge, MoE MLP"),
    "groupvit": (GroupViT, "image32", "group tokens, hard assignment by ArgMax one-hot ScatterElements, straight-through"),
    "luke": (Luke, "text16", "entity embeddings averaged over spans, entity-aware attention (four query projections)"),
    "univnet": (UnivNet, "melnoise8", "location-variable convolution: per-frame predicted kernels, gathered windows, einsum"),
    "timesfm": (TimesFm, "series2x32x3", "patched series normalised by the first patch, residual MLP embedding, softplus query scale"),
    "qat": (QATCNN, "image16x2", "fake quantization: QuantizeLinear / DequantizeLinear, per-channel run-time weight scales"),
    "dlrm": (DLRM, "dlrm2", "EmbeddingBag sum / mean / max with offsets (Loop), pairwise dot-product interaction"),
    "nbeats": (NBeats, "series2x32x3", "doubly residual blocks, fixed polynomial and Fourier bases, backcast subtraction"),
    "pointernet": (PointerNet, "points2x10", "unrolled LSTMCell decoder, glimpse, ArgMax one-hot visited mask, bmm selection"),
    "bnn": (BinaryNet, "image16x2", "binary activations and weights by Sign, mean |W| scales, Bi-Real shortcuts, hardtanh"),
    # seventeenth held-out set (see above): ``--archs heldout17``
    "yoso": (_yoso, "text16", "LSH-expectation attention: (1 - acos(q·k)/pi)^9 of L2-normalised q / k, no softmax"),
    "longt5": (LongT5, "text16", "transient-global attention: local blocks of 3 neighbours, per-block side tokens by one-hot sums"),
    "phimoe": (_phimoe, "text16", "sparsemixer routing: max-relative threshold masks, second expert after scattering -inf"),
    "qwen3next": (Qwen3Next, "text16", "gated delta rule: chunkwise UT transform by forward substitution, gated attention, MoE"),
    "sam": (Sam, "image64", "point prompts: random Fourier features, two-way transformer, hypernetwork mask heads"),
    "hrnet": (HRNetLite, "image32", "parallel multi-resolution branches, repeated exchange by strided Conv and upsampling"),
    "resnest": (ResNeSt, "image16x2", "split attention: radix-axis softmax over grouped Conv splits, avg-pool downsampling"),
    "octconv": (OctaveNet, "image16x2", "octave convolution: high / low frequency maps exchanged by pooling and upsampling"),
    "pointnetpp": (PointNetPP, "points2x3x20", "farthest point sampling (unrolled ArgMax), ball query by TopK, grouped max"),
    "cbam": (CBAMNet, "image16x2", "channel attention by avg + max pooled shared MLP, spatial attention over channel pools"),
    # eighteenth held-out set (see above): ``--archs heldout18``
    "gemma3n": (Gemma3n, "text16", "AltUp stream predict / correct, LAuReL, per-layer embeddings, Gaussian top-k, KV sharing"),
    "zamba2": (Zamba2, "text16", "Mamba-2 layers and one shared attention block at two depths with per-depth LoRA adapters"),
    "rtdetr": (RTDETR, "image64", "hybrid encoder, TopK query selection of encoder tokens, gathered anchors, deformable decoder"),
    "zoedepth": (ZoeDepth, "image16", "metric bins: cumsum bin centres, attractor shifts, sort, log-binomial softmax"),
    "llama4": (Llama4Text, "text16", "chunked attention, NoPE layer with log-position query temperature, input-scaled MoE"),
    "densenet": (DenseNet, "image16x2", "dense concatenation: every layer's output concatenated onto all earlier ones"),
    "inception": (InceptionNet, "image16x2", "parallel branches concatenated, 1×n / n×1 factorised and split Convs"),
    "schnet": (SchNet, "molecule2x12", "continuous-filter convolution: Gaussian RBF of distances, cosine cutoff, neighbour sums"),
    "tft": (TFT, "series2x32x3", "gated residual networks, softmax variable selection, shared-value interpretable attention"),
    "ntm": (NTM, "seq8x20", "external memory: cosine content addressing, circular shift by rolls, sharpening power"),
    # nineteenth held-out set (see above): ``--archs heldout19``
    "florence2": (Florence2Vision, "image32", "DaViT: window attention alternating with channel group attention, Conv position encodings"),
    "upernet": (UperNet, "image64", "pyramid pooling (adaptive pools 1 / 2 / 4), top-down FPN, multi-level upsample and fuse"),
    "qformer": (QFormer, "image16", "learned query tokens cross-attending to ViT patch tokens every layer, query FFN"),
    "eomt": (Eomt, "image32", "queries joined mid-ViT, masked attention thresholded from intermediate mask predictions"),
    "mllama": (MllamaVision, "video4x16", "tiles: aspect-ratio-gathered tanh-gated tile embeddings, tile mask, gated global layers"),
    "fno": (FNO, "series2x32x3", "Fourier neural operator: DFT / truncated inverse DFT as matmuls, complex mode-mixing einsums"),
    "transfoxl": (TransformerXL, "text16", "segment recurrence with memory, relative attention with u / v biases and relative shift"),
    "egnn": (EGNN, "molecule2x12", "E(n)-equivariant: distance messages, coordinate updates along pairwise differences"),
    "convlstm": (ConvLSTMNet, "video4x16", "convolutional LSTM gates with peepholes unrolled over frames, ConvTranspose2d head"),
    "tacotron2": (Tacotron2, "text16", "autoregressive decoder unrolled: location-sensitive attention, cumulative weights, postnet"),
    # twentieth held-out set (see above): ``--archs heldout20``
    "pixtral": (PixtralVision, "image32", "2-D rotary embeddings by patch row / column, patch grid cut to the image size"),
    "dabdetr": (DabDETR, "image64", "learned anchor boxes: sine-embedded positional queries, size-modulated attention, refined"),
    "apertus": (_apertus, "text16", "xIELU activation (learned quadratic / exponential branches), QK-norm, llama-3 rotary"),
    "lilt": (Lilt, "textbox16", "text and layout streams, each stream's attention scores the sum of both streams'"),
    "vitpose": (VitPose, "image64", "ViT with dataset-selected expert MLP parts (masked), ConvTranspose heatmap decoder"),
    "dit": (DiT, "image16t", "adaLN-Zero: timestep-regressed shift / scale / gate, affine-free LayerNorms, unpatchify"),
    "yolodfl": (YoloDFL, "image32", "distribution focal loss decoding: softmax over bins, integral, anchor-point boxes"),
    "linformer": (Linformer, "text16", "keys and values projected along the sequence axis to 4 rows"),
    "graphunet": (GraphUNet, "graph2x10", "gPool: TopK nodes gated by sigmoid scores, adjacency gathered; gUnpool by scatter"),
    "ecmoe": (ExpertChoiceNet, "text16", "expert-choice routing: TopK tokens per expert, gather, batched FFN, scatter-add"),
    # twenty-first held-out set (see above): ``--archs heldout21``
    "xclip": (XClipVision, "video4x16", "cross-frame message tokens: class tokens attend across frames, appended, sliced off"),
    "dectransformer": (DecisionTransformer, "traj10", "return / state / action tokens interleaved by stack and permute, de-interleaved"),
    "markuplm": (MarkupLM, "xpath16", "XPath embeddings: per-depth tag / subscript tables gathered from 3-D ids, concat, FFN"),
    "mgpstr": (MgpStr, "image16x32", "A³ token learners: grouped 1×1 Conv attention maps, softmax over patches, einsum pooling"),
    "parakeet": (Parakeet, "fbank64x16", "FastConformer: depthwise-separable Conv2d subsampling, rel-shift relative attention"),
    "centernet": (CenterNet, "image64", "NMS-free peaks by max-pool equality, flattened TopK, floor-division indices, gathers"),
    "kpconv": (KPConvNet, "cloud2x24", "kernel-point correlations ReLU(1 - |d|/sigma) of gathered k-NN neighbours, einsum"),
    "qrnn": (QRNN, "text16", "causal Conv1d gates, fo-pooling in log space: exp of a cumsum times a cumsum"),
    "lambdanet": (LambdaNet, "image16x2", "lambda layers: keys softmaxed over positions, content and relative position lambdas"),
    "ncde": (NeuralCDE, "series2x8x3", "natural cubic spline control path, RK4 of a matrix field contracted by einsum"),
}
#: the architectures the tool was tuned on, and the held-out ones
CORE = ("bert", "gpt2", "llama", "distilbert", "vit", "swin", "t5enc", "whisper", "convnext", "cnn", "rnn", "unet")
HELDOUT = ("albert", "phi", "segformer", "wav2vec2", "beit", "mobilebert", "mobilese", "tcn")
HELDOUT3 = ("gemma", "falcon", "squeezebert", "swinv2", "dinov2", "poolformer", "efficientnet", "mpnet", "mixerdec", "setenc")
HELDOUT4 = ("opt", "gptneox", "funnel", "bit", "pvtv2", "focalnet", "hubert", "mobilenetv2", "roformer", "graphnet",
            "stn", "pointnet")
HELDOUT5 = ("mistral", "qwen2moe", "bart", "yolos", "dpt", "ast", "diffunet", "tfdecoder", "pixelcnn", "seq2seq")
HELDOUT6 = ("gemma2", "cohere", "modernbert", "mamba", "mobilevitv2", "cvt", "regnet", "sew", "wavenet", "stylenet")
HELDOUT7 = ("gptj", "olmo", "nemotron", "lfm2", "wavlm", "swiftformer", "hiera", "superres", "rnntagger", "fttransformer")
HELDOUT8 = ("esm", "stablelm", "granite", "encodec", "patchtst", "timesformer", "dac", "aspp", "gruenhancer", "dcgan")
HELDOUT9 = ("xlmroberta", "pegasus", "persimmon", "electra", "deit", "mobilenetv3", "cyclegan", "hifigan", "nanogpt",
            "vqvae")
HELDOUT10 = ("qwen3", "phi3", "codegen", "swin2sr", "biogpt", "patchtsmixer", "shufflenetv2", "siren", "neuralode", "moe")
HELDOUT11 = ("deepseekv3", "mpt", "gptneo", "starcoder2", "nystromformer", "rwkv", "capsnet", "realnvp", "retnet", "kan")
HELDOUT12 = ("bigbird", "xlnet", "diffllama", "xlstm", "doge", "perceiver", "involution", "hypernet", "sinkhorn", "aft")
HELDOUT13 = ("switch", "recurrentgemma", "gptoss", "vitdet", "vitmae", "canine", "gat", "tabnet", "deformconv", "s4d")
HELDOUT14 = ("layoutlmv3", "fnet", "bamba", "conddetr", "minimax", "siglip", "performer", "hyena", "nerf", "slotattn")
HELDOUT15 = ("deformdetr", "pix2struct", "qwen2vl", "reformer", "prophetnet", "glow", "gmlp", "cfc", "spiking", "dgcnn")
HELDOUT16 = ("jetmoe", "groupvit", "luke", "univnet", "timesfm", "qat", "dlrm", "nbeats", "pointernet", "bnn")
HELDOUT17 = ("yoso", "longt5", "phimoe", "qwen3next", "sam", "hrnet", "resnest", "octconv", "pointnetpp", "cbam")
HELDOUT18 = ("gemma3n", "zamba2", "rtdetr", "zoedepth", "llama4", "densenet", "inception", "schnet", "tft", "ntm")
HELDOUT19 = ("florence2", "upernet", "qformer", "eomt", "mllama", "fno", "transfoxl", "egnn", "convlstm", "tacotron2")
HELDOUT20 = ("pixtral", "dabdetr", "apertus", "lilt", "vitpose", "dit", "yolodfl", "linformer", "graphunet", "ecmoe")
HELDOUT21 = ("xclip", "dectransformer", "markuplm", "mgpstr", "parakeet", "centernet", "kpconv", "qrnn", "lambdanet",
             "ncde")
HELDOUT2 = tuple(a for a in ARCHS if a not in CORE + HELDOUT + HELDOUT3 + HELDOUT4 + HELDOUT5 + HELDOUT6 + HELDOUT7
                 + HELDOUT8 + HELDOUT9 + HELDOUT10 + HELDOUT11 + HELDOUT12 + HELDOUT13 + HELDOUT14 + HELDOUT15
                 + HELDOUT16 + HELDOUT17 + HELDOUT18 + HELDOUT19 + HELDOUT20 + HELDOUT21)
#: transformers models run with eager attention: the dynamo exporter fails on Swin's and T5's SDPA
#: (scripts/corpus_models.py) and on BEiT's with a relative position bias, the TorchScript exporter on
#: LLaMA's grouped-query SDPA (and GPT-BigCode's multi-query one, Qwen2-MoE's, Qwen3's, Phi-3's, DiffLlama's,
#: Doge's, Bamba's, MiniMax's, Qwen2-VL's, PhiMoE's, Qwen3-Next's, Gemma 3n's, Llama 4's and Apertus's grouped-query
#: ones), the dynamo exporter again on Parakeet's (a view of SDPA's transposed output)
EAGER = {"swin", "t5enc", "llama", "beit", "bigcode", "gemma", "swinv2", "dinov2", "qwen2moe", "nemotron", "lfm2",
         "stablelm", "granite", "qwen3", "phi3", "diffllama", "doge", "bamba", "minimax", "qwen2vl", "phimoe",
         "qwen3next", "gemma3n", "llama4", "apertus", "parakeet"}

INPUTS = {
    "text16": lambda g: (torch.randint(0, 128, (1, 16), generator=g),),
    "text12x2": lambda g: (torch.randint(3, 200, (2, 12), generator=g),),
    "tokens50": lambda g: (torch.randint(0, 50, (2, 12), generator=g),),
    "image16": lambda g: (torch.randn(1, 3, 16, 16, generator=g),),
    "image16x2": lambda g: (torch.randn(2, 3, 16, 16, generator=g),),
    "image32": lambda g: (torch.randn(1, 3, 32, 32, generator=g),),
    "mel": lambda g: (torch.randn(1, 16, 32, generator=g),),
    "wave400": lambda g: (torch.randn(1, 400, generator=g),),
    "seq8x20": lambda g: (torch.randn(2, 8, 20, generator=g),),
    "image64": lambda g: (torch.randn(1, 3, 64, 64, generator=g),),
    "feat10x12": lambda g: (torch.randn(2, 12, 10, generator=g),),
    "clip8": lambda g: (torch.randn(1, 3, 4, 8, 8, generator=g),),
    "set10x6": lambda g: (torch.randn(2, 10, 6, generator=g),),
    "nodes12x5": lambda g: (torch.randn(12, 5, generator=g),),
    "points2x3x20": lambda g: (torch.randn(2, 3, 20, generator=g),),
    "spec32x16": lambda g: (torch.randn(1, 32, 16, generator=g),),
    "image16pair": lambda g: (torch.randn(1, 3, 16, 16, generator=g), torch.randn(1, 3, 16, 16, generator=g)),
    "tab2x12": lambda g: (torch.randn(2, 12, generator=g),),
    "protein16": lambda g: (torch.randint(4, 30, (1, 16), generator=g),),
    "series2x32x3": lambda g: (torch.randn(2, 32, 3, generator=g),),
    "spec2x10x12": lambda g: (torch.randn(2, 10, 12, generator=g),),
    "video4x16": lambda g: (torch.randn(1, 4, 3, 16, 16, generator=g),),
    "latent2x8": lambda g: (torch.randn(2, 8, generator=g),),
    "mel8x16": lambda g: (torch.randn(1, 8, 16, generator=g),),
    "image16t": lambda g: (torch.randn(2, 3, 16, 16, generator=g), torch.randint(0, 1000, (2,), generator=g).float()),
    "coords2x64x2": lambda g: (torch.rand(2, 64, 2, generator=g) * 2 - 1,),
    "setpair2x8x10": lambda g: (torch.randn(2, 8, 6, generator=g), torch.randn(2, 10, 6, generator=g)),
    "image16noise": lambda g: (torch.randn(2, 3, 16, 16, generator=g), torch.rand(2, 16, generator=g)),
    "graph2x10": lambda g: (torch.randn(2, 10, 6, generator=g),
                            ((torch.rand(2, 10, 10, generator=g) < 0.3) | torch.eye(10, dtype=torch.bool)).float()),
    "textbox16": lambda g: _text_boxes(g),
    "rays2x16": lambda g: _rays(g),
    "patches32": lambda g: _patches(g),
    "textmrope16": lambda g: _mrope_ids(g),
    "series2x16ts": lambda g: (torch.randn(2, 16, 3, generator=g), 0.2 + 1.8 * torch.rand(2, 16, generator=g)),
    "melnoise8": lambda g: (torch.randn(1, 8, 10, generator=g), torch.randn(1, 8, 16, generator=g)),
    "dlrm2": lambda g: _dlrm_inputs(g),
    "points2x10": lambda g: (torch.rand(2, 10, 2, generator=g),),
    "molecule2x12": lambda g: (torch.randint(1, 10, (2, 12), generator=g), torch.randn(2, 12, 3, generator=g) * 1.5),
    "traj10": lambda g: _trajectory(g),
    "xpath16": lambda g: _xpaths(g),
    "image16x32": lambda g: (torch.randn(1, 3, 16, 32, generator=g),),
    "fbank64x16": lambda g: (torch.randn(1, 64, 16, generator=g),),
    "cloud2x24": lambda g: (torch.rand(2, 24, 3, generator=g) * 2 - 1,),
    "series2x8x3": lambda g: (torch.randn(2, 8, 3, generator=g),),
}


def _text_boxes(g):
    """Token ids (1, 16) and their boxes (1, 16, 4): x0, y0 in [0, 100), x1 = x0 + w, y1 = y0 + h, w, h in [1, 28)."""
    ids = torch.randint(0, 128, (1, 16), generator=g)
    xy, wh = torch.randint(0, 100, (1, 16, 2), generator=g), torch.randint(1, 28, (1, 16, 2), generator=g)
    return ids, torch.cat((xy, xy + wh), -1)


def _rays(g):
    """Ray origins (2, 16, 3) near the origin and directions of length 1 to 1.2."""
    d = torch.randn(2, 16, 3, generator=g)
    origins = torch.randn(2, 16, 3, generator=g) * 0.3
    return origins, d / d.norm(dim=-1, keepdim=True) * (1 + 0.2 * torch.rand(2, 16, 1, generator=g))


def _patches(g):
    """Pix2Struct-style flattened patches (1, 32, 50): a 3×16×24 image cut into 4×4 patches (4 rows, 6 columns: 24
    patches), each row holding its 1-based row number, 1-based column number and 48 pixel values (row-major over
    the patch, channels last), then 8 all-zero padding patches."""
    img = torch.randn(1, 3, 16, 24, generator=g)
    pix = img.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 4, 5, 1).reshape(1, 24, 48)
    rows = torch.arange(1, 5).repeat_interleave(6).float()
    cols = torch.arange(1, 7).repeat(4).float()
    flat = torch.cat((rows[None, :, None], cols[None, :, None], pix), -1)
    return (torch.cat((flat, torch.zeros(1, 8, 50)), 1),)


def _mrope_ids(g):
    """Token ids (1, 16) and Qwen2-VL multimodal rotary position ids (3, 1, 16): 4 text tokens (positions 0–3 in all
    three rows), a 2×3 grid of vision tokens (temporal 4; height 4–5 by grid row; width 4–6 by grid column), 6 text
    tokens from 7 on, after the grid's largest position, as Qwen2-VL's get_rope_index numbers them."""
    ids = torch.randint(0, 128, (1, 16), generator=g)
    t, h, w = list(range(4)), list(range(4)), list(range(4))
    for r in range(2):
        for c in range(3):
            t.append(4)
            h.append(4 + r)
            w.append(4 + c)
    for k in range(7, 13):
        t.append(k)
        h.append(k)
        w.append(k)
    return ids, torch.tensor([t, h, w])[:, None, :]


def _dlrm_inputs(g):
    """DLRM's dense features (2, 8), a flat index row per table (3, 10: indices below 24, 16 and 12) and its offsets
    (3, 2): the first bag holds 3 to 7 of the indices, the second the rest."""
    dense = torch.randn(2, 8, generator=g)
    indices = torch.stack([torch.randint(0, rows, (10,), generator=g) for rows in (24, 16, 12)])
    splits = torch.randint(3, 8, (3, 1), generator=g)
    return dense, indices, torch.cat((torch.zeros_like(splits), splits), 1)



def _trajectory(g):
    """A 10-step trajectory: states (1, 10, 6), tanh'd actions (1, 10, 3), returns-to-go (1, 10, 1) and timesteps
    5…14 (1, 10)."""
    return (torch.randn(1, 10, 6, generator=g), torch.randn(1, 10, 3, generator=g).tanh(),
            torch.randn(1, 10, 1, generator=g), torch.arange(5, 15)[None])


def _xpaths(g):
    """Token ids (1, 16) and their XPaths: tag ids below 31 and subscript ids below 63 (1, 16, 6) for a depth of 1 to
    6 per token, the pad ids (31, 63) past it."""
    ids = torch.randint(0, 128, (1, 16), generator=g)
    inside = torch.arange(6) < torch.randint(1, 7, (1, 16, 1), generator=g)
    tags = torch.where(inside, torch.randint(0, 31, (1, 16, 6), generator=g), torch.tensor(31))
    subs = torch.where(inside, torch.randint(0, 63, (1, 16, 6), generator=g), torch.tensor(63))
    return ids, tags, subs

def build(name: str) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """``(model, inputs)`` for an architecture name, deterministic across processes."""
    builder, kind, _ = ARCHS[name]
    torch.manual_seed(SEED)
    model = builder()
    if name in EAGER:
        model.model.set_attn_implementation("eager")
    corpus_models.randomize(model)
    model.eval()
    return model, INPUTS[kind](torch.Generator().manual_seed(SEED + 1))


def calibration(name: str, n: int = 4) -> list[tuple[torch.Tensor, ...]]:
    """``n`` random inputs for static quantization, different from ``build``'s."""
    g = torch.Generator().manual_seed(SEED + 100)
    return [INPUTS[ARCHS[name][1]](g) for _ in range(n)]


MODEL_FILE = '''"""Model file for onnx-bisect, written by scripts/fault_sweep.py: {arch} from scripts/sweep_models.py."""
import sys

sys.path.insert(0, {scripts!r})
import sweep_models  # noqa: E402

_MODEL, _INPUTS = sweep_models.build({arch!r})


def get_model():
    return _MODEL


def get_inputs():
    return _INPUTS
'''


def model_file_text(arch: str, scripts_dir: str) -> str:
    """Source of a model file defining ``get_model()`` / ``get_inputs()`` for ``arch``."""
    return MODEL_FILE.format(arch=arch, scripts=scripts_dir)
