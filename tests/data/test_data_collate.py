"""Collation: decoder input/labels shift, padding masks, pad_to_multiple, device moves."""

from __future__ import annotations

from dataclasses import fields

import numpy as np
import pytest
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device

from transformer.data.collate import Batch, Collator
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
