"""A resumed run uses the checkpoint's SentencePiece models, never ones trained again from the raw
files (which, elsewhere or after the files changed, map the model's ids to other pieces)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
import torch

from tests.tiny import (
    DATA_SPLITS,
    TINY_VOCAB,
    data_pairs,
    prepared_datamodule,
    trained_elsewhere,
    write_lines,
)
from transformer.checkpoints import _torch_load, stored_tokenizer_models
from transformer.data import datamodule as dm_module
from transformer.data import prepare
from transformer.data.tokenizer import Tokenizer
from transformer.errors import CheckpointError, DataError


def models(dm: dm_module.TranslationDataModule) -> tuple[bytes, bytes]:
    return dm.src_tokenizer.to_bytes(), dm.tgt_tokenizer.to_bytes()


def token_ids(dm: dm_module.TranslationDataModule, split: str) -> dict[int, tuple[list, list]]:
    """Sentence id -> (source ids, target ids) of a tokenized split."""
    data = dm.split(split)
    return {i: (src.tolist(), tgt.tolist()) for i, src, tgt in (data[k] for k in range(len(data)))}


def moved_copy(corpus_dir: Path, to: Path) -> Path:
    """The corpus in another directory, with new mtimes and another training split."""
    shutil.copytree(corpus_dir, to, copy_function=shutil.copyfile)
    en, de = data_pairs(DATA_SPLITS["train"], 42)
    write_lines(to / "train.en", en)
    write_lines(to / "train.de", de)
    return to


def no_training(*args, **kwargs):
    raise AssertionError("SentencePiece was trained although the checkpoint's models were given")


@pytest.mark.parametrize("joint_vocab", [True, False])
def test_given_tokenizers_are_used_as_they_are(
    corpus_dir, dm_kwargs, tmp_path, monkeypatch, caplog, joint_vocab
):
    first = prepared_datamodule(
        source="local", root=str(corpus_dir), joint_vocab=joint_vocab, **dm_kwargs
    )
    assert (first.src_tokenizer is first.tgt_tokenizer) == joint_vocab
    other = moved_copy(corpus_dir, tmp_path / "elsewhere")
    kwargs = dict(dm_kwargs, root=str(other), joint_vocab=joint_vocab)
    retrained = prepared_datamodule(
        **dict(kwargs, source="local", cache_dir=str(tmp_path / "cache-retrained"))
    )
    assert token_ids(retrained, "val") != token_ids(first, "val")  # what resuming must not do

    monkeypatch.setattr(prepare, "train_tokenizer", no_training)
    with caplog.at_level(logging.INFO, logger=dm_module.__name__):
        resumed = prepared_datamodule(
            models(first), **dict(kwargs, source="local", cache_dir=str(tmp_path / "cache-resumed"))
        )
    assert "using the tokenizers of checkpoint last.ckpt" in caplog.text
    assert models(resumed) == models(first)
    assert (resumed.src_tokenizer is resumed.tgt_tokenizer) == joint_vocab
    for split in ("val", "test"):
        assert token_ids(resumed, split) == token_ids(first, split)
    src_text, tgt_text = resumed.sources("train"), resumed.references("train")  # the new text
    train = token_ids(resumed, "train")
    assert train == {
        i: (first.src_tokenizer.encode(src_text[i]), first.tgt_tokenizer.encode(tgt_text[i]))
        for i in train
    }
    for tok in (resumed.src_tokenizer, resumed.tgt_tokenizer):  # saved, named by their content
        assert tok.model_path.read_bytes() == tok.to_bytes()
        assert tok.model_path.parent == tmp_path / "cache-resumed" / "spm"
        assert Tokenizer(tok.model_path).to_bytes() == tok.to_bytes()


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_token_ids_are_cached_per_tokenizer_content(corpus_dir, dm_kwargs, monkeypatch, where):
    """The same models, given (``elsewhere``: trained again by another process, which
    SentencePiece records in them): the token ids already cached for them are loaded, not
    rebuilt."""
    first = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    calls = []
    monkeypatch.setattr(Tokenizer, "encode_batch", lambda self, texts: calls.append(texts))
    monkeypatch.setattr(prepare, "train_tokenizer", no_training)
    given = models(first) if where == "here" else tuple(map(trained_elsewhere, models(first)))
    resumed = prepared_datamodule(given, source="local", root=str(corpus_dir), **dm_kwargs)
    assert calls == []
    assert resumed.src_tokenizer.model_path != first.src_tokenizer.model_path
    assert token_ids(resumed, "train") == token_ids(first, "train")


def test_given_tokenizers_must_fit_the_config(corpus_dir, dm_kwargs, tmp_path):
    first = prepared_datamodule(
        source="local", root=str(corpus_dir), joint_vocab=False, **dm_kwargs
    )
    dm = dm_module.TranslationDataModule(
        source="local",
        root=str(corpus_dir),
        joint_vocab=False,
        **dict(dm_kwargs, vocab_size=TINY_VOCAB + 8),
    )
    with pytest.raises(DataError) as err:
        dm.use_tokenizers(*models(first), checkpoint="last.ckpt")
    assert (
        f"source tokenizer of checkpoint last.ckpt has {TINY_VOCAB} pieces, but "
        f"data.vocab_size={TINY_VOCAB + 8}; resume with data.vocab_size={TINY_VOCAB}"
    ) in str(err.value)
    joint = dm_module.TranslationDataModule(source="local", root=str(corpus_dir), **dm_kwargs)
    with pytest.raises(DataError, match=r"separate source and target .* data.joint_vocab=false"):
        joint.use_tokenizers(*models(first), checkpoint="last.ckpt")


def test_stored_tokenizer_models(tmp_path):
    stored = {
        side: {"name": f"{side}.model", "model": side.encode() * 3} for side in ("src", "tgt")
    }
    path = tmp_path / "last.ckpt"

    def read(path):
        return stored_tokenizer_models(_torch_load(path, mmap=True), path)

    torch.save({"state_dict": {"model.w": torch.zeros(4, 4)}, "tokenizers": stored}, path)
    assert read(path) == {"src": b"srcsrcsrc", "tgt": b"tgttgttgt"}

    torch.save({"state_dict": {"model.w": torch.zeros(4, 4)}}, path)
    assert read(path) is None
    torch.save({"tokenizers": {"src": stored["src"]}}, path)
    with pytest.raises(CheckpointError, match=r"last.ckpt: its tokenizers entry holds no src and"):
        read(path)
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"checkpoint .*last.ckpt cannot be read"):
        read(path)
    with pytest.raises(CheckpointError, match=r"checkpoint .*none.ckpt does not exist"):
        read(tmp_path / "none.ckpt")
