"""Text in, text out: tokenize, batch by length, decode, detokenize, restore the input order."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from transformer.data.collate import encode_sources, pad
from transformer.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from transformer.decoding import beam_search, greedy_decode
from transformer.errors import ConfigError
from transformer.model import Transformer


def length_batches(lengths: dict[int, int], max_tokens: int) -> list[list[int]]:
    """Keys of ``lengths`` (sentence -> source length) in batches, longest sentences first,
    each at most ``max_tokens`` with padding (longest length x size), at least one sentence."""
    order = sorted(lengths, key=lengths.__getitem__, reverse=True)
    batches, start = [], 0
    while start < len(order):
        count = max(1, max_tokens // lengths[order[start]])
        batches.append(order[start : start + count])
        start += count
    return batches


@dataclass
class DecodeOptions:
    """How to search; the Hydra group ``decode`` sets these (``decode.beam_size=5``, ...)."""

    beam_size: int = 5  # 1 = greedy
    len_penalty: float = 1.0  # score = log-probability / length ** len_penalty
    max_len_a: float = 1.2  # at most a * source length + b tokens before eos
    max_len_b: int = 10
    min_len: int = 1  # at least this many tokens before eos
    nbest: int = 1  # hypotheses per sentence (<= beam_size)
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size (0 = off)
    max_tokens: int = 4096  # source tokens (padding included) per batch

    def __post_init__(self) -> None:
        if self.beam_size < 1:
            raise ConfigError(f"decode.beam_size must be >= 1, got {self.beam_size}")
        if not 1 <= self.nbest <= self.beam_size:
            raise ConfigError(
                f"decode.nbest={self.nbest} must be between 1 and decode.beam_size={self.beam_size}"
            )
        if self.min_len < 0 or self.max_len_a < 0 or self.max_tokens < 1:
            raise ConfigError("decode.min_len, decode.max_len_a and decode.max_tokens must be >= 0")


@dataclass
class Translation:
    text: str
    score: float | None  # beam score; None for greedy


class Translator:
    def __init__(
        self, model: Transformer, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer
    ) -> None:
        self.model = model.eval()
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.device = next(model.parameters()).device

    def translate(self, lines: list[str], options: DecodeOptions) -> list[list[Translation]]:
        """Each line's ``options.nbest`` translations, best first; blank lines give ""."""
        results: list[list[Translation]] = [[Translation("", None)] for _ in lines]
        todo = [i for i, line in enumerate(lines) if line.strip()]
        limit = self.model.cfg.max_positions
        encoded = encode_sources(self.src_tokenizer, [lines[i] for i in todo], limit)
        ids = dict(zip(todo, encoded, strict=True))
        for batch in length_batches({i: len(ids[i]) for i in todo}, options.max_tokens):
            src = pad([ids[i] for i in batch], self.model.cfg.pad_id, self.device)
            for i, hyps in zip(batch, self._decode(src, options), strict=True):
                results[i] = hyps
        return results

    def _decode(self, src: torch.Tensor, options: DecodeOptions) -> list[list[Translation]]:
        return decode_batch(self.model, self.tgt_tokenizer, src, options)


def decode_batch(
    model: Transformer,
    tgt_tokenizer: Tokenizer,
    src: torch.Tensor,
    options: DecodeOptions,
    src_pad_mask: torch.Tensor | None = None,
    *,
    always_beam: bool = False,
) -> list[list[Translation]]:
    """Decode a batch of source ids (B, S) as ``options`` say: each sentence's ``options.nbest``
    detokenized translations, best first.

    The one place that picks the search (evaluation, translation and training's validation all
    come here): one beam without an n-gram ban runs the greedy loop (the same output as beam
    search with one beam, cheaper) unless ``always_beam``; anything else runs beam search.
    """
    limits = dict(max_len_a=options.max_len_a, max_len_b=options.max_len_b, min_len=options.min_len)
    if options.beam_size == 1 and options.no_repeat_ngram_size == 0 and not always_beam:
        out = greedy_decode(model, src, BOS_ID, EOS_ID, src_pad_mask, **limits)
        return [[Translation(tgt_tokenizer.decode(row), None)] for row in out.tolist()]
    hyps = beam_search(
        model, src, bos_id=BOS_ID, eos_id=EOS_ID, src_pad_mask=src_pad_mask,
        beam_size=options.beam_size, len_penalty=options.len_penalty, nbest=options.nbest,
        no_repeat_ngram_size=options.no_repeat_ngram_size, **limits,
    )  # fmt: skip
    return [
        [Translation(tgt_tokenizer.decode(h.tokens), h.score) for h in sentence]
        for sentence in hyps
    ]
