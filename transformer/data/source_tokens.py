"""The tokens before a corpus's source sentences: its tag in training, its target token everywhere.

``data.target_token=true`` puts ``<2xx>`` (xx: the target language) before every source sentence,
in training, validation, test and translation, so that one model translates into several languages
(Johnson et al. 2017). A token instead of ``true`` (``'>>fra<<'``, a multilingual OPUS-MT model's)
is put there as it is; a ``data.corpora`` entry's own ``target_token`` sets its corpus's. Tags and
target tokens become pieces of their own in SentencePiece.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from transformer.errors import DataError

if TYPE_CHECKING:
    from transformer.data.corpora import Corpus

_PIECE = re.compile(r"\S+")  # a target token given as it is: no spaces


def target_token(lang: str) -> str:
    """The token that asks for a translation into ``lang``: ``<2de>``."""
    return f"<2{lang}>"


def resolve_target_token(value: Any, tgt_lang: str, where: str) -> str | None:
    """The token before a corpus's sources that ``data.target_token`` (or an entry's) asks for:
    none (false or null), ``<2xx>`` for its target language (true), or the token given (a
    model's own, such as OPUS-MT's ``>>fra<<``)."""
    if value is None or value is False:
        return None
    if value is True:
        return target_token(tgt_lang)
    if isinstance(value, str) and _PIECE.fullmatch(value):
        return value
    raise DataError(
        f"{where}.target_token must be true (<2xx>, xx: the target language), false, or one "
        f"token without spaces to put there as it is (e.g. '>>fra<<'); got {value!r}"
    )


def uses_target_tokens(data: Mapping[str, Any]) -> bool:
    """Whether data settings (``data.*``, a checkpoint's) put a target token before sources."""
    entries = data.get("corpora") or []
    return bool(data.get("target_token")) or any(
        isinstance(e, Mapping) and bool(e.get("target_token")) for e in entries
    )


def check_target_tokens(corpora: list[Corpus]) -> None:
    """Refuse one target token for two target languages: the model could not tell them apart."""
    langs: dict[str, str] = {}
    for i, corpus in enumerate(corpora):
        token, lang = corpus.target_token, corpus.source.tgt_lang
        if token is None or langs.setdefault(token, lang) == lang:
            continue
        raise DataError(
            f"data.corpora[{i}] puts target token {token} before its sources, as a corpus "
            f"into {langs[token]} does, but it translates into {lang}: give each target "
            "language its own token (data.corpora[i].target_token), or data.target_token=true "
            "for <2xx>"
        )


def prefix_tokens(corpus: Corpus, training: bool) -> tuple[str, ...]:
    """The tokens before each source sentence of ``corpus``: its target token, if it has one,
    then in training its tag."""
    tokens = (corpus.target_token,) if corpus.target_token else ()
    return (*tokens, corpus.tag) if training and corpus.tag else tokens


def special_tokens(corpora: list[Corpus]) -> tuple[str, ...]:
    """The tags and target tokens the corpora use, sorted: SentencePiece keeps each one piece."""
    return tuple(sorted({t for c in corpora for t in (c.tag, c.target_token) if t}))
