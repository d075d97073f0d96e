"""One check per config group, each naming the options it refuses as they are typed on the
command line. Where an owner checks its own options (the model config, the scheduler, the loss's
label smoothing, the validation decoding, the BLEU tokenizer), its check runs here on the config's
values; what stays here is what no owner checks in time: rules across options, and options of
what ``train`` builds only after data work (torch's optimizer, Lightning's Trainer, the module's
NaN, BLEU and compile options, the checkpoint)."""

from __future__ import annotations

import difflib
import importlib.util
import re
import zipfile
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from transformer import sdpa_backends
from transformer.config import TransformerConfig
from transformer.decoding.options import validation_decoding
from transformer.errors import ConfigError, show
from transformer.metrics import TOKENIZE, check_tokenize
from transformer.training.epoch_checkpoint import check_budget_share
from transformer.training.freeze import PARTS
from transformer.training.loss import check_label_smoothing
from transformer.training.optim import takes_progress
from transformer.training.trainer import on_gpu

PRECISIONS = ("auto", "32-true", "32", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
REQUIRED = ("data", "model", "optim", "trainer")


def check_required(cfg: DictConfig) -> None:
    """The groups every run needs are there."""
    for key in REQUIRED:
        if cfg.get(key) is None:
            raise ConfigError(f"the config has no `{key}` group; pick one, e.g. {key}=...")


def _unknown_option(group: str, key: str, known: list[str]) -> ConfigError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {group}.{close[0]}?" if close else f"; known: {', '.join(known)}"
    return ConfigError(f"unknown option {group}.{key}{hint}")


def model_config(cfg: DictConfig, pad_id: int | None = None) -> TransformerConfig:
    """The validated :class:`TransformerConfig` of ``cfg.model`` (a ConfigError names the
    offending ``model.*`` option)."""
    options: dict[str, Any] = OmegaConf.to_container(cfg.model, resolve=True)  # type: ignore[assignment]
    known = [f.name for f in fields(TransformerConfig)]
    # Not a structured config (a dataclass schema in Hydra's ConfigStore): a misspelt key
    # (model.num_head=4) already fails at compose time, the configs being struct, but
    # +model.num_head=4 adds it even under a schema, so this check stays; a schema's type errors
    # are Hydra's multi-line composition errors, not one line naming the option; and OmegaConf
    # cannot type TransformerConfig's Literal fields, so the schema would be a second copy of it.
    for key in options:
        if key not in known:
            raise _unknown_option("model", key, known)
    if pad_id is not None:
        options["pad_id"] = pad_id
    try:
        return TransformerConfig(**options)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"invalid model option (model.*): {err}") from err


def check_data(
    data: DictConfig, model_cfg: TransformerConfig, checkpoint_tokenizers: bool = False
) -> None:
    """The data options the model must fit: its positions and shared embeddings. With
    ``checkpoint_tokenizers`` (``init_from`` or ``ckpt_path``) the tokenizers are a checkpoint's:
    two SentencePiece models that number one vocabulary alike (an imported Marian model's) may
    share the embeddings, which :func:`transformer.training.finetune.initial_weights` checks."""
    if data.get("max_len") is not None and int(data.max_len) + 1 > model_cfg.max_positions:
        raise ConfigError(
            f"data.max_len={data.max_len} pieces (+1 for bos/eos) exceed model.max_positions="
            f"{model_cfg.max_positions}; lower data.max_len or raise model.max_positions"
        )
    if model_cfg.share_all_embeddings and not data.get("joint_vocab", True):
        if checkpoint_tokenizers:
            return
        raise ConfigError(
            "model.share_all_embeddings=true needs one joint vocabulary: set data.joint_vocab=true "
            "or model.share_all_embeddings=false"
        )


def check_optim(optim: DictConfig, trainer: DictConfig) -> None:
    """The optimizer's learning rate and weight decay; the scheduler (:func:`check_scheduler`)."""
    opt = optim.optimizer
    if float(opt.get("lr", 1.0)) <= 0:
        raise ConfigError(f"optim.optimizer.lr must be positive, got {opt.lr}")
    if float(opt.get("weight_decay", 0.0)) < 0:
        raise ConfigError(f"optim.optimizer.weight_decay must be >= 0, got {opt.weight_decay}")
    if optim.get("scheduler") is not None:
        check_scheduler(optim.scheduler, trainer)


def check_scheduler(scheduler: DictConfig, trainer: DictConfig) -> None:
    """The scheduler checks its options: build it on a stand-in optimizer. A budgeted one
    (:class:`transformer.training.optim.BudgetLR`) needs the end of training: ``trainer.max_steps``
    or ``trainer.max_time`` (an epoch count alone is no budget: it depends on the data)."""
    factory = instantiate(scheduler)
    budgeted = takes_progress(factory)
    try:
        stand_in = torch.optim.SGD([torch.zeros(1)], lr=1.0)
        factory(stand_in, **({"progress": lambda: 0.0} if budgeted else {}))
    except ValueError as err:  # its messages name the argument: warmup_steps must be ...
        raise ConfigError(f"optim.scheduler.{err}") from err
    if budgeted and not has_budget(trainer):
        raise ConfigError(
            f"optim.scheduler.shape={scheduler.get('shape', 'cosine')} decays to its minimum "
            "when training ends, but neither trainer.max_steps nor trainer.max_time is set; "
            "set one (e.g. trainer.max_steps=20000 or +trainer.max_time=00:01:00:00), or use "
            "optim=adamw (warmup then inverse square root, no end needed)"
        )


def check_epoch_checkpoints(callbacks: DictConfig | None, trainer: DictConfig) -> None:
    """The epoch checkpoints' ``budget_share`` (:mod:`transformer.training.epoch_checkpoint`)."""
    epochs = (callbacks or {}).get("epoch_checkpoints") or {}
    check_budget_share(epochs.get("budget_share"), has_budget(trainer))


def has_budget(trainer: DictConfig) -> bool:
    """Whether training has an end a share can be taken of: ``trainer.max_steps`` or
    ``trainer.max_time`` (an epoch count alone is no budget: it depends on the data)."""
    return trainer.get("max_steps", -1) != -1 or trainer.get("max_time") is not None


def check_loss(loss: DictConfig, trainer: DictConfig) -> None:
    """R-Drop's weight, the NaN streak that stops training, the label smoothing (the loss's own
    check, :func:`transformer.training.loss.check_label_smoothing`), and a fused loss kernel
    where it can run."""
    if float(loss.rdrop_alpha) < 0:
        raise ConfigError(f"loss.rdrop_alpha must be >= 0 (0 = off), got {loss.rdrop_alpha}")
    kernel = loss.get("kernel", "auto")
    if kernel in ("compiled", "liger") and float(loss.rdrop_alpha) > 0:
        raise ConfigError(
            f"loss.rdrop_alpha={loss.rdrop_alpha} runs the chunked loss, not loss.kernel={kernel}; "
            "set loss.kernel=chunked (or auto) for R-Drop"
        )
    if kernel == "liger" and not on_gpu(trainer):
        raise ConfigError(
            "loss.kernel=liger runs Liger-Kernel's Triton kernel on a CUDA GPU, and this run has "
            "none; on a CPU leave loss.kernel=auto (the chunked loss)"
        )
    if kernel == "liger" and importlib.util.find_spec("liger_kernel") is None:
        raise ConfigError(
            'loss.kernel=liger needs Liger-Kernel: pip install -e ".[gpu]" (or pip install '
            "liger-kernel)"
        )
    if int(loss.max_bad_steps) < 1:
        raise ConfigError(f"loss.max_bad_steps must be >= 1, got {loss.max_bad_steps}")
    try:
        check_label_smoothing(float(loss.label_smoothing), "loss.label_smoothing")
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from err


def check_freeze(freeze: Any) -> None:
    """The parts ``freeze`` names (:data:`transformer.training.freeze.PARTS`)."""
    unknown = [part for part in freeze or [] if part not in PARTS]
    if unknown:
        raise ConfigError(
            f"freeze={show(list(freeze))}: {unknown[0]!r} is not a part of the model; choose "
            f"from {', '.join(PARTS)}"
        )


def check_validation(validation: DictConfig, callbacks: DictConfig | None) -> None:
    """The validation decoding (:func:`transformer.decoding.options.validation_decoding`), BLEU's
    sentences and token budget, and the callbacks that monitor BLEU."""
    try:
        validation_decoding(OmegaConf.to_container(validation.decoding, resolve=True))
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from err
    n = validation.bleu_sentences
    if n is not None and int(n) < 0:
        raise ConfigError(f"validation.bleu_sentences must be >= 0 or null, got {n}")
    budget = validation.get("max_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise ConfigError(f"validation.max_tokens must be a whole number or null, got {budget!r}")
    monitored = [
        f"callbacks.{name}.monitor={c.monitor}"
        for name, c in (callbacks or {}).items()
        if c is not None and str(c.get("monitor", "")).startswith("val/bleu")
    ]
    if n == 0 and monitored:
        raise ConfigError(
            f"validation.bleu_sentences=0 turns val/bleu off, but {monitored[0]} needs it; "
            "drop that checkpoint with ~callbacks.best_checkpoint, or keep some BLEU sentences"
        )


def check_metrics(metrics: DictConfig | None) -> None:
    """sacreBLEU's BLEU tokenizer (:func:`transformer.metrics.check_tokenize`): one it offers,
    with its optional packages installed."""
    check_tokenize((metrics or {}).get("tokenize", TOKENIZE))


def check_ema(ema: DictConfig | None, trainer: DictConfig) -> None:
    """The weight average's decay, and a strategy that keeps the whole model on each device."""
    decay = (ema or {}).get("decay")
    if decay is not None and not 0.0 < float(decay) < 1.0:
        raise ConfigError(f"ema.decay must be in (0, 1), e.g. 0.999, or null (off); got {decay}")
    if decay is not None and trainer.get("strategy") == "fsdp":
        raise ConfigError("ema.decay needs the whole model on each device: not with trainer=fsdp")


def check_kernels(cfg: DictConfig) -> None:
    """``compile_backend`` (when ``compile`` is on) and ``sdpa_backends``."""
    backends = torch._dynamo.list_backends(exclude_tags=())
    if cfg.get("compile") and cfg.get("compile_backend", "inductor") not in backends:
        raise ConfigError(
            f"compile_backend={cfg.compile_backend!r} is not a torch.compile backend; choose one "
            f"of {', '.join(backends)}"
        )
    backends = cfg.get("sdpa_backends")
    sdpa_backends.parse(OmegaConf.to_container(backends) if backends is not None else None)


def check_trainer(tr: DictConfig) -> None:
    """Lightning's precision, gradient accumulation, time limit, and an end of training."""
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


def check_ckpt_path(ckpt_path: str | None) -> None:
    """The checkpoint to resume from is a whole file."""
    if not ckpt_path:
        return
    if not Path(ckpt_path).is_file():
        raise ConfigError(f"ckpt_path={ckpt_path} is not a file")
    if not zipfile.is_zipfile(ckpt_path):  # torch.save writes a zip; its index is last
        raise ConfigError(
            f"ckpt_path={ckpt_path} is truncated or not a checkpoint; resume from another "
            "checkpoint (checkpoints written by train.py are never left half-written)"
        )
