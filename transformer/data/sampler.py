"""Length-bucketed batch sampler with a token budget, per-epoch reshuffling, DDP sharding and an
exact mid-epoch resume.

Each epoch, with a generator seeded by ``(seed, epoch)``: the examples (with ``weights``, each
group's copies) are put in random order and then stably sorted by their padded size, so that
batches hold sentences of nearly equal length (bucketing by length, with random ties); the sorted
list is cut greedily into batches that fit the budget; the batch order is shuffled. Evaluation
(``shuffle=False``) keeps the sorted order, and every pass over it is whole: a pass left
unfinished (Lightning's sanity check stops after a few batches) does not shorten the next.

DDP: all ranks build the same batch list, and rank ``r`` of ``R`` takes batches ``r, r + R, ...``.
To give every rank the same number of steps without dropping or repeating examples, the list is
first made a multiple of ``R`` long by splitting its largest batches in two (a part of a batch fits
the budget whenever the batch does). Only when too few batches can be split (fewer examples than
ranks) are batches from the start of the list repeated.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import torch.distributed as dist

from transformer.data.collate import Buckets, round_up


class TokenBudgetBatchSampler:
    """Yields lists of example indices.

    Args:
        src_sizes, tgt_sizes: each example's row length in a batch (source with eos; target with
            bos, which equals the labels' length with eos).
        max_tokens: budget per batch counting padding: ``len(batch) * padded length <= max_tokens``
            on both sides, after rounding lengths up to ``pad_to_multiple``. ``None`` selects the
            sentence-count mode with ``batch_size`` sentences per batch.
        batch_size: sentences per batch when ``max_tokens`` is None.
        num_replicas, rank: DDP world size and rank; read from ``torch.distributed`` when it is
            initialised and these are None, else a single process.
        weights: ``(count, copies)`` of consecutive groups of examples (several corpora), covering
            them all: each epoch takes every example of a group ``int(copies)`` times and a random
            ``round(count * (copies % 1))`` of them once more, as many of each size every epoch.
            None: each example once.
        buckets: lengths are rounded up to a bucket's (:class:`Buckets`) instead of to
            ``pad_to_multiple``, as the collator pads them.
        epochs: yield ``(epoch, indices)`` instead of ``indices``: the epoch travels with its
            batch to the DataLoader worker that draws the batch's segmentations
            (:class:`transformer.data.subword_sampling.SampledSplit`).
    """

    def __init__(
        self,
        src_sizes: Sequence[int] | np.ndarray,
        tgt_sizes: Sequence[int] | np.ndarray,
        max_tokens: int | None = None,
        batch_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        pad_to_multiple: int = 1,
        num_replicas: int | None = None,
        rank: int | None = None,
        weights: Sequence[tuple[int, float]] | None = None,
        buckets: Buckets | None = None,
        epochs: bool = False,
    ) -> None:
        src_sizes, tgt_sizes = np.asarray(src_sizes), np.asarray(tgt_sizes)
        if src_sizes.shape != tgt_sizes.shape:
            raise ValueError(f"{len(src_sizes)} source sizes but {len(tgt_sizes)} target sizes")
        covered = len(src_sizes) if weights is None else sum(count for count, _ in weights)
        if covered != len(src_sizes):
            raise ValueError(f"weights cover {covered} of {len(src_sizes)} examples")
        if max_tokens is None and (batch_size is None or batch_size < 1):
            raise ValueError("give max_tokens (token budget) or a positive batch_size")
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_initialized() else 0
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is outside world size {num_replicas}")
        self.sizes = np.maximum(src_sizes, tgt_sizes)
        self.max_tokens, self.batch_size = max_tokens, batch_size
        self.shuffle, self.seed, self.pad_to_multiple = shuffle, seed, pad_to_multiple
        self.num_replicas, self.rank = num_replicas, rank
        self.weights, self.buckets, self.epochs = weights, buckets, epochs
        self.epoch, self.position = 0, 0
        if max_tokens is not None and len(self.sizes):
            biggest = int(np.argmax(self.sizes))
            need = int(self._padded(self.sizes[biggest]))
            if need > max_tokens:
                raise ValueError(
                    f"example {biggest} needs {need} tokens (padded length of its longer side), "
                    f"more than max_tokens={max_tokens}; raise data.max_tokens or lower "
                    "data.max_len"
                )
        self._cache: tuple[int, list[list[int]]] | None = None
        # Lightning calls ``set_epoch`` on ``dataloader.batch_sampler.sampler`` at each epoch start.
        self.sampler = self

    def _padded(self, sizes: np.ndarray) -> np.ndarray:
        """The length rows of ``sizes`` tokens take in a batch whose longest row they are."""
        if self.buckets is not None:
            return self.buckets.length(sizes)
        return round_up(sizes, self.pad_to_multiple)

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's shuffle. A new epoch starts at its first batch; setting the epoch that
        is already current keeps the position (Lightning does so after a mid-epoch restore)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position, self.seed = state["epoch"], state["position"], state["seed"]
        self._cache = None

    def __len__(self) -> int:
        return len(self._rank_batches())

    def __iter__(self) -> Iterator[list[int] | tuple[int, list[int]]]:
        batches = self._rank_batches()
        if not self.shuffle:  # evaluation: no position to resume, every pass from the start
            self.position = 0
        if self.position >= len(batches):
            # The epoch was used up (its iterator need not have been exhausted): without a
            # set_epoch call, the next pass is the next epoch, reshuffled.
            self.epoch, self.position = self.epoch + 1, 0
            batches = self._rank_batches()
        while self.position < len(batches):
            self.position += 1
            batch = batches[self.position - 1]
            yield (self.epoch, batch) if self.epochs else batch

    def _rank_batches(self) -> list[list[int]]:
        if self._cache is None or self._cache[0] != self.epoch:
            self._cache = (self.epoch, self._batches(self.epoch)[self.rank :: self.num_replicas])
        return self._cache[1]

    def _batches(self, epoch: int) -> list[list[int]]:
        rng = np.random.default_rng([self.seed, epoch])
        examples = self._examples(rng)
        order = examples[rng.permutation(len(examples))] if self.shuffle else examples
        order = order[np.argsort(self.sizes[order], kind="stable")]
        batches = self._pack(order)
        if self.shuffle:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return self._equalise(batches)

    def _examples(self, rng: np.random.Generator) -> np.ndarray:
        """The epoch's example indices: each once, or as ``weights`` say."""
        if self.weights is None:
            return np.arange(len(self.sizes))
        parts, start = [], 0
        for count, copies in self.weights:
            group = np.arange(start, start + count)
            parts += [group] * int(copies)
            if copies % 1:
                parts.append(self._share(group, copies % 1, rng))
            start += count
        return np.concatenate(parts)

    def _share(self, group: np.ndarray, share: float, rng: np.random.Generator) -> np.ndarray:
        """A random ``share`` of ``group``, drawn anew each epoch but with the same number of
        examples of each size: every epoch then packs into as many batches as the first, which
        Lightning takes for all of them (a longer epoch would lose its last batches)."""
        sizes = self.sizes[group]
        values, counts = np.unique(sizes, return_counts=True)
        want = counts * share
        take = np.floor(want).astype(int)
        extra = round(want.sum()) - int(take.sum())  # to the sizes with the largest remainders
        take[np.argsort(take - want, kind="stable")[:extra]] += 1
        pairs = zip(values, take, strict=True)
        drawn = [rng.choice(group[sizes == v], k, replace=False) for v, k in pairs]
        return np.concatenate(drawn)

    def _pack(self, order: np.ndarray) -> list[list[int]]:
        if self.max_tokens is None:
            idx = order.tolist()
            return [idx[i : i + self.batch_size] for i in range(0, len(idx), self.batch_size)]
        batches, current, longest = [], [], 0
        budget = self.max_tokens
        for i, size in zip(order.tolist(), self._padded(self.sizes[order]).tolist(), strict=True):
            new_longest = max(longest, size)
            if current and (len(current) + 1) * new_longest > budget:
                batches.append(current)
                current, new_longest = [], size
            current.append(i)
            longest = new_longest
        if current:
            batches.append(current)
        return batches

    def _equalise(self, batches: list[list[int]]) -> list[list[int]]:
        """Make the number of batches a multiple of the world size (see the module docstring)."""
        r = self.num_replicas
        while len(batches) % r:
            biggest = max(range(len(batches)), key=lambda j: len(batches[j]), default=None)
            if biggest is None or len(batches[biggest]) < 2:
                break
            b = batches[biggest]
            batches[biggest : biggest + 1] = [b[: len(b) // 2], b[len(b) // 2 :]]
        n = len(batches)
        if n % r:
            batches += [batches[i % n] for i in range(r - n % r)]
        return batches
