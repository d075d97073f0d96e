"""Position encodings other than the embedding's sinusoids (``model.positions``, see
:mod:`transformer.config`): rotary embeddings of self-attention's queries and keys (Su et al. 2021),
T5's bucketed relative attention bias (Raffel et al. 2020) and ALiBi's linear biases (Press et al.
2022).

All act on self-attention only (cross-attention has none, as in T5 and in CTranslate2) and all
take the position of a call's first query as an int or, in a static decoding step, as a (1,)
device tensor, so that a CUDA graph reads it rather than baking it in. Rotary tables are halves
(GPT-NeoX's and Llama's layout, CTranslate2's ``rotary_interleave=False``): dimension i of a head
pairs with dimension i + Dh/2. The relative bias is one (buckets, H) table per layer stack, shared
by its layers as in T5 and as CTranslate2 computes it (its first layer's table serves them all).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

ROTARY_BASE = 10000.0
RELATIVE_BUCKETS = 32  # T5's
RELATIVE_MAX_DISTANCE = 128  # T5's: distances beyond share the last bucket


def key_minus_query(offset: int | Tensor, queries: int, keys: int, device: torch.device) -> Tensor:
    """(Tq, Tk) the position of each key 0..keys-1 minus that of each query, the queries at
    offset, offset + 1, ... (offset: int or (1,) tensor)."""
    q = torch.arange(queries, device=device)[:, None] + offset  # (Tq, 1)
    return torch.arange(keys, device=device)[None, :] - q


class Rotary(nn.Module):
    """cos and sin tables of rotary embeddings, (max_positions, Dh/2) each, not saved."""

    def __init__(self, head_dim: int, max_positions: int, base: float = ROTARY_BASE) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rotary positions need an even head dimension, got {head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.arange(max_positions, dtype=torch.float64)[:, None] * inv_freq  # (P, Dh/2)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, offset: int | Tensor, steps: int) -> tuple[Tensor, Tensor]:
        """cos and sin of the positions offset.. (offset: int or (1,) tensor): (steps, Dh/2)."""
        if isinstance(offset, Tensor):  # a static step: the device position, no host read
            return self.cos.index_select(0, offset), self.sin.index_select(0, offset)
        if offset + steps > self.cos.size(0):
            raise ValueError(
                f"sequence reaches position {offset + steps}, beyond max_positions="
                f"{self.cos.size(0)}; raise model.max_positions or shorten the input"
            )
        return self.cos[offset : offset + steps], self.sin[offset : offset + steps]


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of heads x (B, T, N, Dh) at the positions of cos, sin (T, Dh/2): the pair
    (x_i, x_{i+Dh/2}) turned by position * base^(-2i/Dh). Computed in float32 at least."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, T, N, Dh/2) each
    cos, sin = cos[:, None], sin[:, None]  # (T, 1, Dh/2)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def relative_buckets(
    relative: Tensor, bidirectional: bool, buckets: int = RELATIVE_BUCKETS,
    max_distance: int = RELATIVE_MAX_DISTANCE,
) -> Tensor:  # fmt: skip
    """T5's bucket of each relative position (key - query): exact below half the buckets (of a
    direction), logarithmic up to ``max_distance``. Unidirectional (a causal decoder): later keys
    share the bucket of distance 0 (the causal mask hides them). The same integer arithmetic as
    Hugging Face's T5 and CTranslate2's ``get_relative_position_bucket``."""
    bucket = torch.zeros_like(relative)
    if bidirectional:
        buckets //= 2
        bucket = bucket + (relative > 0).long() * buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    exact = buckets // 2
    scaled = (distance.float() / exact).log() / math.log(max_distance / exact) * (buckets - exact)
    large = (exact + scaled.long()).clamp(max=buckets - 1)  # (log 0 = -inf: only where small)
    return bucket + torch.where(distance < exact, distance, large)


class RelativeBias(nn.Module):
    """One learned bias per head and bucket of relative distance, ``weight`` (buckets, H):
    -> (1, H, Tq, Tk) additive attention bias."""

    no_weight_decay = True  # a looked-up table (transformer.training.optim.param_groups)

    def __init__(self, num_heads: int, bidirectional: bool) -> None:
        super().__init__()
        self.bidirectional = bidirectional
        self.weight = nn.Parameter(torch.zeros(RELATIVE_BUCKETS, num_heads))

    def forward(self, offset: int | Tensor, queries: int, keys: int) -> Tensor:
        """Bias of queries at positions offset.. (int or (1,) tensor) over keys 0..keys-1."""
        relative = key_minus_query(offset, queries, keys, self.weight.device)  # (Tq, Tk)
        bucket = relative_buckets(relative, self.bidirectional)  # (Tq, Tk)
        # Contiguous: CUDA's fused kernels take a mask only with a last-dimension stride of 1.
        return self.weight[bucket].permute(2, 0, 1).contiguous().unsqueeze(0)  # (1, H, Tq, Tk)


def alibi_slopes(num_heads: int) -> Tensor:
    """(H,) ALiBi's slope of each head: 2^(-8/n), 2^(-16/n), ..., 2^(-8) for n = H a power of
    two; otherwise those of n, the largest power of two below H, then every other slope of 2n's
    sequence (2^(-4/n), 2^(-12/n), ...) for the remaining heads, as the paper's code does."""
    n = 2 ** int(math.log2(num_heads))
    slopes = [2 ** (-8 * (i + 1) / n) for i in range(n)]
    slopes += [2 ** (-8 * (i + 1) / (2 * n)) for i in range(0, 2 * n, 2)][: num_heads - n]
    return torch.tensor(slopes)


class LinearBias(nn.Module):
    """ALiBi: a fixed bias per head, falling linearly with the distance between query and key,
    -slope_h * |key - query| (the same both ways in the encoder, as NeMo's bidirectional ALiBi;
    the decoder's causal mask hides later keys) -> (1, H, Tq, Tk) additive attention bias. No
    weights: the slopes are a buffer, not saved."""

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(num_heads), persistent=False)

    def forward(self, offset: int | Tensor, queries: int, keys: int) -> Tensor:
        """Bias of queries at positions offset.. (int or (1,) tensor) over keys 0..keys-1."""
        relative = key_minus_query(offset, queries, keys, self.slopes.device)  # (Tq, Tk)
        distance = relative.abs().to(self.slopes.dtype)
        return (-self.slopes[:, None, None] * distance).unsqueeze(0)  # (1, H, Tq, Tk)
