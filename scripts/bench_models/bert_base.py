"""bert-base (transformers config defaults, random seeded weights), sequence length 128."""
import torch
from transformers import BertConfig, BertModel


class BertEncoder(torch.nn.Module):
    """Returns the last hidden state, so both exporters can trace it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.bert = BertModel(BertConfig())

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids).last_hidden_state


def get_model():
    return BertEncoder().eval()


def get_inputs():
    g = torch.Generator().manual_seed(1)
    return (torch.randint(0, 30522, (1, 128), generator=g),)
