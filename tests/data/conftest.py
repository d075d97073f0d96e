"""Tiny synthetic parallel corpora, written to tmp_path, so the data tests need no download."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny import DATA_SPLITS, TINY_VOCAB, data_pairs, write_corpus


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """``{train,val,test}.{en,de}`` plain text files."""
    return write_corpus(tmp_path / "corpus", DATA_SPLITS, pairs=data_pairs)


@pytest.fixture
def multi30k_dir(tmp_path: Path) -> Path:
    """A Multi30k look-alike: ``{train,val,test_2016_flickr}.{en,de}.gz``."""
    splits = dict(zip(("train", "val", "test_2016_flickr"), DATA_SPLITS.values(), strict=True))
    return write_corpus(tmp_path / "multi30k", splits, suffix=".gz", pairs=data_pairs)


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
