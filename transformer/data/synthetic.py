"""A made-up parallel corpus for tests, benchmark dry runs and GPU-check dry runs: no download.

Each German word is the image of one English word, so a few training steps already move the loss
and BLEU has something to score.
"""

from __future__ import annotations

import gzip
import random
from collections.abc import Callable
from pathlib import Path

WORDS_EN = (
    "a the man woman dog cat child girl boy walks runs sits eats red blue green big small on in "
    "near under street park house tree ball water bike car plays jumps looks"
).split()
WORDS_DE = (
    "ein der mann frau hund katze kind mädchen junge geht läuft sitzt isst rot blau grün groß "
    "klein auf in bei unter straße park haus baum ball wasser fahrrad auto spielt springt schaut"
).split()
SPLITS = {"train": 400, "val": 32, "test": 32}  # sentence pairs of write_corpus's splits
# Multi30k's five splits (``{split}.{en,de}.gz``), read by ``data=multi30k`` as the real files are
MULTI30K_SPLITS = {"train": 400, "val": 16, "test_2016_flickr": 12, "test_2017_flickr": 8,
                   "test_2017_mscoco": 8}  # fmt: skip

Pairs = Callable[[int, int], tuple[list[str], list[str]]]


def sentence_pairs(
    n: int, seed: int, max_words: int = 10, punctuated: bool = False
) -> tuple[list[str], list[str]]:
    """``n`` English sentences of 2 to ``max_words`` words and their German, word by word;
    ``punctuated``: capitalised and ending in a full stop."""
    rng = random.Random(seed)
    en, de = [], []
    for _ in range(n):
        idx = [rng.randrange(len(WORDS_EN)) for _ in range(rng.randint(2, max_words))]
        pair = (" ".join(words[i] for i in idx) for words in (WORDS_EN, WORDS_DE))
        e, d = (s.capitalize() + "." for s in pair) if punctuated else pair
        en.append(e)
        de.append(d)
    return en, de


def write_lines(path: Path, lines: list[str]) -> Path:
    """One sentence a line, UTF-8; gzipped where the name ends in ``.gz``."""
    data = "".join(line + "\n" for line in lines).encode("utf-8")
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def write_corpus(
    root: Path, splits: dict[str, int] = SPLITS, suffix: str = "", pairs: Pairs = sentence_pairs
) -> Path:
    """``{split}.{en,de}{suffix}`` in ``root``: ``pairs(n, seed=i)`` for the i-th split."""
    root.mkdir(parents=True, exist_ok=True)
    for seed, (split, n) in enumerate(splits.items()):
        en, de = pairs(n, seed)
        write_lines(root / f"{split}.en{suffix}", en)
        write_lines(root / f"{split}.de{suffix}", de)
    return root
