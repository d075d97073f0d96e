"""Input lines as ids, and in batches: each line's source ids and target prefix, and batches by
length under a token budget; what both engines' translators (:class:`transformer.translate.
Translator`, and CTranslate2's) and scoring share."""

from __future__ import annotations

from collections.abc import Sequence

from transformer.data.collate import encode_sources
from transformer.data.tokenizer import Tokenizer
from transformer.errors import DataError, GuideError


def encode_lines(tok: Tokenizer, lines: Sequence[str], limit: int) -> dict[int, list[int]]:
    """Each non-blank line's ``x + eos`` ids, at most ``limit`` long, by its index in ``lines``
    (blank lines translate to ""); a cut line is named by its line number in the warning."""
    todo = [i for i, line in enumerate(lines) if line.strip()]
    encoded = encode_sources(tok, [lines[i] for i in todo], limit, [i + 1 for i in todo])
    return dict(zip(todo, encoded, strict=True))


def check_guides(
    lines: int, prefixes: Sequence[str] | None, constraints: Sequence[object] | None = None
) -> None:
    """One prefix and one list of constraints a line, where given: else a :class:`DataError`."""
    if prefixes is not None and len(prefixes) != lines:
        raise DataError(f"{len(prefixes)} prefixes for {lines} lines: give one a line")
    if constraints is not None and len(constraints) != lines:
        raise DataError(
            f"{len(constraints)} lists of constraints for {lines} lines: give one a line "
            "([] for none)"
        )


def target_prefixes(
    tok: Tokenizer, lines: Sequence[str], prefixes: Sequence[str] | None, limit: int, first: int
) -> list[list[int]] | None:
    """Each line's prefix as target ids, without eos (None: no line has one); a prefix needs as
    many lines as ``lines``, and at most ``limit - 1`` pieces (line ``first`` + 1 the first's
    number in errors)."""
    if prefixes is None:
        return None
    check_guides(len(lines), prefixes)
    if not any(p.strip() for p in prefixes):
        return None
    encoded = [tok.encode(p) if p.strip() else [] for p in prefixes]
    for number, ids in enumerate(encoded, start=first + 1):
        if len(ids) >= limit:
            raise GuideError(
                f"line {number}: the prefix has {len(ids)} pieces; the model's translations "
                f"take at most {limit - 1}: shorten it",
                "prefixes",
            )
    return encoded


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
