"""``train(cfg)``: a composed Hydra config -> a trained model, checkpoints and logs.

The order matters: the whole config is checked first (model shape, data options, optimizer,
trainer), so a misspelt option or an invalid value fails before any data is read or tokenized;
then the data module, the model, loggers and callbacks are built and Lightning fits.
"""

from __future__ import annotations

import difflib
import logging
import re
import tempfile
import zipfile
from dataclasses import fields
from datetime import timedelta
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

from transformer.atomic import AtomicCheckpointIO
from transformer.checkpoints import read_tokenizer_models
from transformer.config import TransformerConfig
from transformer.errors import ConfigError
from transformer.lit_module import TranslationModule, validation_decoding

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")


def _unknown_option(group: str, key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {group}.{close[0]}?" if close else f"; known: {', '.join(known)}"
    return ConfigError(f"unknown option {group}.{key}{hint}")


def model_config(cfg: DictConfig, pad_id: int | None = None) -> TransformerConfig:
    """The validated :class:`TransformerConfig` of ``cfg.model`` (a ConfigError names the
    offending ``model.*`` option)."""
    options: dict[str, Any] = OmegaConf.to_container(cfg.model, resolve=True)  # type: ignore[assignment]
    known = [f.name for f in fields(TransformerConfig)]
    for key in options:
        if key not in known:
            raise _unknown_option("model", key, known)
    if pad_id is not None:
        options["pad_id"] = pad_id
    try:
        return TransformerConfig(**options)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid model option (model.*): {err}") from err


def validate_config(cfg: DictConfig) -> TransformerConfig:
    """Check every option that can be checked without data; return the model config."""
    for key in ("data", "model", "optim", "trainer"):
        if cfg.get(key) is None:
            raise ConfigError(f"the config has no `{key}` group; pick one, e.g. {key}=...")
    model_cfg = model_config(cfg)
    data = cfg.data
    if data.get("src_lang") == data.get("tgt_lang"):
        raise ConfigError(f"data.src_lang and data.tgt_lang are both {data.src_lang!r}")
    if data.get("max_len") is not None and int(data.max_len) + 1 > model_cfg.max_positions:
        raise ConfigError(
            f"data.max_len={data.max_len} pieces (+1 for bos/eos) exceed model.max_positions="
            f"{model_cfg.max_positions}; lower data.max_len or raise model.max_positions"
        )
    if int(data.get("vocab_size", 1)) <= 4:
        raise ConfigError(
            f"data.vocab_size={data.vocab_size} leaves no room beyond pad/unk/bos/eos"
        )
    if model_cfg.share_all_embeddings and not data.get("joint_vocab", True):
        raise ConfigError(
            "model.share_all_embeddings=true needs one joint vocabulary: set data.joint_vocab=true "
            "or model.share_all_embeddings=false"
        )
    opt = cfg.optim.optimizer
    if float(opt.get("lr", 1.0)) <= 0:
        raise ConfigError(f"optim.optimizer.lr must be positive, got {opt.lr}")
    if float(opt.get("weight_decay", 0.0)) < 0:
        raise ConfigError(f"optim.optimizer.weight_decay must be >= 0, got {opt.weight_decay}")
    sched = cfg.optim.get("scheduler")
    if sched is not None and int(sched.get("warmup_steps", 0)) < 0:
        raise ConfigError(f"optim.scheduler.warmup_steps must be >= 0, got {sched.warmup_steps}")
    if int(cfg.loss.max_bad_steps) < 1:
        raise ConfigError(f"loss.max_bad_steps must be >= 1, got {cfg.loss.max_bad_steps}")
    eps = float(cfg.loss.label_smoothing)
    if not 0.0 <= eps < 1.0:
        raise ConfigError(f"loss.label_smoothing must be in [0, 1), got {eps}")
    try:  # the options' one check, the module's own
        validation_decoding(OmegaConf.to_container(cfg.validation.decoding, resolve=True))
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from err
    n = cfg.validation.bleu_sentences
    if n is not None and int(n) < 0:
        raise ConfigError(f"validation.bleu_sentences must be >= 0 or null, got {n}")
    monitored = [
        f"callbacks.{name}.monitor={c.monitor}"
        for name, c in (cfg.get("callbacks") or {}).items()
        if c is not None and str(c.get("monitor", "")).startswith("val/bleu")
    ]
    if n == 0 and monitored:
        raise ConfigError(
            f"validation.bleu_sentences=0 turns val/bleu off, but {monitored[0]} needs it; "
            "drop that checkpoint with ~callbacks.best_checkpoint, or keep some BLEU sentences"
        )
    if not isinstance(cfg.get("compile", False), bool):
        raise ConfigError(f"compile must be true or false, got {cfg.compile!r}")
    backends = torch._dynamo.list_backends(exclude_tags=())
    if cfg.get("compile") and cfg.get("compile_backend", "inductor") not in backends:
        raise ConfigError(
            f"compile_backend={cfg.compile_backend!r} is not a torch.compile backend; choose one "
            f"of {', '.join(backends)}"
        )
    tr = cfg.trainer
    if str(tr.get("precision", "auto")) not in PRECISIONS:
        raise ConfigError(f"trainer.precision={tr.precision!r}; choose one of {PRECISIONS}")
    if int(tr.get("accumulate_grad_batches", 1)) < 1:
        raise ConfigError(
            f"trainer.accumulate_grad_batches must be >= 1, got {tr.accumulate_grad_batches}"
        )
    max_time = tr.get("max_time")
    if max_time is not None:
        check_max_time(max_time)
    no_limit = tr.get("max_steps", -1) == -1 and tr.get("max_epochs", -1) in (-1, None)
    if no_limit and max_time is None and not tr.get("fast_dev_run"):
        raise ConfigError(
            "set trainer.max_steps, trainer.max_epochs or trainer.max_time: training would not end"
        )
    if cfg.get("ckpt_path"):
        if not Path(cfg.ckpt_path).is_file():
            raise ConfigError(f"ckpt_path={cfg.ckpt_path} is not a file")
        if not zipfile.is_zipfile(cfg.ckpt_path):  # torch.save writes a zip; its index is last
            raise ConfigError(
                f"ckpt_path={cfg.ckpt_path} is truncated or not a checkpoint; resume from another "
                "checkpoint (checkpoints written by train.py are never left half-written)"
            )
    return model_cfg


MAX_TIME = re.compile(r"(\d+):(\d\d):(\d\d):(\d\d)")  # Lightning's Timer: DD:HH:MM:SS


def check_max_time(value: Any) -> None:
    """``trainer.max_time`` as Lightning takes it: ``DD:HH:MM:SS`` or a mapping of timedelta
    arguments (``{hours: 1}``); a positive duration."""
    try:
        if isinstance(value, str):
            match = MAX_TIME.fullmatch(value.strip())
            if not match:
                raise ValueError
            days, hours, minutes, seconds = map(int, match.groups())
            duration = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        elif isinstance(value, DictConfig):
            duration = timedelta(**OmegaConf.to_container(value))  # type: ignore[arg-type]
        else:
            raise TypeError
    except (TypeError, ValueError) as err:
        raise ConfigError(
            f"trainer.max_time={value!r} is not a duration; write DD:HH:MM:SS, e.g. "
            "trainer.max_time=00:01:30:00 for an hour and a half"
        ) from err
    if duration <= timedelta(0):
        raise ConfigError(f"trainer.max_time={value!r}: training would end before it starts")


def output_dirs(cfg: DictConfig) -> dict[str, Path]:
    """The directories training writes to, by the option that names them."""
    dirs = {"paths.output_dir": Path(cfg.paths.output_dir)}
    for name, c in (cfg.get("callbacks") or {}).items():
        if c is not None and c.get("dirpath"):
            dirs[f"callbacks.{name}.dirpath"] = Path(c.dirpath)
    return dirs


def check_writable(dirs: dict[str, Path]) -> None:
    """Create each directory and write a probe file there: an unwritable output directory fails
    now, not at the first checkpoint an hour into training."""
    for option, path in dirs.items():
        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as err:
            raise ConfigError(
                f"{option}={path} is not a writable directory ({err.strerror}); choose another, "
                "e.g. hydra.run.dir=DIR"
            ) from err


def check_data_root(data: DictConfig) -> None:
    """A ``data.root`` that does not exist is a typo, unless Multi30k is to be downloaded there."""
    root = data.get("root")
    downloads = data.get("source") == "multi30k" and data.get("download", True)
    if root is not None and not downloads and not Path(root).is_dir():
        raise ConfigError(
            f"data.root={root} does not exist; set data.root to the directory of the corpus files"
        )


def build_datamodule(cfg: DictConfig) -> L.LightningDataModule:
    """Construct the data module (which checks its options and touches no data yet); an invalid
    data option becomes a ConfigError with the module's own message."""
    try:
        return instantiate(cfg.data)
    except InstantiationException as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ConfigError(f"invalid data option (data.*): {cause}") from err


def on_gpu(trainer_cfg: DictConfig) -> bool:
    """Whether the trainer will run on a CUDA GPU (``accelerator`` auto picks one if there is)."""
    accelerator = str(trainer_cfg.get("accelerator", "auto"))
    return accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()


def resolve_precision(trainer_cfg: DictConfig) -> str:
    """``auto``: bf16-mixed on a GPU that has bf16 (else 16-mixed), 32-true on CPU."""
    precision = str(trainer_cfg.get("precision", "auto"))
    if precision != "auto":
        return precision
    if on_gpu(trainer_cfg):
        return "bf16-mixed" if torch.cuda.is_bf16_supported() else "16-mixed"
    return "32-true"


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


def train(cfg: DictConfig) -> dict[str, float]:
    """Train as configured; returns the final logged metrics (``trainer.callback_metrics``)."""
    model_cfg = validate_config(cfg)  # before any data work
    L.seed_everything(int(cfg.seed), workers=True)

    datamodule = build_datamodule(cfg)  # checks its options; reads nothing yet
    if cfg.get("ckpt_path"):  # resume with the tokenizers the weights were trained with
        models = read_tokenizer_models(cfg.ckpt_path)
        if models is None:
            log.warning("%s holds no tokenizers: the data's own are used", cfg.ckpt_path)
        else:
            datamodule.use_tokenizers(models["src"], models["tgt"], checkpoint=cfg.ckpt_path)
    check_data_root(cfg.data)
    check_writable(output_dirs(cfg))
    if datamodule.src_vocab_size != model_cfg.src_vocab_size or (
        datamodule.tgt_vocab_size != model_cfg.tgt_vocab_size
    ):
        raise ConfigError(
            f"model vocab sizes {model_cfg.src_vocab_size}/{model_cfg.tgt_vocab_size} differ from "
            f"the data's {datamodule.src_vocab_size}/{datamodule.tgt_vocab_size}; leave "
            "model.src_vocab_size/tgt_vocab_size at ${data.vocab_size}"
        )
    model_cfg = model_config(cfg, pad_id=datamodule.pad_id)  # hand-off: the data's pad id
    module = TranslationModule(
        model=model_cfg.to_dict(),
        optimizer=instantiate(cfg.optim.optimizer),
        scheduler=instantiate(cfg.optim.scheduler) if cfg.optim.get("scheduler") else None,
        label_smoothing=float(cfg.loss.label_smoothing),
        decoding=OmegaConf.to_container(cfg.validation.decoding, resolve=True),
        val_bleu_sentences=cfg.validation.bleu_sentences,
        max_bad_steps=int(cfg.loss.max_bad_steps),
        compile_model=cfg.get("compile", False),
        compile_backend=cfg.get("compile_backend", "inductor"),
    )
    log.info("model: %s parameters, %s", f"{module.model.num_parameters():,}", model_cfg)

    logger_cfg = cfg.get("logger")
    if logger_cfg and "wandb" in logger_cfg:
        name, group = run_identity(cfg)
        logger_cfg = OmegaConf.merge(logger_cfg, {"wandb": {"name": name, "group": group}})
        log.info("wandb run %r in group %r", name, group)
    loggers = _instantiate_group(logger_cfg)
    callbacks = _instantiate_group(cfg.get("callbacks"))
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
    flat = flatten(OmegaConf.to_container(cfg, resolve=True))  # type: ignore[arg-type]
    flat["model.num_parameters"] = module.model.num_parameters()
    for lg in trainer.loggers:
        lg.log_hyperparams(flat)

    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    finally:
        if any(type(lg).__name__.endswith("WandbLogger") for lg in loggers):
            import wandb

            wandb.finish()
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if trainer.is_global_zero:
        log.info("finished at step %d: %s", trainer.global_step, metrics)
    return metrics
