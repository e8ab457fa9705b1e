"""Coverage triage on clean architectures: no node may be called unsupported or falling back.

    python scripts/coverage_corpus.py [--archs bert,gpt2] [--exporters dynamo,torchscript]

Builds small BERT, ViT, GPT-2, ResNet, T5 (transformers configs, random
weights) and a Conv-BN CNN, exports each with both exporters through the
export triage (a failed export is listed with its operator and source line),
triages the files against CUDAExecutionProvider + CPUExecutionProvider (CUDA is reported
as not assessed in a CPU build) and prints one row per export.  Exit 1 when a
clean export gets an "unsupported" or "falls back" claim.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import onnx
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from archs import ConvBN  # noqa: E402

from onnx_bisect.coverage import Status, triage  # noqa: E402
from onnx_bisect.coverage.export_problems import format_problem  # noqa: E402
from onnx_bisect.pipeline.coverage import triage_export  # noqa: E402
from onnx_bisect.records import ModelInputs  # noqa: E402

PROVIDERS = ("CUDAExecutionProvider", "CPUExecutionProvider")


class Hidden(nn.Module):
    """Calls a transformers model with keyword inputs and returns its last hidden state."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args))).last_hidden_state


def build(name: str):
    """``(model, inputs)`` for an architecture name, deterministic."""
    import transformers as tf

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (1, 16), generator=g)
    if name == "bert":
        cfg = tf.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64)
        return Hidden(tf.BertModel(cfg), ["input_ids"]).eval(), (ids,)
    if name == "vit":
        cfg = tf.ViTConfig(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64)
        return Hidden(tf.ViTModel(cfg, add_pooling_layer=False), ["pixel_values"]).eval(), (
            torch.randn(1, 3, 16, 16, generator=g),)
    if name == "gpt2":
        cfg = tf.GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=2, use_cache=False)
        return Hidden(tf.GPT2Model(cfg), ["input_ids"]).eval(), (ids,)
    if name == "resnet":
        cfg = tf.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
        return Hidden(tf.ResNetModel(cfg), ["pixel_values"]).eval(), (torch.randn(1, 3, 32, 32, generator=g),)
    if name == "t5":
        cfg = tf.T5Config(vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=2, use_cache=False)
        return Hidden(tf.T5Model(cfg), ["input_ids", "decoder_input_ids"]).eval(), (ids, ids[:, :8])
    if name == "cnn":
        return ConvBN().eval(), (torch.randn(2, 3, 16, 16, generator=g),)
    raise SystemExit(f"unknown architecture {name}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="bert,vit,gpt2,resnet,t5,cnn")
    parser.add_argument("--exporters", default="dynamo,torchscript")
    args = parser.parse_args()
    rows, bad = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.archs.split(","):
            model, inputs = build(arch)
            names = tuple(f"input_{i}" for i in range(len(inputs)))
            attempts, protos = triage_export(model, ModelInputs(args=inputs, kwargs={}, names=names))
            for attempt in attempts:
                if attempt.exporter not in args.exporters.split(","):
                    continue
                if not attempt.ok:
                    first = next((p for p in attempt.problems if p.fatal), None)
                    what = format_problem(first).split(": ", 1)[1] if first else "unknown"
                    rows.append(f"| {arch} | {attempt.exporter} | export failed: {what[:160]} | | | | | | | |")
                    continue
                path = Path(tmp, f"{arch}.{attempt.exporter}.onnx")
                onnx.save(protos[attempt.exporter], path)
                start = time.perf_counter()
                report = triage(str(path), providers=PROVIDERS)
                seconds = time.perf_counter() - start
                counts = [report.count(s) for s in Status]
                bad += counts[0] + counts[1]
                placed = len(report.placement.assigned) + len(report.placement.expanded)
                rows.append(f"| {arch} | {attempt.exporter} | {len(report.findings)} | "
                            + " | ".join(map(str, counts)) + f" | {placed} | {seconds:.2f}s |")
    print("| arch | exporter | nodes | unsupported | falls back | needs newer opset | risky | ok | placed by session "
          "| triage time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(f"\n{bad} unsupported/falls-back claims on clean architectures"
          f" (providers: {', '.join(PROVIDERS)}; CUDA is not in this build and is reported as not assessed).")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
