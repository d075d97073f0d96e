"""SentencePiece tokenizers: round trip, the project's special ids, exact vocabulary size."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import pytest

from tests.tiny import (
    REPO,
    TINY_VOCAB,
    data_pairs,
    other_tokenizer,
    prepared_datamodule,
    trained_elsewhere,
    write_lines,
)
from transformer.data.spm_model import model_digest
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from transformer.data.tokenizer_training import train_tokenizer
from transformer.errors import DataError


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_round_trip_and_special_ids(tmp_path, model_type):
    en, de = data_pairs(300, 0)
    tok = train_tokenizer(en + de, tmp_path / "t.model", TINY_VOCAB, model_type)
    assert tok.vocab_size == TINY_VOCAB
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    sp = tok._sp
    assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, 2, 3)
    for text in en[:20] + de[:20]:
        ids = tok.encode(text)
        assert ids and min(ids) > EOS_ID  # plain text never encodes to a special id
        assert tok.decode(ids) == text
    assert tok.encode_batch(en[:5]) == [tok.encode(t) for t in en[:5]]


def test_decode_drops_bos_pad_and_stops_at_eos(tmp_path):
    en, de = data_pairs(300, 0)
    tok = train_tokenizer(en + de, tmp_path / "t.model", TINY_VOCAB)
    ids = tok.encode(en[0])
    assert tok.decode([BOS_ID, *ids, EOS_ID, *tok.encode(en[1]), PAD_ID]) == en[0]
    assert tok.decode([BOS_ID, *ids, PAD_ID, PAD_ID]) == en[0]


def test_pickles_for_worker_processes(tmp_path):
    en, de = data_pairs(300, 0)
    tok = train_tokenizer(en + de, tmp_path / "t.model", TINY_VOCAB)
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode(en[3]) == tok.encode(en[3])


def test_too_large_vocabulary_says_which_option(tmp_path):
    en, de = data_pairs(30, 0)
    with pytest.raises(DataError, match="data.vocab_size"):
        train_tokenizer(en + de, tmp_path / "t.model", 50_000)
    assert not (tmp_path / "t.model").exists()


def test_spm_train_sentences_caps_what_sentencepiece_trains_on(corpus_dir, dm_kwargs):
    """``data.spm_train_sentences`` is a cache setting: another cap trains another model (a
    sample of 200 of the 600 sentences gives other pieces), under another name."""
    full = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    sample = prepared_datamodule(
        source="local", root=str(corpus_dir), spm_train_sentences=200, **dm_kwargs
    )
    assert full.src_tokenizer.model_path != sample.src_tokenizer.model_path
    assert full.src_tokenizer.to_bytes() != sample.src_tokenizer.to_bytes()


@pytest.mark.slow
def test_two_processes_training_one_tokenizer_write_the_same_bytes(tmp_path):
    """SentencePiece records in its model where it was written (a temporary path holding the
    process id): two processes training the same tokenizer on the same data, into files of one
    name in two folders, write the same bytes, and their models have one digest."""
    en, de = data_pairs(300, 0)
    text = write_lines(tmp_path / "text", en + de)
    code = (
        "import sys; from transformer.data.text_files import read_lines; "
        "from transformer.data.tokenizer_training import train_tokenizer; "
        f"train_tokenizer(read_lines(sys.argv[1]), sys.argv[2], {TINY_VOCAB})"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for folder in ("a", "b"):
        model = tmp_path / folder / "t.model"
        subprocess.run([sys.executable, "-c", code, text, model], env=env, check=True)
    a, b = ((tmp_path / folder / "t.model").read_bytes() for folder in ("a", "b"))
    assert a == b
    assert model_digest(a) == model_digest(trained_elsewhere(a)) != model_digest(other_tokenizer(a))
