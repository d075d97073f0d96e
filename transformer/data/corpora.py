"""Several corpora in one training run: their directions, sampling weights and source-side tokens.

``data.corpora`` lists them (null: the one corpus the ``data.*`` keys name). Each entry is a
mapping of the corpus keys below, which default to the ``data.*`` keys of the same name, plus:

* ``weight`` (1.0): copies of each of its training pairs an epoch; 2 = each pair twice, 0.5 = a
  random half, drawn again each epoch;
* ``tag`` (none): a token put before each of its training source sentences, e.g. ``<bt>`` for
  back-translated pairs (tagged back-translation, Caswell et al. 2019). Validation, test and
  translation inputs carry no tag.

``data.target_token=true`` puts ``<2xx>`` (xx: the target language) before every source sentence,
in training, validation, test and translation, so that one model translates into several languages
(Johnson et al. 2017). Tags and target tokens become pieces of their own in SentencePiece.

Validation and test read the val and test splits of the first corpus of each direction; the
others (back-translated, distilled) are training data only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from transformer.data.hf_source import HFSource
from transformer.data.sources import CorpusSource, LocalSource, Multi30kSource
from transformer.errors import DataError

# What an entry of data.corpora may set for itself; missing keys come from data.*.
CORPUS_KEYS = (
    "source", "root", "src_lang", "tgt_lang", "train_split", "val_split", "test_split",
    "hf_name", "hf_config", "hf_path", "download",
)  # fmt: skip
ENTRY_KEYS = (*CORPUS_KEYS, "weight", "tag")
_TOKEN = re.compile(r"<[^<>\s]+>")  # a tag: no spaces, in angle brackets


DEFAULT_SPLITS = {  # data.source -> its (train, val, test) split names
    "multi30k": ("train", "val", "test_2016_flickr"),
    "hf": ("train", "validation", "test"),
    "local": ("train", "val", "test"),
}


def make_source(
    name: str,
    root: str | os.PathLike | None,
    src_lang: str,
    tgt_lang: str,
    download: bool = True,
    hf_name: str | None = None,
    hf_config: str | None = None,
    hf_path: str | os.PathLike | None = None,
) -> CorpusSource:
    """The source that ``data.source=name`` reads; it checks its options and reads nothing."""
    if name == "multi30k":
        return Multi30kSource(root, src_lang, tgt_lang, download=download)
    if name == "local":
        return LocalSource(root, src_lang, tgt_lang)
    return HFSource(src_lang, tgt_lang, hf_name, hf_config, hf_path)


def target_token(lang: str) -> str:
    """The token that asks for a translation into ``lang``: ``<2de>``."""
    return f"<2{lang}>"


@dataclass(frozen=True)
class Corpus:
    """One corpus of a run: where its pairs come from, in which direction, and how they train."""

    source: CorpusSource
    splits: dict[str, str]  # train / val / test -> the corpus's split names
    weight: float = 1.0
    tag: str | None = None

    @property
    def direction(self) -> str:
        return f"{self.source.src_lang}-{self.source.tgt_lang}"


def corpus_options(entry: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """An entry of ``data.corpora`` with the keys it leaves out taken from ``data.*``."""
    return {**{k: defaults.get(k) for k in CORPUS_KEYS}, **entry}


def make_corpora(
    entries: list[Mapping[str, Any]] | None, defaults: Mapping[str, Any]
) -> list[Corpus]:
    """The corpora ``data.corpora`` lists (``entries``; None: one, from ``defaults`` alone),
    their options checked; nothing is read."""
    if entries is not None and not entries:
        raise DataError("data.corpora is an empty list; list the corpora, or set it to null")
    corpora = []
    for i, entry in enumerate(entries if entries is not None else [{}]):
        where = f"data.corpora[{i}]" if entries is not None else "data"
        if not isinstance(entry, Mapping):
            raise DataError(f"{where} must be a mapping of {ENTRY_KEYS}, got {entry!r}")
        unknown = sorted(set(entry) - set(ENTRY_KEYS))
        if unknown:
            raise DataError(f"{where}: unknown key(s) {unknown}; an entry may set {ENTRY_KEYS}")
        opts = corpus_options(entry, defaults)
        weight = opts.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise DataError(f"{where}.weight must be a positive number, got {weight!r}")
        tag = opts.get("tag")
        if tag is not None and not (isinstance(tag, str) and _TOKEN.fullmatch(tag)):
            raise DataError(
                f"{where}.tag must be one token in angle brackets, e.g. <bt>; got {tag!r}"
            )
        name = opts["source"]
        if name not in DEFAULT_SPLITS:
            raise DataError(f"{where}.source must be one of {list(DEFAULT_SPLITS)}, got {name!r}")
        if name in ("multi30k", "local") and opts["root"] is None:
            raise DataError(f"{where}.root is needed for source={name}: the directory of its files")
        source = make_source(
            name, opts["root"], opts["src_lang"], opts["tgt_lang"],
            True if opts["download"] is None else opts["download"],
            opts["hf_name"], opts["hf_config"], opts["hf_path"],
        )  # fmt: skip
        train, val, test = DEFAULT_SPLITS[name]
        splits = {
            "train": opts["train_split"] or train,
            "val": opts["val_split"] or val,
            "test": opts["test_split"] or test,
        }
        corpora.append(Corpus(source, splits, float(weight), tag))
    return corpora


def validated(corpora: list[Corpus]) -> dict[str, int]:
    """Each direction's corpus for validation and test: the index of its first."""
    first: dict[str, int] = {}
    for i, corpus in enumerate(corpora):
        first.setdefault(corpus.direction, i)
    return first


def prefix_tokens(corpus: Corpus, target_tokens: bool, training: bool) -> tuple[str, ...]:
    """The tokens before each source sentence of ``corpus``: its target token (with
    ``target_tokens``), then in training its tag."""
    tokens = (target_token(corpus.source.tgt_lang),) if target_tokens else ()
    return (*tokens, corpus.tag) if training and corpus.tag else tokens


def special_tokens(corpora: list[Corpus], target_tokens: bool) -> tuple[str, ...]:
    """The tags and target tokens the corpora use, sorted: SentencePiece keeps each one piece."""
    tokens = {c.tag for c in corpora if c.tag}
    if target_tokens:
        tokens |= {target_token(c.source.tgt_lang) for c in corpora}
    return tuple(sorted(tokens))
