"""``train(cfg)``: a composed Hydra config -> a trained model, checkpoints and logs.

The order matters: the whole config is checked first (:mod:`transformer.training.config_checks`;
the data module checks its own options when it is built, reading nothing), so a misspelt option or
an invalid value fails before any data is read or tokenized; then the model, loggers and callbacks
are built (the Trainer: :mod:`transformer.training.trainer`) and Lightning fits.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from transformer import sdpa_backends
from transformer.allocator import bound_kernel_caches, keep_freed_memory
from transformer.atomic import sweep_temporaries
from transformer.checkpoints import load_checkpoint, stored_tokenizer_models
from transformer.config import TransformerConfig
from transformer.data.datamodule import TranslationDataModule
from transformer.errors import ConfigError
from transformer.metrics import TOKENIZE
from transformer.training import config_checks as checks
from transformer.training import run_dir
from transformer.training.finetune import initial_checkpoint, initial_weights
from transformer.training.lit_module import TranslationModule
from transformer.training.resume import check_resume
from transformer.training.trainer import (
    build_loggers,
    build_trainer,
    on_gpu,
    precision_dtype,
    training_callbacks,
)

log = logging.getLogger(__name__)


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    """Construct the data module (which checks its options and touches no data yet); an invalid
    data option becomes a ConfigError with the module's own message."""
    try:
        return instantiate(cfg.data, validation_max_tokens=validation_tokens(cfg))
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ConfigError(f"invalid data option (data.*): {cause}") from err


GPU_VALIDATION_TOKENS = 32768  # validation.max_tokens=null on a GPU: the least budget


def validation_tokens(cfg: DictConfig) -> int | None:
    """The validation batches' token budget: ``validation.max_tokens``, or when null, on a GPU at
    least ``GPU_VALIDATION_TOKENS`` (greedy decoding of small batches leaves it idle between
    kernels: fewer, larger batches), elsewhere ``data.max_tokens``."""
    given = (cfg.get("validation") or {}).get("max_tokens")
    budget = cfg.data.get("max_tokens")
    if given is not None or budget is None or not on_gpu(cfg.trainer):
        return given
    return max(int(budget), GPU_VALIDATION_TOKENS)


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def resume_from(
    cfg: DictConfig, model_cfg: TransformerConfig, datamodule: TranslationDataModule
) -> None:
    """A run resumed from ``ckpt_path`` (loaded once, its tensors memory-mapped, not read):
    checked against the run, its pruned heads adopted, and the tokenizers the weights were
    trained with given to the data."""
    ckpt = load_checkpoint(cfg.ckpt_path, mmap=True)
    check_resume(ckpt, cfg.ckpt_path, model_cfg, datamodule.hparams)
    adopt_pruned_heads(cfg, ckpt["hyper_parameters"]["model"])
    models = stored_tokenizer_models(ckpt, cfg.ckpt_path)
    if models is None:
        log.warning("%s holds no tokenizers: the data's own are used", cfg.ckpt_path)
    else:
        datamodule.use_tokenizers(models["src"], models["tgt"], checkpoint=cfg.ckpt_path)


def adopt_pruned_heads(
    cfg: DictConfig, model: dict[str, Any], option: str = "ckpt_path", name: str | None = None
) -> None:
    """A checkpoint pruned by ``python -m transformer.prune`` has fewer heads in some layers: a
    run resumed (or started) from it takes its ``model.heads_per_layer`` (given, it must agree).
    ``option=name`` names the checkpoint in messages (default: ``ckpt_path``'s)."""
    name = cfg.get(option) if name is None else name
    stored = model.get("heads_per_layer")
    given = cfg.model.get("heads_per_layer")
    given = None if given is None else OmegaConf.to_container(given)
    if given == stored:
        return
    if given is not None:
        held = stored if stored is not None else "every head: it is not pruned"
        raise ConfigError(
            f"model.heads_per_layer={given} differs from the heads of {option}={name} "
            f"({held}); leave model.heads_per_layer null to take the checkpoint's (heads are "
            "removed with python -m transformer.prune)"
        )
    cfg.model.heads_per_layer = stored
    log.info("%s is pruned: model.heads_per_layer=%s", name, stored)


def fit(
    cfg: DictConfig,
    trainer: L.Trainer,
    module: TranslationModule,
    datamodule: L.LightningDataModule,
) -> None:
    """Log the config to the loggers and fit, from ``cfg.ckpt_path`` when it is set."""
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    flat["model.num_parameters"] = module.model.num_parameters()
    for lg in trainer.loggers:
        lg.log_hyperparams(flat)

    try:
        with warnings.catch_warnings():
            # Lightning's warning for a checkpoint taken inside an epoch, whose loader has no
            # state_dict: the datamodule holds the sampler's position and resumes it exactly
            warnings.filterwarnings("ignore", "You're resuming from a checkpoint that ended before")
            trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    finally:
        if any(type(lg).__name__.endswith("WandbLogger") for lg in trainer.loggers):
            import wandb

            wandb.finish()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # Lightning leaves a gloo group (CPU DDP) to the interpreter's exit, where its threads
            # can abort the process ("terminate called without an active exception")
            torch.distributed.destroy_process_group()


def sweep_checkpoint_dirs(cfg: DictConfig) -> None:
    """Remove the temporary checkpoints that killed runs left in this run's directories and in
    that of ``ckpt_path`` (:func:`transformer.atomic.sweep_temporaries`)."""
    dirs = [*checks.output_dirs(cfg).values()]
    dirs += [Path(cfg.ckpt_path).parent] if cfg.get("ckpt_path") else []
    for directory in dirs:
        for path in sweep_temporaries(directory):
            log.info("removed %s, left by a process that no longer runs", path)


def build_module(cfg: DictConfig, model_cfg: TransformerConfig) -> TranslationModule:
    """The Lightning module ``cfg`` trains: the model of ``model_cfg``, the optimizer and schedule,
    the loss, validation decoding and compilation as configured."""
    return TranslationModule(
        model=model_cfg.to_dict(),
        optimizer=instantiate(cfg.optim.optimizer),
        scheduler=instantiate(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None,
        label_smoothing=float(cfg.loss.label_smoothing),
        rdrop_alpha=float(cfg.loss.rdrop_alpha),
        loss_kernel=cfg.loss.get("kernel", "auto"),
        decoding=OmegaConf.to_container(cfg.validation.decoding, resolve=True),
        val_bleu_sentences=cfg.validation.bleu_sentences,
        bleu_tokenize=(cfg.get("metrics") or {}).get("tokenize", TOKENIZE),
        max_bad_steps=int(cfg.loss.max_bad_steps),
        compile_model=cfg.get("compile", False),
        compile_backend=cfg.get("compile_backend", "inductor"),
        shape_buckets=int(cfg.data.get("num_buckets", 0)),
        freeze=list(cfg.get("freeze") or []),
    )


def train(cfg: DictConfig) -> dict[str, float]:
    """Train as configured; returns the final logged metrics (``trainer.callback_metrics``)."""
    bound_kernel_caches()  # before any CPU matrix product (`precision: auto` times some)
    model_cfg = checks.validate_config(cfg)  # before any data work
    L.seed_everything(int(cfg.seed), workers=True)

    datamodule = build_datamodule(cfg)  # checks its options; reads nothing yet
    weights = None  # init_from's, loaded into the new model
    if cfg.get("ckpt_path"):  # resume with the tokenizers the weights were trained with
        resume_from(cfg, model_cfg, datamodule)
        if cfg.get("init_from"):
            log.info("init_from is not read: ckpt_path=%s resumes the run", cfg.ckpt_path)
    elif cfg.get("init_from"):  # fine-tuning: the weights and tokenizers, nothing else
        ckpt, name = initial_checkpoint(cfg)
        weights = initial_weights(ckpt, name, model_cfg, datamodule)
        adopt_pruned_heads(cfg, ckpt["hyper_parameters"]["model"], "init_from", name)
    checks.check_data_root(cfg.data)
    if not run_dir.later_rank():  # rank 0's directories: the others write nothing there
        checks.check_writable(checks.output_dirs(cfg))
        sweep_checkpoint_dirs(cfg)
    if datamodule.src_vocab_size != model_cfg.src_vocab_size or (
        datamodule.tgt_vocab_size != model_cfg.tgt_vocab_size
    ):
        raise ConfigError(
            f"model vocab sizes {model_cfg.src_vocab_size}/{model_cfg.tgt_vocab_size} differ from "
            f"the data's {datamodule.src_vocab_size}/{datamodule.tgt_vocab_size}; leave "
            "model.src_vocab_size/tgt_vocab_size at ${data.vocab_size}"
        )
    model_cfg = checks.model_config(cfg, pad_id=datamodule.pad_id)  # hand-off: the data's pad id
    module = build_module(cfg, model_cfg)
    if weights is not None:
        module.model.load_state_dict(weights)
    log.info("model: %s parameters, %s", f"{module.model.num_parameters():,}", model_cfg)
    trainer = build_trainer(cfg, build_loggers(cfg), training_callbacks(cfg))
    if trainer.strategy.root_device.type == "cpu":
        keep_freed_memory()  # the step's tensors reused, not faulted in again from the kernel
    backends = sdpa_backends.parse(cfg.get("sdpa_backends"))
    kernels = sdpa_backends.describe(
        module.model, backends, trainer.strategy.root_device, precision_dtype(trainer.precision)
    )
    log.info("attention kernels (sdpa_backends): %s", kernels)
    # the run directory claimed by rank 0 (the other ranks' processes share it)
    claim = run_dir.claim_training_run(cfg) if trainer.is_global_zero else nullcontext()
    with claim, sdpa_backends.selected(module.model, backends):
        fit(cfg, trainer, module, datamodule)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if trainer.is_global_zero:
        log.info("finished at step %d: %s", trainer.global_step, metrics)
    return metrics
