"""Token ids on disk: tokenize a split once with ``datasets.map``, filter it, save it under a name
derived from a fingerprint of its inputs, and load it back memory-mapped on later runs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import Dataset

from transformer.atomic import atomic_directory
from transformer.data.collate import Example
from transformer.data.text_files import ParallelText
from transformer.data.tokenizer import Tokenizer
from transformer.errors import DataError

log = logging.getLogger(__name__)

# Rows from which tokenizing in several processes pays for their start-up.
MULTIPROCESS_MIN_ROWS = 500_000
_IDS = datasets.List(datasets.Value("int32"))
FEATURES = datasets.Features({"id": datasets.Value("int64"), "src_ids": _IDS, "tgt_ids": _IDS})


def fingerprint(*parts: object) -> str:
    """A short hex digest of JSON-serialisable parts."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:16]


def content_digest(data: bytes) -> str:
    """A short hex digest of a file's contents (as :func:`file_digest` gives for the file)."""
    return hashlib.sha1(data).hexdigest()[:16]


def file_digest(path: str | os.PathLike) -> str:
    return content_digest(Path(path).read_bytes())


class _Encode:
    """The batched ``datasets.map`` function (a class, so it pickles for worker processes)."""

    def __init__(self, src_tok: Tokenizer, tgt_tok: Tokenizer) -> None:
        self.src_tok, self.tgt_tok = src_tok, tgt_tok

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        return {
            "id": batch["id"],
            "src_ids": self.src_tok.encode_batch(batch["src"]),
            "tgt_ids": self.tgt_tok.encode_batch(batch["tgt"]),
        }


def build_split(
    text: ParallelText,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    path: Path,
    max_len: int | None,
    name: str,
) -> None:
    """Tokenize ``text`` and save it at ``path``, whole or not at all (a full disk leaves nothing
    that a later run would read back).

    With ``max_len`` (training), pairs with an empty side and pairs with more than ``max_len``
    pieces on a side are dropped and counted in the log; without it every pair is kept, so that
    evaluation covers the whole split in corpus order.
    """
    n = len(text.src)
    ds = datasets.Dataset.from_dict({"id": np.arange(n), "src": text.src, "tgt": text.tgt})
    ds = ds.map(
        _Encode(src_tok, tgt_tok),
        batched=True,
        batch_size=10_000,
        remove_columns=["src", "tgt"],
        features=FEATURES,
        num_proc=min(os.cpu_count() or 1, 8) if n >= MULTIPROCESS_MIN_ROWS else None,
        new_fingerprint=path.name,
        desc=f"tokenizing {name}",
    )
    if max_len is not None:
        src_len = pc.list_value_length(ds.data.column("src_ids")).to_numpy()
        tgt_len = pc.list_value_length(ds.data.column("tgt_ids")).to_numpy()
        empty = (src_len == 0) | (tgt_len == 0)
        too_long = ~empty & ((src_len > max_len) | (tgt_len > max_len))
        keep = np.flatnonzero(~(empty | too_long))
        log.info(
            "%s: kept %d of %d pairs; dropped %d with an empty side, %d longer than max_len=%d",
            name, len(keep), n, int(empty.sum()), int(too_long.sum()), max_len,
        )  # fmt: skip
        if len(keep) == 0:
            raise DataError(
                f"no pairs left in {name} ({text.origin}) after filtering: the empty-side filter "
                f"removed {int(empty.sum())} of {n} pairs and the max_len={max_len} filter removed "
                f"{int(too_long.sum())}; check the files or raise data.max_len"
            )
        if len(keep) < n:
            ds = ds.select(keep)
    try:
        atomic_directory(path, lambda tmp: ds.save_to_disk(str(tmp)))
    except OSError as err:
        raise DataError(
            f"could not write the token cache {path} ({err}); free space there or set "
            "data.cache_dir to a disk with room"
        ) from err


class TokenIds:
    """One side of a tokenized split: its Arrow list chunks, indexed where they lie. Loaded from
    the cache they are memory-mapped, so only the rows read become resident (concatenating the
    chunks would copy the whole split into memory: BENCHMARKS.md, "Data pipeline at WMT
    sizes")."""

    def __init__(self, column: pa.ChunkedArray) -> None:
        chunks = [c for c in column.chunks if len(c)]
        self._offsets = [c.offsets.to_numpy() for c in chunks]  # into each chunk's values
        self._values = [c.values.to_numpy() for c in chunks]
        self._starts = np.cumsum([0, *(len(c) for c in chunks)])  # first row of each chunk
        self.lens = np.concatenate([np.diff(o) for o in self._offsets] or [np.zeros(0, int)])

    def __getitem__(self, i: int) -> np.ndarray:
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        offsets, j = self._offsets[k], i - self._starts[k]
        return self._values[k][offsets[j] : offsets[j + 1]]


class TokenizedSplit(Dataset):
    """A tokenized split: sentence ids and both sides' token ids; ``split[i]`` is an
    :data:`Example`."""

    def __init__(self, ids: np.ndarray, src: pa.ChunkedArray, tgt: pa.ChunkedArray) -> None:
        self.ids = ids
        self._src, self._tgt = TokenIds(src), TokenIds(tgt)
        self.src_lens, self.tgt_lens = self._src.lens, self._tgt.lens

    @classmethod
    def load(cls, path: Path) -> TokenizedSplit:
        table = datasets.load_from_disk(str(path)).data
        return cls(table.column("id").to_numpy(), table.column("src_ids"), table.column("tgt_ids"))

    def __len__(self) -> int:
        return len(self.ids)

    def check_fits(self, name: str, max_positions: int) -> None:
        """Raise :class:`DataError` if a pair has more than ``max_positions`` pieces on a side
        with bos/eos (``name``: the split, for the message)."""
        over = np.flatnonzero(np.maximum(self.src_lens, self.tgt_lens) + 1 > max_positions)
        if over.size:
            i = int(over[0])
            raise DataError(
                f"{name}: {over.size} sentence pair(s) longer than model.max_positions="
                f"{max_positions} pieces with bos/eos (first: pair {int(self.ids[i]) + 1} in "
                f"corpus order, {self.src_lens[i]} source / {self.tgt_lens[i]} target pieces); "
                "raise model.max_positions or shorten them"
            )

    def __getitem__(self, i: int) -> Example:
        return int(self.ids[i]), self._src[i], self._tgt[i]
