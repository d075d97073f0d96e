"""A config value against the type its owner annotates: the owner's keyword arguments and their
types (:func:`option_types`), whether a value fits one (:func:`fits`), the type in words
(:func:`describe`), and one :class:`ConfigError` line naming the option where it does not
(:func:`check_type`). Shared by training's option checks
(:mod:`transformer.training.config_checks`) and evaluation's
(:mod:`transformer.evaluation.config_checks`); light: no Lightning."""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hydra.utils import get_object

from transformer.errors import ConfigError, show


def option_types(owner: Any) -> dict[str, tuple[Any, Any]]:
    """(annotated type, default) of each keyword argument ``owner`` takes: a function, a class
    (its ``__init__``'s, and its bases' for the ``**kwargs`` it passes on) or a Hydra
    ``_target_`` naming one, with the options a class declares its ``**kwargs`` take
    (``keyword_options``: name -> (type, default)). A parameter whose annotation cannot be
    resolved is left out."""
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
    return {**getattr(owner, "keyword_options", {}), **found}


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


def check_type(option: str, value: Any, hint: Any, default: Any = None) -> None:
    """A :class:`ConfigError` naming ``option`` where ``value`` does not fit ``hint``: the value,
    the type expected, and ``default`` as an example where it fits."""
    if isinstance(value, dict) and "_target_" in value:  # an object Hydra builds
        return
    if not fits(value, hint):
        example = (
            f", e.g. {option}={show(default)}"
            if default is not None and fits(default, hint)
            else ""
        )
        if isinstance(value, bool | int | float) and fits(show(value), hint):  # e.g. split=2017
            kind = "a boolean" if isinstance(value, bool) else "a number"
            quoted = f"'{option}=\"{show(value)}\"'"
            example = f"; the command line read it as {kind}: quote it, {quoted}"
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
