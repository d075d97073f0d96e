"""Text in, text out: tokenize, batch by length (:mod:`transformer.line_batches`), decode,
detokenize, restore the input order; and the teacher-forced scores and word alignments of given
translations."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from transformer.averaging import load_or_average
from transformer.checkpoints import load_ensemble, model_from_checkpoint, tokenizers_from_checkpoint
from transformer.data.collate import encode_sources, encode_targets, pad
from transformer.data.corpora import direction_prefix
from transformer.data.tokenizer import BOS_ID, EOS_ID, UNK_ID, Tokenizer, word_index
from transformer.decoding import (
    DecodeOptions,
    Hypothesis,
    Models,
    as_ensemble,
    beam_search,
    greedy_decode,
    sample,
)
from transformer.decoding.alignment import cross_attention, format_alignment, word_alignment
from transformer.decoding.scoring import token_log_probs
from transformer.device import decoding_device, decoding_dtype
from transformer.errors import ConfigError, GuideError
from transformer.line_batches import (
    check_guides,
    encode_lines,
    length_batches,
    target_prefixes,
)


@dataclass
class Translation:
    text: str
    score: float | None  # log-probability / length ** len_penalty; None: a blank line's, or
    # CTranslate2's greedy translation (it returns no score)
    alignment: str | None = None  # "0-0 1-2 ...": source-target word pairs (decode.alignment)
    constraints_met: bool | None = None  # with constraints: it holds every phrase's pieces


def output_lines(translations: list[list[Translation]], options: DecodeOptions) -> list[str]:
    """What ``evaluate.py input=...`` writes: ``options.nbest`` lines per input line (a blank
    line's, or a sentence's missing hypotheses, are empty), each the translation, after its score
    and a tab with ``print_scores``, before a tab and its alignment with ``alignment``."""
    out = []
    for sentence in translations:
        for t in [*sentence, *[Translation("", None)] * (options.nbest - len(sentence))]:
            fields = [t.text]
            if options.print_scores:
                fields.insert(0, "" if t.score is None else f"{t.score:.4f}")
            if options.alignment:
                fields.append(t.alignment or "")
            out.append("\t".join(fields))
    return out


def search(
    model: Models,
    src: torch.Tensor,
    options: DecodeOptions,
    src_pad_mask: torch.Tensor | None = None,
    sentence_ids: torch.Tensor | None = None,
    constraints: list[list[list[int]]] | None = None,
    target_prefix: torch.Tensor | None = None,
) -> list[list[Hypothesis]]:
    """Decode source ids (B, S) with the search ``options.strategy`` names; ``sentence_ids`` (B,)
    number the sentences for sampling's random draws (default 0..B-1); ``constraints``: each
    sentence's target phrases (beam search only, :mod:`transformer.decoding.constraints`);
    ``target_prefix`` (B, P), padded: each translation's given start
    (:mod:`transformer.decoding.prefix`)."""
    ids = dict(bos_id=BOS_ID, eos_id=EOS_ID, src_pad_mask=src_pad_mask, target_prefix=target_prefix)
    if constraints is not None and options.strategy != "beam":
        raise ConfigError(
            f"constraints need beam search; decode.strategy={options.strategy} cannot place "
            "them: set decode.strategy=beam"
        )
    if options.strategy == "greedy":
        return greedy_decode(model, src, options, **ids)
    if options.strategy == "beam":
        return beam_search(model, src, options, **ids, constraints=constraints)
    return sample(model, src, options, **ids, sentence_ids=sentence_ids)


def decode_batch(
    model: Models,
    tgt_tokenizer: Tokenizer,
    src: torch.Tensor,
    options: DecodeOptions,
    src_pad_mask: torch.Tensor | None = None,
) -> list[list[Translation]]:
    """Decode a batch of source ids (B, S) as ``options`` say: each sentence's ``options.nbest``
    detokenized translations, best first (training's validation comes here)."""
    hyps = search(model, src, options, src_pad_mask)
    return [
        [Translation(tgt_tokenizer.decode(h.tokens), h.score) for h in sentence]
        for sentence in hyps
    ]


def load_translator(
    paths: Sequence[str | os.PathLike], ensemble: bool, device: torch.device, dtype: torch.dtype
) -> tuple[Translator, dict[str, Any]]:
    """The translator of checkpoints written by ``train.py`` (their average, or with
    ``ensemble`` each its own model) with the tokenizers they carry, on ``device`` in
    ``dtype``; and the first checkpoint."""
    if ensemble:
        ckpts, names = load_ensemble(paths), list(paths)
    else:
        ckpts, names = [load_or_average(paths)], list(paths[:1])
    src_tok, tgt_tok = tokenizers_from_checkpoint(ckpts[0], paths[0])
    models = [
        model_from_checkpoint(c, name).to(device, dtype)
        for c, name in zip(ckpts, names, strict=True)
    ]
    return Translator(models, src_tok, tgt_tok), ckpts[0]


class Translator:
    """Translates and scores lines with one model or an ensemble (a list of models, decoded on
    their mean probabilities); ``model`` is the first, the one attention analysis reads."""

    def __init__(self, model: Models, src_tokenizer: Tokenizer, tgt_tokenizer: Tokenizer) -> None:
        """A multilingual model's ``src_tokenizer`` puts its target token before each line
        (``Tokenizer.with_prefix``)."""
        self.models = [m.eval() for m in as_ensemble(model)]
        self.model = self.models[0]
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.device = next(self.model.parameters()).device
        self.max_positions = min(m.cfg.max_positions for m in self.models)
        self.pad_id = self.model.cfg.pad_id

    @classmethod
    def from_checkpoint(
        cls,
        *paths: str | os.PathLike,
        ensemble: bool = False,
        device: str = "auto",
        dtype: str = "auto",
        direction: str | None = None,
    ) -> Translator:
        """The translator of one checkpoint written by ``train.py``, or of several: their
        average, or with ``ensemble`` each its own model, decoded on their mean probabilities;
        with the tokenizers the first carries. ``device``: auto (a GPU where there is one), cpu
        or cuda; ``dtype``: auto (bf16 on a GPU that computes it natively, fp16 on an older
        one, float32 on a CPU), float32, bfloat16 or float16 (as ``evaluate.py``'s). A model
        trained with target tokens (``data.target_token``) gets ``direction``'s (e.g. "en-fr";
        None: its first) before each line that does not start with one, as in ``evaluate.py``."""
        if not paths:
            raise ValueError("Translator.from_checkpoint needs the path of a checkpoint")
        where = decoding_device(device)
        translator, ckpt = load_translator(paths, ensemble, where, decoding_dtype(dtype, where))
        settings = ckpt.get("datamodule_hyper_parameters") or {}
        if prefix := direction_prefix(settings, direction):
            tokenizer = translator.src_tokenizer
            translator.src_tokenizer = tokenizer.with_prefix(prefix, unless_written=True)
        return translator

    def translate(
        self,
        lines: list[str],
        options: DecodeOptions,
        max_tokens: int = 4096,
        first_line: int = 0,
        constraints: list[list[str]] | None = None,
        prefixes: list[str] | None = None,
    ) -> list[list[Translation]]:
        """Each line's ``options.nbest`` translations, best first; blank lines give "". Batches
        hold at most ``max_tokens`` source tokens, padding included. Line i is sentence
        ``first_line + i`` for sampling's draws (its line number in a file read in chunks).
        ``constraints[i]``: phrases line i's translations must contain (beam search only; see
        :meth:`constraint_ids`). ``prefixes``, one a line (line-aligned): the start each
        translation must have ("" = none), after which the search goes on
        (:mod:`transformer.decoding.prefix`)."""
        results: list[list[Translation]] = [[Translation("", None)] for _ in lines]
        ids = encode_lines(self.src_tokenizer, lines, self.max_positions)
        phrases = None
        if constraints is not None:
            check_guides(len(lines), None, constraints)
            phrases = [
                self.constraint_ids(c, first_line + i + 1) for i, c in enumerate(constraints)
            ]
        forced = target_prefixes(
            self.tgt_tokenizer, lines, prefixes, self.max_positions, first_line
        )
        for batch in length_batches({i: len(x) for i, x in ids.items()}, max_tokens):
            src = pad([ids[i] for i in batch], self.pad_id, self.device)
            numbers = torch.tensor([first_line + i for i in batch], device=self.device)
            wanted = None if phrases is None else [phrases[i] for i in batch]
            target_prefix = None
            if forced:
                target_prefix = pad([forced[i] for i in batch], self.pad_id, self.device)
            hyps = search(
                self.models, src, options, sentence_ids=numbers, constraints=wanted,
                target_prefix=target_prefix,
            )  # fmt: skip
            alignments = self._align(src, hyps, options) if options.alignment else None
            for k, (i, sentence) in enumerate(zip(batch, hyps, strict=True)):
                results[i] = [
                    Translation(
                        self.tgt_tokenizer.decode(h.tokens),
                        h.score,
                        alignments[k][j] if alignments is not None else None,
                        h.constraints_met,
                    )  # fmt: skip
                    for j, h in enumerate(sentence)
                ]
        return results

    def constraint_ids(self, phrases: list[str], line: int) -> list[list[int]]:
        """Each phrase's target pieces, encoded on its own: it matches only where the
        translation is segmented the same way. ``line`` numbers the input line in errors."""
        out = []
        for phrase in phrases:
            encoded = self.tgt_tokenizer.encode(phrase)
            if not encoded or UNK_ID in encoded:
                what = "is empty" if not encoded else "has characters the target vocabulary lacks"
                raise GuideError(
                    f"line {line}: constraint {phrase!r} {what} (its SentencePiece pieces: "
                    f"{self.tgt_tokenizer.pieces(encoded)}); give a phrase the model can write",
                    "constraints",
                )
            out.append(encoded)
        return out

    def _align(
        self, src: torch.Tensor, hyps: list[list[Hypothesis]], options: DecodeOptions
    ) -> list[list[str]]:
        """Each hypothesis' word alignment (``decode.alignment_layer``/``alignment_head``), from
        one teacher-forced pass over all of them."""
        rows = [(k, h) for k, sentence in enumerate(hyps) for h in sentence]
        if not rows:
            return [[] for _ in hyps]
        index = torch.tensor([k for k, _ in rows], device=self.device)
        tgt_in = pad([[BOS_ID, *h.tokens] for _, h in rows], self.pad_id, self.device)
        weights = cross_attention(
            self.models, src[index], tgt_in, options.alignment_layer, options.alignment_head
        ).cpu()  # (N, T, S)
        out: list[list[str]] = [[] for _ in hyps]
        first = len(self.src_tokenizer.prefix)  # the line's words start after its prefix
        for r, (k, h) in enumerate(rows):
            x = [i for i in src[k].tolist() if i not in (self.pad_id, EOS_ID)][first:]
            src_words = word_index(x, self.src_tokenizer.pieces(x))
            tgt_words = word_index(h.tokens, self.tgt_tokenizer.pieces(h.tokens))
            # (T, S): the prefix, eos and pad left out
            piece_weights = weights[r, : len(h.tokens), first : first + len(x)]
            out[k].append(format_alignment(word_alignment(piece_weights, tgt_words, src_words)))
        return out

    def score(
        self, sources: list[str], targets: list[str], max_tokens: int = 4096
    ) -> list[list[float]]:
        """Teacher-forced log-probability of each target piece and of eos, per pair; batches of
        at most ``max_tokens`` tokens on the longer side, padding included. Lines longer than
        the model takes are cut (a warning counts the sources)."""
        limit = self.max_positions
        src_ids = encode_sources(self.src_tokenizer, sources, limit)
        tgt_in = encode_targets(self.tgt_tokenizer, targets, limit)
        pairs = enumerate(zip(src_ids, tgt_in, strict=True))
        lengths = {i: max(len(s), len(t)) for i, (s, t) in pairs}
        results: list[list[float]] = [[] for _ in sources]
        for batch in length_batches(lengths, max_tokens):
            src = pad([src_ids[i] for i in batch], self.pad_id, self.device)
            tgt = pad([tgt_in[i] for i in batch], self.pad_id, self.device)
            labels = pad([[*tgt_in[i][1:], EOS_ID] for i in batch], self.pad_id, self.device)
            lprobs = token_log_probs(self.models, src, tgt, labels).cpu().tolist()  # (B, T)
            for i, row in zip(batch, lprobs, strict=True):
                results[i] = row[: len(tgt_in[i])]
        return results
