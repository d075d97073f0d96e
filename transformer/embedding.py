"""Token embeddings scaled by sqrt(d_model) plus absolute positions: sinusoidal (Vaswani et al.
2017), learned (Gehring et al. 2017), or none where attention encodes positions (rotary or a
relative bias, :mod:`transformer.positions`)."""

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
    ``positions``: ``sinusoidal`` (a fixed table, not saved), ``learned`` (a (max_positions, D)
    parameter, initialised as the token embeddings are), or anything else: none added.
    """

    no_weight_decay = True  # its own parameter, the learned positions, is a looked-up table

    def __init__(
        self, tokens: nn.Embedding, max_positions: int, dropout: float,
        positions: str = "sinusoidal",
    ) -> None:  # fmt: skip
        super().__init__()
        self.tokens = tokens
        self.scale = math.sqrt(tokens.embedding_dim)
        self.max_positions = max_positions
        if positions == "sinusoidal":
            table = sinusoidal_table(max_positions, tokens.embedding_dim)
            self.register_buffer("positions", table, persistent=False)
        elif positions == "learned":
            table = torch.randn(max_positions, tokens.embedding_dim) * tokens.embedding_dim**-0.5
            self.positions = nn.Parameter(table)
        else:
            self.positions = None
        self.dropout = Dropout(dropout)

    def forward(self, tokens: Tensor, offset: int | Tensor = 0) -> Tensor:
        T = tokens.size(1)
        if not isinstance(offset, Tensor) and offset + T > self.max_positions:
            raise ValueError(
                f"sequence reaches position {offset + T}, beyond max_positions="
                f"{self.max_positions}; raise model.max_positions or shorten the input"
            )
        x = self.tokens(tokens) * self.scale  # (B, T, D)
        if self.positions is None:  # positions are the attention's
            return self.dropout(x)
        if isinstance(offset, Tensor):  # (1,): within max_positions, as its cache was made
            positions = self.positions.index_select(0, offset)  # (1, D)
        else:
            positions = self.positions[offset : offset + T]  # (T, D)
        return self.dropout(x + positions)
