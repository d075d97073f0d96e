"""Decoding on the model's KV cache: greedy, beam search and sampling, for one model or an
ensemble, all driven by one DecodeOptions; teacher-forced scoring and word alignments."""

from transformer.decoding.beam_search import beam_search
from transformer.decoding.greedy import greedy_decode
from transformer.decoding.options import DecodeOptions
from transformer.decoding.sampling import sample
from transformer.decoding.step import Hypothesis, Models, Stepper, as_ensemble, max_output_lengths

__all__ = [
    "DecodeOptions",
    "Hypothesis",
    "Models",
    "Stepper",
    "as_ensemble",
    "beam_search",
    "greedy_decode",
    "max_output_lengths",
    "sample",
]
