"""Tiny synthetic parallel corpora for the data tests (a uniquely named module, so that test files
can import it without clashing with other conftest.py files)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

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
