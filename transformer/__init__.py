"""A seq2seq Transformer for machine translation."""

from transformer.config import TransformerConfig
from transformer.masks import attention_allowed, padding_mask

__all__ = ["TransformerConfig", "attention_allowed", "padding_mask"]
