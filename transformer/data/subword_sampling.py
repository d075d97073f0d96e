"""Subword regularisation (``data.spm_sampling``): each training pair segmented anew every epoch,
in the DataLoader workers, by SentencePiece's own sampler: a unigram model's sampling of Kudo
(2018), a BPE model's BPE-dropout (Provilkov et al., 2020).

The token caches keep the deterministic segmentation: validation and test read them as without
sampling. A training side is decoded from its cached ids to its (normalised) text and segmented
again by a draw seeded with ``(seed, epoch, index, side)``: the same in every run, whichever worker
draws it and however many there are, so a resumed run draws what an uninterrupted one does. A
side that holds an unknown piece keeps its cached ids (the text of ``<unk>`` is lost). A pair
that a corpus ``weight`` takes twice in an epoch is drawn alike both times.

The token budget holds for every batch. The batch sampler plans batches in the main process,
before any draw, from each side's deterministic size grown by what sampling does to sides of
that size (:class:`Growth`: a high quantile, measured on a probe of training pairs when the
loader is made). A worker draws a batch's sides; a drawn side longer than the batch allows
(:class:`RowLimit`: its rows times the padded length within ``max_tokens``, and ``max_len``) is
drawn again, up to :data:`REDRAWS` times, and then keeps its deterministic segmentation, which
always fits. No pair is dropped or cut.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import sentencepiece
from torch.utils.data import Dataset

from transformer.data.collate import Buckets, Example
from transformer.data.token_cache import ConcatSplit, TokenizedSplit
from transformer.data.tokenizer import Tokenizer
from transformer.errors import DataError

log = logging.getLogger(__name__)

KEYS = ("alpha", "nbest")
MAX_NBEST = 512  # SentencePiece's limit
REDRAWS = 3  # draws more of a side too long for its batch, before its deterministic ids
PROBE_PAIRS = 2000  # training pairs drawn to measure the growth that batches are planned for
PLAN_QUANTILE = 0.99  # of the drawn sizes: the share of sides that fit their batch at once
SIZE_BINS = 8  # the growth is measured apart for sides of so many size ranges
SEED_CHECKS = 32  # probe pairs drawn twice: sentencepiece must draw alike under one seed


@dataclass(frozen=True)
class SpmSampling:
    """How segmentations are drawn: a unigram model samples one of its ``nbest`` best
    segmentations (-1: any, from the whole lattice) with probability proportional to its
    likelihood to the power ``alpha``; a BPE model drops each merge with probability ``alpha``
    (``nbest`` -1, unused)."""

    alpha: float
    nbest: int = -1


def sampling_options(options: Mapping[str, Any] | None, model_type: str) -> SpmSampling | None:
    """``data.spm_sampling`` checked for a ``model_type`` SentencePiece model (a ValueError names
    the option and the fix); None when sampling is off (``alpha`` null)."""
    options = dict(options or {})
    if unknown := sorted(set(options) - set(KEYS)):
        raise ValueError(
            f"data.spm_sampling has no key {unknown[0]!r}; its keys are {', '.join(KEYS)}"
        )
    alpha, nbest = options.get("alpha"), options.get("nbest")
    if alpha is None:
        if nbest is not None:
            raise ValueError(
                f"data.spm_sampling.nbest={nbest} without data.spm_sampling.alpha: set alpha "
                "(e.g. 0.1) to sample segmentations, or nbest=null"
            )
        return None
    if model_type not in ("unigram", "bpe"):
        raise ValueError(
            f"data.spm_sampling: a {model_type} SentencePiece model cannot sample "
            "segmentations; use a unigram or bpe model (data.spm_model_type), or set "
            "data.spm_sampling.alpha=null"
        )
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"data.spm_sampling.alpha={alpha!r} must be a number, e.g. 0.1")
    if model_type == "bpe":
        if nbest is not None:
            raise ValueError(
                f"data.spm_sampling.nbest={nbest} applies to unigram models only: BPE-dropout "
                "(data.spm_model_type=bpe) takes alpha alone, the probability of dropping a "
                "merge; set data.spm_sampling.nbest=null"
            )
        if not 0 < alpha < 1:
            raise ValueError(
                f"data.spm_sampling.alpha={alpha} is out of range: for a BPE model it is the "
                "probability of dropping a merge, 0 < alpha < 1 (0.1 in Provilkov et al. 2020); "
                "set one, or alpha=null to turn sampling off"
            )
        return SpmSampling(float(alpha))
    if not 0 < alpha <= 1:
        raise ValueError(
            f"data.spm_sampling.alpha={alpha} is out of range: for a unigram model it smooths "
            "the segmentations' likelihoods (P**alpha), 0 < alpha <= 1 (0.1 to 0.2 in Kudo "
            "2018; smaller draws more varied, longer segmentations); set one, or alpha=null to "
            "turn sampling off"
        )
    nbest = -1 if nbest is None else nbest
    if type(nbest) is not int:
        raise ValueError(
            f"data.spm_sampling.nbest={nbest!r} is not an integer: -1 (any segmentation, from "
            f"the whole lattice) or 2 to {MAX_NBEST} (the n best; 64 in Kudo 2018)"
        )
    if not (nbest == -1 or 2 <= nbest <= MAX_NBEST):
        raise ValueError(
            f"data.spm_sampling.nbest={nbest!r} is out of range: -1 (any segmentation, from "
            f"the whole lattice) or 2 to {MAX_NBEST} (the n best; 64 in Kudo 2018); 0 and 1 "
            "draw nothing but the best"
        )
    return SpmSampling(float(alpha), nbest)


def draw_seed(*key: int) -> int:
    """A 32-bit seed for SentencePiece's sampler from 64-bit ints (a hash of them), below
    2**32 - 1 (which SentencePiece takes for "no seed")."""
    digest = hashlib.blake2b(struct.pack(f"<{len(key)}q", *key), digest_size=8).digest()
    return int.from_bytes(digest, "little") % 0xFFFFFFFF


@dataclass(frozen=True)
class RowLimit:
    """The longest row (pieces + 1 for bos/eos) a batch of ``n`` pairs may have: ``max_len``
    pieces, and the budget's share a row: ``n`` rows of its padded length (to
    ``pad_to_multiple``, or to a bucket of ``buckets`` with room for ``n`` rows) within
    ``max_tokens``."""

    max_len: int
    max_tokens: int | None = None
    pad_to_multiple: int = 1
    buckets: Buckets | None = None

    def __call__(self, n: int) -> int:
        limit = self.max_len + 1
        if self.buckets is not None:
            fits = [length for length in self.buckets.lengths if self.buckets.rows(length) >= n]
            return min(limit, max(fits, default=0))
        if self.max_tokens is not None:
            m = self.pad_to_multiple
            limit = min(limit, self.max_tokens // n // m * m)
        return limit


class SampledSplit(Dataset):
    """Training pairs segmented anew each epoch. ``parts``: each corpus's tokenized training split
    with its source and target tokenizers (their prefixes, a tag or target token, kept in front).
    ``split.__getitems__((epoch, indices))``, as a :class:`TokenBudgetBatchSampler` with
    ``epochs=True`` yields them, gives the batch's :data:`Example` s drawn for ``epoch`` within
    ``limit(len(indices))`` (:class:`RowLimit`)."""

    def __init__(
        self,
        parts: Sequence[tuple[TokenizedSplit, Tokenizer, Tokenizer]],
        sampling: SpmSampling,
        seed: int,
        limit: RowLimit,
    ) -> None:
        splits = [split for split, _, _ in parts]
        self.data = splits[0] if len(splits) == 1 else ConcatSplit(splits)
        self.tokenizers = [(src, tgt) for _, src, tgt in parts]
        self.sampling, self.seed, self.limit = sampling, seed, limit

    def within(self, limit: RowLimit) -> SampledSplit:
        """This split, its batches' rows within ``limit``."""
        bounded = copy.copy(self)
        bounded.limit = limit
        return bounded

    def __len__(self) -> int:
        return len(self.data)

    def __getitems__(self, batch: tuple[int, list[int]]) -> list[Example]:
        epoch, indices = batch
        limit = self.limit(len(indices))
        return [self.draw(i, epoch, limit) for i in indices]

    def draw(self, i: int, epoch: int, limit: int) -> Example:
        """Example ``i`` as epoch ``epoch`` segments it, each side at most ``limit`` long with
        bos/eos."""
        k = self.data.locate(i)[0] if isinstance(self.data, ConcatSplit) else 0
        sid, src, tgt = self.data[i]
        tokenizers = self.tokenizers[k]
        src, tgt = (
            self._side(ids, tok, (self.seed, epoch, i, side), limit)
            for side, (ids, tok) in enumerate(zip((src, tgt), tokenizers, strict=True))
        )
        return sid, src, tgt

    def _side(
        self, ids: np.ndarray, tok: Tokenizer, key: tuple[int, ...], limit: int
    ) -> np.ndarray:
        """A draw of the side ``ids`` seeded by ``key`` that fits ``limit`` (with bos/eos), or
        ``ids`` when :data:`REDRAWS` + 1 draws do not."""
        for attempt in range(REDRAWS + 1):
            seed = draw_seed(*key, attempt)
            drawn = tok.resample(ids, self.sampling.alpha, self.sampling.nbest, seed)
            if len(drawn) + 1 <= limit:
                return np.asarray(drawn, dtype=ids.dtype)
        return ids

    def planned_sizes(self, src_sizes: np.ndarray, tgt_sizes: np.ndarray) -> tuple[np.ndarray, ...]:
        """The sizes (with bos/eos) to plan batches for, from the deterministic ones: each grown
        as :class:`Growth` measures on a probe of :data:`PROBE_PAIRS` pairs (epoch 0's draws),
        at most ``max_len`` + 1. Raises :class:`DataError` if SentencePiece draws differently
        under one seed (before 0.2.3)."""
        rng = np.random.default_rng([self.seed, len(self)])
        probe = np.sort(rng.choice(len(self), min(PROBE_PAIRS, len(self)), replace=False))
        limit = self.limit.max_len + 1
        drawn = [self.draw(int(i), 0, limit) for i in probe]
        self._check_seeding(probe[:SEED_CHECKS], drawn, limit)
        planned = []
        for side, sizes in ((1, src_sizes), (2, tgt_sizes)):
            before = np.array([len(self.data[int(i)][side]) + 1 for i in probe])
            after = np.array([len(d[side]) + 1 for d in drawn])
            growth = Growth.measure(before, after)
            planned.append(np.minimum(growth.planned(np.asarray(sizes)), limit))
            log.info(
                "subword sampling: %s sides grow x%.2f on average (on %d training pairs); "
                "batches are planned for the %g quantile by length, %s",
                ("source", "target")[side - 1], after.sum() / before.sum(), len(probe),
                PLAN_QUANTILE, growth,
            )  # fmt: skip
        return tuple(planned)

    def _check_seeding(self, probe: np.ndarray, drawn: list[Example], limit: int) -> None:
        again = [self.draw(int(i), 0, limit) for i in probe]
        for first, second in zip(drawn, again, strict=False):
            if any(not np.array_equal(a, b) for a, b in zip(first[1:], second[1:], strict=True)):
                raise DataError(
                    f"data.spm_sampling: sentencepiece {sentencepiece.__version__} draws "
                    "differently under the same seed (its set_random_generator_seed seeds a "
                    "thread's generator once), so a resumed run would not see the segmentations "
                    "of an uninterrupted one; pip install -U 'sentencepiece>=0.2.3', or set "
                    "data.spm_sampling.alpha=null"
                )


@dataclass(frozen=True)
class Growth:
    """How sampling grows a side, by its deterministic size (with bos/eos): sides of a size below
    ``edges[0]`` grow by ``factors[0]``, below ``edges[1]`` by ``factors[1]``, ..., the rest by
    ``factors[-1]``; each factor is the :data:`PLAN_QUANTILE` of the drawn / deterministic size
    ratios in its size range."""

    edges: tuple[int, ...]
    factors: tuple[float, ...]

    @classmethod
    def measure(cls, before: np.ndarray, after: np.ndarray) -> Growth:
        """From the deterministic and drawn sizes of the same sides: :data:`SIZE_BINS` ranges
        holding about as many sides each."""
        cuts = np.quantile(before, np.linspace(0, 1, SIZE_BINS + 1)[1:-1], method="higher")
        edges = np.unique(cuts)
        ratios, bins = after / before, np.searchsorted(edges, before, side="right")
        overall = float(np.quantile(ratios, PLAN_QUANTILE))
        factors = [
            float(np.quantile(ratios[bins == k], PLAN_QUANTILE)) if (bins == k).any() else overall
            for k in range(len(edges) + 1)
        ]
        return cls(tuple(int(e) for e in edges), tuple(factors))

    def planned(self, sizes: np.ndarray) -> np.ndarray:
        factors = np.asarray(self.factors)[np.searchsorted(self.edges, sizes, side="right")]
        return np.maximum(sizes, np.ceil(sizes * factors - 1e-9).astype(np.int64))

    def __str__(self) -> str:
        bounds = [*(f"<{e}" for e in self.edges), f">={self.edges[-1]}" if self.edges else "all"]
        return ", ".join(f"{b}: x{f:.2f}" for b, f in zip(bounds, self.factors, strict=True))
