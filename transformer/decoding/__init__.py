"""Decoding on the model's KV cache: greedy and beam search."""

from transformer.decoding.beam_search import Hypothesis, beam_search
from transformer.decoding.greedy import greedy_decode, max_output_lengths
from transformer.decoding.step import Stepper

__all__ = ["Hypothesis", "Stepper", "beam_search", "greedy_decode", "max_output_lengths"]
