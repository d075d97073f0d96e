"""Raw parallel text from a Hugging Face dataset (:class:`transformer.data.sources.CorpusSource`);
``datasets`` is imported only when one is read."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from transformer.data.sources import CorpusSource
from transformer.data.text_files import CHUNK_PAIRS, ParallelText
from transformer.errors import DataError


class HFSource(CorpusSource):
    """A Hugging Face dataset with a ``translation`` feature (``{"de": ..., "en": ...}``).

    Loaded with ``datasets.load_from_disk(path)`` when ``path`` is given (a ``DatasetDict`` saved
    with ``save_to_disk``), else ``datasets.load_dataset(name, config)``.
    """

    def __init__(
        self,
        src_lang: str,
        tgt_lang: str,
        name: str | None = None,
        config: str | None = None,
        path: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(src_lang, tgt_lang)
        if (name is None) == (path is None):
            raise DataError(
                "data=hf needs exactly one of data.hf_name (hub) or data.hf_path (disk)"
            )
        self.name, self.config, self.path = name, config, path
        self._dict = None

    @property
    def tag(self) -> str:
        if self.path is not None:
            return f"hf-{Path(self.path).resolve().name}"
        return "hf-" + "-".join(x for x in (self.name, self.config) if x).replace("/", "_")

    def _split(self, split: str):
        import datasets

        if self._dict is None:
            if self.path is not None:
                self._dict = datasets.load_from_disk(str(self.path))
            else:
                try:
                    self._dict = datasets.load_dataset(self.name, self.config)
                except ValueError as err:  # e.g. a config the dataset does not have
                    raise DataError(
                        f"data.hf_name={self.name} data.hf_config={self.config}: {err}"
                    ) from err
        if split not in self._dict:
            raise DataError(f"{self.tag} has no split {split!r}; it has {list(self._dict)}")
        ds = self._dict[split]
        if "translation" not in ds.column_names:
            raise DataError(
                f"{self.tag}[{split}] has no 'translation' column (columns: {ds.column_names})"
            )
        return ds

    def identity(self, split: str) -> str:
        return f"{self.tag}:{split}:{self._split(split)._fingerprint}"

    def files(self, split: str) -> list[Path]:
        return [Path(f["filename"]) for f in self._split(split).cache_files]

    def origin(self, split: str) -> str:
        return f"{self.tag}[{split}]"

    def read_chunks(self, split: str, chunk: int = CHUNK_PAIRS) -> Iterator[ParallelText]:
        flat = self._split(split).select_columns(["translation"]).flatten()
        columns = [f"translation.{lang}" for lang in (self.src_lang, self.tgt_lang)]
        for column in columns:
            if column not in flat.column_names:
                langs = [c.removeprefix("translation.") for c in flat.column_names]
                raise DataError(
                    f"{self.origin(split)} has no language {column.split('.')[1]!r}; it has {langs}"
                )
        for batch in flat.select_columns(columns).iter(batch_size=chunk):
            src, tgt = ([t or "" for t in batch[c]] for c in columns)
            yield ParallelText(src, tgt, self.origin(split))
