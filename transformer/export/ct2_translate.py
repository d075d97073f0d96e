"""Translate with an exported CTranslate2 model directory as
:class:`transformer.translate.Translator` translates with a checkpoint: the same tokenization,
length rules, banned ids and detokenization, so that ``evaluate.py engine=ctranslate2`` scores both
engines with one metrics code.

CTranslate2 takes one length limit per call, ours is per sentence (``max_len_a * source length +
max_len_b``): sentences are grouped by their limit, each group one call (``exact_limits``; without
it, one call with the largest limit: larger batches, and a sentence may exceed its own limit).
Greedy decoding then matches ours token for token; beam search can differ where a hypothesis
reaches the limit (we force eos and count it, CTranslate2 stops) and where banned ids shift scores
(CTranslate2 drops them before its softmax, we after ours).
"""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch

from transformer.data.tokenizer import BOS_ID, PAD_ID, Tokenizer
from transformer.decoding import DecodeOptions
from transformer.decoding.step import max_output_lengths
from transformer.errors import CheckpointError, ConfigError, show
from transformer.export.ct2 import INFO_FILE, SPM_FILES, import_ctranslate2
from transformer.line_batches import encode_lines, target_prefixes
from transformer.translate import Translation


def read_info(model_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``transformer_nmt.json`` of a directory written by ``python -m transformer.export``."""
    path = Path(model_dir) / INFO_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{model_dir} holds no {INFO_FILE}: it is not a model directory written by "
            "`python -m transformer.export ct2 CKPT OUT_DIR`"
        )
    return json.loads(path.read_text(encoding="utf-8"))


# What becomes of each decode option (each field of DecodeOptions) on this engine; a field in
# none of these is a test failure, so that a new option is declared here when it is added.
MAPPED = {  # to translate_batch's arguments (search_kwargs), or to its per-call length limit
    "strategy", "beam_size", "len_penalty", "max_len_a", "max_len_b", "min_len", "nbest",
    "no_repeat_ngram_size",
}  # fmt: skip
HOST = {
    "print_scores",
    "graphs",
    "sync_every",
    "static_search",
}  # how results are written, how ours runs
OURS_ONLY = {  # only our decoder has them: a value but the default is refused
    "temperature", "top_k", "top_p", "seed", "score_prefix", "alignment", "alignment_layer",
    "alignment_head",
}  # fmt: skip


def check_options(options: DecodeOptions) -> None:
    """Refuse, by name, what CTranslate2 would silently not do: sampling, and any option of
    :data:`OURS_ONLY` away from its default."""
    wrong = ["decode.strategy=sample"] if options.strategy == "sample" else []
    for field in fields(options):
        value = getattr(options, field.name)
        if field.name in OURS_ONLY and value != field.default:
            wrong.append(f"decode.{field.name}={show(value)}")
    if wrong:
        raise ConfigError(f"{wrong[0]} runs our decoder; use engine=torch")


def search_kwargs(options: DecodeOptions, pad: str, bos: str) -> dict[str, Any]:
    """``Translator.translate_batch`` options for ours (but the per-call length limit)."""
    greedy = options.strategy == "greedy"
    return {
        "beam_size": 1 if greedy else options.beam_size,
        "num_hypotheses": options.nbest,
        "length_penalty": options.len_penalty,
        "min_decoding_length": options.min_len,
        "no_repeat_ngram_size": options.no_repeat_ngram_size,
        "suppress_sequences": [[pad], [bos]],  # never generated, as in our searches
        "max_input_length": 0,  # sources are cut to max_positions here, as ours are
        "return_scores": not greedy,
    }


class CT2Translator:
    """``translate(lines, options, max_tokens)`` as :class:`transformer.translate.Translator`."""

    def __init__(
        self,
        model_dir: str | os.PathLike,
        device: str = "cpu",
        compute_type: str = "default",
        threads: int = 0,
        exact_limits: bool = True,
    ) -> None:
        ctranslate2 = import_ctranslate2()
        model_dir = Path(model_dir)
        self.info = read_info(model_dir)
        self.src_tokenizer = Tokenizer(model_dir / SPM_FILES["src"])
        self.tgt_tokenizer = Tokenizer(model_dir / SPM_FILES["tgt"])
        self.max_positions = int(self.info["model"]["max_positions"])
        pieces = self.tgt_tokenizer.pieces(range(self.tgt_tokenizer.vocab_size))
        self.tgt_ids = {piece: i for i, piece in enumerate(pieces)}
        self.translator = ctranslate2.Translator(
            str(model_dir), device=device, compute_type=compute_type, intra_threads=threads
        )
        self.compute_type = self.translator.compute_type
        self.exact_limits = exact_limits

    def translate(
        self,
        lines: list[str],
        options: DecodeOptions,
        max_tokens: int = 4096,
        first_line: int = 0,
        prefixes: list[str] | None = None,
    ) -> list[list[Translation]]:
        """Each line's ``options.nbest`` translations, best first; blank lines give "".
        (``first_line`` numbers the lines for sampling, which evaluation runs on engine=torch
        only.) ``prefixes``: each translation's given start, CTranslate2's ``target_prefix``,
        a sentence's limit raised to its length as ours is (CTranslate2 would cut it)."""
        results: list[list[Translation]] = [[Translation("", None)] for _ in lines]
        ids = encode_lines(self.src_tokenizer, lines, self.max_positions)
        forced = target_prefixes(
            self.tgt_tokenizer, lines, prefixes, self.max_positions, first_line
        )
        limits = max_output_lengths(
            torch.tensor([len(x) for x in ids.values()]), options.max_len_a, options.max_len_b,
            options.min_len, self.max_positions - 1,
        ).tolist()  # fmt: skip
        if forced:
            limits = [max(n, len(forced[i])) for i, n in zip(ids, limits, strict=True)]
        # Sentences without a prefix apart: in a call with target_prefix, CTranslate2 lets only
        # their best first candidate be eos, which ours (and its own without prefixes) does not.
        groups: dict[tuple[int, bool], list[int]] = {}
        for i, limit in zip(ids, limits, strict=True):
            key = (limit if self.exact_limits else max(limits), bool(forced and forced[i]))
            groups.setdefault(key, []).append(i)
        kwargs = search_kwargs(options, *self.tgt_tokenizer.pieces([PAD_ID, BOS_ID]))
        for (limit, prefixed), rows in groups.items():
            sources = [self.src_tokenizer.pieces(ids[i][:-1]) for i in rows]  # eos: the model's
            pieces = self.tgt_tokenizer.pieces
            kwargs["target_prefix"] = [pieces(forced[i]) for i in rows] if prefixed else None
            out = self.translator.translate_batch(
                sources, max_batch_size=max_tokens, batch_type="tokens",
                max_decoding_length=limit, **kwargs,
            )  # fmt: skip
            for i, result in zip(rows, out, strict=True):
                scores = result.scores or [None] * len(result.hypotheses)  # greedy: none
                results[i] = [
                    Translation(self.tgt_tokenizer.decode([self.tgt_ids[p] for p in hyp]), score)
                    for hyp, score in zip(result.hypotheses, scores, strict=True)
                ]
        return results
