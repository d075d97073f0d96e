"""TranslationDataModule end to end on tiny corpora: batches, caching, sources, bad input."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace

import datasets
import lightning as L
import pyarrow as pa
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

from tests.tiny import DATA_SPLITS, TINY_VOCAB, data_pairs, prepared_datamodule, write_lines
from transformer.configs import CONFIG_DIR
from transformer.data import datamodule as dm_module
from transformer.data import prepare
from transformer.data.collate import Batch
from transformer.data.tokenizer import EOS_ID, PAD_ID, Tokenizer
from transformer.errors import DataError

CONFIGS = CONFIG_DIR / "data"


def ids_of(loader) -> list[int]:
    return [i for b in loader for i in b.ids.tolist()]


def test_a_full_disk_while_caching_leaves_nothing_to_read_back(corpus_dir, dm_kwargs, monkeypatch):
    """The disk fills up while a split's token ids are written (after a truncated file): a
    DataError names the cache and the fix, nothing is left under ``tok/`` (no temporary
    directory, no half-written split), and the next run builds every split whole."""
    real = pa.ipc.new_file

    class FullDisk:
        """The cache's Arrow writer, where the disk fills up after the first chunk."""

        def __init__(self, sink, schema):
            self.sink, self.writer = sink, real(sink, schema)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.writer.close()

        def write_batch(self, batch):
            self.writer.write_batch(batch)
            self.writer.close()
            Path(self.sink).write_bytes(Path(self.sink).read_bytes()[:100])
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pa.ipc, "new_file", FullDisk)
    with pytest.raises(DataError, match=r"token cache .*No space left on device.*data.cache_dir"):
        prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert list((Path(dm_kwargs["cache_dir"]) / "tok").iterdir()) == []
    monkeypatch.setattr(pa.ipc, "new_file", real)
    dm = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    for split in ("train", "val", "test"):
        assert sorted(ids_of(getattr(dm, f"{split}_dataloader")())) == list(
            range(DATA_SPLITS[split])
        )


def test_local_corpus_end_to_end(corpus_dir, dm_kwargs):
    dm = prepared_datamodule(source="local", root=str(corpus_dir), pad_to_multiple=8, **dm_kwargs)
    assert dm.src_vocab_size == dm.tgt_vocab_size == TINY_VOCAB == dm.src_tokenizer.vocab_size
    assert dm.src_tokenizer is dm.tgt_tokenizer and dm.pad_id == PAD_ID
    refs = dm.references("train")
    n_batches = 0
    for b in dm.train_dataloader():
        n_batches += 1
        assert isinstance(b, Batch)
        assert b.src.numel() <= 256 and b.tgt_in.numel() <= 256  # the token budget
        assert b.src.shape[1] % 8 == 0 and b.tgt_in.shape[1] % 8 == 0
        row = 0
        assert dm.tgt_tokenizer.decode(b.labels[row].tolist()) == refs[int(b.ids[row])]
    assert n_batches == len(dm.train_dataloader().batch_sampler)
    assert sorted(ids_of(dm.train_dataloader())) == list(range(DATA_SPLITS["train"]))
    # evaluation splits are whole and ids index the references in corpus order
    for split in ("val", "test"):
        assert sorted(ids_of(getattr(dm, f"{split}_dataloader")())) == list(
            range(DATA_SPLITS[split])
        )
    b = next(iter(dm.val_dataloader()))
    row = int(b.ids[0])
    src_ids = [t for t in b.src[0].tolist() if t not in (PAD_ID, EOS_ID)]
    assert dm.src_tokenizer.decode(src_ids) == dm.sources("val")[row]
    assert dm.tgt_tokenizer.decode(b.labels[0].tolist()) == dm.references("val")[row]


def test_second_run_loads_the_cache_without_tokenizing(corpus_dir, dm_kwargs, monkeypatch):
    calls = []
    encode_batch = Tokenizer.encode_batch

    def counting(self, texts):
        calls.append(len(texts))
        return encode_batch(self, texts)

    monkeypatch.setattr(Tokenizer, "encode_batch", counting)
    first = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert sum(calls) == 2 * sum(DATA_SPLITS.values())  # both sides of every split, once

    calls.clear()

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again")

    monkeypatch.setattr(prepare, "train_tokenizer", no_training)
    second = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert calls == []
    assert ids_of(second.val_dataloader()) == ids_of(first.val_dataloader())
    assert second.src_tokenizer.model_path == first.src_tokenizer.model_path

    # a changed setting or changed data is tokenized again
    prepared_datamodule(source="local", root=str(corpus_dir), **{**dm_kwargs, "max_len": 63})
    assert sum(calls) == 2 * DATA_SPLITS["train"]
    calls.clear()
    en, de = data_pairs(DATA_SPLITS["test"], 99)
    write_lines(corpus_dir / "test.en", en)
    write_lines(corpus_dir / "test.de", de)
    prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert sum(calls) == 2 * DATA_SPLITS["test"]


def test_line_count_mismatch_fails_before_tokenizer_training(corpus_dir, dm_kwargs, monkeypatch):
    en, _ = data_pairs(DATA_SPLITS["val"] + 2, 5)
    write_lines(corpus_dir / "val.en", en)

    def no_training(*args, **kwargs):
        raise AssertionError("trained a tokenizer on data that failed its checks")

    monkeypatch.setattr(prepare, "train_tokenizer", no_training)
    with pytest.raises(DataError) as err:
        prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert "val.en has 32 lines" in str(err.value) and "val.de has 30" in str(err.value)


def test_non_utf8_training_file(corpus_dir, dm_kwargs):
    path = corpus_dir / "train.de"
    path.write_bytes(path.read_bytes() + "Straße\n".encode("cp1252"))
    (corpus_dir / "train.en").write_bytes((corpus_dir / "train.en").read_bytes() + b"Street\n")
    with pytest.raises(DataError, match=r"train.de, line 301: bytes that are not UTF-8"):
        prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)


def test_nothing_left_after_filtering_says_which_filter(corpus_dir, dm_kwargs):
    with pytest.raises(DataError, match=r"max_len=1 filter removed 300"):
        prepared_datamodule(source="local", root=str(corpus_dir), **{**dm_kwargs, "max_len": 1})
    en, de = data_pairs(DATA_SPLITS["train"], 0)  # each pair with one side empty
    write_lines(corpus_dir / "train.en", [s if i % 2 else "" for i, s in enumerate(en)])
    write_lines(corpus_dir / "train.de", ["" if i % 2 else s for i, s in enumerate(de)])
    with pytest.raises(DataError, match=r"empty-side filter removed 300 of 300"):
        prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)


def test_empty_and_overlong_training_pairs_are_dropped(corpus_dir, dm_kwargs, caplog):
    en, de = data_pairs(DATA_SPLITS["train"], 0)
    en[3], de[10] = "", "  "
    en[20] = " ".join(["dog"] * 80)
    write_lines(corpus_dir / "train.en", en)
    write_lines(corpus_dir / "train.de", de)
    with caplog.at_level("INFO"):
        dm = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert "kept 297 of 300 pairs; dropped 2 with an empty side, 1 longer than max_len=64" in (
        caplog.text
    )
    assert sorted(ids_of(dm.train_dataloader())) == sorted(set(range(300)) - {3, 10, 20})


def save_hf_dataset(path: Path) -> None:
    features = datasets.Features({"translation": datasets.Translation(languages=["de", "en"])})
    parts = {}
    for seed, (split, n) in enumerate((("train", 300), ("validation", 30), ("test", 25))):
        en, de = data_pairs(n, seed)
        rows = [{"de": g, "en": e} for e, g in zip(en, de, strict=True)]
        parts[split] = datasets.Dataset.from_dict({"translation": rows}, features=features)
    datasets.DatasetDict(parts).save_to_disk(str(path))


def test_hub_format_dataset_saved_to_disk(tmp_path, dm_kwargs):
    save_hf_dataset(tmp_path / "hf")
    dm = prepared_datamodule(
        source="hf", root=None, hf_path=str(tmp_path / "hf"), src_lang="de", tgt_lang="en",
        **dm_kwargs,
    )  # fmt: skip
    en, de = data_pairs(30, 1)
    assert dm.sources("val") == de and dm.references("validation") == en
    assert sorted(ids_of(dm.val_dataloader())) == list(range(30))
    b = next(iter(dm.train_dataloader()))
    assert dm.tgt_tokenizer.decode(b.labels[0].tolist()) == dm.references("train")[int(b.ids[0])]


def test_separate_vocabularies(corpus_dir, dm_kwargs):
    dm = prepared_datamodule(source="local", root=str(corpus_dir), joint_vocab=False, **dm_kwargs)
    src, tgt = dm.src_tokenizer, dm.tgt_tokenizer
    assert src.model_path != tgt.model_path
    assert src.vocab_size == tgt.vocab_size == TINY_VOCAB
    assert ".en." in src.model_path.name and ".de." in tgt.model_path.name
    b = next(iter(dm.val_dataloader()))
    assert tgt.decode(b.labels[0].tolist()) == dm.references("val")[int(b.ids[0])]


def test_batches_are_pinned_only_for_a_trainer_on_cuda(corpus_dir, dm_kwargs, monkeypatch):
    dm = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    cpu_trainer = L.Trainer(
        accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU that is not used
    assert not dm.train_dataloader().pin_memory  # the datamodule alone, no trainer
    dm.trainer = cpu_trainer
    assert not dm.train_dataloader().pin_memory and not dm.val_dataloader().pin_memory
    dm.trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device("cuda", 0)))
    assert dm.train_dataloader().pin_memory and dm.test_dataloader().pin_memory


def test_datamodule_state_resumes_mid_epoch(corpus_dir, dm_kwargs):
    dm = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    loader = dm.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    it = iter(loader)
    [next(it) for _ in range(3)]
    state = dm.state_dict()
    rest = [b.ids.tolist() for b in it]
    assert rest

    resumed = prepared_datamodule(source="local", root=str(corpus_dir), **dm_kwargs)
    resumed.load_state_dict(state)  # Lightning restores before building the loaders
    loader = resumed.train_dataloader()
    loader.batch_sampler.set_epoch(1)
    assert [b.ids.tolist() for b in loader] == rest


@pytest.mark.parametrize("name", ["multi30k", "local", "hf"])
def test_hydra_configs_instantiate(name, multi30k_dir, corpus_dir, tmp_path, dm_kwargs):
    with initialize_config_dir(str(CONFIGS.parent), version_base="1.3"):  # with _shared.yaml's keys
        cfg = compose(f"data/{name}").data
    assert cfg._target_ == "transformer.data.datamodule.TranslationDataModule"
    assert cfg.vocab_size == 8000 and cfg.joint_vocab is True and cfg.max_tokens == 4096
    overrides = {**dm_kwargs, "root": str(multi30k_dir if name == "multi30k" else corpus_dir)}
    if name == "hf":
        save_hf_dataset(tmp_path / "hf")
        overrides.update(root=None, hf_path=str(tmp_path / "hf"))
    dm = instantiate(OmegaConf.merge(cfg, overrides))
    dm.prepare_data()
    dm.setup("fit")
    assert len(dm.split("val")) == (DATA_SPLITS["val"])
    batch = next(iter(dm.train_dataloader()))
    assert batch.src.dtype == torch.long


def test_a_source_option_is_declared_by_its_source_alone(corpus_dir, dm_kwargs) -> None:
    """The data module has no parameter of its own for a source's options: each reaches the
    corpus from the mapping SOURCES declares (a new source adds its keys there only), and a key
    no source declares is refused by name."""
    import inspect

    from transformer.data.corpora import SOURCE_OPTIONS

    assert not set(SOURCE_OPTIONS) & set(
        inspect.signature(dm_module.TranslationDataModule).parameters
    )
    dm = dm_module.TranslationDataModule(source="local", root=str(corpus_dir), **dm_kwargs)
    assert dm.corpora[0].source.root == corpus_dir and dm.hparams["root"] == str(corpus_dir)
    with pytest.raises(ValueError, match=r"unknown data option\(s\) \['hf_nmae'\].*'hf_name'"):
        dm_module.TranslationDataModule(source="hf", hf_nmae="wmt/wmt14", **dm_kwargs)


def test_an_earlier_checkpoints_validation_budget_is_read_under_its_name_now(corpus_dir, dm_kwargs):
    """Checkpoints of earlier versions store validation.max_tokens as eval_max_tokens: their data
    settings still build the data module, with that budget."""
    stored = {"source": "local", "root": str(corpus_dir), "eval_max_tokens": 512, **dm_kwargs}
    settings = dm_module.stored_settings({"datamodule_hyper_parameters": stored})
    assert dm_module.TranslationDataModule(**settings).validation_max_tokens == 512
    texts = dm_module.checkpoint_texts(
        {"datamodule_hyper_parameters": stored}, {}, DataError("no corpus"), "invalid"
    )
    assert texts.references("val") == dm_module.TranslationDataModule(**settings).references("val")


def test_multi30k_offline_without_files_names_the_option(tmp_path, dm_kwargs, monkeypatch):
    monkeypatch.setattr("transformer.data.sources.MULTI30K_URL", "http://127.0.0.1:9")
    dm = dm_module.TranslationDataModule(root=str(tmp_path / "none"), **dm_kwargs)
    with pytest.raises(DataError, match=r"data.root=DIR"):
        dm.prepare_data()


@pytest.mark.slow
def test_real_multi30k(tmp_path):
    root = os.environ.get("MULTI30K_DIR")
    if not root or not Path(root, "train.en.gz").exists():
        pytest.skip("MULTI30K_DIR is not set to a directory with the Multi30k files")
    dm = prepared_datamodule(
        root=root, num_workers=0, cache_dir=str(tmp_path / "cache"), download=False
    )
    assert dm.src_tokenizer.vocab_size == 8000
    assert len(dm.split("train")) == 29_000
    assert len(dm.references("val")) == len(dm.split("val")) == 1014
    assert len(dm.sources("test")) == len(dm.split("test")) == 1000
    batches = list(dm.train_dataloader())
    assert all(b.src.numel() <= 4096 and b.tgt_in.numel() <= 4096 for b in batches)
    assert sum(len(b) for b in batches) == 29_000
