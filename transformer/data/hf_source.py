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
    with ``save_to_disk``), else ``datasets.load_dataset(name, config)``, from the hub
    repository's ``revision`` and folder ``data_dir`` where given. A repository that holds a
    loading script, which ``datasets`` no longer runs, is read from the hub's Parquet export of
    it: ``revision="refs/convert/parquet"``, ``data_dir`` the script's config.
    """

    def __init__(
        self,
        src_lang: str,
        tgt_lang: str,
        name: str | None = None,
        config: str | None = None,
        path: str | os.PathLike | None = None,
        revision: str | None = None,
        data_dir: str | None = None,
    ) -> None:
        super().__init__(src_lang, tgt_lang)
        if (name is None) == (path is None):
            raise DataError(
                "data=hf needs exactly one of data.hf_name (hub) or data.hf_path (disk)"
            )
        self.name, self.config, self.path = name, config, path
        self.revision, self.data_dir = revision, data_dir
        self._dict = None

    @property
    def tag(self) -> str:
        if self.path is not None:
            return f"hf-{Path(self.path).resolve().name}"
        parts = (self.name, self.config, self.data_dir)
        return "hf-" + "-".join(x for x in parts if x).replace("/", "_")

    def _load(self):
        import datasets

        if self.path is not None:
            return datasets.load_from_disk(str(self.path))
        options = {"name": self.name, "config": self.config}
        extra = {k: v for k, v in (("revision", self.revision), ("data_dir", self.data_dir)) if v}
        where = " ".join(f"data.hf_{k}={v}" for k, v in {**options, **extra}.items() if v)
        try:
            return datasets.load_dataset(self.name, self.config, **extra)
        except ValueError as err:  # e.g. a config the dataset does not have
            raise DataError(f"{where}: {err}") from err
        except RuntimeError as err:
            if "scripts are no longer supported" not in str(err):
                raise
            raise DataError(
                f"{where}: the dataset is a loading script, which datasets no longer runs; read "
                "the hub's Parquet export of it: data.hf_revision=refs/convert/parquet "
                "data.hf_data_dir=<its config> (and data.hf_config=null)"
            ) from err

    def _split(self, split: str):
        if self._dict is None:
            self._dict = self._load()
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
