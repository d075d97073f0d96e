"""Tiny synthetic parallel corpora, written to tmp_path, so the tests need no download."""

from __future__ import annotations

import gzip
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

WORDS = {
    "en": "a the man woman dog cat child girl boy walks runs sits eats red blue green big small "
    "on in near under street park house tree ball water bike car plays jumps looks".split(),
    "de": "ein der mann frau hund katze kind mädchen junge geht läuft sitzt isst rot blau grün "
    "groß klein auf in bei unter straße park haus baum ball wasser fahrrad auto spielt springt "
    "schaut".split(),
}
TINY_VOCAB = 64


def make_pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    """``n`` sentence pairs; the German side is a word-by-word image of the English one."""
    rng = random.Random(seed)
    en, de = [], []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS["en"])) for _ in range(rng.randint(2, 12))]
        en.append(" ".join(WORDS["en"][i] for i in idx).capitalize() + ".")
        de.append(" ".join(WORDS["de"][i] for i in idx).capitalize() + ".")
    return en, de


def write_lines(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


SPLIT_SIZES = {"train": 300, "val": 30, "test": 25}


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
