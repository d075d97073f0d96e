"""The composed Hydra config checked before any data work: a bad option fails at once with one
:class:`ConfigError` line naming it (as typed on the command line) and the fix.

:func:`validate_config` runs one check per config group (:mod:`.groups`), after each value is
checked against the type its owner annotates (:mod:`.option_types`). Each option has one check.
Where the object that uses an option checks it, that check is run early: the model's
(:class:`TransformerConfig`), the loss's (:func:`transformer.training.loss.check_label_smoothing`),
the validation decoding's (:func:`transformer.decoding.options.validation_decoding`), the BLEU
tokenizer's (:func:`transformer.metrics.check_tokenize`) and the LR
scheduler's (built on a stand-in optimizer); the data module's and its corpus source's by
``train``, which builds the data module (reading nothing) before any data work, then checks the
file system (:mod:`.paths`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from transformer.config import TransformerConfig
from transformer.training.config_checks.groups import (
    check_ckpt_path,
    check_data,
    check_ema,
    check_epoch_checkpoints,
    check_freeze,
    check_kernels,
    check_loss,
    check_metrics,
    check_optim,
    check_required,
    check_trainer,
    check_validation,
    model_config,
)
from transformer.training.config_checks.option_types import check_types, show
from transformer.training.config_checks.paths import check_data_root, check_writable, output_dirs


def validate_config(cfg: DictConfig) -> TransformerConfig:
    """Check every option that can be checked without data; return the model config."""
    check_required(cfg)
    check_types(cfg)
    model_cfg = model_config(cfg)
    check_data(cfg.data, model_cfg, bool(cfg.get("init_from") or cfg.get("ckpt_path")))
    check_optim(cfg.optim, cfg.trainer)
    check_loss(cfg.loss, cfg.trainer)
    check_validation(cfg.validation, cfg.get("callbacks"))
    check_epoch_checkpoints(cfg.get("callbacks"), cfg.trainer)
    check_metrics(cfg.get("metrics"))
    check_ema(cfg.get("ema"), cfg.trainer)
    check_freeze(cfg.get("freeze"))
    check_kernels(cfg)
    check_trainer(cfg.trainer)
    check_ckpt_path(cfg.get("ckpt_path"))
    return model_cfg


__all__ = [
    "check_data_root",
    "check_types",
    "check_writable",
    "model_config",
    "output_dirs",
    "show",
    "validate_config",
]
