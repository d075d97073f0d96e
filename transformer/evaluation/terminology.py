"""Terminology constraints as text: evaluate's ``constraints=FILE`` (one JSON list of phrases a
line, line-aligned with the sentences translated) and the share of the phrases translations hold.
The search that places them is :mod:`transformer.decoding.constraints`."""

from __future__ import annotations

import json
from collections.abc import Sequence

from transformer.data.text_files import iter_line_blocks
from transformer.data.tokenizer import Tokenizer
from transformer.errors import DataError


def read_constraints(path: str, sentences: int | None, what: str) -> list[list[str]]:
    """The phrases of each line of ``path``: a JSON list of strings a line (``[]`` for none).
    ``sentences``: how many lines it must have, those of ``what`` (the input, the split)."""
    out: list[list[str]] = []
    for block in iter_line_blocks(path):
        for line in block:
            number = len(out) + 1
            try:
                phrases = json.loads(line)
            except json.JSONDecodeError as err:
                phrases = err
            if not isinstance(phrases, list) or not all(isinstance(p, str) for p in phrases):
                raise DataError(
                    f"constraints={path}, line {number}: {line.strip()[:80]!r} is not a JSON list "
                    'of strings; write one list a line, e.g. ["Hund", "roten Ball"], or [] for none'
                )
            out.append(phrases)
    if sentences is not None and len(out) != sentences:
        raise DataError(
            f"constraints={path} has {len(out)} lines but {what} has {sentences}: give one line "
            "of constraints for each sentence, in order ([] for none)"
        )
    return out


def constraints_met(
    translations: Sequence[str], constraints: Sequence[Sequence[str]], tokenizer: Tokenizer
) -> tuple[int, int]:
    """(phrases met, phrases): a phrase is met where its text, as the target SentencePiece model
    writes it (encoded and decoded, so normalised as translations are), occurs in the
    translation (case-sensitive, anywhere: "Hund" is met in "Hunde")."""
    met = total = 0
    for text, phrases in zip(translations, constraints, strict=True):
        for phrase in phrases:
            total += 1
            met += tokenizer.decode(tokenizer.encode(phrase)) in text
    return met, total
