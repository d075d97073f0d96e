"""Corpora read as a stream: lines decoded a block at a time, pairs a chunk at a time, the
SentencePiece sample drawn on the way, sharded splits. Each must give what reading the whole
input at once gives."""

from __future__ import annotations

import gzip
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.tiny import DATA_SPLITS, data_pairs, write_lines
from transformer.data import datamodule as dm_module
from transformer.data import text_files
from transformer.data.hf_source import HFSource
from transformer.data.sources import LocalSource
from transformer.data.text_files import iter_line_blocks, iter_parallel_files, line_blocks
from transformer.data.tokenizer_training import SentenceSample
from transformer.errors import DataError


def pieces(data: bytes, sizes: list[int]) -> list[bytes]:
    """``data`` cut into consecutive pieces of ``sizes`` (cycled) bytes."""
    out, i, k = [], 0, 0
    while i < len(data):
        out.append(data[i : i + sizes[k % len(sizes)]])
        i, k = i + sizes[k % len(sizes)], k + 1
    return out


def test_lines_are_the_same_however_the_bytes_are_cut():
    """Line ends (LF, CRLF, none at the end), empty lines, a byte-order mark and multi-byte
    characters falling across the cuts: the lines of every cutting equal ``bytes.split``'s."""
    rng = random.Random(0)
    words = ["Ein", "Hund", "läuft", "über", "Straße", "猫", "", "a\u2028b", "x\ty"]
    for trial in range(200):
        lines = [
            " ".join(rng.choices(words, k=rng.randint(0, 4))) for _ in range(rng.randint(0, 9))
        ]
        ends = [rng.choice(["\n", "\r\n"]) for _ in lines]
        text = "".join(s + e for s, e in zip(lines, ends, strict=True))
        if lines and lines[-1] and rng.random() < 0.3:
            text = text[: -len(ends[-1])]  # no final line end
        data = (b"\xef\xbb\xbf" if trial % 3 == 0 else b"") + text.encode("utf-8")
        cut = pieces(data, [rng.randint(1, 7) for _ in range(5)])
        got = [s for block in line_blocks(cut, "x") for s in block]
        assert got == lines, (trial, data, cut)


def test_a_bad_byte_in_a_later_block_names_its_line(tmp_path, monkeypatch):
    monkeypatch.setattr(text_files, "BLOCK_BYTES", 16)
    path = tmp_path / "big.de.gz"
    data = b"".join(f"Zeile {i}\n".encode() for i in range(1, 40)) + "Straße\n".encode("cp1252")
    with gzip.open(path, "wb") as f:
        f.write(data)
    blocks = iter_line_blocks(path)
    assert next(blocks) == ["Zeile 1", "Zeile 2"]  # 16 bytes: a block at a time
    with pytest.raises(DataError, match=r"big.de.gz, line 40: bytes that are not UTF-8"):
        list(blocks)


@pytest.mark.parametrize("extra", ["src", "tgt"])
def test_parallel_files_of_different_lengths_are_counted_to_their_ends(tmp_path, extra):
    """The mismatch is found in a later chunk than the first; both files' full counts are named."""
    en, de = data_pairs(10, 0)
    n_en, n_de = (10, 7) if extra == "src" else (7, 10)
    write_lines(tmp_path / "a.en", en[:n_en])
    write_lines(tmp_path / "a.de", de[:n_de])
    chunks = iter_parallel_files(tmp_path / "a.en", tmp_path / "a.de", chunk=3)
    assert [len(c.src) for c in (next(chunks), next(chunks))] == [3, 3]
    with pytest.raises(DataError, match=rf"a.en has {n_en} lines but .*a.de has {n_de}"):
        next(chunks)


def test_sentence_sample_keeps_everything_in_order_up_to_its_size():
    sample = SentenceSample(10)
    sample.add(["a", " ", "b"])
    sample.add(["c", ""])
    assert sample.sentences == ["a", "b", "c"]


@pytest.mark.slow
def test_sentence_sample_is_uniform_and_reproducible():
    """Each of 40 sentences, given in chunks of 7, lands in a sample of 10 with probability 1/4:
    counted over 4,000 seeds, every share within 4 standard deviations of 0.25."""
    sentences = [f"s{i}" for i in range(40)]
    counts, seeds = Counter(), 4000
    for seed in range(seeds):
        sample = SentenceSample(10, seed)
        for i in range(0, 40, 7):
            sample.add(sentences[i : i + 7])
        assert len(sample.sentences) == len(set(sample.sentences)) == 10
        counts.update(sample.sentences)
    share = np.array([counts[s] for s in sentences]) / seeds
    assert np.abs(share - 0.25).max() < 4 * np.sqrt(0.25 * 0.75 / seeds), share

    def draw(seed):
        sample = SentenceSample(10, seed)
        sample.add(sentences)
        return sample.sentences

    assert draw(1) == draw(1) != draw(2)


def shard(root: Path, split: str, sizes: list[int], fmt: str) -> None:
    """The split ``root/{split}.{en,de}`` written again as a directory of shards of ``sizes``."""
    en = (root / f"{split}.en").read_text().splitlines()
    de = (root / f"{split}.de").read_text().splitlines()
    assert sum(sizes) == len(en)
    folder = root.parent / f"sharded-{fmt}" / split
    folder.mkdir(parents=True)
    start = 0
    for k, n in enumerate(sizes):
        part = slice(start, start + n)
        if fmt == "text":  # names sort in corpus order, one shard gzipped
            suffix = ".gz" if k == 1 else ""
            write_lines(folder / f"part-{k:03d}.en{suffix}", en[part])
            write_lines(folder / f"part-{k:03d}.de{suffix}", de[part])
        else:
            write_lines(
                folder / f"part-{k:03d}.tsv",
                ["de\ten"] + [f"{g}\t{e}" for e, g in zip(en[part], de[part], strict=True)],
            )
        start += n


@pytest.mark.parametrize("fmt", ["text", "tsv"])
def test_a_sharded_split_is_read_and_cached_as_the_one_file_split(corpus_dir, dm_kwargs, fmt):
    """Training split as a directory of shards: the same pairs in the same order, the same token
    ids in the cache, every pair batched once; the other splits stay single files."""
    shard(corpus_dir, "train", [120, 80, 100], fmt)
    sharded_root = corpus_dir.parent / f"sharded-{fmt}"
    for split in ("val", "test"):
        for lang in ("en", "de"):
            (sharded_root / f"{split}.{lang}").write_bytes(
                (corpus_dir / f"{split}.{lang}").read_bytes()
            )
    whole = LocalSource(corpus_dir, "en", "de")
    sharded = LocalSource(sharded_root, "en", "de")
    chunks = list(sharded.read_chunks("train", chunk=50))
    assert max(len(c.src) for c in chunks) == 50
    joined = sharded.read("train")
    assert (joined.src, joined.tgt) == (whole.read("train").src, whole.read("train").tgt)

    def built(root, cache):
        dm = dm_module.TranslationDataModule(
            source="local", root=str(root), **{**dm_kwargs, "cache_dir": str(cache)}
        )
        dm.prepare_data()
        dm.setup("fit")
        return dm

    a = built(corpus_dir, corpus_dir.parent / "cache-a")
    b = built(sharded_root, corpus_dir.parent / "cache-b")
    ta, tb = a.split("train"), b.split("train")
    assert len(ta) == len(tb) > 0
    for i in range(len(ta)):
        assert ta[i][0] == tb[i][0]
        np.testing.assert_array_equal(ta[i][1], tb[i][1])
        np.testing.assert_array_equal(ta[i][2], tb[i][2])
    seen = sorted(i for batch in b.train_dataloader() for i in batch.ids.tolist())
    assert seen == sorted(int(i) for i in tb.ids) and len(seen) <= DATA_SPLITS["train"]


def test_a_shard_without_its_other_side_is_named(corpus_dir, dm_kwargs):
    shard(corpus_dir, "train", [150, 150], "text")
    folder = corpus_dir.parent / "sharded-text" / "train"
    (folder / "part-001.de.gz").unlink()
    with pytest.raises(DataError, match=r"part-001.en.gz has no de side.*needs part-001.de"):
        LocalSource(folder.parent, "en", "de").identity("train")


def test_a_sharded_hf_dataset_is_read_in_chunks_in_corpus_order(tmp_path):
    """A dataset saved in 3 shards (``save_to_disk(num_shards=...)``, ``data.hf_path``): read in
    chunks of at most 40 pairs that join into its rows in order."""
    import datasets

    en, de = data_pairs(300, 0)
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    rows = [{"de": g, "en": e} for e, g in zip(en, de, strict=True)]
    train = datasets.Dataset.from_dict({"translation": rows}, features=features)
    datasets.DatasetDict({"train": train}).save_to_disk(
        str(tmp_path / "hf"), num_shards={"train": 3}
    )
    assert len(list((tmp_path / "hf" / "train").glob("*.arrow"))) == 3
    chunks = list(HFSource("en", "de", path=tmp_path / "hf").read_chunks("train", chunk=40))
    assert [len(c.src) for c in chunks] == [40] * 7 + [20]
    assert [s for c in chunks for s in c.src] == en and [t for c in chunks for t in c.tgt] == de
