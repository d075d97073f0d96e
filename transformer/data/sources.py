"""Raw parallel text: Multi30k files and local files (text/TSV/JSONL); Hugging Face datasets in
:mod:`transformer.data.hf_source`.

Every source reads one split as a stream of :class:`ParallelText` chunks (source and target
sentences in corpus order), so that no split is ever whole in memory unless asked for (``read``),
and gives a cheap ``identity`` string for a split that changes whenever its data does, which names
the caches built from it. Bad input raises :class:`DataError` naming the file, the line or the
counts, and what would fix it; nothing is skipped silently. The file formats are read in
:mod:`transformer.data.text_files`.
"""

from __future__ import annotations

import logging
import os
import shutil
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.data.text_files import (
    CHUNK_PAIRS,
    ParallelText,
    file_identity,
    iter_jsonl,
    iter_parallel_files,
    iter_tsv,
)
from transformer.errors import DataError

log = logging.getLogger(__name__)

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw"
MULTI30K_SPLITS = ("train", "val", "test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
MULTI30K_LANGS = ("en", "de", "fr", "cs")
DOWNLOAD_TIMEOUT_S = 10.0


class CorpusSource(ABC):
    """A parallel corpus with named splits, read in the direction ``src_lang -> tgt_lang``."""

    def __init__(self, src_lang: str, tgt_lang: str) -> None:
        if src_lang == tgt_lang:
            raise DataError(
                f"data.src_lang and data.tgt_lang are both {src_lang!r}; choose two languages"
            )
        self.src_lang, self.tgt_lang = src_lang, tgt_lang

    @property
    @abstractmethod
    def tag(self) -> str:
        """A short file-name-safe name of the corpus for cache file names."""

    def prepare(self, splits: list[str]) -> None:  # noqa: B027 (optional hook)
        """Make the splits available locally (download); a no-op where they already are."""

    @abstractmethod
    def identity(self, split: str) -> str:
        """A cheap string that changes whenever the split's data does."""

    @abstractmethod
    def files(self, split: str) -> list[Path]:
        """The files the split is read from."""

    @abstractmethod
    def origin(self, split: str) -> str:
        """Where the split's pairs come from (files, a dataset), for messages."""

    @abstractmethod
    def read_chunks(self, split: str, chunk: int = CHUNK_PAIRS) -> Iterator[ParallelText]:
        """The split's sentence pairs in corpus order, ``chunk`` at a time, validated as read."""

    def read(self, split: str) -> ParallelText:
        """The split's sentence pairs, all of them."""
        return ParallelText.join(self.read_chunks(split), self.origin(split))


class Multi30kSource(CorpusSource):
    """The official raw gzipped Multi30k files ``{split}.{lang}.gz`` in ``root``.

    Missing files are downloaded once from the public release when ``download`` is on; files
    already in ``root`` (``data.root=DIR``) are read with the same code.
    """

    tag = "multi30k"

    def __init__(
        self, root: str | os.PathLike, src_lang: str, tgt_lang: str, download: bool = True
    ):
        super().__init__(src_lang, tgt_lang)
        for lang in (src_lang, tgt_lang):
            if lang not in MULTI30K_LANGS:
                raise DataError(f"Multi30k has no language {lang!r}; choose from {MULTI30K_LANGS}")
        self.root = Path(root)
        self.download = download

    def path(self, split: str, lang: str) -> Path:
        return self.root / f"{split}.{lang}.gz"

    def prepare(self, splits: list[str]) -> None:
        missing = [
            self.path(s, lang)
            for s in splits
            for lang in (self.src_lang, self.tgt_lang)
            if not self.path(s, lang).exists()
        ]
        if not missing:
            return
        names = ", ".join(p.name for p in missing)
        hint = (
            f"Put the Multi30k files ({names}) into {self.root}, or pass data.root=DIR for a "
            "directory that has them (e.g. data.root=../shared/data/multi30k)"
        )
        if not self.download:
            raise DataError(f"Multi30k files missing from {self.root}. {hint}")
        self.root.mkdir(parents=True, exist_ok=True)
        for path in missing:
            url = f"{MULTI30K_URL}/{path.name}"
            log.info("downloading %s", url)
            try:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as r:
                    atomic_write(path, partial(shutil.copyfileobj, r))
            except OSError as err:  # URLError, HTTPError, timeouts are all OSErrors
                raise DataError(f"could not download {url} ({err}). {hint}") from err

    def _paths(self, split: str) -> tuple[Path, Path]:
        paths = self.path(split, self.src_lang), self.path(split, self.tgt_lang)
        for p in paths:
            if not p.exists():
                raise DataError(
                    f"{p} does not exist: Multi30k split {split!r} is not there for this language "
                    f"pair; splits are {MULTI30K_SPLITS} (cs lacks the 2017 test sets)"
                )
        return paths

    def files(self, split: str) -> list[Path]:
        return list(self._paths(split))

    def identity(self, split: str) -> str:
        return file_identity(*self._paths(split))

    def origin(self, split: str) -> str:
        return " + ".join(map(str, self._paths(split)))

    def read_chunks(self, split: str, chunk: int = CHUNK_PAIRS) -> Iterator[ParallelText]:
        return iter_parallel_files(*self._paths(split), chunk)


class LocalSource(CorpusSource):
    """Local files in ``root``, per split one of (plain or ``.gz``):

    * ``{split}.{lang}``: one text file per language, one sentence per line;
    * ``{split}.tsv``: a header line naming the languages (``en<TAB>de``), then one pair a line;
    * ``{split}.jsonl``: one JSON object a line, ``{"en": ..., "de": ...}`` or
      ``{"translation": {"en": ..., "de": ...}}``;
    * a directory ``{split}/`` of shards in one of these formats (``part-000.en`` with
      ``part-000.de``, or ``*.tsv``, or ``*.jsonl``), read in the order of their names as one
      split.
    """

    def __init__(self, root: str | os.PathLike, src_lang: str, tgt_lang: str) -> None:
        super().__init__(src_lang, tgt_lang)
        self.root = Path(root)

    @property
    def tag(self) -> str:
        return f"local-{self.root.resolve().name}"

    def _files(self, split: str) -> tuple[str, list[list[Path]]]:
        """The split's format and its files: one group per shard, ``[src, tgt]`` or ``[file]``."""
        if (self.root / split).is_dir():
            return self._shards(split)
        found = (
            _find(self.root, f"{split}.{self.src_lang}"),
            _find(self.root, f"{split}.{self.tgt_lang}"),
        )
        if found[0] and found[1]:
            return "text", [list(found)]
        for kind in ("tsv", "jsonl"):
            if p := _find(self.root, f"{split}.{kind}"):
                return kind, [[p]]
        raise DataError(
            f"no files for split {split!r} in {self.root}: expected {split}.{self.src_lang} and "
            f"{split}.{self.tgt_lang}, or {split}.tsv, or {split}.jsonl (each optionally .gz), or "
            f"a directory {split}/ of such files"
        )

    def _shards(self, split: str) -> tuple[str, list[list[Path]]]:
        folder = self.root / split
        for kind in (self.src_lang, "tsv", "jsonl"):
            shards = sorted(
                p for p in folder.iterdir() if p.name.endswith((f".{kind}", f".{kind}.gz"))
            )
            if not shards:
                continue
            if kind in ("tsv", "jsonl"):
                return kind, [[p] for p in shards]
            groups = []
            for src in shards:
                stem = src.name.removesuffix(".gz").removesuffix(f".{kind}")
                tgt = _find(folder, f"{stem}.{self.tgt_lang}")
                if tgt is None:
                    raise DataError(
                        f"{src} has no {self.tgt_lang} side: every shard of {folder} needs "
                        f"{stem}.{self.tgt_lang} (or .gz) beside it"
                    )
                groups.append([src, tgt])
            return "text", groups
        raise DataError(
            f"{folder} has no shards: expected files *.{self.src_lang} with *.{self.tgt_lang}, or "
            "*.tsv, or *.jsonl (each optionally .gz)"
        )

    def files(self, split: str) -> list[Path]:
        return [p for group in self._files(split)[1] for p in group]

    def identity(self, split: str) -> str:
        return file_identity(*self.files(split))

    def origin(self, split: str) -> str:
        kind, groups = self._files(split)
        first = " + ".join(map(str, groups[0]))
        return first if len(groups) == 1 else f"{self.root / split} ({len(groups)} shards)"

    def read_chunks(self, split: str, chunk: int = CHUNK_PAIRS) -> Iterator[ParallelText]:
        kind, groups = self._files(split)
        for group in groups:
            if kind == "text":
                yield from iter_parallel_files(*group, chunk)
            else:
                read = iter_tsv if kind == "tsv" else iter_jsonl
                yield from read(group[0], self.src_lang, self.tgt_lang, chunk)


def _find(folder: Path, name: str) -> Path | None:
    """``folder/name`` or ``folder/name.gz``, whichever exists."""
    for p in (folder / name, folder / f"{name}.gz"):
        if p.exists():
            return p
    return None
