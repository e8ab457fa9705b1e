"""Held-out check: architectures the alignment was never tuned on, clean and with planted weight faults.

    python scripts/holdout_faults.py [--archs llama,roberta,...] [--provenances dynamo,slim:torchscript,...]
                                     [--faults 4] [--noise 0.3]

Each architecture is built from a ``transformers`` config with seeded random
weights (LLaMA, RoBERTa, ALBERT, DistilBERT, DeiT, SegFormer, Wav2Vec2 — none of
them in ``scripts/corpus_models.py``), exported, and rewritten (onnxslim, the
float16 converter with ``keep_io_types``, ONNX Runtime's extended offline
optimization).  For every file:

* the clean file must show no layer that introduces error (float16 files are
  checked at the default tolerance too: their outputs may diverge, as float16
  cannot meet 1e-4, but only as precision along the path, never a layer);
* ``--faults`` weights feeding MatMul/Gemm/Conv nodes, spread over the graph,
  get Gaussian noise of ``--noise`` times their spread, one at a time; when the
  outputs then diverge, the first divergence must hold the planted node in its
  segment (``pinned``), be blamed on the module that owns the weight
  (``module``), and be diagnosed ``weight-mismatch`` (``cause``).  A fault that
  does not reach the outputs beyond tolerance is counted as ``hidden`` (the
  report then warns when a layer inside still diverges).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))
import rewrites  # noqa: E402

import onnx_bisect  # noqa: E402
from onnx_bisect.records import ErrorOrigin  # noqa: E402

PROVENANCES = ("dynamo", "torchscript", "slim:dynamo", "slim:torchscript", "fp16:dynamo", "fp16:torchscript",
               "ort-extended:dynamo", "ort-extended:torchscript")
LAYER_OPS = ("MatMul", "Gemm", "Conv")


class _Hidden(torch.nn.Module):
    def __init__(self, model, key):
        super().__init__()
        self.m, self.key = model, key

    def forward(self, x):
        return self.m(**{self.key: x}).last_hidden_state


#: name -> (model class, config class, config, extra model arguments, input kind); all small, seeded
SMALL = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
SPECS = {
    "llama": ("LlamaModel", "LlamaConfig", dict(SMALL, vocab_size=200, hidden_size=64, num_key_value_heads=2,
                                                  max_position_embeddings=64), {}, "text"),
    "roberta": ("RobertaModel", "RobertaConfig", dict(SMALL, vocab_size=200, hidden_size=64,
                                                      max_position_embeddings=64), {"add_pooling_layer": False}, "text"),
    "albert": ("AlbertModel", "AlbertConfig", dict(SMALL, vocab_size=200, embedding_size=32, hidden_size=64,
                                                   max_position_embeddings=64), {"add_pooling_layer": False}, "text"),
    "distilbert": ("DistilBertModel", "DistilBertConfig", dict(vocab_size=200, dim=64, n_layers=2, n_heads=4,
                                                               hidden_dim=128, max_position_embeddings=64), {}, "text"),
    "deit": ("DeiTModel", "DeiTConfig", dict(SMALL, image_size=32, patch_size=8, hidden_size=64),
             {"add_pooling_layer": False}, "image"),
    "segformer": ("SegformerModel", "SegformerConfig", dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1],
                                                            hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                                            decoder_hidden_size=32, patch_sizes=[7, 3],
                                                            strides=[4, 2]), {}, "image"),
    "wav2vec2": ("Wav2Vec2Model", "Wav2Vec2Config", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=64, conv_dim=(16, 16), conv_stride=(5, 2),
                                                         conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                                                         num_conv_pos_embedding_groups=4, do_stable_layer_norm=True),
                 {}, "audio"),
}
#: input kind -> (forward keyword, input maker)
INPUTS = {
    "text": ("input_ids", lambda g: torch.randint(3, 200, (2, 12), generator=g)),
    "image": ("pixel_values", lambda g: torch.randn(2, 3, 32, 32, generator=g)),
    "audio": ("input_values", lambda g: torch.randn(2, 800, generator=g)),
}


def build(name: str):
    """``(model, inputs)``: a small seeded ``transformers`` model returning its last hidden state."""
    import transformers

    model_class, config_class, config, extra, kind = SPECS[name]
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config), **extra)
    key, make = INPUTS[kind]
    return _Hidden(model, key).eval(), (make(torch.Generator().manual_seed(1)),)


def make_file(model, inputs, provenance: str):
    kind, _, exporter = provenance.rpartition(":")
    proto = rewrites.export(model, inputs, exporter)
    return rewrites.rewrite(proto, kind) if kind else proto


def spread(items: list, n: int) -> list:
    """``n`` items evenly spread over ``items`` (first and last included)."""
    if len(items) <= n:
        return items
    return [items[round(i * (len(items) - 1) / (n - 1))] for i in range(n)] if n > 1 else items[:1]


def measure(arch: str, provenance: str, faults: int, noise: float) -> dict:
    model, inputs = build(arch)
    proto = make_file(model, inputs, provenance)
    clean = onnx_bisect.bisect(model, inputs, onnx=proto)
    introduced = [r.pair.activation.name for r in clean.layers if r.origin is ErrorOrigin.INTRODUCED]
    fd = clean.first_divergence
    clean_ok = not introduced and (clean.ok or (provenance.startswith("fp16") and fd is not None
                                                 and fd.cause == "precision" and not fd.introduced))
    ops = {n.name: n.op_type for n in proto.graph.node}
    sites = spread([(w, node) for w, node in rewrites.weights(proto) if ops.get(node) in LAYER_OPS], faults)
    row = {"arch": arch, "provenance": provenance, "clean_ok": clean_ok, "clean_introduced": introduced,
           "planted": 0, "hidden": 0, "pinned": 0, "module": 0, "cause": 0, "misses": []}
    for weight, node in sites:
        report = onnx_bisect.bisect(model, inputs, onnx=rewrites.perturb(proto, weight, noise))
        if report.ok:
            row["hidden"] += 1
            continue
        row["planted"] += 1
        fd = report.first_divergence
        owner = rewrites.owner(model, proto, weight)
        pinned = fd is not None and node in fd.layer.segment
        module = fd is not None and owner is not None and fd.layer.pair.activation.module.startswith(owner)
        cause = fd is not None and fd.cause == "weight-mismatch"
        row["pinned"] += pinned
        row["module"] += module or owner is None and pinned
        row["cause"] += cause
        if not (pinned and cause):
            row["misses"].append(f"{weight}@{node}: blamed {fd.layer.pair.activation.name if fd else None} "
                                 f"({fd.cause if fd else None})")
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(SPECS))
    parser.add_argument("--provenances", default=",".join(PROVENANCES))
    parser.add_argument("--faults", type=int, default=4, help="weights planted per file")
    parser.add_argument("--noise", type=float, default=0.3, help="noise, times the weight's spread")
    a = parser.parse_args()
    import logging
    import warnings

    from tabulate import tabulate

    logging.disable(logging.WARNING)  # exporter chatter
    warnings.filterwarnings("ignore")

    rows, start = [], time.perf_counter()
    for arch in a.archs.split(","):
        for prov in a.provenances.split(","):
            try:
                row = measure(arch, prov, a.faults, a.noise)
            except Exception as exc:  # noqa: BLE001 - an exporter or converter that fails is reported, not fatal
                row = {"arch": arch, "provenance": prov, "error": f"{type(exc).__name__}: {str(exc)[:90]}"}
            rows.append(row)
            print(f"[{time.perf_counter() - start:6.1f}s] {arch} {prov}: "
                  + (row.get("error") or f"clean {'ok' if row['clean_ok'] else 'FALSE DIVERGENCE'}, "
                                         f"pinned {row['pinned']}/{row['planted']}, hidden {row['hidden']}"),
                  flush=True)
    table = [[r["arch"], r["provenance"], "ERROR" if "error" in r else ("ok" if r["clean_ok"] else "FALSE DIV"),
              r.get("planted", "-"), r.get("hidden", "-"), r.get("pinned", "-"), r.get("module", "-"),
              r.get("cause", "-"), "; ".join(r.get("misses", [])[:2]) or r.get("error", "")] for r in rows]
    print(tabulate(table, headers=["arch", "provenance", "clean", "planted", "hidden", "pinned", "module", "cause",
                                   "misses / error"]))
    done = [r for r in rows if "error" not in r]
    planted = sum(r["planted"] for r in done)
    print(f"\nClean files without a false divergence: {sum(r['clean_ok'] for r in done)}/{len(done)}; "
          f"faults reaching the outputs: {planted}, pinned to their node {sum(r['pinned'] for r in done)}, "
          f"to the owning module {sum(r['module'] for r in done)}, diagnosed weight-mismatch "
          f"{sum(r['cause'] for r in done)}; hidden by the model: {sum(r['hidden'] for r in done)}; "
          f"files that could not be made: {len(rows) - len(done)}.")
    ok = all(r["clean_ok"] for r in done) and all(r["pinned"] == r["planted"] for r in done)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
