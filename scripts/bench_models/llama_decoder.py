"""A LLaMA-style decoder (transformers ``LlamaModel``, seeded random weights) of a size given by the
environment: ``LLAMA_SIZE=hidden,intermediate,layers,heads,kv_heads,vocab,tokens`` (default: 0.3 B parameters,
hidden 1024, 24 layers, grouped-query attention, 64 tokens).  Used by ``scripts/bench_scale.py``."""
import os

import torch
from transformers import LlamaConfig, LlamaModel

DEFAULT = "1024,2816,24,16,4,32000,64"


def _size():
    hidden, inter, layers, heads, kv, vocab, tokens = (int(x) for x in os.environ.get("LLAMA_SIZE", DEFAULT).split(","))
    return dict(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv, vocab_size=vocab, max_position_embeddings=max(2048, tokens)), tokens


class Decoder(torch.nn.Module):
    """The decoder's last hidden state, without a key/value cache."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        config, _ = _size()
        self.model = LlamaModel(LlamaConfig(**config, use_cache=False))

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


def get_model():
    return Decoder().eval()


def get_inputs():
    config, tokens = _size()
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, config["vocab_size"], (1, tokens), generator=g),)
