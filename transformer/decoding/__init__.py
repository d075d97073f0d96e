"""Decoding: beam search on the KV cache."""

from transformer.decoding.beam_search import Hypothesis, beam_search
from transformer.decoding.step import Stepper

__all__ = ["Hypothesis", "Stepper", "beam_search"]
