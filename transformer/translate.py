"""Text in, text out: tokenize, batch by length, decode, detokenize, restore the input order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from transformer.data.collate import encode_sources, pad
from transformer.data.tokenizer import BOS_ID, EOS_ID, Tokenizer
from transformer.decoding import DecodeOptions, beam_search, greedy_decode
from transformer.model import Transformer


def encode_lines(tok: Tokenizer, lines: Sequence[str], limit: int) -> dict[int, list[int]]:
    """Each non-blank line's ``x + eos`` ids, at most ``limit`` long, by its index in ``lines``
    (blank lines translate to ""); a cut line is named by its line number in the warning."""
    todo = [i for i, line in enumerate(lines) if line.strip()]
    encoded = encode_sources(tok, [lines[i] for i in todo], limit, [i + 1 for i in todo])
    return dict(zip(todo, encoded, strict=True))


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

    def translate(
        self, lines: list[str], options: DecodeOptions, max_tokens: int = 4096
    ) -> list[list[Translation]]:
        """Each line's ``options.nbest`` translations, best first; blank lines give "". Batches
        hold at most ``max_tokens`` source tokens, padding included."""
        results: list[list[Translation]] = [[Translation("", None)] for _ in lines]
        ids = encode_lines(self.src_tokenizer, lines, self.model.cfg.max_positions)
        for batch in length_batches({i: len(x) for i, x in ids.items()}, max_tokens):
            src = pad([ids[i] for i in batch], self.model.cfg.pad_id, self.device)
            hyps = decode_batch(self.model, self.tgt_tokenizer, src, options)
            for i, sentence in zip(batch, hyps, strict=True):
                results[i] = sentence
        return results


def decode_batch(
    model: Transformer,
    tgt_tokenizer: Tokenizer,
    src: torch.Tensor,
    options: DecodeOptions,
    src_pad_mask: torch.Tensor | None = None,
) -> list[list[Translation]]:
    """Decode a batch of source ids (B, S) as ``options`` say: each sentence's ``options.nbest``
    detokenized translations, best first (evaluation, translation and training's validation all
    come here)."""
    search = greedy_decode if options.strategy == "greedy" else beam_search
    hyps = search(model, src, options, bos_id=BOS_ID, eos_id=EOS_ID, src_pad_mask=src_pad_mask)
    return [
        [Translation(tgt_tokenizer.decode(h.tokens), h.score) for h in sentence]
        for sentence in hyps
    ]
