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
    decoding incrementally, or a (1,) tensor holding it (a static decoding step, one token: no
    host value read). The token table is an ``nn.Embedding`` that other modules may share.
    """

    def __init__(self, tokens: nn.Embedding, max_positions: int, dropout: float) -> None:
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(tokens.embedding_dim)
        self.register_buffer(
            "positions", sinusoidal_table(max_positions, tokens.embedding_dim), persistent=False
        )
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int | Tensor = 0) -> Tensor:
        T = tokens.size(1)
        if isinstance(offset, Tensor):  # (1,): within max_positions, as its cache was made
            positions = self.positions.index_select(0, offset)  # (1, D)
        elif offset + T > self.positions.size(0):
            raise ValueError(
                f"sequence reaches position {offset + T}, beyond max_positions="
                f"{self.positions.size(0)}; raise model.max_positions or shorten the input"
            )
        else:
            positions = self.positions[offset : offset + T]  # (T, D)
        x = self.tokens(tokens) * self.scale + positions  # (B, T, D)
        return self.dropout(x)
