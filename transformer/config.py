"""Model configuration: one validated dataclass, the single source of a model's shape."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

ATTENTION_TYPES = ("encoder_self", "decoder_self", "cross")
ACTIVATIONS = ("relu", "gelu", "silu")
POSITIONS = ("sinusoidal", "learned", "rope", "relative", "alibi")


@dataclass
class TransformerConfig:
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    num_heads: int = 8
    num_kv_heads: int | None = None  # grouped-query attention; None = num_heads, 1 = multi-query
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1  # on embeddings and on each residual branch
    attention_dropout: float = 0.0  # on attention weights
    activation_dropout: float = 0.0  # inside the feed-forward block, after the activation
    activation: Literal["relu", "gelu", "silu"] = "relu"  # silu = swish (OPUS-MT's Marian models)
    norm_first: bool = True  # pre-norm trains stably; False = the original post-norm
    bias: bool = True  # bias terms in attention and feed-forward projections
    layer_norm_eps: float = 1e-5
    max_positions: int = 1024  # longest sequence the position tables (and caches) cover
    # sinusoidal | learned (absolute, added to the embeddings) | rope (rotary, on self-attention's
    # queries and keys) | relative (T5's bucketed per-head bias on self-attention scores)
    positions: Literal["sinusoidal", "learned", "rope", "relative", "alibi"] = "sinusoidal"
    output_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)
    tie_output_embeddings: bool = True  # decoder input embedding = output projection (Press & Wolf)
    share_all_embeddings: bool = False  # one embedding for source and target: needs a joint vocab
    pad_id: int = 0  # must agree with the tokenizer's; its embedding row starts at zero
    # query heads left in each layer of each attention type ({"encoder_self": [8, 5, ...],
    # "decoder_self": [...], "cross": [...]}) by ``python -m transformer.prune``; None =
    # num_heads everywhere. Heads keep head_dim = d_model / num_heads; 0 heads leave the bias.
    heads_per_layer: dict[str, list[int]] | None = None

    def __post_init__(self) -> None:
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        positive = (
            "src_vocab_size", "tgt_vocab_size", "d_model", "num_heads", "num_kv_heads",
            "d_ff", "max_positions",
        )  # fmt: skip
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("num_encoder_layers", "num_decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        check_heads(self.d_model, self.num_heads, self.num_kv_heads)
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.positions not in POSITIONS:
            raise ValueError(
                f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}"
            )
        if self.positions == "rope" and self.head_dim % 2:
            raise ValueError(
                f"positions=rope turns pairs of dimensions: head_dim = d_model / num_heads = "
                f"{self.head_dim} must be even"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {', '.join(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.share_all_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                "share_all_embeddings needs one joint vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}; train a joint "
                "tokenizer or set share_all_embeddings=False"
            )
        for name in ("src_vocab_size", "tgt_vocab_size"):
            if not 0 <= self.pad_id < getattr(self, name):
                raise ValueError(f"pad_id={self.pad_id} is outside {name}={getattr(self, name)}")
        if self.heads_per_layer is not None:
            self._check_heads_per_layer(self.heads_per_layer)

    def _check_heads_per_layer(self, given: dict[str, list[int]]) -> None:
        if set(given) != set(ATTENTION_TYPES):
            raise ValueError(
                f"heads_per_layer has the attention types {sorted(given)}; it needs exactly "
                f"{', '.join(ATTENTION_TYPES)}, each a list of head counts, one per layer"
            )
        group = self.num_heads // self.num_kv_heads
        for kind in ATTENTION_TYPES:
            counts, layers = list(given[kind]), self.num_layers(kind)
            if len(counts) != layers:
                raise ValueError(
                    f"heads_per_layer.{kind} has {len(counts)} entries for {layers} layers"
                )
            for layer, count in enumerate(counts):
                if isinstance(count, bool) or not isinstance(count, int):
                    raise ValueError(f"heads_per_layer.{kind}[{layer}]={count!r} is not a count")
                if not 0 <= count <= self.num_heads or count % group:
                    raise ValueError(
                        f"heads_per_layer.{kind}[{layer}]={count} must be a multiple of "
                        f"num_heads/num_kv_heads={group} (grouped-query attention keeps or "
                        f"removes whole key/value groups) between 0 and num_heads={self.num_heads}"
                    )

    def num_layers(self, kind: str) -> int:
        """The number of layers that have attention of type ``kind`` (``ATTENTION_TYPES``)."""
        if kind not in ATTENTION_TYPES:
            raise ValueError(f"unknown attention type {kind!r}; one of {ATTENTION_TYPES}")
        return self.num_encoder_layers if kind == "encoder_self" else self.num_decoder_layers

    def layer_heads(self, kind: str) -> list[int]:
        """Query heads in each layer of one attention type (all ``num_heads`` unless pruned)."""
        if self.heads_per_layer is None:
            return [self.num_heads] * self.num_layers(kind)
        return list(self.heads_per_layer[kind])

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_heads(d_model: int, num_heads: int, num_kv_heads: int) -> None:
    """Raise a ValueError naming the offending sizes when heads do not split the model evenly."""
    if d_model % num_heads:
        raise ValueError(
            f"num_heads={num_heads} does not divide d_model={d_model}: each head needs "
            f"d_model / num_heads dimensions; pick num_heads among the divisors of {d_model}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} does not divide num_heads={num_heads}: each key/value "
            "head serves a whole group of query heads"
        )
