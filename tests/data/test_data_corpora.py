"""Several corpora in one run (data.corpora): weights, tags, target tokens, directions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from tests.tiny import data_pairs, prepared_datamodule, write_language
from transformer.data.datamodule import TranslationDataModule
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.errors import DataError

VOCAB = 80  # the tiny corpora's words and the three special tokens


@pytest.fixture
def corpora(tmp_path: Path) -> dict[str, Path]:
    return {
        "parallel": write_language(
            tmp_path / "parallel", "de", {"train": 120, "val": 20, "test": 10}, data_pairs, 0
        ),
        "bt": write_language(tmp_path / "bt", "de", {"train": 80}, data_pairs, 10),  # train only
        # "fr": the German with its words reversed
        "fr": write_language(
            tmp_path / "fr", "fr", {"train": 100, "val": 16, "test": 10}, data_pairs, 20, True
        ),
    }


def build(tmp_path: Path, entries: list[dict], **kwargs) -> TranslationDataModule:
    return prepared_datamodule(
        source="local", root=None, vocab_size=VOCAB, max_tokens=256, max_len=120, num_workers=0,
        cache_dir=str(tmp_path / "cache"), corpora=entries, **kwargs,
    )  # fmt: skip


def test_tags_and_target_tokens_are_one_piece_first_in_the_sources(tmp_path, corpora) -> None:
    entries = [
        {"root": str(corpora["parallel"])},
        {"root": str(corpora["bt"]), "tag": "<bt>"},
        {"root": str(corpora["fr"]), "tgt_lang": "fr"},
    ]
    dm = build(tmp_path, entries, target_token=True)
    tok = dm.src_tokenizer
    de, fr, bt = (tok._sp.piece_to_id(p) for p in ("<2de>", "<2fr>", "<bt>"))
    assert len({de, fr, bt, 1}) == 4  # three pieces of their own (1: unk)
    train = dm.split("train")
    firsts = Counter(tuple(train[i][1][:2].tolist()) for i in range(len(train)))
    plain = sum(n for (a, b), n in firsts.items() if a == de and b != bt)
    assert (firsts[de, bt], plain, sum(n for (a, _), n in firsts.items() if a == fr)) == (
        80, 120, 100,
    )  # fmt: skip
    for direction, token in (("en-de", de), ("en-fr", fr)):  # validation: target token, no tag
        val = dm.split("val", direction)
        assert {val[i][1][0] for i in range(len(val))} == {token}
        assert all(bt not in val[i][1].tolist() for i in range(len(val)))
    # The rest of a source is the line as the tokenizer encodes it alone.
    line = dm.sources("val", "en-fr")[3]
    assert dm.split("val", "en-fr")[3][1].tolist() == [fr, *tok.encode(line)]  # eos: collate's
    assert tok.with_prefix(dm.source_prefix("en-fr")).encode(line) == [fr, *tok.encode(line)]
    # Written at the line's start (after spaces or not), a token is that piece, and the rest the
    # line alone: no word start before it, as SentencePiece alone would put.
    for written in (f"<2fr> {line}", f"  <2fr>{line}", f"<2fr> <bt> {line}"):
        want = [fr, bt, *tok.encode(line)] if "<bt>" in written else [fr, *tok.encode(line)]
        assert tok.encode(written) == want and tok.encode_batch([written, line])[0] == want
    assert tok._sp.encode(f"<2fr> {line}")[:2] == [tok._sp.piece_to_id("\u2581"), fr]
    # Translating (unless_written): a line that names its own target keeps it, the rest get the
    # prefix; training keeps the prefix before whatever a line starts with.
    into_de = tok.with_prefix(("<2de>",), unless_written=True)
    for encode in (into_de.encode, lambda t: into_de.encode_batch([t, "", line])[0]):
        assert encode(f"<2fr> {line}") == [fr, *tok.encode(line)]
        assert encode(line) == [de, *tok.encode(line)]
    assert into_de.encode_batch(["", f"<2fr> {line}"])[0] == []
    assert tok.with_prefix(("<2de>",)).encode(f"<2fr> {line}") == [de, fr, *tok.encode(line)]


def test_a_token_given_as_it_is_goes_before_its_corpus_sources(tmp_path, corpora) -> None:
    """``data.target_token`` may name the token itself (an OPUS-MT model's ``>>fra<<``): it goes
    before the sources of every corpus that does not set its own, in training (before a tag)
    and in validation, one piece of the SentencePiece model trained on them."""
    entries = [
        {"root": str(corpora["parallel"])},
        {"root": str(corpora["bt"]), "tag": "<bt>"},
        {"root": str(corpora["fr"]), "tgt_lang": "fr", "target_token": ">>fra<<"},
    ]
    dm = build(tmp_path, entries, target_token=">>deu<<")
    tok = dm.src_tokenizer
    de, fr, bt = (tok._sp.piece_to_id(p) for p in (">>deu<<", ">>fra<<", "<bt>"))
    assert len({de, fr, bt, 1}) == 4 and tok._sp.piece_to_id("<2de>") == 1
    train = dm.split("train")
    firsts = Counter(tuple(train[i][1][:2].tolist()) for i in range(len(train)))
    assert firsts[de, bt] == 80 and sum(n for (a, _), n in firsts.items() if a == fr) == 100
    assert sum(n for (a, b), n in firsts.items() if a == de and b != bt) == 120
    assert (dm.source_prefix("en-de"), dm.source_prefix("en-fr")) == ((">>deu<<",), (">>fra<<",))
    line = dm.sources("val", "en-fr")[0]
    assert dm.split("val", "en-fr")[0][1].tolist() == [fr, *tok.encode(line)]
    assert tok.encode(f">>fra<< {line}") == [fr, *tok.encode(line)]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"target_token": "> >"}, r"data.target_token must be true .*got '> >'"),
        ({"target_token": 2}, r"data.target_token must be true .*got 2"),
        (
            {"corpora": [{"target_token": ""}]},
            r"data.corpora\[0\].target_token must be true .*got ''",
        ),
        (
            {"corpora": [{}, {"tgt_lang": "fr"}], "target_token": ">>deu<<"},
            r"data.corpora\[1\] puts target token >>deu<< before its sources, as a corpus into "
            r"de does, but it translates into fr: give each target language its own token",
        ),
    ],
)
def test_a_target_token_that_cannot_work_is_refused_by_name(corpora, data, message) -> None:
    with pytest.raises(DataError, match=message):
        TranslationDataModule(source="local", root=str(corpora["parallel"]), **data)


def test_a_resume_keeps_each_corpus_target_token() -> None:
    from transformer.errors import ConfigError
    from transformer.training.resume import check_data_settings

    was = {"source": "local", "src_lang": "en", "tgt_lang": "de"}
    was["corpora"] = [{"tgt_lang": "de"}, {"tgt_lang": "fr", "target_token": ">>fra<<"}]
    check_data_settings(was, dict(was), "last.ckpt")
    now = {**was, "corpora": [{"tgt_lang": "de"}, {"tgt_lang": "fr", "target_token": ">>fr<<"}]}
    with pytest.raises(ConfigError, match=r"trained with data.corpora\[1\].target_token=>>fra<<"):
        check_data_settings(was, now, "last.ckpt")


def test_validation_and_references_per_direction(tmp_path, corpora) -> None:
    entries = [
        {"root": str(corpora["parallel"])},
        {"root": str(corpora["bt"]), "weight": 0.5},  # en-de too: training only
        {"root": str(corpora["fr"]), "tgt_lang": "fr"},
    ]
    dm = build(tmp_path, entries, target_token=True)
    assert dm.directions == ["en-de", "en-fr"]
    loaders = dm.val_dataloader()
    assert [len(loader.dataset) for loader in loaders] == [20, 16]
    fr_refs = (corpora["fr"] / "val.fr").read_text().splitlines()
    assert dm.references("val", "en-fr") == fr_refs
    assert dm.references("val") == (corpora["parallel"] / "val.de").read_text().splitlines()
    assert dm.split_name("test", "en-fr") == "test"
    with pytest.raises(DataError, match=r"no corpus translates en-cs; the directions are \["):
        dm.references("val", "en-cs")


def test_an_epoch_takes_each_corpus_by_its_weight(tmp_path, corpora) -> None:
    entries = [
        {"root": str(corpora["parallel"]), "weight": 2},
        {"root": str(corpora["bt"]), "weight": 0.25},
    ]
    dm = build(tmp_path, entries)
    train = dm.split("train")
    sampler = dm.train_dataloader().batch_sampler
    halves = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = Counter(i for batch in sampler for i in batch)
        assert all(seen[i] == 2 for i in range(120))  # the parallel corpus twice
        bt = {i for i in seen if i >= 120}
        assert len(bt) == 20 and all(seen[i] == 1 for i in bt)  # a quarter of the 80, once
        halves.append(bt)
    assert halves[0] != halves[1]  # drawn again each epoch
    assert len(train) == 200


def test_unweighted_epochs_are_what_they_were() -> None:
    """``weights`` of one copy each draw the same epochs as no weights (the same generator
    draws); a fraction draws more."""
    sizes = np.random.default_rng(0).integers(3, 30, 50)
    plain = list(TokenBudgetBatchSampler(sizes, sizes, max_tokens=60, seed=3))
    ones = TokenBudgetBatchSampler(sizes, sizes, max_tokens=60, seed=3, weights=[(20, 1), (30, 1)])
    assert list(ones) == plain
    more = TokenBudgetBatchSampler(sizes, sizes, max_tokens=60, seed=3, weights=[(50, 1.5)])
    assert sum(len(b) for b in more) == 75
    with pytest.raises(ValueError, match="weights cover 40 of 50 examples"):
        TokenBudgetBatchSampler(sizes, sizes, max_tokens=60, weights=[(40, 1.0)])


def test_a_share_of_a_corpus_packs_into_as_many_batches_every_epoch() -> None:
    """Lightning sizes every epoch by the first: a random share drawn each epoch must pack into
    the same number of batches (the same sizes, other sentences), or batches would be lost."""
    sizes = np.random.default_rng(1).integers(2, 40, 300)
    sampler = TokenBudgetBatchSampler(sizes, sizes, max_tokens=80, weights=[(100, 1), (200, 0.3)])
    counts, drawn = set(), []
    for epoch in range(8):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        counts.add(len(batches))
        share = sorted(i for b in batches for i in b if i >= 100)
        assert len(share) == 60 and len(set(share)) == 60
        drawn.append(tuple(share))
    assert len(counts) == 1 and len(set(drawn)) == 8


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"wieght": 2}, r"data.corpora\[0\]: unknown key\(s\) \['wieght'\]"),
        ({"weight": 0}, r"data.corpora\[0\].weight must be a positive number, got 0"),
        ({"tag": "bt"}, r"data.corpora\[0\].tag must be one token in angle brackets"),
        ({"tag": "<b t>"}, r"data.corpora\[0\].tag must be one token in angle brackets"),
        ({"source": "local", "root": None}, r"data.corpora\[0\].root is needed for source=local"),
    ],
)
def test_bad_entries_are_refused_by_name(tmp_path, corpora, entry, message) -> None:
    with pytest.raises(DataError, match=message):
        TranslationDataModule(source="local", root=str(corpora["parallel"]), corpora=[entry])
    with pytest.raises(DataError, match="data.corpora is an empty list"):
        TranslationDataModule(source="local", root=str(corpora["parallel"]), corpora=[])


def test_a_tokenizer_trained_without_the_token_is_refused_by_name(tmp_path, corpora) -> None:
    dm = build(tmp_path, [{"root": str(corpora["parallel"])}])  # no tag, no target tokens
    with pytest.raises(DataError, match="has no piece <2de>: this SentencePiece model was trained"):
        dm.src_tokenizer.with_prefix(("<2de>",))


def test_each_source_is_declared_once_and_every_place_reads_the_declaration() -> None:
    """SOURCES names each data.source's options: together with the keys every source has they
    are exactly what a data.corpora entry may set, data=<name>'s config sets each, and
    evaluate.yaml lets each be set in place of the checkpoint's (but the training split)."""
    from omegaconf import OmegaConf

    from transformer.configs import CONFIG_DIR
    from transformer.data.corpora import COMMON_KEYS, CORPUS_IDENTITY, CORPUS_KEYS, SOURCES

    declared = set(COMMON_KEYS) | {k for kind in SOURCES.values() for k in kind.options}
    assert declared == set(CORPUS_KEYS)
    evaluate = OmegaConf.load(f"{CONFIG_DIR}/evaluate.yaml")
    assert set(CORPUS_KEYS) - {"train_split"} <= set(evaluate.data)
    assert set(CORPUS_IDENTITY) <= set(CORPUS_KEYS)
    shared = set(OmegaConf.load(f"{CONFIG_DIR}/data/_shared.yaml"))
    for name, kind in SOURCES.items():  # data=<name>: its config file sets what it reads
        keys = shared | set(OmegaConf.load(f"{CONFIG_DIR}/data/{name}.yaml"))
        assert set(COMMON_KEYS) | set(kind.options) <= keys, name
