"""Training through ``train(cfg)`` and ``train.py`` on a tiny synthetic corpus (CPU, tiny model)."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, fields
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Timer
from omegaconf import OmegaConf

import transformer.data.prepare
import transformer.translate
from tests.tiny import (
    ATTENTION_MAPS_OFF,
    CONFIGS,
    REPO,
    compose_cfg,
    read_metrics,
    script_env,
    tiny_overrides,
)
from transformer import Transformer, TransformerConfig
from transformer.checkpoints import load_checkpoint, model_from_checkpoint
from transformer.config import ATTENTION_TYPES
from transformer.data.tokenizer_training import SPM_TRAIN_SENTENCES
from transformer.decoding import DecodeOptions
from transformer.errors import ConfigError
from transformer.training import TranslationModule
from transformer.training.config_checks import model_config, validate_config
from transformer.training.epoch_checkpoint import EpochCheckpoint
from transformer.training.run import build_datamodule, train, validation_tokens

pytestmark = pytest.mark.heavy

EXPERIMENTS = sorted(p.stem for p in (CONFIGS / "experiment").glob("*.yaml"))
DEBUGS = sorted(p.stem for p in (CONFIGS / "debug").glob("*.yaml"))
MODELS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))


def train_losses(rows) -> dict[int, float]:
    return {int(r["step"]): float(r["train/loss"]) for r in rows if r.get("train/loss")}


def val_losses(rows) -> list[float]:
    return [float(r["val/loss"]) for r in rows if r.get("val/loss")]


# -- composition and validation --------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [[f"experiment={e}"] for e in EXPERIMENTS]
    + [[f"debug={d}"] for d in DEBUGS]
    + [[f"model={m}"] for m in MODELS]
    + [["logger=csv"], ["logger=wandb"], ["trainer=ddp"], ["trainer=fsdp"], ["trainer=cpu"]],
    ids=lambda o: o[0],
)
def test_overlays_compose_and_instantiate(overrides, tmp_path):
    cfg = compose_cfg([*overrides, "trainer.accelerator=cpu", "trainer.devices=1"], tmp_path)
    model_cfg = validate_config(cfg)
    dm = instantiate(cfg.data)  # constructs only: no download, no tokenizer training
    assert dm.src_vocab_size == model_cfg.src_vocab_size == cfg.data.vocab_size
    for name, c in (cfg.get("logger") or {}).items():
        if name != "tensorboard":  # needs the optional tensorboard package
            instantiate(c)
    for c in cfg.callbacks.values():
        instantiate(c)
    instantiate(cfg.trainer, precision="32-true", strategy="auto")


def test_default_is_multi30k_en_de_with_wandb(tmp_path):
    cfg = compose_cfg([], tmp_path)
    assert cfg.experiment_name == "multi30k_en_de"
    assert (cfg.data.source, cfg.data.src_lang, cfg.data.tgt_lang) == ("multi30k", "en", "de")
    assert (cfg.model.d_model, cfg.model.num_heads, cfg.model.d_ff) == (128, 4, 256)
    assert "wandb" in cfg.logger and cfg.callbacks.epoch_checkpoints.save_top_k == 10
    # the GPU recipe: 12,000 updates, warmup-stable-decay to 0 at the last (README, "The GPU
    # recipe's levers"), mini's dropout
    assert (cfg.trainer.max_steps, cfg.trainer.max_epochs) == (12000, -1)
    sched = cfg.optim.scheduler
    assert (sched.shape, sched.warmup_steps, sched.min_lr_ratio) == ("wsd", 2000, 0)
    assert cfg.model.dropout == 0.3
    base = compose_cfg(["model=base"], tmp_path).model
    assert (base.d_model, base.num_heads, base.num_encoder_layers, base.d_ff) == (512, 8, 6, 2048)


@pytest.mark.slow
def test_cpu_recipe_is_the_default_experiment_under_a_time_limit(tmp_path):
    gpu, cpu = compose_cfg([], tmp_path), compose_cfg(["experiment=multi30k_en_de_cpu"], tmp_path)
    assert cpu.trainer.max_time == "00:00:54:00" and cpu.experiment_name == "multi30k_en_de_cpu"
    assert cpu.trainer.max_epochs == cpu.trainer.max_steps == -1  # the time alone ends it
    assert cpu.trainer.precision == "auto"  # bf16-mixed where this CPU multiplies bf16 faster
    assert cpu.optim.scheduler.shape == "wsd" and cpu.optim.scheduler.min_lr_ratio == 0
    # the two model changes: less dropout for the hour, RoPE (docs/experiments/positions.md)
    assert cpu.model == OmegaConf.merge(gpu.model, {"dropout": 0.2, "positions": "rope"})
    assert cpu.data == gpu.data and cpu.callbacks == gpu.callbacks
    other = compose_cfg(["experiment=multi30k_en_de_cpu", "data.src_lang=de", "data.tgt_lang=en"])
    assert other.experiment_name == "multi30k_de_en_cpu"
    assert list(other.tags) == ["multi30k", "de-en"]


# What transformer/configs/data/*.yaml compose to (the files inherit shared keys:
# data/_shared.yaml): every source's keys.
DATA_KEYS = {
    "_target_": "transformer.data.datamodule.TranslationDataModule", "src_lang": "en",
    "tgt_lang": "de", "train_split": "train", "vocab_size": 8000, "spm_model_type": "unigram",
    "joint_vocab": True, "spm_train_sentences": 500_000, "max_tokens": 4096, "batch_size": 64,
    "max_len": 128, "pad_to_multiple": 1, "num_buckets": 0, "num_workers": 2, "seed": 1234,
    "cache_dir": "data/cache", "prepare_per_node": True, "corpora": None, "target_token": False,
    "spm_sampling": {"alpha": None, "nbest": None},
}  # fmt: skip
DATA_SOURCES = {
    "multi30k": {"source": "multi30k", "root": "data/multi30k", "download": True,
                 "val_split": "val", "test_split": "test_2016_flickr"},
    "hf": {"source": "hf", "root": None, "hf_name": None, "hf_config": None, "hf_path": None,
           "hf_revision": None, "hf_data_dir": None, "val_split": "validation",
           "test_split": "test"},
    "local": {"source": "local", "root": "???", "val_split": "val", "test_split": "test"},
}  # fmt: skip


@pytest.mark.parametrize("option", MODELS)
def test_every_model_option_builds_a_transformer_of_its_config(option):
    """Each transformer/configs/model/*.yaml, composed as train.py composes it, spells out every
    ``TransformerConfig`` field (a model is edited in its file alone), validates, takes its
    vocabularies from the data, and builds a Transformer of that shape."""
    cfg = compose_cfg([f"model={option}", "~experiment"])
    config = model_config(cfg)  # what validate_config checks of the model group
    assert set(cfg.model) == {f.name for f in fields(TransformerConfig)}
    options = OmegaConf.to_container(cfg.model, resolve=True)
    assert all(
        getattr(config, k) == v for k, v in options.items() if v is not None
    )  # None: a default
    assert config.src_vocab_size == config.tgt_vocab_size == cfg.data.vocab_size
    assert config.share_all_embeddings == cfg.data.joint_vocab
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        model = Transformer(config)
    assert len(model.encoder.layers) == config.num_encoder_layers
    assert len(model.decoder.layers) == config.num_decoder_layers
    for kind in ATTENTION_TYPES:
        for attention in model.attention_modules(kind):
            assert (attention.d_model, attention.num_heads) == (config.d_model, config.num_heads)


@pytest.mark.parametrize("option", DATA_SOURCES)
def test_data_options_compose_to_their_source_and_the_shared_keys(option):
    data = compose_cfg([f"data={option}", "~experiment"]).data
    assert OmegaConf.to_container(data) == {**DATA_KEYS, **DATA_SOURCES[option]}
    assert data.spm_train_sentences == SPM_TRAIN_SENTENCES  # the code's default is the config's


def test_decode_configs_spell_out_the_decode_options_defaults():
    """transformer/configs/decode/ lists every DecodeOptions field (for ``decode.x=`` and
    ``validation.decoding.x=`` overrides) with the dataclass's defaults."""
    validation = compose_cfg([]).validation.decoding
    assert dict(validation) == asdict(DecodeOptions(strategy="greedy"))
    with initialize_config_dir(str(CONFIGS), version_base="1.3"):
        decode = dict(compose("evaluate").decode)
    del decode["max_tokens"]  # batching (evaluate.yaml's), not a DecodeOptions field
    assert decode == asdict(DecodeOptions())


def test_misspelt_option_is_named():
    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(["model.num_head=4"])
    assert "model.num_head" in str(err.value)
    cfg = compose_cfg(["+model.num_head=4"])
    with pytest.raises(ConfigError, match=r"model\.num_head; did you mean model\.num_heads"):
        model_config(cfg)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.num_heads=3", "num_heads=3 does not divide d_model=128"),  # model=mini
        ("model.dropout=1.5", "dropout must be in"),
        ("optim.optimizer.lr=-1", "optim.optimizer.lr must be positive"),
        ("trainer.precision=fp8", "trainer.precision"),
        ("data.max_tokens=10", "data.max_tokens"),
        ("data.tgt_lang=en", "data.src_lang and data.tgt_lang"),
        ("ckpt_path=/nonexistent.ckpt", "ckpt_path=/nonexistent.ckpt"),
        ("validation.bleu_sentences=0", "callbacks.best_checkpoint.monitor=val/bleu needs it"),
        ("compile=maybe", r"^compile=maybe: expected true or false or one of layers, e\.g\. "),
        ("loss.rdrop_alpha=-1", r"loss\.rdrop_alpha must be >= 0 \(0 = off\)"),
        ("ema.decay=1.5", r"ema\.decay must be in \(0, 1\), e\.g\. 0\.999, or null"),
        (
            "validation.decoding.strategy=sample",
            r"validation\.decoding\.strategy='sample'; choose one of 'greedy' or 'beam'",
        ),
        ("validation.decoding.beam_size=0", r"validation\.decoding\.beam_size must be >= 1"),
        ("+validation.decoding.beam=4", r"unknown option validation\.decoding\.beam;"),
        # the GPU recipe without its budget: its schedule needs the end of training
        ("trainer.max_steps=-1", "neither trainer.max_steps nor trainer.max_time is set"),
        (
            "+trainer.max_time=54min",
            "trainer.max_time='54min' is not a duration; write DD:HH:MM:SS",
        ),
        ("+trainer.max_time=00:00:00:00", "trainer.max_time='00:00:00:00': training would end"),
        ("validation.max_tokens=64", r"validation\.max_tokens=64 needs .* max_len=128 pieces"),
        ("validation.max_tokens=big", "validation.max_tokens must be a whole number or null"),
        ("data.spm_sampling.alpha=2", r"data\.spm_sampling\.alpha=2 is out of range: .*alpha=null"),
        (
            "metrics.tokenize=13b",
            r"metrics\.tokenize=13b is not one of sacreBLEU's BLEU tokenizers",
        ),
    ],
)
def test_invalid_value_fails_before_data_work(override, message, tmp_path):
    # data.root does not exist and downloads are off: any data work would fail differently.
    missing = tmp_path / "no-data"
    cfg = compose_cfg([override, f"data.root={missing}", "data.download=false"], tmp_path)
    with pytest.raises(ValueError, match=message):
        train(cfg)
    assert not missing.exists() and not (tmp_path / "checkpoints").exists()


@pytest.mark.parametrize("max_epochs", ["-1", "null"])
@pytest.mark.parametrize("max_time", ["00:00:54:00", "{hours: 1}"])
def test_max_time_alone_ends_training(max_epochs, max_time):
    """With no epoch or step limit, ``trainer.max_time`` is accepted as the limit; without it the
    same config is refused (the run would not end; under the inverse square root, which needs
    no end of training). A real run: the CPU recipe test below."""
    no_limit = [f"trainer.max_epochs={max_epochs}", "trainer.max_steps=-1", "optim=adamw"]
    validate_config(compose_cfg([*no_limit, f"+trainer.max_time={max_time}"]))
    with pytest.raises(ConfigError, match="training would not end"):
        validate_config(compose_cfg(no_limit))


@pytest.mark.slow
def test_validation_batches_take_their_own_token_budget(corpus, monkeypatch):
    """validation.max_tokens sizes the validation batches (their loss and the sentences decoded at
    once); null: the training budget on CPU, at least 32768 tokens on a GPU."""

    def val_batches(*overrides: str) -> list:
        cfg = compose_cfg([*tiny_overrides(corpus), "data.max_len=30", "data.max_tokens=64",
                           *overrides])  # fmt: skip
        dm = build_datamodule(cfg)
        dm.setup("fit")
        assert all(b.src.numel() <= 64 for b in dm.train_dataloader())
        return list(dm.val_dataloader())

    small, large = val_batches(), val_batches("validation.max_tokens=2048")
    assert len(small) > 4 and all(max(b.src.numel(), b.labels.numel()) <= 64 for b in small)
    assert len(large) == 1 and len(large[0]) == sum(len(b) for b in small) == 32
    cfg = compose_cfg([])  # trainer.accelerator=auto
    assert validation_tokens(cfg) is None  # the data module's max_tokens
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert validation_tokens(cfg) == 32768
    assert validation_tokens(compose_cfg(["data.max_tokens=50000"])) == 50000


# -- training ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_fast_dev_run(corpus, tmp_path):
    cfg = compose_cfg([*tiny_overrides(corpus), "debug=fast_dev_run"], tmp_path)
    metrics = train(cfg)
    assert math.isfinite(metrics["train/loss"]) and "val/loss" in metrics and "val/bleu" in metrics


@pytest.mark.slow
def test_short_training_lowers_validation_loss(corpus, tmp_path, caplog):
    overrides = [
        *tiny_overrides(corpus),
        "trainer.max_steps=48",
        "trainer.val_check_interval=8",
        "trainer.check_val_every_n_epoch=null",
        "trainer.num_sanity_val_steps=2",  # a partial pass first: later passes must be whole
        "validation.bleu_sentences=null",
    ]
    with caplog.at_level(logging.INFO, logger="transformer.training.lit_module"):
        metrics = train(compose_cfg(overrides, tmp_path))
    decoded = [int(n) for n in re.findall(r"val BLEU \S+ on (\d+) sentences", caplog.text)]
    assert decoded == [32] * 6  # every validation decodes the whole validation set
    losses = val_losses(read_metrics(tmp_path))
    assert len(losses) == 6
    assert losses[-1] < losses[0] - 0.5, losses
    assert {"train/ppl", "lr", "train/tokens_per_sec", "val/ppl", "val/bleu"} <= set(metrics)
    ckpts = {p.name for p in (tmp_path / "checkpoints").iterdir()}
    assert "last.ckpt" in ckpts and any(n.startswith("best-") for n in ckpts)


@pytest.fixture(scope="module")
def beam_run(corpus, tmp_path_factory) -> Path:
    """A short training run whose validation decodes with beam search, two beams."""
    out = tmp_path_factory.mktemp("beam_run")
    overrides = [
        *tiny_overrides(corpus),
        "trainer.max_steps=80",
        "trainer.val_check_interval=40",
        "optim.optimizer.lr=5e-3",  # val/bleu above 0 by step 80
        "trainer.check_val_every_n_epoch=null",
        "validation.bleu_sentences=null",
        "validation.decoding.strategy=beam",
        "validation.decoding.beam_size=2",
    ]
    train(compose_cfg(overrides, out))
    return out


@pytest.mark.slow
def test_training_with_beam_validation_logs_bleu(beam_run):
    rows = read_metrics(beam_run)
    bleu = [float(r["val/bleu"]) for r in rows if r.get("val/bleu")]
    chrf = [float(r["val/chrf"]) for r in rows if r.get("val/chrf")]
    assert len(bleu) == len(chrf) == 2 and all(math.isfinite(b) and b >= 0 for b in bleu)
    assert chrf[-1] > 0
    hparams = load_checkpoint(beam_run / "checkpoints" / "last.ckpt")["hyper_parameters"]
    assert hparams["decoding"]["strategy"] == "beam" and hparams["decoding"]["beam_size"] == 2


@pytest.mark.slow
def test_beam_validation_with_one_beam_gives_greedy_hypotheses(corpus, beam_run, monkeypatch):
    """The trained weights validated twice: strategy=beam beam_size=1 runs beam search (not the
    greedy loop) and decodes every validation sentence as strategy=greedy does."""
    beams = []
    search = transformer.translate.beam_search
    monkeypatch.setattr(
        transformer.translate,
        "beam_search",
        lambda model, src, options, **kw: (
            beams.append(options.beam_size) or search(model, src, options, **kw)
        ),
    )
    cfg = compose_cfg([*tiny_overrides(corpus), "validation.bleu_sentences=null"])
    dm = instantiate(cfg.data)
    state = load_checkpoint(beam_run / "checkpoints" / "last.ckpt")["state_dict"]
    hyps, bleu = {}, {}
    for strategy in ("greedy", "beam"):
        decoding = {"strategy": strategy, "beam_size": 1, "max_len_a": 1.2, "max_len_b": 10}
        module = TranslationModule(model_config(cfg, dm.pad_id).to_dict(), decoding=decoding)
        module.load_state_dict(state)
        trainer = L.Trainer(
            accelerator="cpu", logger=False, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False,
        )  # fmt: skip
        bleu[strategy] = trainer.validate(module, datamodule=dm, verbose=False)[0]["val/bleu"]
        hyps[strategy] = module._val_hyps[0]  # the one validation loader's
        assert len(beams) == (strategy == "beam") * len(dm.val_dataloader())  # every val batch
    assert beams and set(beams) == {1}
    assert len(hyps["greedy"]) == 32 and any(hyps["greedy"].values())
    assert hyps["beam"] == hyps["greedy"]
    assert bleu["beam"] == bleu["greedy"]


@pytest.mark.slow
def test_epoch_checkpoints_keep_the_last_epochs(corpus, tmp_path, caplog, recwarn):
    """The Multi30k experiments' epoch checkpoints: the weights of the most recent N epochs.
    (4 epochs end the recipe's 12,000 updates early, before its decay: a warning says so.) A new
    run directory gets no warning of a non-empty checkpoint directory."""
    overrides = [
        *tiny_overrides(corpus),  # command-line choices win over the experiment's
        "experiment=multi30k_en_de",
        "optim=adamw_wsd",  # the recipe's (tiny_overrides picks the inverse square root)
        "trainer.max_epochs=4",
        "callbacks.epoch_checkpoints.save_top_k=2",
    ]
    with caplog.at_level(logging.WARNING, logger="transformer.training.lit_module"):
        train(compose_cfg(overrides, tmp_path))
    assert "trainer.max_epochs=4 ends training after about 64 updates, before" in caplog.text
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "epochs").iterdir())
    steps_per_epoch = int(re.search(r"step(\d+)", kept[0]).group(1)) // 3
    assert kept == [f"epoch00{e}-step{(e + 1) * steps_per_epoch}.ckpt" for e in (2, 3)]


STEPS_PER_EPOCH = 16  # the tiny corpus: 400 pairs in 16 batches of up to 512 tokens
STOP_AT_STEP_40 = ["+callbacks.stop._target_=tests.fault_kit.StopAtStep", "+callbacks.stop.step=40"]


@pytest.mark.parametrize(
    "accumulate, stop",
    [
        (1, ["trainer.max_steps=40"]),  # 2.5 epochs
        (3, ["trainer.max_steps=15"]),  # 6 steps an epoch (the 16th batch steps too): 2.5 epochs
        (1, ["trainer.max_epochs=10", *STOP_AT_STEP_40]),  # should_stop, as max_time sets it
    ],
    ids=["max_steps", "max_steps-accumulate3", "should_stop-as-max_time"],
)
@pytest.mark.slow
def test_epoch_checkpoints_skip_an_epoch_cut_short(corpus, tmp_path, accumulate, stop):
    """Training stopped inside an epoch (max_steps, or max_time's should_stop) keeps complete
    epochs only, though Lightning ends the partial epoch with on_train_epoch_end too."""
    overrides = [
        *tiny_overrides(corpus),
        "experiment=multi30k_en_de",
        "trainer.max_epochs=-1",
        f"trainer.accumulate_grad_batches={accumulate}",
        *stop,
    ]
    train(compose_cfg(overrides, tmp_path))
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "epochs").iterdir())
    steps = -(-STEPS_PER_EPOCH // accumulate)
    assert kept == [f"epoch00{e}-step{(e + 1) * steps}.ckpt" for e in (0, 1)]
    last = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert last["global_step"] == (15 if accumulate == 3 else 40)  # the partial epoch is here


@pytest.mark.slow
def test_epoch_checkpoints_count_an_epoch_resumed_midway(corpus, tmp_path):
    """Stopped in epoch 2, resumed into the same run directory: epoch 2 ends complete and is kept
    (so is epoch 3, where max_steps=64 falls on its last batch), and so are the first run's."""
    common = [*tiny_overrides(corpus), "experiment=multi30k_en_de", "trainer.max_epochs=-1"]
    train(compose_cfg([*common, "trainer.max_steps=40"], tmp_path))
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    train(compose_cfg([*common, "trainer.max_steps=64", f"ckpt_path={ckpt}"], tmp_path))
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "epochs").iterdir())
    assert kept == [f"epoch00{e}-step{(e + 1) * STEPS_PER_EPOCH}.ckpt" for e in range(4)]


@pytest.mark.slow
def test_epoch_checkpoints_keep_the_last_share_of_the_budget(corpus, tmp_path):
    """budget_share=0.5 of 80 updates (5 epochs of 16): the epochs that end from update 40 on,
    all of them (save_top_k=-1), none before."""
    overrides = [
        *tiny_overrides(corpus),
        "experiment=multi30k_en_de",
        "trainer.max_epochs=-1",
        f"trainer.max_steps={5 * STEPS_PER_EPOCH}",
        "callbacks.epoch_checkpoints.save_top_k=-1",
        "callbacks.epoch_checkpoints.budget_share=0.5",
    ]
    train(compose_cfg(overrides, tmp_path))
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "epochs").iterdir())
    assert kept == [f"epoch00{e}-step{(e + 1) * STEPS_PER_EPOCH}.ckpt" for e in (2, 3, 4)]


@pytest.mark.slow
def test_epoch_checkpoints_keep_the_last_share_of_the_time(corpus, tmp_path):
    """The CPU recipe's budget, trainer.max_time: budget_share=0.5 of 10 seconds keeps the epochs
    that end in the last 5, the most recent complete ones, and not the first. (An epoch takes
    about a second alone; 6 seconds were too few for the first epoch to end in the first half on
    a loaded machine.)"""
    overrides = [
        *tiny_overrides(corpus),
        "experiment=multi30k_en_de_cpu",
        "trainer.max_time=00:00:00:10",
        "callbacks.epoch_checkpoints.save_top_k=-1",
        "callbacks.epoch_checkpoints.budget_share=0.5",
    ]
    train(compose_cfg(overrides, tmp_path))
    complete = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] // 16
    kept = sorted(p.name for p in (tmp_path / "checkpoints" / "epochs").iterdir())
    first = complete - len(kept)
    assert 0 < first < complete  # some epochs kept, the first ones not
    assert kept == [
        f"epoch{e:03d}-step{(e + 1) * STEPS_PER_EPOCH}.ckpt" for e in range(first, complete)
    ]


@pytest.mark.parametrize(
    "given, says",
    [
        (["trainer.max_steps=-1", "trainer.max_epochs=2", "budget_share=0.2"], "has none: set"),
        (["budget_share=1.5"], "in (0, 1]"),
        (["budget_share=true"], "expected a number or null"),
    ],
    ids=["no-budget", "above-1", "bool"],
)
def test_epoch_checkpoints_budget_share_is_checked_before_any_work(corpus, tmp_path, given, says):
    overrides = [
        *tiny_overrides(corpus),
        "experiment=multi30k_en_de",
        *(o if o.startswith("trainer") else f"callbacks.epoch_checkpoints.{o}" for o in given),
    ]
    with pytest.raises(ConfigError, match=re.escape(says)) as err:
        validate_config(compose_cfg(overrides, tmp_path))
    assert "callbacks.epoch_checkpoints.budget_share=" in str(err.value)


def test_epoch_checkpoint_saves_at_train_epoch_ends_only(tmp_path):
    with pytest.raises(ValueError, match="save_on_train_epoch_end must be true"):
        EpochCheckpoint(dirpath=tmp_path, save_on_train_epoch_end=False)


@pytest.mark.slow
def test_a_run_shorter_than_an_epoch_keeps_no_epoch_checkpoint(corpus, tmp_path):
    overrides = [*tiny_overrides(corpus), "experiment=multi30k_en_de", "trainer.max_steps=5"]
    train(compose_cfg(overrides, tmp_path))
    assert not list((tmp_path / "checkpoints" / "epochs").glob("*.ckpt"))
    assert load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")["global_step"] == 5


@pytest.mark.slow
def test_cpu_recipe_trains_until_its_time_is_up(corpus, tmp_path, monkeypatch):
    """max_time alone ends training (max_epochs null or -1): no epoch cap, Lightning's Timer."""
    trainers = []
    fit = L.Trainer.fit
    monkeypatch.setattr(
        L.Trainer, "fit", lambda self, *a, **k: trainers.append(self) or fit(self, *a, **k)
    )
    overrides = [
        *tiny_overrides(corpus),
        "experiment=multi30k_en_de_cpu",
        "trainer.max_time=00:00:00:02",
        "trainer.max_epochs=null",
    ]
    train(compose_cfg(overrides, tmp_path))
    (trainer,) = trainers
    assert trainer.fit_loop.max_epochs == -1 and trainer.max_steps == -1
    (timer,) = [c for c in trainer.callbacks if isinstance(c, Timer)]
    assert timer.time_elapsed("train") >= 2 and trainer.global_step > 0


@pytest.mark.slow
def test_compiled_training_writes_checkpoints_an_uncompiled_model_loads(corpus, tmp_path, caplog):
    """Compiled on two shape buckets (aot_eager traces what inductor compiles, in seconds;
    inductor: tests/training/test_lit_module.py): at most a graph a bucket, no graph break; the log
    names the buckets and the attention kernels."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    overrides = [
        *tiny_overrides(corpus),
        "compile=true",
        "compile_backend=aot_eager",
        "data.pad_to_multiple=8",
        "data.num_buckets=2",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "trainer.check_val_every_n_epoch=null",
    ]
    with caplog.at_level(logging.INFO):
        metrics = train(compose_cfg(overrides, tmp_path))
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    assert not torch._dynamo.utils.counters["graph_break"]
    assert re.search(
        r"training batches padded to 2 shapes \(rows x length\): \d+x\d+, ", caplog.text
    )
    assert (
        "attention kernels (sdpa_backends): encoder_self: flash (of flash > efficient > math)"
        in (caplog.text)
    )
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.ckpt")
    assert ckpt["global_step"] == 3 and ckpt["hyper_parameters"]["compile_model"]
    model_from_checkpoint(ckpt)  # strict: the weights kept their names


@pytest.mark.slow
@pytest.mark.parametrize("accumulate, total, first", [(1, 20, 10), (2, 10, 5), (1, 20, 8)])
def test_resume_continues_exactly(corpus, tmp_path, accumulate, total, first):
    """``total`` optimizer steps in one run == ``first`` steps, checkpoint, resume to ``total``:
    20 batches either way, crossing the epoch boundary at 16 batches, with validation in between
    and dropout on; at 8 steps a validation runs just before the checkpoint is written."""
    common = [
        *tiny_overrides(corpus),
        "trainer.val_check_interval=4",
        "trainer.check_val_every_n_epoch=null",
        f"trainer.accumulate_grad_batches={accumulate}",
        "model.dropout=0.1",
    ]
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    train(compose_cfg([*common, f"trainer.max_steps={total}"], full))
    train(compose_cfg([*common, f"trainer.max_steps={first}"], part))
    ckpt = part / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    train(compose_cfg([*common, f"trainer.max_steps={total}", f"ckpt_path={ckpt}"], resumed))
    full_rows, part_rows = read_metrics(full), read_metrics(part)
    resumed_rows = read_metrics(resumed)
    want = [float(r["train/loss"]) for r in full_rows if r.get("train/loss")]
    got = [float(r["train/loss"]) for r in part_rows + resumed_rows if r.get("train/loss")]
    assert len(want) == total  # logged once per optimizer step
    assert got == pytest.approx(want, abs=1e-6)
    assert val_losses(resumed_rows) == pytest.approx(val_losses(full_rows)[-3:], abs=1e-6)


@pytest.mark.slow
def test_resume_after_a_max_time_stop_inside_an_epoch_continues_exactly(
    corpus, tmp_path, monkeypatch, recwarn
):
    """``trainer.max_time`` ends training inside an epoch (here its clock says time is up after
    step 10 of a 16-batch epoch); resumed to 20 steps, the run trains on the rest of that epoch
    (same batches, same dropout) as an uninterrupted one, and saves the same epoch checkpoints.
    Lightning's warning that such a resume is unreliable is not shown: it is exact."""
    common = [
        *tiny_overrides(corpus),
        "trainer.val_check_interval=4",
        "trainer.check_val_every_n_epoch=null",
        "model.dropout=0.1",
        "experiment=multi30k_en_de",  # its epoch checkpoints
        "trainer.max_epochs=-1",
        "+trainer.max_time=00:01:00:00",
    ]
    full, part, resumed = tmp_path / "full", tmp_path / "part", tmp_path / "resumed"
    train(compose_cfg([*common, "trainer.max_steps=20"], full))

    def time_is_up_after_step_10(self, trainer):
        trainer.should_stop = trainer.should_stop or trainer.global_step >= 10

    with monkeypatch.context() as patch:
        patch.setattr(Timer, "_check_time_remaining", time_is_up_after_step_10)
        train(compose_cfg(common, part))
    ckpt = part / "checkpoints" / "last.ckpt"
    assert load_checkpoint(ckpt)["global_step"] == 10
    train(compose_cfg([*common, "trainer.max_steps=20", f"ckpt_path={ckpt}"], resumed))

    full_rows, part_rows = read_metrics(full), read_metrics(part)
    resumed_rows = read_metrics(resumed)
    want = [float(r["train/loss"]) for r in full_rows if r.get("train/loss")]
    got = [float(r["train/loss"]) for r in part_rows + resumed_rows if r.get("train/loss")]
    assert len(want) == 20
    assert got == pytest.approx(want, abs=1e-6)

    def names(run: Path) -> list[str]:
        return sorted(p.name for p in (run / "checkpoints" / "epochs").glob("*.ckpt"))

    assert names(full) == [f"epoch000-step{STEPS_PER_EPOCH}.ckpt"]
    assert names(part) == [] and names(resumed) == names(full)
    assert not [w for w in recwarn if "ended before the epoch ended" in str(w.message)]


@pytest.mark.slow
def test_resume_elsewhere_uses_the_checkpoints_tokenizers(corpus, tmp_path, monkeypatch):
    """Resumed on another machine (a copy of the corpus with new mtimes, another cache, and here
    a training file that would give another SentencePiece model), training continues with the
    tokenizers stored in the checkpoint: nothing is retrained, and the run's new checkpoint
    holds the same models."""
    common = [*tiny_overrides(corpus), "validation.bleu_sentences=0", "~callbacks.best_checkpoint"]
    part = tmp_path / "part"
    train(compose_cfg([*common, "trainer.max_steps=2"], part))
    ckpt = part / "checkpoints" / "last.ckpt"

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(corpus, elsewhere, ignore=shutil.ignore_patterns("cache"))
    with open(elsewhere / "train.en", "a", encoding="utf-8") as f:
        f.write("zebra quartz vortex\n" * 50)  # new words: a retrained model would differ
    with open(elsewhere / "train.de", "a", encoding="utf-8") as f:
        f.write("zebra quarz wirbel\n" * 50)

    def no_training(*args, **kwargs):
        raise AssertionError("SentencePiece was trained again on resume")

    monkeypatch.setattr(transformer.data.prepare, "train_tokenizer", no_training)
    moved = [f"data.root={elsewhere}", f"data.cache_dir={elsewhere / 'cache'}"]
    resumed = tmp_path / "resumed"
    metrics = train(compose_cfg([*common, *moved, "trainer.max_steps=4", f"ckpt_path={ckpt}"],
                                resumed))  # fmt: skip
    assert math.isfinite(metrics["train/loss"])
    before, after = load_checkpoint(ckpt), load_checkpoint(resumed / "checkpoints" / "last.ckpt")
    assert after["global_step"] == 4
    assert after["tokenizers"]["src"]["model"] == before["tokenizers"]["src"]["model"]


@pytest.mark.slow
def test_sweep_runs_each_job_as_its_own_offline_wandb_run(corpus, tmp_path):
    env = script_env(tmp_path)
    env.pop("WANDB_MODE", None)  # no key and no mode: the logger must go offline by itself
    cmd = [
        sys.executable, "train.py", "-m", "model.num_heads=1,2",
        *[o for o in tiny_overrides(corpus) if not o.startswith("logger=")],
        "trainer.max_steps=3", "validation.bleu_sentences=0", "~callbacks.best_checkpoint",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    for job in ("0", "1"):
        assert (tmp_path / "sweep" / job / "checkpoints" / "last.ckpt").is_file()
        runs = list((tmp_path / "sweep" / job / "wandb").glob("offline-run-*"))
        assert len(runs) == 1, runs
    out = res.stderr + res.stdout
    assert "wandb sync" in out
    groups = re.findall(r"wandb run '([^']*)' in group '([^']*)'", out)
    assert len(groups) == 2 and groups[0][1] == groups[1][1] == "multi30k_en_de-sweep"
    assert "model.num_heads=1" in groups[0][0] and "model.num_heads=2" in groups[1][0]


@pytest.mark.slow
def test_ddp_two_cpu_processes_see_disjoint_batches(corpus, tmp_path):
    """Each rank trains on its own batches; validation (beam search here) decodes each rank's
    shard and scores the gathered whole."""
    env = script_env(tmp_path)  # with the checkout on the path: tests.fault_kit.BatchIdRecorder
    ids_dir = tmp_path / "ids"
    cmd = [
        sys.executable, "train.py", *tiny_overrides(corpus),
        "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=4",
        "validation.bleu_sentences=null", "trainer.val_check_interval=4",
        "trainer.check_val_every_n_epoch=null",
        "validation.decoding.strategy=beam", "validation.decoding.beam_size=2",
        "+callbacks.batch_ids._target_=tests.fault_kit.BatchIdRecorder",
        f"+callbacks.batch_ids.out_dir={ids_dir}", f"hydra.run.dir={tmp_path / 'run'}",
    ]  # fmt: skip
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    seen = []
    for rank in (0, 1):
        lines = (ids_dir / f"batch_ids.rank{rank}.jsonl").read_text().splitlines()
        assert len(lines) == 4
        seen.append({i for line in lines for i in json.loads(line)["ids"]})
    assert seen[0] and seen[1] and not seen[0] & seen[1]
    assert (tmp_path / "run" / "checkpoints" / "last.ckpt").is_file()
    # rank 1's log lines go to its stderr: no log file of its own beside rank 0's
    assert [p.name for p in (tmp_path / "run").glob("*.log")] == ["train.log"]
    log = (tmp_path / "run" / "train.log").read_text()  # rank 0's
    assert re.findall(r"val BLEU \S+ on (\d+) sentences", log) == ["32"]  # both ranks' shards


@pytest.mark.skipif(
    not os.environ.get("MULTI30K_DIR"), reason="MULTI30K_DIR is not set to the Multi30k files"
)
@pytest.mark.slow
def test_multi30k_smoke(tmp_path):
    """The default experiment's data with the tiny model: a few steps, BLEU on a subset."""
    overrides = [
        "model=tiny",
        f"data.root={os.environ['MULTI30K_DIR']}",
        "data.download=false",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.num_workers=0",
        "logger=csv",
        "trainer.accelerator=cpu",
        "trainer.max_steps=5",
        "trainer.val_check_interval=5",
        "trainer.limit_val_batches=2",
        "trainer.num_sanity_val_steps=0",
        "trainer.enable_progress_bar=false",
        "validation.bleu_sentences=16",
        ATTENTION_MAPS_OFF,  # the maps' figures (~11 s of CPU): tests/analysis/ runs them
    ]
    metrics = train(compose_cfg(overrides, tmp_path))
    assert math.isfinite(metrics["val/loss"]) and "val/bleu" in metrics
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow
def test_wandb_falls_back_offline_when_the_server_is_unreachable(tmp_path):
    """A key but no reachable server: online start gives up after init_timeout, runs offline."""
    env = script_env(tmp_path)
    env.pop("WANDB_MODE", None)
    env["WANDB_API_KEY"] = "0" * 40
    env["WANDB_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens on the discard port
    code = (
        "import logging, wandb\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from transformer.training.loggers import OfflineFallbackWandbLogger\n"
        f"lg = OfflineFallbackWandbLogger(project='p', save_dir={str(tmp_path / 'out')!r},"
        " init_timeout=1)\n"
        "lg.log_metrics({'x': 1.0}, step=0)\n"
        "print('MODE', lg.experiment.settings.mode)\n"
        "wandb.finish()\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    assert "MODE offline" in res.stdout
    assert "wandb sync" in res.stderr and "online start failed" in res.stderr
    assert list((tmp_path / "out" / "wandb").glob("offline-run-*"))
