"""Every experiment that reads a Hugging Face hub dataset reads what it names: composed as train.py
composes it, its data source is built and each split it names is read, against a stand-in of the
hub (no network) that serves the dataset as ``datasets`` (4 and later) loads it from the hub."""

from __future__ import annotations

import datasets
import pytest
from datasets import Dataset, DatasetDict, Features, Translation

from tests.tiny import CONFIGS, compose_cfg
from transformer.data.hf_source import HFSource
from transformer.errors import DataError
from transformer.training.run import build_datamodule

# The stand-in hub: datasets.load_dataset(path, config, revision=, data_dir=) -> (splits,
# languages) of what it loads. IWSLT/iwslt2017's repository is a loading script (iwslt2017.py),
# which datasets refuses; the hub's Parquet export of it (branch refs/convert/parquet) holds a
# folder per config of the script, each with its splits. wmt/wmt14 is Parquet with configs.
PARQUET_EXPORT = "refs/convert/parquet"
HUB = {
    ("IWSLT/iwslt2017", None, PARQUET_EXPORT, "iwslt2017-de-en"): (
        ("train", "validation", "test"),
        ("de", "en"),
    ),
    ("wmt/wmt14", "de-en", None, None): (("train", "validation", "test"), ("de", "en")),
}
SCRIPTS = {"IWSLT/iwslt2017": "iwslt2017.py"}  # repositories whose main branch is a script
PAIRS = 3  # a split's pairs in the stand-in


def text(split: str, i: int, lang: str) -> str:
    return f"{split} {i} {lang}"


def load_dataset(path, name=None, *, revision=None, data_dir=None) -> DatasetDict:
    """What datasets.load_dataset gives for these arguments from the stand-in hub."""
    if path in SCRIPTS and revision is None:
        raise RuntimeError(f"Dataset scripts are no longer supported, but found {SCRIPTS[path]}")
    found = HUB.get((path, name, revision, data_dir))
    if found is None:
        raise FileNotFoundError(
            f"the hub has no {path} config={name} revision={revision} data_dir={data_dir}"
        )
    splits, langs = found
    features = Features({"translation": Translation(languages=list(langs))})
    rows = {
        split: {
            "translation": [{lang: text(split, i, lang) for lang in langs} for i in range(PAIRS)]
        }
        for split in splits
    }
    return DatasetDict({s: Dataset.from_dict(r, features=features) for s, r in rows.items()})


def hub_experiments() -> list[str]:
    """The experiments (transformer/configs/experiment/*.yaml) whose data is a hub dataset."""
    names = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
    return [e for e in names if compose_cfg([f"experiment={e}"]).data.source == "hf"]


@pytest.fixture
def hub(monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", load_dataset)


@pytest.mark.parametrize("experiment", hub_experiments())
def test_a_hub_experiment_reads_the_splits_and_languages_it_names(experiment, hub):
    cfg = compose_cfg([f"experiment={experiment}", "trainer.accelerator=cpu"])
    (corpus,) = build_datamodule(cfg).corpora  # its options checked; nothing read yet
    source = corpus.source
    assert (source.src_lang, source.tgt_lang) == (cfg.data.src_lang, cfg.data.tgt_lang)
    for stage, split in corpus.splits.items():
        pairs = source.read(split)  # the split, its translation column and both languages
        assert pairs.src == [text(split, i, cfg.data.src_lang) for i in range(PAIRS)], stage
        assert pairs.tgt == [text(split, i, cfg.data.tgt_lang) for i in range(PAIRS)], stage


def test_a_hub_dataset_that_is_a_loading_script_names_its_parquet_export(hub):
    """datasets no longer runs loading scripts: the error names the options that read the
    hub's Parquet export of it instead."""
    with pytest.raises(DataError) as err:
        HFSource("de", "en", name="IWSLT/iwslt2017", config="iwslt2017-de-en").read("train")
    assert str(err.value) == (
        "data.hf_name=IWSLT/iwslt2017 data.hf_config=iwslt2017-de-en: the dataset is a loading "
        "script, which datasets no longer runs; read the hub's Parquet export of it: "
        "data.hf_revision=refs/convert/parquet data.hf_data_dir=<its config> (and "
        "data.hf_config=null)"
    )
