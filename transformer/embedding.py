"""Token embeddings scaled by sqrt(d_model) plus sinusoidal positions (Vaswani et al. 2017)."""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from transformer.dropout import Dropout


def sinusoidal_table(max_positions: int, d_model: int) -> Tensor:
    """(P, D): sin on even dimensions, cos on odd, wavelengths from 2*pi to 10000*2*pi."""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)  # (P, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq[: d_model // 2])
    return table


class TransformerEmbedding(nn.Module):
    """tokens (B, T) -> dropout(embedding * sqrt(D) + position) (B, T, D).

    ``offset`` is the position of the first token: the number of steps already decoded when
    decoding incrementally. The token table is an ``nn.Embedding`` that other modules may share.
    """

    def __init__(self, tokens: nn.Embedding, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(tokens.embedding_dim)
        self.register_buffer(
            "positions", sinusoidal_table(max_positions, tokens.embedding_dim), persistent=False
        )
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        T = tokens.size(1)
        if offset + T > self.positions.size(0):
            raise ValueError(
                f"sequence reaches position {offset + T}, beyond max_positions="
                f"{self.positions.size(0)}; raise model.max_positions or shorten the input"
            )
        x = self.tokens(tokens) * self.scale + self.positions[offset : offset + T]  # (B, T, D)
        return self.dropout(x)
