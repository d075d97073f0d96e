"""Several corpora in one training run: their directions, sampling weights and source-side tokens.

``data.corpora`` lists them (null: the one corpus the ``data.*`` keys name). Each entry is a
mapping of the corpus keys below, which default to the ``data.*`` keys of the same name, plus:

* ``weight`` (1.0): copies of each of its training pairs an epoch; 2 = each pair twice, 0.5 = a
  random half, drawn again each epoch;
* ``tag`` (none): a token put before each of its training source sentences, e.g. ``<bt>`` for
  back-translated pairs (tagged back-translation, Caswell et al. 2019). Validation, test and
  translation inputs carry no tag;
* ``target_token`` (``data.target_token``): the token put before each of its source sentences,
  in training, validation, test and translation (:mod:`transformer.data.source_tokens`).

Validation and test read the val and test splits of the first corpus of each direction; the
others (back-translated, distilled) are training data only (:class:`CorpusTexts`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformer.data.hf_source import HFSource
from transformer.data.source_tokens import (
    check_target_tokens,
    prefix_tokens,
    resolve_target_token,
    uses_target_tokens,
)
from transformer.data.sources import CorpusSource, LocalSource, Multi30kSource
from transformer.data.text_files import ParallelText, checked
from transformer.errors import ConfigError, DataError

COMMON_KEYS = ("source", "src_lang", "tgt_lang", "train_split", "val_split", "test_split")
_TOKEN = re.compile(r"<[^<>\s]+>")  # a tag: no spaces, in angle brackets


@dataclass(frozen=True)
class SourceKind:
    """What ``data.source=<name>`` is, declared once: how its corpus is made from a corpus's
    options (:data:`CORPUS_KEYS`, nothing read yet), its default (train, val, test) split names,
    the ``data.*`` keys it reads beyond :data:`COMMON_KEYS` (their types and defaults in
    :data:`SOURCE_OPTIONS`), whether ``data.root`` must name its files' directory, and which of
    its keys name its corpus (a resume must keep them)."""

    make: Callable[[Mapping[str, Any]], CorpusSource]
    splits: tuple[str, str, str]
    options: tuple[str, ...]
    needs_root: bool = False
    identifies: tuple[str, ...] = ()


def _multi30k(opts: Mapping[str, Any]) -> CorpusSource:
    download = True if opts["download"] is None else opts["download"]
    return Multi30kSource(opts["root"], opts["src_lang"], opts["tgt_lang"], download=download)


def _hf(opts: Mapping[str, Any]) -> CorpusSource:
    return HFSource(
        opts["src_lang"], opts["tgt_lang"], opts["hf_name"], opts["hf_config"], opts["hf_path"],
        opts["hf_revision"], opts["hf_data_dir"],
    )  # fmt: skip


def _local(opts: Mapping[str, Any]) -> CorpusSource:
    return LocalSource(opts["root"], opts["src_lang"], opts["tgt_lang"])


# Each option that only some sources read (their kind's ``options``; the data module takes them
# as one mapping): its type (checked before any work, as an annotation is) and its value where
# none is given
SOURCE_OPTIONS: dict[str, tuple[Any, Any]] = {
    "root": (str | None, "data/multi30k"),
    "download": (bool, True),
    "hf_name": (str | None, None),
    "hf_config": (str | None, None),
    "hf_path": (str | None, None),
    "hf_revision": (str | None, None),
    "hf_data_dir": (str | None, None),
}
SOURCES = {  # data.source -> its kind
    "multi30k": SourceKind(
        _multi30k, ("train", "val", "test_2016_flickr"), ("root", "download"), needs_root=True
    ),
    "hf": SourceKind(
        _hf,
        ("train", "validation", "test"),
        ("hf_name", "hf_config", "hf_path", "hf_revision", "hf_data_dir"),
        identifies=("hf_name", "hf_config"),
    ),
    "local": SourceKind(_local, ("train", "val", "test"), ("root",), needs_root=True),
}
# What an entry of data.corpora may set for itself; missing keys come from data.*: the keys of
# every source, and those that a source of SOURCES reads (a test holds the two together)
CORPUS_KEYS = (*COMMON_KEYS, *SOURCE_OPTIONS)
ENTRY_KEYS = (*CORPUS_KEYS, "weight", "tag", "target_token")
# What names a run's corpus, for every source: a resume must keep it
CORPUS_IDENTITY = COMMON_KEYS[:3] + tuple(k for kind in SOURCES.values() for k in kind.identifies)


@dataclass(frozen=True)
class Corpus:
    """One corpus of a run: where its pairs come from, in which direction, and how they train."""

    source: CorpusSource
    splits: dict[str, str]  # train / val / test -> the corpus's split names
    weight: float = 1.0
    tag: str | None = None
    target_token: str | None = None  # before each of its source sentences

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
        if name not in SOURCES:
            raise DataError(f"{where}.source must be one of {list(SOURCES)}, got {name!r}")
        kind = SOURCES[name]
        if kind.needs_root and opts["root"] is None:
            raise DataError(f"{where}.root is needed for source={name}: the directory of its files")
        source = kind.make(opts)
        train, val, test = kind.splits
        splits = {
            "train": opts["train_split"] or train,
            "val": opts["val_split"] or val,
            "test": opts["test_split"] or test,
        }
        token = entry.get("target_token", defaults.get("target_token"))
        token = resolve_target_token(token, source.tgt_lang, where)
        corpora.append(Corpus(source, splits, float(weight), tag, token))
    check_target_tokens(corpora)
    return corpora


def validated(corpora: list[Corpus]) -> dict[str, int]:
    """Each direction's corpus for validation and test: the index of its first."""
    first: dict[str, int] = {}
    for i, corpus in enumerate(corpora):
        first.setdefault(corpus.direction, i)
    return first


Key = tuple[int, str]  # (corpus index, split name)


class CorpusTexts:
    """The corpora of a run (:func:`make_corpora`): their directions, the splits each one has,
    and their texts. A validation or test split is read whole once and kept (BLEU's
    references; small), a training split only ever streamed (:meth:`chunks`)."""

    def __init__(self, corpora: list[Corpus]) -> None:
        self.corpora = corpora
        self.validated = validated(corpora)  # direction -> its corpus for val and test
        self.directions = list(self.validated)
        self._texts: dict[Key, ParallelText] = {}

    def corpus(self, direction: str | None) -> int:
        """The corpus that validates ``direction`` (None: the first direction)."""
        if direction is None:
            return 0
        if direction not in self.validated:
            raise DataError(
                f"no corpus translates {direction}; the directions are {self.directions}"
            )
        return self.validated[direction]

    def splits_of(self, c: int) -> list[str]:
        """Corpus ``c``'s splits: its training split, and if it validates its direction its val
        and test splits."""
        corpus = self.corpora[c]
        if self.validated[corpus.direction] != c:
            return [corpus.splits["train"]]
        return list(dict.fromkeys(corpus.splits.values()))

    def trains(self) -> list[Key]:
        """Each corpus's training split."""
        return [(c, corpus.splits["train"]) for c, corpus in enumerate(self.corpora)]

    def split_name(self, name: str, direction: str | None = None) -> str:
        """The split a stage alias (``train``/``val``/``test``) names in ``direction``'s corpus;
        any other name as it is."""
        return self.corpora[self.corpus(direction)].splits.get(name, name)

    def source_prefix(self, direction: str | None = None) -> tuple[str, ...]:
        """The tokens before each source sentence translated in ``direction``: its corpus's
        target token, if it has one (``Tokenizer.with_prefix`` puts them there)."""
        return prefix_tokens(self.corpora[self.corpus(direction)], training=False)

    def prefix(self, c: int, split: str) -> tuple[str, ...]:
        """The tokens before each source sentence of corpus ``c``'s ``split`` (training: its tag
        too)."""
        corpus = self.corpora[c]
        return prefix_tokens(corpus, training=split == corpus.splits["train"])

    def tag(self, c: int) -> str:
        return self.corpora[c].source.tag

    def read(self, split: str, c: int = 0) -> ParallelText:
        """A split's pairs, all of them, checked (and kept)."""
        if (c, split) not in self._texts:
            origin = self.corpora[c].source.origin(split)
            self._texts[c, split] = ParallelText.join(self.chunks(split, c), origin)
        return self._texts[c, split]

    def chunks(self, split: str, c: int = 0) -> Iterator[ParallelText]:
        """A split's pairs as the source streams them, checked on the way."""
        if (c, split) in self._texts:
            return iter([self._texts[c, split]])
        source = self.corpora[c].source
        langs = source.src_lang, source.tgt_lang
        return checked(source.read_chunks(split), split, langs, source.origin(split))

    def pairs(self, split: str, direction: str | None = None) -> ParallelText:
        """A split of ``direction`` (a stage alias or a name), in corpus order (index =
        ``Batch.ids``), the source side as the files have it (without :meth:`source_prefix`)."""
        return self.read(self.split_name(split, direction), self.corpus(direction))

    def files(self, split: str, direction: str | None = None) -> list[Path]:
        """The files a split of ``direction`` (:meth:`pairs`) is read from."""
        c = self.corpus(direction)
        return self.corpora[c].source.files(self.split_name(split, direction))

    def references(self, split: str, direction: str | None = None) -> list[str]:
        """Target-side texts of a split of ``direction`` (:meth:`pairs`)."""
        return self.pairs(split, direction).tgt

    def sources(self, split: str, direction: str | None = None) -> list[str]:
        """Source-side texts of a split of ``direction`` (:meth:`pairs`)."""
        return self.pairs(split, direction).src


def direction_prefix(settings: Mapping[str, Any], direction: str | None) -> tuple[str, ...]:
    """The target token before each source line translated in ``direction`` (None: the first)
    by a model of data ``settings`` (a checkpoint's), if it was trained with them. A direction
    for a model that records no corpus (an imported one) is refused: it has none to choose."""
    if direction is None and not uses_target_tokens(settings):
        return ()
    if "source" not in settings and not settings.get("corpora"):
        raise ConfigError(
            f"direction={direction!r}: the checkpoint records no corpus (an imported model), so "
            "it has no directions to choose from; leave direction out (a multilingual OPUS-MT "
            "model reads the language from a token at each line's start, e.g. '>>fra<< ...')"
        )
    return CorpusTexts(make_corpora(settings.get("corpora"), settings)).source_prefix(direction)
