"""The composed Hydra config checked before any data work: a bad option fails at once with one
:class:`ConfigError` line naming it (as typed on the command line) and the fix.

Each option has one check. Where the object that uses an option checks it, that check is run
early: the model's (:class:`TransformerConfig`), the Lightning module's
(:func:`check_label_smoothing`, :func:`validation_decoding`) and the LR scheduler's (built on a
stand-in optimizer) from here; the data module's and its corpus source's by ``train``, which builds
the data module (reading nothing) before any data work. What stays here is what no owner checks
in time: rules across options, and options of what ``train`` builds only after data work (torch's
optimizer, Lightning's Trainer, the module's NaN, BLEU and compile options, the checkpoint).
"""

from __future__ import annotations

import difflib
import re
import tempfile
import zipfile
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from transformer.config import TransformerConfig
from transformer.errors import ConfigError
from transformer.lit_module import check_label_smoothing, takes_progress, validation_decoding

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


def validate_config(cfg: DictConfig) -> TransformerConfig:
    """Check every option that can be checked without data; return the model config."""
    for key in ("data", "model", "optim", "trainer"):
        if cfg.get(key) is None:
            raise ConfigError(f"the config has no `{key}` group; pick one, e.g. {key}=...")
    model_cfg = model_config(cfg)
    data = cfg.data
    if data.get("max_len") is not None and int(data.max_len) + 1 > model_cfg.max_positions:
        raise ConfigError(
            f"data.max_len={data.max_len} pieces (+1 for bos/eos) exceed model.max_positions="
            f"{model_cfg.max_positions}; lower data.max_len or raise model.max_positions"
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
    if cfg.optim.get("scheduler") is not None:
        check_scheduler(cfg.optim.scheduler, cfg.trainer)
    if float(cfg.loss.rdrop_alpha) < 0:
        raise ConfigError(f"loss.rdrop_alpha must be >= 0 (0 = off), got {cfg.loss.rdrop_alpha}")
    if int(cfg.loss.max_bad_steps) < 1:
        raise ConfigError(f"loss.max_bad_steps must be >= 1, got {cfg.loss.max_bad_steps}")
    try:  # the Lightning module's own checks, with the options' names
        check_label_smoothing(float(cfg.loss.label_smoothing), "loss.label_smoothing")
        validation_decoding(OmegaConf.to_container(cfg.validation.decoding, resolve=True))
    except (ValueError, TypeError) as err:
        raise ConfigError(str(err)) from err
    n = cfg.validation.bleu_sentences
    if n is not None and int(n) < 0:
        raise ConfigError(f"validation.bleu_sentences must be >= 0 or null, got {n}")
    budget = cfg.validation.get("max_tokens")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int)):
        raise ConfigError(f"validation.max_tokens must be a whole number or null, got {budget!r}")
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
    ema = (cfg.get("ema") or {}).get("decay")
    if ema is not None and not 0.0 < float(ema) < 1.0:
        raise ConfigError(f"ema.decay must be in (0, 1), e.g. 0.999, or null (off); got {ema}")
    if ema is not None and cfg.trainer.get("strategy") == "fsdp":
        raise ConfigError("ema.decay needs the whole model on each device: not with trainer=fsdp")
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


def check_scheduler(scheduler: DictConfig, trainer: DictConfig) -> None:
    """The scheduler checks its options: build it on a stand-in optimizer. A budgeted one
    (:class:`transformer.optim.BudgetLR`) needs the end of training: ``trainer.max_steps`` or
    ``trainer.max_time`` (an epoch count alone is no budget: it depends on the data)."""
    factory = instantiate(scheduler)
    budgeted = takes_progress(factory)
    try:
        stand_in = torch.optim.SGD([torch.zeros(1)], lr=1.0)
        factory(stand_in, **({"progress": lambda: 0.0} if budgeted else {}))
    except ValueError as err:  # its messages name the argument: warmup_steps must be ...
        raise ConfigError(f"optim.scheduler.{err}") from err
    if budgeted and trainer.get("max_steps", -1) == -1 and trainer.get("max_time") is None:
        raise ConfigError(
            f"optim.scheduler.shape={scheduler.get('shape', 'cosine')} decays to its minimum "
            "when training ends, but neither trainer.max_steps nor trainer.max_time is set; "
            "set one (e.g. trainer.max_steps=20000 or +trainer.max_time=00:01:00:00), or use "
            "optim=adamw (warmup then inverse square root, no end needed)"
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


def output_dirs(cfg: DictConfig) -> dict[str, Path]:
    """The directories training writes to, by the option that names them."""
    dirs = {"paths.output_dir": Path(cfg.paths.output_dir)}
    for name, c in (cfg.get("callbacks") or {}).items():
        if c is not None and c.get("dirpath"):
            dirs[f"callbacks.{name}.dirpath"] = Path(c.dirpath)
    return dirs


def check_writable(dirs: dict[str, Path]) -> None:
    """Write a probe file in each directory: an unwritable output directory fails now, not at the
    first checkpoint an hour into training. The directories created for the probe are removed
    again: Lightning warns of a checkpoint directory that "exists and is not empty" (an earlier
    run's), and an empty ``checkpoints/epochs`` of this run would set it off."""
    for option, path in dirs.items():
        created = [p for p in (path, *path.parents) if not p.exists()]  # deepest first
        try:
            path.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as err:
            raise ConfigError(
                f"{option}={path} is not a writable directory ({err.strerror}); choose another, "
                "e.g. hydra.run.dir=DIR"
            ) from err
        for p in created:
            p.rmdir()


def check_data_root(data: DictConfig) -> None:
    """A ``data.root`` that does not exist is a typo, unless Multi30k is to be downloaded there."""
    root = data.get("root")
    downloads = data.get("source") == "multi30k" and data.get("download", True)
    if root is not None and not downloads and not Path(root).is_dir():
        raise ConfigError(
            f"data.root={root} does not exist; set data.root to the directory of the corpus files"
        )
