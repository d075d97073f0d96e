"""A seq2seq Transformer for machine translation.

The model: :class:`Transformer` and its parts. Translation from Python: ``Translator`` (a trained
checkpoint's model and tokenizers; ``Translator.from_checkpoint(path).translate(lines, options)``)
and ``DecodeOptions`` (the search), imported on first use so that the model alone imports
lightly.
"""

from typing import Any

from transformer.attention import MultiheadAttention
from transformer.config import TransformerConfig
from transformer.kv_cache import DecoderCache, KVCache
from transformer.masks import attention_allowed, padding_mask
from transformer.model import AttentionMaps, Transformer

__all__ = [
    "AttentionMaps",
    "DecodeOptions",
    "DecoderCache",
    "KVCache",
    "MultiheadAttention",
    "Transformer",
    "TransformerConfig",
    "Translation",
    "Translator",
    "attention_allowed",
    "padding_mask",
]


def __getattr__(name: str) -> Any:  # PEP 562
    if name in ("Translator", "Translation"):
        from transformer import translate

        return getattr(translate, name)
    if name == "DecodeOptions":
        from transformer.decoding.options import DecodeOptions

        return DecodeOptions
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
