"""Batches: padded source, decoder input (bos + y), labels (y + eos) and padding masks."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace

import numpy as np
import torch
from torch import Tensor

from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer
from transformer.masks import padding_mask

log = logging.getLogger(__name__)

# One example as the dataset gives it: (index in the split, source piece ids, target piece ids),
# the ids without bos/eos.
Example = tuple[int, np.ndarray, np.ndarray]


@dataclass
class Batch:
    """A padded batch. Masks are True at padding (see :mod:`transformer.masks`).

    ``src`` is ``x + eos``; ``tgt_in`` is ``bos + y`` and ``labels`` is ``y + eos``, both padded
    with ``pad_id`` to the same length, so ``labels[:, t]`` is what the decoder predicts after
    reading ``tgt_in[:, : t + 1]``. ``ids`` are the examples' indices in their split (corpus
    order), so outputs can be put back in corpus order; rows that :class:`Buckets` add are all
    padding, with id -1.
    """

    src: Tensor  # (B, S) long
    tgt_in: Tensor  # (B, T) long
    labels: Tensor  # (B, T) long
    src_pad_mask: Tensor  # (B, S) bool, True at padding
    num_tgt_tokens: int  # non-pad labels
    ids: Tensor  # (B,) long

    def __len__(self) -> int:
        return self.src.shape[0]

    def pin_memory(self) -> Batch:
        """Called by ``DataLoader(pin_memory=True)``."""
        return replace(
            self,
            **{
                f.name: getattr(self, f.name).pin_memory()
                for f in fields(self)
                if _is_tensor(self, f)
            },
        )


def _is_tensor(batch: Batch, f) -> bool:
    return isinstance(getattr(batch, f.name), Tensor)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def padded_sizes(src_len: int, tgt_len: int) -> tuple[int, int]:
    """Lengths of one example's rows in a batch: ``x + eos`` and ``bos + y`` (= ``y + eos``)."""
    return src_len + 1, tgt_len + 1


@dataclass(frozen=True)
class Buckets:
    """The few shapes training batches are padded to, so that a compiled step with static shapes
    (CUDA graphs) is compiled once a bucket rather than once for every shape token-budget
    batches take.

    A batch's rows, source and target alike, are padded to the smallest of ``lengths`` that holds
    its longest side, and the batch to :meth:`rows` rows, the added ones all padding. Padding
    changes no loss: padded keys are masked, padded labels ignored.
    """

    lengths: tuple[int, ...]  # ascending
    max_tokens: int | None  # the token budget; None: batch_size sentences a batch
    batch_size: int | None = None

    @classmethod
    def at_quantiles(
        cls,
        sizes: np.ndarray,
        count: int,
        multiple: int,
        max_tokens: int | None,
        batch_size: int | None = None,
    ) -> Buckets:
        """``count`` lengths at evenly spaced quantiles of the examples' row ``sizes`` (the
        last: the longest), rounded up to ``multiple``; fewer where they coincide. As fairseq's
        ``num_batch_buckets``: short sentences get short buckets where most sentences are."""
        quantiles = np.quantile(sizes, np.linspace(0, 1, count + 1)[1:], method="higher")
        lengths = sorted({round_up(int(q), multiple) for q in quantiles})
        return cls(tuple(lengths), max_tokens, batch_size)

    def length(self, longest: np.ndarray) -> np.ndarray:
        """The padded length of a batch whose longest row is ``longest`` tokens (elementwise)."""
        i = np.searchsorted(self.lengths, longest)
        if np.any(i == len(self.lengths)):
            too_long = int(np.max(longest))
            raise ValueError(
                f"a row of {too_long} tokens is longer than every bucket {self.lengths}"
            )
        return np.asarray(self.lengths)[i]

    def rows(self, length: int) -> int:
        """A batch's rows at bucket length ``length``: the most the token budget packs there
        (``max_tokens // length``), or ``batch_size``."""
        return self.max_tokens // length if self.max_tokens is not None else self.batch_size

    def __str__(self) -> str:
        return ", ".join(f"{self.rows(n)}x{n}" for n in self.lengths)


class Collator:
    """Turns a list of :data:`Example` into a :class:`Batch`; picklable for DataLoader workers.
    With ``buckets``, batches take the shapes of :class:`Buckets`."""

    def __init__(
        self, pad_to_multiple: int = 1, pad_id: int = PAD_ID, buckets: Buckets | None = None
    ) -> None:
        if pad_to_multiple < 1:
            raise ValueError(f"pad_to_multiple must be >= 1, got {pad_to_multiple}")
        self.pad_to_multiple = pad_to_multiple
        self.pad_id = pad_id
        self.buckets = buckets

    def _shape(self, examples: list[Example]) -> tuple[int, int, int]:
        """Rows, source length and target length of the padded batch."""
        s_len = max(len(s) for _, s, _ in examples) + 1
        t_len = max(len(t) for _, _, t in examples) + 1
        if self.buckets is None:
            m = self.pad_to_multiple
            return len(examples), round_up(s_len, m), round_up(t_len, m)
        length = int(self.buckets.length(max(s_len, t_len)))
        rows = self.buckets.rows(length)
        if len(examples) > rows:
            raise ValueError(f"{len(examples)} examples do not fit bucket {rows}x{length}")
        return rows, length, length

    def __call__(self, examples: list[Example]) -> Batch:
        n, s_len, t_len = self._shape(examples)
        src = np.full((n, s_len), self.pad_id, dtype=np.int64)
        tgt_in = np.full((n, t_len), self.pad_id, dtype=np.int64)
        labels = np.full((n, t_len), self.pad_id, dtype=np.int64)
        ids = np.full(n, -1, dtype=np.int64)
        for row, (i, s, t) in enumerate(examples):
            ids[row] = i
            src[row, : len(s)] = s
            src[row, len(s)] = EOS_ID
            tgt_in[row, 0] = BOS_ID
            tgt_in[row, 1 : len(t) + 1] = t
            labels[row, : len(t)] = t
            labels[row, len(t)] = EOS_ID
        src_t, tgt_in_t, labels_t = map(torch.from_numpy, (src, tgt_in, labels))
        labels_mask = padding_mask(labels_t, self.pad_id)
        return Batch(
            src=src_t,
            tgt_in=tgt_in_t,
            labels=labels_t,
            src_pad_mask=padding_mask(src_t, self.pad_id),
            num_tgt_tokens=int((~labels_mask).sum()),
            ids=torch.from_numpy(ids),
        )


# Raw text outside a Batch (translation, analysis): the same conventions, with lengths capped at
# the model's positions.


def encode_sources(
    tok: Tokenizer, texts: Sequence[str], limit: int, line_numbers: Sequence[int] | None = None
) -> list[list[int]]:
    """Texts -> ``x + eos`` ids, at most ``limit`` long; cut lines are counted in a warning that
    names the first by its number in ``line_numbers`` (default: 1, 2, ...)."""
    encoded = tok.encode_batch(list(texts))
    cut = [i for i, ids in enumerate(encoded) if len(ids) + 1 > limit]
    if cut:
        first = line_numbers[cut[0]] if line_numbers is not None else cut[0] + 1
        log.warning(
            "%d input line(s) have more than %d pieces with eos (the model's max_positions) and "
            "are cut to fit (first: line %d)", len(cut), limit, first,
        )  # fmt: skip
    return [ids[: limit - 1] + [EOS_ID] for ids in encoded]


def encode_targets(tok: Tokenizer, texts: Sequence[str], limit: int) -> list[list[int]]:
    """Texts -> ``bos + y`` ids (decoder inputs), at most ``limit`` long."""
    return [[BOS_ID, *ids[: limit - 1]] for ids in tok.encode_batch(list(texts))]


def pad(seqs: Sequence[Sequence[int]], pad_id: int, device: torch.device | None = None) -> Tensor:
    """Right-pad id lists into (B, max length) long."""
    out = torch.full((len(seqs), max(len(s) for s in seqs)), pad_id, dtype=torch.long)
    for i, seq in enumerate(seqs):
        out[i, : len(seq)] = torch.tensor(list(seq), dtype=torch.long)
    return out.to(device)
