"""A seq2seq Transformer for machine translation."""

from transformer.attention import MultiheadAttention
from transformer.config import TransformerConfig
from transformer.kv_cache import DecoderCache, KVCache
from transformer.masks import attention_allowed, padding_mask
from transformer.model import AttentionMaps, Transformer

__all__ = [
    "AttentionMaps",
    "DecoderCache",
    "KVCache",
    "MultiheadAttention",
    "Transformer",
    "TransformerConfig",
    "attention_allowed",
    "padding_mask",
]
