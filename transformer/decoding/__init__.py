"""Decoding strategies on the model's KV cache (greedy now; beam search in a later issue)."""

from transformer.decoding.greedy import greedy_decode, max_output_lengths

__all__ = ["greedy_decode", "max_output_lengths"]
