"""``train(cfg)``: a composed Hydra config -> a trained model, checkpoints and logs.

The order matters: the whole config is checked first (:mod:`transformer.training.config_checks`; the
data module checks its own options when it is built, reading nothing), so a misspelt option or an
invalid value fails before any data is read or tokenized; then the model, loggers and callbacks
are built and Lightning fits.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ProgressBar
from lightning.pytorch.plugins import MixedPrecision
from omegaconf import DictConfig, OmegaConf

from transformer import sdpa_backends
from transformer.atomic import sweep_temporaries
from transformer.checkpoints import load_checkpoint, stored_tokenizer_models
from transformer.config import TransformerConfig
from transformer.data.datamodule import TranslationDataModule
from transformer.errors import ConfigError
from transformer.training import config_checks as checks
from transformer.training import run_dir
from transformer.training.callbacks import AtomicCheckpointIO, WeightEMA
from transformer.training.lit_module import TranslationModule
from transformer.training.resume import check_resume

log = logging.getLogger(__name__)


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    """Construct the data module (which checks its options and touches no data yet); an invalid
    data option becomes a ConfigError with the module's own message."""
    try:
        return instantiate(cfg.data, eval_max_tokens=validation_tokens(cfg))
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ConfigError(f"invalid data option (data.*): {cause}") from err


def on_gpu(trainer_cfg: DictConfig) -> bool:
    """Whether the trainer will run on a CUDA GPU (``accelerator`` auto picks one if there is)."""
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    return accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()


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


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX), where bf16-mixed trains
    faster than float32 (the CPU recipe: 1.33-1.57x a step, README); elsewhere oneDNN emulates
    bf16 and it is slower. ``torch.backends.cpu.get_cpu_capability()`` cannot tell: it says
    ``AVX512`` with or without them."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def resolve_precision(trainer_cfg: DictConfig) -> str:
    """``auto``: bf16-mixed on a GPU that has bf16 (else 16-mixed); on CPU bf16-mixed where it
    has bf16 instructions (:func:`cpu_has_fast_bf16`), else 32-true. The choice is logged; any
    other value is kept as it is."""
    precision = str(trainer_cfg.get("precision", "auto"))
    if precision != "auto":
        return precision
    if on_gpu(trainer_cfg):
        precision = "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
        log.info("trainer.precision=auto: %s on this GPU", precision)
    elif cpu_has_fast_bf16():
        precision = "bf16-mixed"
        log.info("trainer.precision=auto: bf16-mixed, this CPU has bf16 instructions")
    else:
        precision = "32-true"
        log.info("trainer.precision=auto: 32-true, this CPU has no bf16 instructions")
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


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key))
        else:
            out[key] = v
    return out


def _instantiate_group(group: DictConfig | None, **kwargs: Any) -> list[Any]:
    if not group:
        return []
    return [instantiate(c, **kwargs) for c in group.values() if c is not None and "_target_" in c]


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


def adopt_pruned_heads(cfg: DictConfig, model: dict[str, Any]) -> None:
    """A checkpoint pruned by ``python -m transformer.prune`` has fewer heads in some layers: a
    run resumed from it takes its ``model.heads_per_layer`` (given, it must agree)."""
    stored = model.get("heads_per_layer")
    given = cfg.model.get("heads_per_layer")
    given = None if given is None else OmegaConf.to_container(given)
    if given == stored:
        return
    if given is not None:
        held = stored if stored is not None else "every head: it is not pruned"
        raise ConfigError(
            f"model.heads_per_layer={given} differs from the heads of ckpt_path={cfg.ckpt_path} "
            f"({held}); leave model.heads_per_layer null to take the checkpoint's (heads are "
            "removed with python -m transformer.prune)"
        )
    cfg.model.heads_per_layer = stored
    log.info("%s is pruned: model.heads_per_layer=%s", cfg.ckpt_path, stored)


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


def train(cfg: DictConfig) -> dict[str, float]:
    """Train as configured; returns the final logged metrics (``trainer.callback_metrics``)."""
    model_cfg = checks.validate_config(cfg)  # before any data work
    L.seed_everything(int(cfg.seed), workers=True)

    datamodule = build_datamodule(cfg)  # checks its options; reads nothing yet
    if cfg.get("ckpt_path"):  # resume with the tokenizers the weights were trained with
        resume_from(cfg, model_cfg, datamodule)
    checks.check_data_root(cfg.data)
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
    module = TranslationModule(
        model=model_cfg.to_dict(),
        optimizer=instantiate(cfg.optim.optimizer),
        scheduler=instantiate(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None,
        label_smoothing=float(cfg.loss.label_smoothing),
        rdrop_alpha=float(cfg.loss.rdrop_alpha),
        decoding=OmegaConf.to_container(cfg.validation.decoding, resolve=True),
        val_bleu_sentences=cfg.validation.bleu_sentences,
        max_bad_steps=int(cfg.loss.max_bad_steps),
        compile_model=cfg.get("compile", False),
        compile_backend=cfg.get("compile_backend", "inductor"),
        shape_buckets=int(cfg.data.get("num_buckets", 0)),
    )
    log.info("model: %s parameters, %s", f"{module.model.num_parameters():,}", model_cfg)

    logger_cfg = cfg.get("logger")
    if logger_cfg and "wandb" in logger_cfg:
        name, group = run_identity(cfg)
        logger_cfg = OmegaConf.merge(logger_cfg, {"wandb": {"name": name, "group": group}})
        log.info("wandb run %r in group %r", name, group)
    loggers = _instantiate_group(logger_cfg)
    callbacks = _instantiate_group(cfg.get("callbacks"))
    ema_decay = (cfg.get("ema") or {}).get("decay")
    if ema_decay is not None:  # first: a checkpoint written after a step holds its average
        callbacks.insert(0, WeightEMA(decay=float(ema_decay)))
    if not cfg.trainer.get("enable_progress_bar", True):
        callbacks = [c for c in callbacks if not isinstance(c, ProgressBar)]
    # max_epochs=null beside another limit means no epoch limit (Lightning caps a run with no
    # max_steps and no Timer at 1000 epochs)
    limits = {"max_epochs": -1} if cfg.trainer.get("max_epochs", -1) is None else {}
    precision = precision_options(cfg.trainer)
    trainer: L.Trainer = instantiate(
        cfg.trainer,
        **limits,
        callbacks=callbacks,
        logger=loggers or False,
        precision=precision.get("precision"),
        # no checkpoint is ever left half-written
        plugins=[AtomicCheckpointIO(), *precision.get("plugins", [])],
    )
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
