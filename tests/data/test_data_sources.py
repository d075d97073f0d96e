"""Reading raw parallel text: formats, Multi30k download/offline path, bad input."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from tests.tiny import write_lines
from transformer.data import sources
from transformer.data.hf_source import HFSource
from transformer.data.sources import LocalSource, Multi30kSource
from transformer.data.text_files import count_lines, read_line_chunks, read_lines
from transformer.errors import DataError


@pytest.mark.parametrize("name", ["a.txt", "a.txt.gz"])
def test_read_lines_plain_and_gzip(tmp_path, name):
    lines = ["Ein Hund läuft.", "", "Zwei\u2028Katzen", "x\ty"]
    assert read_lines(write_lines(tmp_path / name, lines)) == lines


def test_read_lines_accepts_crlf_and_missing_final_newline(tmp_path):
    (tmp_path / "a").write_bytes(b"one\r\ntwo\r\nthree")
    assert read_lines(tmp_path / "a") == ["one", "two", "three"]
    (tmp_path / "b").write_bytes(b"")
    assert read_lines(tmp_path / "b") == []


@pytest.mark.parametrize("name", ["bad.de", "bad.de.gz"])
def test_non_utf8_names_file_and_line(tmp_path, name):
    data = b"eins\nzwei\n" + "drei groß\n".encode("latin-1")
    path = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    with pytest.raises(DataError, match=rf"{name}, line 3: bytes that are not UTF-8"):
        read_lines(path)


@pytest.mark.parametrize("name", ["quirky.txt", "quirky.txt.gz"])
def test_lines_read_in_chunks_are_the_lines_read_whole(tmp_path, name):
    """A byte-order mark, CRLF, a U+2028 inside a line, blank lines, no final newline: chunks of
    any size, from any line on, give read_lines's lines; a bad byte is named by its line."""
    text = "\ufeffone\r\ntwo\u2028still two\n\n\nfive\r\nsix\nseven"
    path = tmp_path / name
    data = text.encode("utf-8")
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    whole = read_lines(path)
    assert len(whole) == 7
    for size in (1, 2, 3, 7, 100):
        for skip in (0, 1, 4, 7):
            chunks = list(read_line_chunks(str(path), size, skip))
            assert [line for _, chunk in chunks for line in chunk] == whole[skip:]
            assert [first for first, _ in chunks] == list(range(skip, 7, size))
    assert count_lines(str(path)) == (None if name.endswith(".gz") else 7)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nfine\nbad \xff byte\n")
    with pytest.raises(DataError, match=r"bad.txt, line 3: bytes that are not UTF-8"):
        list(read_line_chunks(str(bad), 2))
    utf16 = tmp_path / "utf16.txt"
    utf16.write_bytes("one\n".encode("utf-16"))
    with pytest.raises(DataError, match="line 1: a UTF-16 or UTF-32 byte-order mark"):
        list(read_line_chunks(str(utf16), 2, skip=1))


def test_line_count_mismatch_names_both_files_and_counts(corpus_dir):
    write_lines(corpus_dir / "val.de", ["nur eine Zeile"])
    src = LocalSource(corpus_dir, "en", "de")
    with pytest.raises(DataError) as err:
        src.read("val")
    msg = str(err.value)
    assert "val.en has 30 lines" in msg and "val.de has 1" in msg


def test_local_text_tsv_and_jsonl_agree(tmp_path):
    en, de = ["A dog.", "Two cats."], ["Ein Hund.", "Zwei Katzen."]
    for d in ("text", "tsv", "jsonl"):
        (tmp_path / d).mkdir()
    write_lines(tmp_path / "text" / "train.en", en)
    write_lines(tmp_path / "text" / "train.de.gz", de)
    write_lines(
        tmp_path / "tsv" / "train.tsv",
        ["de\ten"] + [f"{g}\t{e}" for e, g in zip(en, de, strict=True)],
    )
    write_lines(
        tmp_path / "jsonl" / "train.jsonl.gz",
        [
            json.dumps({"translation": {"en": en[0], "de": de[0]}}),
            json.dumps({"en": en[1], "de": de[1]}),
        ],
    )
    for d in ("text", "tsv", "jsonl"):
        text = LocalSource(tmp_path / d, "en", "de").read("train")
        assert (text.src, text.tgt) == (en, de), d
        reverse = LocalSource(tmp_path / d, "de", "en").read("train")
        assert (reverse.src, reverse.tgt) == (de, en), d


def test_tsv_and_jsonl_errors_name_file_and_line(tmp_path):
    write_lines(tmp_path / "train.tsv", ["en\tde", "a\tb", "only one field"])
    with pytest.raises(DataError, match=r"train.tsv, line 3: 1 tab-separated fields"):
        LocalSource(tmp_path, "en", "de").read("train")
    write_lines(
        tmp_path / "val.jsonl", [json.dumps({"en": "a", "de": "b"}), json.dumps({"en": "a"})]
    )
    with pytest.raises(DataError, match=r"val.jsonl, line 2"):
        LocalSource(tmp_path, "en", "de").read("val")
    with pytest.raises(DataError, match=r"expected test.en and test.de, or test.tsv"):
        LocalSource(tmp_path, "en", "de").read("test")


def test_multi30k_offline_without_files_fails_fast_with_a_fix(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MULTI30K_URL", "http://127.0.0.1:9/nothing")  # refused at once
    src = Multi30kSource(tmp_path / "m30k", "en", "de")
    start = time.monotonic()
    with pytest.raises(DataError) as err:
        src.prepare(["train", "val"])
    assert time.monotonic() - start < 5
    msg = str(err.value)
    assert "data.root=DIR" in msg and "train.en.gz" in msg and "val.de.gz" in msg
    assert not list((tmp_path / "m30k").iterdir())  # no partial files left behind


def test_multi30k_download_then_read_with_the_same_code(multi30k_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MULTI30K_URL", multi30k_dir.as_uri())  # file:// "release"
    root = tmp_path / "downloaded"
    downloaded = Multi30kSource(root, "de", "en")
    downloaded.prepare(["train", "val"])
    assert sorted(p.name for p in root.iterdir()) == [
        "train.de.gz", "train.en.gz", "val.de.gz", "val.en.gz",
    ]  # fmt: skip
    on_disk = Multi30kSource(multi30k_dir, "de", "en", download=False)
    on_disk.prepare(["train", "val"])
    assert (
        downloaded.read("val").src
        == on_disk.read("val").src
        == read_lines(multi30k_dir / "val.de.gz")
    )


def test_multi30k_rejects_unknown_language(tmp_path):
    with pytest.raises(DataError, match="no language 'xx'"):
        Multi30kSource(tmp_path, "en", "xx")


def test_hf_source_needs_name_or_path():
    with pytest.raises(DataError, match="hf_name"):
        HFSource("en", "de")


def test_hf_config_the_dataset_lacks_is_a_data_error(monkeypatch):
    import datasets

    def load_dataset(name, config):
        raise ValueError(f"BuilderConfig '{config}' not found. Available: ['de-en']")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with pytest.raises(DataError, match=r"data.hf_name=wmt14 data.hf_config=xx-en: BuilderConfig"):
        HFSource("en", "de", name="wmt14", config="xx-en").read("train")
