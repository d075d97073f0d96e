"""Decoding on the model's KV cache: greedy and beam search, both driven by one DecodeOptions."""

from transformer.decoding.beam_search import beam_search
from transformer.decoding.greedy import greedy_decode
from transformer.decoding.options import DecodeOptions
from transformer.decoding.step import Hypothesis, Stepper, max_output_lengths

__all__ = [
    "DecodeOptions",
    "Hypothesis",
    "Stepper",
    "beam_search",
    "greedy_decode",
    "max_output_lengths",
]
