"""The Lightning Trainer of a training run: its precision resolved for the machine, its loggers and
callbacks (:func:`build_trainer`, :func:`build_loggers`, :func:`training_callbacks`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.plugins import MixedPrecision
from omegaconf import DictConfig, OmegaConf

from transformer.precision import BF16_MIN_SPEEDUP, cpu_bf16_speedup, cuda_has_bf16
from transformer.training.callbacks import AtomicCheckpointIO, WeightEMA

log = logging.getLogger(__name__)


def on_gpu(trainer_cfg: DictConfig) -> bool:
    """Whether the trainer will run on a CUDA GPU (``accelerator`` auto picks one if there is)."""
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    return accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()


def resolve_precision(trainer_cfg: DictConfig) -> str:
    """``auto``: bf16-mixed on a GPU that computes bf16 natively (:func:`cuda_has_bf16`; else
    16-mixed, with a GradScaler); on CPU bf16-mixed where it multiplies bf16 matrices at least
    ``BF16_MIN_SPEEDUP`` times as fast as float32 ones (:func:`cpu_bf16_speedup`), else 32-true.
    The choice and its reason are logged; any other value is kept as it is."""
    precision = str(trainer_cfg.get("precision", "auto"))
    if precision != "auto":
        return precision
    if on_gpu(trainer_cfg):
        precision = "bf16-mixed" if cuda_has_bf16() else "16-mixed"
        log.info("trainer.precision=auto: %s on this GPU", precision)
        return precision
    speedup = cpu_bf16_speedup()
    precision = "bf16-mixed" if speedup is not None and speedup >= BF16_MIN_SPEEDUP else "32-true"
    if speedup is None:
        log.info("trainer.precision=auto: 32-true, this CPU has no bf16 instructions")
    else:
        log.info(
            "trainer.precision=auto: %s, this CPU multiplies bf16 matrices at %.2fx float32's "
            "speed (bf16-mixed from %.2fx)",
            precision,
            speedup,
            BF16_MIN_SPEEDUP,
        )
    return precision


def precision_options(trainer_cfg: DictConfig) -> dict[str, Any]:
    """The Trainer's precision argument, or the plugin that stands for it.

    ``16-mixed`` on CPU trains in float16 with a GradScaler, as it does on GPUs without bf16 (where
    ``auto`` picks it): Lightning would switch to bf16-mixed instead, with a warning. It is slow
    (float16 matrix products are far slower than float32 on CPUs), but it is the same path.
    """
    precision = resolve_precision(trainer_cfg)
    if precision != "16-mixed" or on_gpu(trainer_cfg):
        return {"precision": precision}
    log.warning("trainer.precision=16-mixed on CPU: float16 is slow here; bf16-mixed is faster")
    return {"plugins": [MixedPrecision("16-mixed", "cpu")]}


def precision_dtype(precision: str) -> torch.dtype:
    """The dtype a Lightning precision (``bf16-mixed``, ``16-true``, ``32-true``, ...) computes
    the model's products in."""
    if precision.startswith("bf16"):
        return torch.bfloat16
    return torch.float16 if precision.startswith("16") else torch.float32


def run_identity(cfg: DictConfig) -> tuple[str, str | None]:
    """(wandb run name, group) unless set in the config. A sweep's jobs share one group named
    after the experiment and the sweep's start; each is named by its overrides."""
    name, group = cfg.get("run_name"), cfg.get("group")
    experiment = cfg.get("experiment_name", "run")
    if HydraConfig.initialized():
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            overrides = hc.job.override_dirname or f"job{hc.job.num}"
            name = name or f"{experiment}-{overrides}"
            group = group or f"{experiment}-{Path(hc.sweep.dir).name}"
        else:
            name = name or f"{experiment}-{Path(hc.runtime.output_dir).name}"
    return name or experiment, group


def _instantiate_group(group: DictConfig | None, **kwargs: Any) -> list[Any]:
    if not group:
        return []
    return [instantiate(c, **kwargs) for c in group.values() if c is not None and "_target_" in c]


def build_loggers(cfg: DictConfig) -> list[Any]:
    """The run's loggers (``cfg.logger``); wandb's run named and grouped by :func:`run_identity`."""
    logger_cfg = cfg.get("logger")
    if logger_cfg and "wandb" in logger_cfg:
        name, group = run_identity(cfg)
        logger_cfg = OmegaConf.merge(logger_cfg, {"wandb": {"name": name, "group": group}})
        log.info("wandb run %r in group %r", name, group)
    return _instantiate_group(logger_cfg)


def training_callbacks(cfg: DictConfig) -> list[L.Callback]:
    """The run's callbacks: ``cfg.callbacks``, the weights' moving average (``ema.decay``) first,
    the progress bar only where ``trainer.enable_progress_bar`` is on."""
    callbacks = _instantiate_group(cfg.get("callbacks"))
    ema_decay = (cfg.get("ema") or {}).get("decay")
    if ema_decay is not None:  # first: a checkpoint written after a step holds its average
        callbacks.insert(0, WeightEMA(decay=float(ema_decay)))
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    return callbacks


def build_trainer(cfg: DictConfig, loggers: list[Any], callbacks: list[L.Callback]) -> L.Trainer:
    """The Trainer of ``cfg.trainer``: its precision resolved (:func:`precision_options`), no
    epoch limit where ``max_epochs`` is null, checkpoints written atomically."""
    # max_epochs=null beside another limit means no epoch limit (Lightning caps a run with no
    # max_steps and no Timer at 1000 epochs)
    limits = {"max_epochs": -1} if cfg.trainer.get("max_epochs", -1) is None else {}
    precision = precision_options(cfg.trainer)
    return instantiate(
        cfg.trainer,
        **limits,
        callbacks=callbacks,
        logger=loggers or False,
        precision=precision.get("precision"),
        # no checkpoint is ever left half-written
        plugins=[AtomicCheckpointIO(), *precision.get("plugins", [])],
    )
