"""Each option's value against the type its owner annotates (:func:`check_types`), before any
other check: ``model.d_model=abc`` is named as such, not as a comparison that failed."""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import lightning as L
from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf

from transformer.config import TransformerConfig
from transformer.errors import ConfigError, show
from transformer.training.lit_module import TranslationModule

# Options outside the groups that name a ``_target_``: the parameter of the object that takes
# them, or their type where train() takes them itself.
OWNED_OPTIONS: dict[str, tuple[Any, str] | Any] = {
    "seed": (L.seed_everything, "seed"),
    "loss.label_smoothing": (TranslationModule, "label_smoothing"),
    "loss.rdrop_alpha": (TranslationModule, "rdrop_alpha"),
    "loss.max_bad_steps": (TranslationModule, "max_bad_steps"),
    "loss.kernel": (TranslationModule, "loss_kernel"),
    "validation.bleu_sentences": (TranslationModule, "val_bleu_sentences"),
    "metrics.tokenize": (TranslationModule, "bleu_tokenize"),
    "compile": (TranslationModule, "compile_model"),
    "freeze": (TranslationModule, "freeze"),
    "init_from": str | list[str] | None,  # checkpoints (transformer.training.finetune)
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
        if OmegaConf.is_config(value):  # a list or mapping: as the owner gets it
            value = OmegaConf.to_container(value, resolve=True)
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
