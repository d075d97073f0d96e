"""Collation: decoder input/labels shift, padding masks, pad_to_multiple, shape buckets, device
moves."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from transformer.data.collate import Batch, Buckets, Collator, padded_sizes, round_up
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


def examples():
    return [
        (5, np.array([10, 11, 12], dtype=np.int32), np.array([20, 21], dtype=np.int32)),
        (2, np.array([13], dtype=np.int32), np.array([22, 23, 24, 25], dtype=np.int32)),
    ]


def test_batch_layout():
    b = Collator()(examples())
    assert b.src.tolist() == [[10, 11, 12, EOS_ID], [13, EOS_ID, PAD_ID, PAD_ID]]
    assert b.tgt_in.tolist() == [[BOS_ID, 20, 21, PAD_ID, PAD_ID], [BOS_ID, 22, 23, 24, 25]]
    assert b.labels.tolist() == [[20, 21, EOS_ID, PAD_ID, PAD_ID], [22, 23, 24, 25, EOS_ID]]
    assert b.src_pad_mask.tolist() == [[False] * 4, [False, False, True, True]]
    assert b.num_tgt_tokens == 8
    assert b.ids.tolist() == [5, 2]
    for t in (b.src, b.tgt_in, b.labels, b.ids):
        assert t.dtype == torch.long
    assert b.src_pad_mask.dtype == torch.bool
    assert len(b) == 2


@pytest.mark.parametrize("multiple", [1, 8])
def test_pad_to_multiple(multiple):
    b = Collator(pad_to_multiple=multiple)(examples())
    assert b.src.shape[1] == (4 if multiple == 1 else 8)
    assert b.tgt_in.shape == b.labels.shape == (2, 5 if multiple == 1 else 8)
    assert b.num_tgt_tokens == 8  # extra padding adds no target tokens
    assert (b.src_pad_mask == b.src.eq(PAD_ID)).all()


def test_buckets_give_every_batch_one_of_their_few_shapes():
    """The sampler packs and the collator pads to buckets at quantiles of the lengths: each batch
    is (max_tokens // L) x L on both sides for a bucket length L, every example comes once, and
    the added rows are all padding, id -1."""
    rng = np.random.default_rng(0)
    src_lens = rng.integers(1, 60, 300)
    tgt_lens = np.maximum(src_lens + rng.integers(-3, 4, 300), 1)  # translations: alike
    pairs = zip(src_lens, tgt_lens, strict=True)
    data = [(i, rng.integers(4, 50, s), rng.integers(4, 50, t)) for i, (s, t) in enumerate(pairs)]
    sizes = padded_sizes(src_lens, tgt_lens)
    buckets = Buckets.at_quantiles(np.maximum(*sizes), 4, 8, max_tokens=512)
    assert len(buckets.lengths) == 4 and buckets.lengths[-1] == round_up(
        int(np.maximum(*sizes).max()), 8
    )
    sampler = TokenBudgetBatchSampler(*sizes, max_tokens=512, pad_to_multiple=8, buckets=buckets)
    collate = Collator(8, PAD_ID, buckets)
    shapes, seen = set(), []
    for indices in sampler:
        b = collate([data[i] for i in indices])
        rows, length = b.src.shape
        assert b.tgt_in.shape == b.labels.shape == (rows, length)
        assert length in buckets.lengths and rows == 512 // length
        shapes.add((rows, length))
        real = b.ids >= 0
        assert int(real.sum()) == len(indices)
        assert b.src_pad_mask[~real].all() and b.labels[~real].eq(PAD_ID).all()
        seen += b.ids[real].tolist()
    assert sorted(seen) == list(range(300))
    assert len(shapes) == 4


def test_lightning_moves_a_batch():
    b = move_data_to_device(Collator()(examples()), torch.device("cpu"))
    assert isinstance(b, Batch) and b.num_tgt_tokens == 8
    assert torch.equal(b.src, Collator()(examples()).src)


def test_batch_pin_memory_pins_every_tensor(monkeypatch):
    if not torch.cuda.is_available():  # no pinned memory without CUDA: stand-ins that mark tensors
        pinned: list[torch.Tensor] = []
        monkeypatch.setattr(
            torch.Tensor, "pin_memory", lambda t: pinned.append(t.clone()) or pinned[-1]
        )
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: any(t is p for p in pinned))
    b = Collator()(examples())
    p = b.pin_memory()
    assert isinstance(p, Batch) and p.num_tgt_tokens == b.num_tgt_tokens == 8
    tensors = [f.name for f in fields(Batch) if isinstance(getattr(b, f.name), torch.Tensor)]
    assert tensors == ["src", "tgt_in", "labels", "src_pad_mask", "ids"]
    for name in tensors:
        assert getattr(p, name).is_pinned() and not getattr(b, name).is_pinned()
        assert torch.equal(getattr(p, name), getattr(b, name))
