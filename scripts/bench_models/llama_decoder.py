"""A LLaMA-style decoder (transformers ``LlamaModel``, seeded random weights) of a size given by the
environment: ``LLAMA_SIZE=hidden,intermediate,layers,heads,kv_heads,vocab,tokens`` (default: 0.3 B parameters,
hidden 1024, 24 layers, grouped-query attention, 64 tokens).  Used by ``scripts/bench_scale.py``.

With ``LLAMA_FAULT=1`` the middle layer's ``mlp.down_proj`` exports a weight with 5 % noise (a buffer read only
while ``torch.export`` traces): a stale weight in onnx-bisect's own export, for the benchmark's planted fault."""
import os

import torch
from transformers import LlamaConfig, LlamaModel

DEFAULT = "1024,2816,24,16,4,32000,64"


def _size():
    hidden, inter, layers, heads, kv, vocab, tokens = (int(x) for x in os.environ.get("LLAMA_SIZE", DEFAULT).split(","))
    return dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=max(2048, tokens)), tokens


class StaleWeight(torch.nn.Module):
    """A Linear whose export reads a perturbed copy of its weight."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias
        g = torch.Generator().manual_seed(0)
        noise = torch.randn(linear.weight.shape, generator=g) * 0.05 * linear.weight.detach().std()
        self.register_buffer("exported_weight", linear.weight.detach() + noise)

    def forward(self, x):
        w = self.exported_weight if torch.compiler.is_exporting() else self.weight
        return torch.nn.functional.linear(x, w, self.bias)


class Decoder(torch.nn.Module):
    """The decoder's last hidden state, without a key/value cache."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        config, _ = _size()
        self.model = LlamaModel(LlamaConfig(**config, use_cache=False))
        if os.environ.get("LLAMA_FAULT") == "1":
            mlp = self.model.layers[len(self.model.layers) // 2].mlp
            mlp.down_proj = StaleWeight(mlp.down_proj)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def get_model():
    return Decoder().eval()


def get_inputs():
    config, tokens = _size()
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, config["vocab_size"], (1, tokens), generator=g),)
