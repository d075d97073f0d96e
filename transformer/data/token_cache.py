"""Token ids on disk: tokenize a split once, a chunk at a time, filter it, write it as an Arrow file
under a name derived from a fingerprint of its inputs, and load it back memory-mapped on later
runs (only the rows read become resident)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from torch.utils.data import Dataset

from transformer.atomic import atomic_directory
from transformer.data.collate import Example, round_up
from transformer.data.text_files import ParallelText
from transformer.data.tokenizer import Tokenizer
from transformer.errors import DataError

log = logging.getLogger(__name__)

TOKENS_FILE = "tokens.arrow"  # in a split's cache directory: an Arrow IPC file of SCHEMA
CACHE_FORMAT = 2  # part of every cache name: caches of another layout are never read
_IDS = pa.list_(pa.int32())
SCHEMA = pa.schema([("id", pa.int64()), ("src_ids", _IDS), ("tgt_ids", _IDS)])


class DamagedCache(DataError):
    """A token cache that cannot be read back (the data module builds it again)."""


def fingerprint(*parts: object) -> str:
    """A short hex digest of JSON-serialisable parts."""
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:16]


def build_split(
    parts: Iterable[ParallelText],
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    path: Path,
    max_len: int | None,
    name: str,
) -> None:
    """Tokenize the pairs of ``parts`` (a split's chunks, in corpus order) and write their ids to
    ``path`` chunk by chunk, so memory holds one chunk whatever the split's size; the directory
    appears whole or not at all (an error in the input or a full disk leaves nothing that a later
    run would read back).

    With ``max_len`` (training), pairs with an empty side and pairs with more than ``max_len``
    pieces on a side are dropped and counted in the log; without it every pair is kept, so that
    evaluation covers the whole split in corpus order.
    """
    counts = {"pairs": 0, "kept": 0, "empty": 0, "too_long": 0}
    origin = name

    def write(tmp: Path) -> None:
        nonlocal origin
        tmp.mkdir(parents=True)
        with pa.ipc.new_file(str(tmp / TOKENS_FILE), SCHEMA) as writer:
            for part in parts:
                origin = part.origin
                src = pa.array(src_tok.encode_batch(part.src), _IDS)
                tgt = pa.array(tgt_tok.encode_batch(part.tgt), _IDS)
                ids = pa.array(np.arange(len(src)) + counts["pairs"], pa.int64())
                batch = pa.record_batch([ids, src, tgt], schema=SCHEMA)
                counts["pairs"] += len(src)
                if max_len is not None:
                    batch = batch.filter(_keep(src, tgt, max_len, counts))
                counts["kept"] += len(batch)
                writer.write_batch(batch)
        if max_len is not None:
            _check_kept(counts, name, origin, max_len)

    try:
        atomic_directory(path, write)
    except OSError as err:
        raise DataError(
            f"could not write the token cache {path} ({err}); free space there or set "
            "data.cache_dir to a disk with room"
        ) from err


def _keep(src: pa.Array, tgt: pa.Array, max_len: int, counts: dict[str, int]) -> pa.Array:
    """The pairs kept by training's filters, counting those dropped into ``counts``."""
    src_len = pc.list_value_length(src).to_numpy()
    tgt_len = pc.list_value_length(tgt).to_numpy()
    empty = (src_len == 0) | (tgt_len == 0)
    too_long = ~empty & ((src_len > max_len) | (tgt_len > max_len))
    counts["empty"] += int(empty.sum())
    counts["too_long"] += int(too_long.sum())
    return pa.array(~(empty | too_long))


def _check_kept(counts: dict[str, int], name: str, origin: str, max_len: int) -> None:
    n, empty, too_long = counts["pairs"], counts["empty"], counts["too_long"]
    log.info(
        "%s: kept %d of %d pairs; dropped %d with an empty side, %d longer than max_len=%d",
        name, counts["kept"], n, empty, too_long, max_len,
    )  # fmt: skip
    if counts["kept"] == 0:
        raise DataError(
            f"no pairs left in {name} ({origin}) after filtering: the empty-side filter "
            f"removed {empty} of {n} pairs and the max_len={max_len} filter removed "
            f"{too_long}; check the files or raise data.max_len"
        )


class TokenIds:
    """One side of a tokenized split: its Arrow list chunks, indexed where they lie. Loaded from the
    cache they are memory-mapped, so only the rows read become resident (concatenating the chunks
    would copy the whole split into memory: docs/benchmarks.md#data-pipeline-at-wmt-sizes)."""

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
        """The split cached in ``path``; a damaged file (cut short, overwritten, not Arrow)
        raises :class:`DamagedCache`. The check reads the list offsets, which loading reads anyway,
        not the token ids."""
        file = path / TOKENS_FILE
        try:
            table = pa.ipc.open_file(pa.memory_map(str(file))).read_all()
            if table.schema != SCHEMA:
                raise pa.ArrowInvalid(f"columns {table.schema.names}, not {SCHEMA.names}")
            table.validate(full=True)
        except (pa.ArrowInvalid, OSError) as err:
            raise DamagedCache(f"the token cache {file} is damaged ({err})") from err
        return cls(table.column("id").to_numpy(), table.column("src_ids"), table.column("tgt_ids"))

    def __len__(self) -> int:
        return len(self.ids)

    def check_fits(
        self, name: str, max_positions: int, max_tokens: int | None = None, pad_to_multiple: int = 1
    ) -> None:
        """Raise :class:`DataError` if a pair has more than ``max_positions`` pieces on a side
        with bos/eos, or (given ``max_tokens``, a batch's budget) fills more than a batch
        (``name``: the split, for the message)."""
        longer = np.maximum(self.src_lens, self.tgt_lens) + 1  # with bos/eos
        if (over := longer > max_positions).any():
            raise self._too_long(
                name, over, f"model.max_positions={max_positions} pieces with bos/eos",
                lambda i: f"{self.src_lens[i]} source / {self.tgt_lens[i]} target pieces",
                "raise model.max_positions or shorten them",
            )  # fmt: skip
        if max_tokens is None:
            return
        need = round_up(longer, pad_to_multiple)  # the tokens of a batch of one
        if (over := need > max_tokens).any():
            raise self._too_long(
                name, over, f"data.max_tokens={max_tokens}, the tokens of a batch",
                lambda i: f"{need[i]} tokens with bos/eos",
                f"raise data.max_tokens to at least {need.max()} or shorten them",
            )  # fmt: skip

    def _too_long(
        self, name: str, over: np.ndarray, limit: str, sizes: Callable[[int], str], fix: str
    ) -> DataError:
        """The error for the pairs the mask ``over`` marks as longer than ``limit``: their count,
        the first's number and ``sizes``, then the ``fix``."""
        (found,) = np.nonzero(over)
        i = int(found[0])
        return DataError(
            f"{name}: {found.size} sentence pair(s) longer than {limit} (first: pair "
            f"{int(self.ids[i]) + 1} in corpus order, {sizes(i)}); {fix}"
        )

    def __getitem__(self, i: int) -> Example:
        return int(self.ids[i]), self._src[i], self._tgt[i]


class ConcatSplit(Dataset):
    """Several tokenized splits as one (training on several corpora): ``parts[0]``'s examples,
    then ``parts[1]``'s, ...; ``ids`` are each part's own sentence ids."""

    def __init__(self, parts: list[TokenizedSplit]) -> None:
        self.parts = parts
        self.ids = np.concatenate([p.ids for p in parts])
        self.src_lens = np.concatenate([p.src_lens for p in parts])
        self.tgt_lens = np.concatenate([p.tgt_lens for p in parts])
        self._starts = np.cumsum([0, *(len(p) for p in parts)])

    def __len__(self) -> int:
        return len(self.ids)

    def locate(self, i: int) -> tuple[int, int]:
        """The part example ``i`` is in, and its index there."""
        k = int(np.searchsorted(self._starts, i, side="right")) - 1
        return k, i - int(self._starts[k])

    def __getitem__(self, i: int) -> Example:
        k, j = self.locate(i)
        return self.parts[k][j]
