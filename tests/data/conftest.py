"""Tiny synthetic parallel corpora, written to tmp_path, so the tests need no download."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tinycorpus import SPLIT_SIZES, TINY_VOCAB, make_pairs, write_lines

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """``{train,val,test}.{en,de}`` plain text files."""
    root = tmp_path / "corpus"
    root.mkdir()
    for seed, (split, n) in enumerate(SPLIT_SIZES.items()):
        en, de = make_pairs(n, seed)
        write_lines(root / f"{split}.en", en)
        write_lines(root / f"{split}.de", de)
    return root


@pytest.fixture
def multi30k_dir(tmp_path: Path) -> Path:
    """A Multi30k look-alike: ``{train,val,test_2016_flickr}.{en,de}.gz``."""
    root = tmp_path / "multi30k"
    root.mkdir()
    for seed, (split, n) in enumerate(
        zip(("train", "val", "test_2016_flickr"), (300, 30, 25), strict=True)
    ):
        en, de = make_pairs(n, seed)
        write_lines(root / f"{split}.en.gz", en)
        write_lines(root / f"{split}.de.gz", de)
    return root


@pytest.fixture
def dm_kwargs(tmp_path: Path) -> dict:
    """Settings of a small, fast datamodule; add ``source`` and ``root``."""
    return dict(
        vocab_size=TINY_VOCAB,
        max_tokens=256,
        max_len=64,
        num_workers=0,
        seed=7,
        cache_dir=str(tmp_path / "cache"),
    )
