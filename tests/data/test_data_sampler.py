"""Token-budget batch sampler: budget incl. padding, coverage, shuffling, DDP, resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch.distributed as dist

from transformer.data.collate import round_up
from transformer.data.sampler import TokenBudgetBatchSampler


def sizes(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(2, 60, n), rng.integers(2, 60, n)


@pytest.mark.parametrize("multiple", [1, 8])
def test_every_batch_within_budget_including_padding(multiple):
    src, tgt = sizes()
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=1, pad_to_multiple=multiple)
    batches = list(s)
    for b in batches:
        longest = round_up(int(max(src[b].max(), tgt[b].max())), multiple)
        assert len(b) * longest <= 500
    # packing is not wasteful: on average batches use most of the budget
    used = [len(b) * round_up(int(max(src[b].max(), tgt[b].max())), multiple) for b in batches]
    assert np.mean(used) > 0.8 * 500


def test_every_example_exactly_once_per_epoch_and_epochs_differ():
    src, tgt = sizes()
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=1)
    epochs = []
    for epoch in range(3):
        s.set_epoch(epoch)
        batches = list(s)
        assert len(batches) == len(s)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(1000))
        epochs.append(batches)
    assert epochs[0] != epochs[1] != epochs[2]
    again = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=1)
    again.set_epoch(1)
    assert list(again) == epochs[1]  # reproducible from (seed, epoch)
    other_seed = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=2)
    other_seed.set_epoch(1)
    assert list(other_seed) != epochs[1]


def test_sentence_count_mode():
    src, tgt = sizes(103)
    batches = list(TokenBudgetBatchSampler(src, tgt, batch_size=10, seed=0))
    assert sorted(len(b) for b in batches) == [3] + [10] * 10
    assert sorted(i for b in batches for i in b) == list(range(103))


def test_eval_order_is_sorted_and_fixed():
    src, tgt = sizes(200)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=300, shuffle=False)
    first = list(s)
    assert list(s) == first
    longest = [max(max(src[i], tgt[i]) for i in b) for b in first]
    assert longest == sorted(longest)


def test_eval_pass_after_an_unfinished_one_is_whole():
    src, tgt = sizes(200)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=300, shuffle=False)
    whole = list(s)
    partial = iter(s)
    next(partial), next(partial)  # a sanity check stops after two batches
    assert list(s) == whole


def test_sentence_over_budget_is_an_error():
    with pytest.raises(ValueError, match=r"example 1 needs 80 tokens.*max_tokens=64"):
        TokenBudgetBatchSampler([5, 70, 6], [5, 80, 6], max_tokens=64)
    with pytest.raises(ValueError, match=r"needs 72 tokens"):  # rounded up to a multiple of 8
        TokenBudgetBatchSampler([5, 70], [5, 6], max_tokens=70, pad_to_multiple=8)


@pytest.mark.parametrize("n", [1000, 37, 3])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_ddp_shards_are_disjoint_cover_and_equal(n, world):
    src, tgt = sizes(n)
    for epoch in (0, 1):
        shards = []
        for rank in range(world):
            s = TokenBudgetBatchSampler(
                src, tgt, max_tokens=400, seed=3, num_replicas=world, rank=rank
            )
            s.set_epoch(epoch)
            shards.append(list(s))
            assert len(shards[-1]) == len(s)
        assert len({len(b) for b in shards}) == 1  # same number of steps on every rank
        seen = [i for shard in shards for b in shard for i in b]
        if n >= world:
            assert sorted(seen) == list(range(n))  # no overlap, nothing dropped
        else:
            assert set(seen) == set(range(n))


def test_rank_and_world_size_come_from_torch_distributed(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda: 3)
    monkeypatch.setattr(dist, "get_rank", lambda: 1)
    src, tgt = sizes(100)
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=300, seed=0)
    assert (s.num_replicas, s.rank) == (3, 1)
    explicit = TokenBudgetBatchSampler(src, tgt, max_tokens=300, seed=0, num_replicas=3, rank=1)
    assert list(s) == list(explicit)


def test_exact_mid_epoch_resume():
    src, tgt = sizes()
    s = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=5)
    s.set_epoch(2)
    it = iter(s)
    consumed = [next(it) for _ in range(7)]
    state = s.state_dict()
    assert state == {"epoch": 2, "position": 7, "seed": 5}
    rest = list(it)

    resumed = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=0)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)  # as Lightning does at the start of the restored epoch
    assert list(resumed) == rest
    full = TokenBudgetBatchSampler(src, tgt, max_tokens=500, seed=5)
    full.set_epoch(2)
    assert consumed + rest == list(full)
    # a used-up epoch moves on: the next pass is the next epoch's shuffle
    full.set_epoch(3)
    assert list(resumed) == list(full)
    assert resumed.state_dict()["epoch"] == 3
