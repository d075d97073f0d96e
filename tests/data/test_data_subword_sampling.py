"""Subword regularisation (``data.spm_sampling``): training pairs segmented anew each epoch, in the
loader workers, the same for the same seed, epoch and pair; validation and test untouched; the
token budget kept; bad options refused by name."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from tests.tiny import TINY_VOCAB, compose_cfg, logged, prepared_datamodule, tiny_overrides
from transformer.data.collate import Buckets
from transformer.data.sampler import TokenBudgetBatchSampler
from transformer.data.subword_sampling import PLAN_QUANTILE, REDRAWS, Growth, RowLimit
from transformer.data.tokenizer import EOS_ID, UNK_ID, Tokenizer
from transformer.errors import ConfigError, DataError
from transformer.training import train

SAMPLING = {"alpha": 0.1, "nbest": -1}
VOCAB = 150  # pieces enough for most of the tiny corpus's sentences to have several segmentations


@pytest.fixture
def make_dm(corpus_dir, dm_kwargs):
    """``make_dm(**options)``: a prepared data module on the tiny corpus; all share one cache."""

    def make(**options):
        options = {**dm_kwargs, "vocab_size": VOCAB, **options}
        return prepared_datamodule(source="local", root=str(corpus_dir), **options)

    return make


def batches(dm, epoch: int = 0, loader=None) -> list[tuple]:
    """An epoch of training batches: (ids, sources, labels) each, as lists."""
    loader = loader or dm.train_dataloader()
    loader.batch_sampler.set_epoch(epoch)
    return listed(loader)


def listed(loader) -> list[tuple]:
    return [(b.ids.tolist(), b.src.tolist(), b.labels.tolist()) for b in loader]


def pairs(epoch_batches: list[tuple], tok: Tokenizer) -> dict[int, tuple[tuple, tuple]]:
    """Each pair's source and target ids (without eos and padding), by its id."""

    def strip(row: list[int]) -> tuple[int, ...]:
        return tuple(row[: row.index(EOS_ID)])

    found = {}
    for ids, src, labels in epoch_batches:
        for i, s, t in zip(ids, src, labels, strict=True):
            assert i not in found  # each pair once an epoch
            found[i] = strip(s), strip(t)
    return found


def test_training_pairs_are_segmented_anew_each_epoch_within_the_budget(make_dm, dm_kwargs):
    plain, sampled = make_dm(), make_dm(spm_sampling=SAMPLING)
    tok = plain.tgt_tokenizer
    fixed = pairs(batches(plain), tok)
    first, second = (pairs(batches(sampled, epoch), tok) for epoch in (0, 1))
    assert set(first) == set(second) == set(fixed) and len(fixed) == 300  # no pair dropped
    for drawn in (first, second):
        for i, sides in drawn.items():  # the same text: nothing cut
            for side, ids in enumerate(sides):
                assert tok.decode(ids) == tok.decode(fixed[i][side])
    assert sum(first[i] != fixed[i] for i in fixed) > 200  # (some have one segmentation)
    assert sum(first[i] != second[i] for i in fixed) > 200
    longer = sum(len(first[i][0]) + len(first[i][1]) for i in fixed)
    assert longer > 1.05 * sum(len(fixed[i][0]) + len(fixed[i][1]) for i in fixed)
    budget, rows = dm_kwargs["max_tokens"], dm_kwargs["max_len"] + 1
    for _, src, labels in batches(sampled, 2):
        assert len(src) * len(src[0]) <= budget and len(labels) * len(labels[0]) <= budget
        assert len(src[0]) <= rows and len(labels[0]) <= rows


def test_validation_and_test_batches_and_caches_are_those_without_sampling(make_dm, dm_kwargs):
    plain = make_dm()
    caches = sorted((Path(dm_kwargs["cache_dir"]) / "tok").iterdir())
    sampled = make_dm(spm_sampling=SAMPLING)
    sampled.train_dataloader()
    assert sorted((Path(dm_kwargs["cache_dir"]) / "tok").iterdir()) == caches
    for loaders in ("val_dataloader", "test_dataloader"):
        want = listed(getattr(plain, loaders)())
        assert listed(getattr(sampled, loaders)()) == want and want


def test_draws_depend_on_seed_epoch_and_pair_only(make_dm):
    """Two workers draw what the main process draws; a pair drawn alone, in another order, is
    drawn alike; another data seed draws otherwise."""
    dm = make_dm(spm_sampling=SAMPLING)
    in_main = [batches(dm, epoch) for epoch in (0, 1)]
    workers = make_dm(spm_sampling=SAMPLING, num_workers=2)
    loader = workers.train_dataloader()
    assert [batches(workers, epoch, loader) for epoch in (0, 1)] == in_main
    split = dm.sampled_train()
    limit = split.limit(1)
    forward = [split.draw(i, 1, limit) for i in range(40)]
    backward = [split.draw(i, 1, limit) for i in reversed(range(40))][::-1]
    same = [
        np.array_equal(a[k], b[k]) for a, b in zip(forward, backward, strict=True) for k in (1, 2)
    ]
    assert all(same)
    other = make_dm(spm_sampling=SAMPLING, seed=8).sampled_train()
    differ = [not np.array_equal(other.draw(i, 1, limit)[2], forward[i][2]) for i in range(40)]
    assert sum(differ) > 15


def test_a_restored_sampler_draws_the_rest_of_the_epoch_alike(make_dm):
    full = batches(make_dm(spm_sampling=SAMPLING), 1)
    resumed = make_dm(spm_sampling=SAMPLING)
    resumed.load_state_dict({"train_sampler": {"epoch": 1, "position": 7, "seed": 7}})
    assert batches(resumed, 1) == full[7:]


@pytest.mark.parametrize("options", [dict(num_buckets=3), dict(pad_to_multiple=8)])
def test_buckets_and_padding_keep_the_budget(make_dm, dm_kwargs, options):
    dm = make_dm(spm_sampling=SAMPLING, **options)
    budget = dm_kwargs["max_tokens"]
    shapes = {(len(src), len(src[0])) for _, src, _ in batches(dm, 1)}
    assert all(rows * length <= budget for rows, length in shapes)
    if "num_buckets" in options:
        buckets = dm.train_buckets(dm.sampled_train().planned_sizes(*planned_input(dm)))
        assert shapes <= {(buckets.rows(n), n) for n in buckets.lengths}


def planned_input(dm):
    data = dm.split("train")
    return data.src_lens + 1, data.tgt_lens + 1


def test_a_side_too_long_for_its_batch_is_drawn_again_then_kept_as_cached(make_dm, monkeypatch):
    dm = make_dm(spm_sampling={"alpha": 0.1})
    split, data = dm.sampled_train(), dm.split("train")
    draws = []
    resample = Tokenizer.resample
    monkeypatch.setattr(Tokenizer, "resample", lambda *a: draws.append(a[1]) or resample(*a))
    kept = 0
    for i in range(100):
        _, src, tgt = data[i]
        limit = max(len(src), len(tgt)) + 1  # room for the cached sides, no more
        _, s, t = split.draw(i, 0, limit)
        assert len(s) < limit and len(t) < limit
        kept += np.array_equal(src, s) + np.array_equal(tgt, t)
    assert 10 < kept and 200 < len(draws) <= 200 * (REDRAWS + 1)
    draws.clear()
    split.draw(0, 0, 1000)
    assert len(draws) == 2  # one draw a side when it fits


def test_row_limit_is_the_batch_budget_a_row():
    assert RowLimit(max_len=64)(3) == 65
    assert RowLimit(64, max_tokens=256)(10) == 25
    assert RowLimit(64, max_tokens=256, pad_to_multiple=8)(10) == 24
    buckets = Buckets((16, 32, 64), max_tokens=256)  # rows: 16, 8, 4
    assert RowLimit(64, 256, 8, buckets)(9) == 16 and RowLimit(64, 256, 8, buckets)(8) == 32
    assert RowLimit(20, 256, 8, buckets)(2) == 21


def test_growth_plans_for_a_high_quantile_of_each_size_range():
    before = np.repeat([10, 40], 500)
    ratios = np.concatenate([np.linspace(1.0, 2.0, 500), np.linspace(1.0, 1.2, 500)])
    growth = Growth.measure(before, np.round(before * ratios).astype(int))
    planned = growth.planned(np.array([5, 10, 40, 100]))
    short = np.quantile(np.round(10 * ratios[:500]) / 10, PLAN_QUANTILE)
    assert planned[1] == math.ceil(10 * short)
    assert planned[2] == 48 and planned[3] == 120  # 40 x 1.2; beyond the probe: the last range's
    assert planned[0] >= 5


def test_the_sampler_sends_each_batch_with_its_epoch():
    sizes = np.arange(1, 41)
    plain = TokenBudgetBatchSampler(sizes, sizes, max_tokens=64, seed=3)
    tagged = TokenBudgetBatchSampler(sizes, sizes, max_tokens=64, seed=3, epochs=True)
    for epoch in (0, 1):
        plain.set_epoch(epoch)
        tagged.set_epoch(epoch)
        assert list(tagged) == [(epoch, b) for b in plain]


def test_resample_draws_alike_under_one_seed(make_dm):
    tok = make_dm().src_tokenizer
    ids = tok.encode("a child plays with a red ball near the big house.")
    again = [tok.resample(ids, 0.1, -1, seed) for seed in (5, 6, 5)]
    assert again[0] == again[2]
    assert tok.decode(again[1]) == tok.decode(ids)
    # Two seeds may draw the same segmentation; twenty draw more than one.
    assert len({tuple(tok.resample(ids, 0.1, -1, seed)) for seed in range(20)}) > 1
    with_unknown = [*ids[:3], UNK_ID, *ids[3:]]
    assert tok.resample(with_unknown, 0.1, -1, 5) == with_unknown


def test_a_source_prefix_stays_in_front(make_dm):
    dm = make_dm(spm_sampling=SAMPLING, target_token=True)
    (prefix,) = dm.src_tokenizer.with_prefix(dm.source_prefix()).prefix
    drawn = batches(dm)
    assert all(row[0] == prefix and prefix not in row[1:] for _, src, _ in drawn for row in src)
    fixed = batches(make_dm(target_token=True))
    assert pairs(drawn, dm.tgt_tokenizer) != pairs(fixed, dm.tgt_tokenizer)
    # a token written at the line's start (an imported OPUS-MT model's way) stays in front too
    tok = dm.src_tokenizer
    ids = tok.encode(f"{tok.pieces([prefix])[0]} a child plays with a red ball")
    assert ids[0] == prefix
    for seed in range(5):
        again = tok.resample(ids, 0.1, -1, seed)
        assert again[0] == prefix and prefix not in again[1:]
        assert tok.decode(again) == tok.decode(ids)


def test_sentencepiece_that_does_not_reseed_is_refused(make_dm, monkeypatch):
    dm = make_dm(spm_sampling=SAMPLING)
    monkeypatch.setattr(spm, "set_random_generator_seed", lambda seed: None)  # (before 0.2.3)
    with pytest.raises(DataError, match=r"same seed.*pip install -U 'sentencepiece>=0\.2\.3'"):
        dm.train_dataloader()


@pytest.mark.parametrize(
    "options, model_type, message",
    [
        ({"alpha": 1.5}, "unigram", r"spm_sampling\.alpha=1\.5 is out of range: .*0 < alpha <= 1"),
        ({"alpha": 0}, "unigram", r"data\.spm_sampling\.alpha=0 is out of range"),
        ({"alpha": 1.0}, "bpe", r"alpha=1\.0 is out of range: for a BPE model .*0 < alpha < 1"),
        ({"alpha": 0.1, "nbest": 64}, "bpe", r"nbest=64 applies to unigram models only: .*=null"),
        ({"alpha": 0.1, "nbest": 1}, "unigram", r"nbest=1 is out of range: -1 .* or 2 to 512"),
        ({"alpha": 0.1, "nbest": 1000}, "unigram", r"nbest=1000 is out of range"),
        ({"alpha": 0.1, "nbest": 2.5}, "unigram", r"nbest=2\.5 is not an integer: -1 .* or 2 to"),
        ({"nbest": 64}, "unigram", r"nbest=64 without data\.spm_sampling\.alpha"),
        ({"alpha": "high"}, "unigram", r"alpha='high' must be a number"),
        ({"alpha": 0.1, "n_best": 4}, "unigram", r"data\.spm_sampling has no key 'n_best'"),
    ],
)
def test_bad_options_are_refused_by_name(make_dm, dm_kwargs, options, model_type, message):
    from transformer.data.datamodule import TranslationDataModule

    with pytest.raises(ValueError, match=message):
        TranslationDataModule(**dm_kwargs, spm_model_type=model_type, spm_sampling=options)


def test_a_tokenizer_that_cannot_sample_is_refused(corpus_dir, dm_kwargs, tmp_path):
    text = (corpus_dir / "train.en").read_text().splitlines()
    model = tmp_path / "char"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_prefix=str(model), model_type="char",
        vocab_size=TINY_VOCAB, hard_vocab_limit=False, pad_id=0, unk_id=1, bos_id=2, eos_id=3,
        minloglevel=2,
    )  # fmt: skip
    char = Path(f"{model}.model").read_bytes()
    size = Tokenizer("char", model_proto=char).vocab_size
    options = {**dm_kwargs, "vocab_size": size, "spm_sampling": SAMPLING}
    with pytest.raises(ConfigError, match=r"a char SentencePiece model cannot sample"):
        prepared_datamodule((char, char), source="local", root=str(corpus_dir), **options)


@pytest.mark.slow
def test_training_with_sampling_learns(corpus, tmp_path):
    overrides = [*tiny_overrides(corpus), "data.spm_sampling.alpha=0.2", "trainer.max_steps=30",
                 "trainer.val_check_interval=30",
                 "trainer.check_val_every_n_epoch=null"]  # fmt: skip
    train(compose_cfg(overrides, tmp_path))
    losses = logged(tmp_path, "train/loss")
    assert len(losses) == 30 and np.mean(losses[-5:]) < np.mean(losses[:5]) - 0.5, losses
