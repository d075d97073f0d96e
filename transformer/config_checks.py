"""The composed Hydra config checked before any data work: a bad option fails at once with one
:class:`ConfigError` line naming it (as typed on the command line) and the fix.

Each option has one check. Where the object that uses an option checks it, that check is run
early: the model's (:class:`TransformerConfig`), the Lightning module's
(:func:`check_label_smoothing`, :func:`validation_decoding`) and the LR scheduler's (built on a
stand-in optimizer) from here; the data module's and its corpus source's by ``train``, which builds
the data module (reading nothing) before any data work. What stays here is what no owner checks
in time: rules across options, and options of what ``train`` builds only after data work (torch's
optimizer, Lightning's Trainer, the module's NaN, BLEU and compile options, the checkpoint).
Before all of them, each value is checked against the type its owner annotates
(:func:`check_types`): ``model.d_model=abc`` is named as such, not as a comparison that failed.
"""

from __future__ import annotations

import difflib
import inspect
import os
import re
import tempfile
import types
import typing
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from transformer import sdpa_backends
from transformer.config import TransformerConfig
from transformer.errors import ConfigError
from transformer.lit_module import (
    TranslationModule,
    check_label_smoothing,
    takes_progress,
    validation_decoding,
)

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
    check_types(cfg)
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
    backends = torch._dynamo.list_backends(exclude_tags=())
    if cfg.get("compile") and cfg.get("compile_backend", "inductor") not in backends:
        raise ConfigError(
            f"compile_backend={cfg.compile_backend!r} is not a torch.compile backend; choose one "
            f"of {', '.join(backends)}"
        )
    backends = cfg.get("sdpa_backends")
    sdpa_backends.parse(OmegaConf.to_container(backends) if backends is not None else None)
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


# Options outside the groups that name a ``_target_``: the parameter of the object that takes
# them, or their type where train() takes them itself.
OWNED_OPTIONS: dict[str, tuple[Any, str] | Any] = {
    "seed": (L.seed_everything, "seed"),
    "loss.label_smoothing": (TranslationModule, "label_smoothing"),
    "loss.rdrop_alpha": (TranslationModule, "rdrop_alpha"),
    "loss.max_bad_steps": (TranslationModule, "max_bad_steps"),
    "validation.bleu_sentences": (TranslationModule, "val_bleu_sentences"),
    "compile": (TranslationModule, "compile_model"),
    "compile_backend": (TranslationModule, "compile_backend"),
    "ema.decay": float | None,  # WeightEMA's decay; null: no WeightEMA
}
# Options that train() resolves before their owner sees them (trainer.precision=auto)
RESOLVED_BY_TRAIN = ("trainer.precision",)
_ABSENT = object()


def check_types(cfg: DictConfig) -> None:
    """Each option's value against the type its owner annotates (the model config's field, the
    data module's, optimizer's, scheduler's, Trainer's, a callback's or logger's parameter), so
    that ``model.d_model=abc`` or ``model.num_encoder_layers=2.5`` fails naming the option, its
    value and the type expected, before any data work."""
    groups = {}  # data first: the model's vocabulary options interpolate its
    for name in ("data", "model", "optim.optimizer", "optim.scheduler", "trainer"):
        node = OmegaConf.select(cfg, name)
        if name == "model":
            groups[name] = (TransformerConfig, node)
        elif node is not None and node.get("_target_"):
            groups[name] = (node._target_, node)
    for kind in ("callbacks", "logger"):
        for name, node in (cfg.get(kind) or {}).items():
            if isinstance(node, DictConfig) and node.get("_target_"):
                groups[f"{kind}.{name}"] = (node._target_, node)
    for group, (owner, node) in groups.items():
        hints = option_types(owner)
        options = OmegaConf.to_container(node, resolve=True)
        for key, value in options.items():  # type: ignore[union-attr]
            option = f"{group}.{key}"
            if key in hints and option not in RESOLVED_BY_TRAIN:
                _check_type(option, value, *hints[key])
    for option, owner in OWNED_OPTIONS.items():
        value = OmegaConf.select(cfg, option, default=_ABSENT)
        hint = option_types(owner[0]).get(owner[1]) if isinstance(owner, tuple) else (owner, None)
        if value is not _ABSENT and hint is not None:
            _check_type(option, value, *hint)


def option_types(owner: Any) -> dict[str, tuple[Any, Any]]:
    """(annotated type, default) of each keyword argument ``owner`` takes: a function, a class
    (its ``__init__``'s, and its bases' for the ``**kwargs`` it passes on) or a Hydra
    ``_target_`` naming one. A parameter whose annotation cannot be resolved is left out."""
    if isinstance(owner, str):
        try:
            owner = get_object(owner)
        except Exception:  # (instantiating it names the fault)
            return {}
    functions = [c.__init__ for c in reversed(owner.__mro__)] if isinstance(owner, type) else []
    found: dict[str, tuple[Any, Any]] = {}
    for function in functions or [owner]:  # a subclass's own parameters last: they win
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin's
            continue
        hints = _annotations(function)
        for p in parameters:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name in hints:
                found[p.name] = (hints[p.name], None if p.default is p.empty else p.default)
    return found


def _annotations(function: Any) -> dict[str, Any]:
    """A function's annotations, resolved; where some name only exists for type checkers
    (``typing.get_type_hints`` fails), each one that resolves."""
    try:
        return typing.get_type_hints(function)
    except Exception:  # a NameError, or a TypeError of an annotation typing cannot read
        pass
    resolved = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        try:  # a string under `from __future__ import annotations`, as get_type_hints does it
            resolved[name] = (
                eval(annotation, function.__globals__)
                if isinstance(annotation, str)
                else annotation
            )
        except Exception:  # the name imported for type checkers only
            continue
    return resolved


def _check_type(option: str, value: Any, hint: Any, default: Any) -> None:
    if isinstance(value, dict) and "_target_" in value:  # an object Hydra builds
        return
    if not fits(value, hint):
        example = (
            f", e.g. {option}={show(default)}"
            if default is not None and fits(default, hint)
            else ""
        )
        raise ConfigError(f"{option}={show(value)}: expected {describe(hint)}{example}")


def fits(value: Any, hint: Any) -> bool:
    """Whether a config value (None, bool, int, float, str, or lists and mappings of them) can
    be given where ``hint`` is annotated. A class a config cannot hold passes only its
    instances, except a path, given as a string."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any or isinstance(hint, typing.TypeVar):
        return True
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in args)
    if origin is typing.Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint in (None, type(None)):
        return value is None
    if hint is float:  # an integer is a number
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint in (bool, int, str):
        return type(value) is hint
    if origin in (list, tuple, Sequence, Iterable):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and args[-1] is not Ellipsis:
            return len(value) == len(args) and all(map(fits, value, args))
        return not args or all(fits(v, args[0]) for v in value)
    if origin in (dict, Mapping):
        return isinstance(value, dict) and (
            not args or all(fits(v, args[1]) for v in value.values())
        )
    if isinstance(hint, type):
        return isinstance(value, hint) or (isinstance(value, str) and issubclass(hint, os.PathLike))
    return True  # a type this check does not know: its owner checks the value


def describe(hint: Any) -> str:
    """``hint`` in words, as a config value: "an integer", "true or false", "null", ..."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        held = [a for a in args if not (a is int and float in args)]  # (a number)
        held = [a for a in held if not _held_by_no_config(a)] or held
        return " or ".join(dict.fromkeys(describe(a) for a in held))
    if origin is typing.Literal:
        return "one of " + ", ".join(show(a) for a in args)
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if hint in words:
        return words[hint]
    if hint in (None, type(None)):
        return "null"
    if origin in (list, tuple, Sequence, Iterable):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return f"a list of {len(args)}: " + ", ".join(describe(a) for a in args)
        return f"a list, each {describe(args[0])}" if args else "a list"
    if origin in (dict, Mapping):
        return "a mapping"
    return getattr(hint, "__name__", str(hint))


def _held_by_no_config(hint: Any) -> bool:
    """A class no config value is (a tensor, an accelerator object): left out of messages."""
    return isinstance(hint, type) and hint not in (bool, int, float, str, type(None))


def show(value: Any) -> str:
    """A value as it is written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(show, value)) + "]"
    return str(value)


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
